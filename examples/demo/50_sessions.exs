# The session registry example (examples/session_registry): session info as a
# map against info as a proplist, as MongooseIM measured when it moved to maps.
Code.require_file("../session_registry/session_registry.ex", __DIR__)
alias Larder.Bench

demo = Bench.start("Session registry: map info vs proplist info", ["--quick"])
pairs = for i <- 1..10, do: {:"key#{i}", {:value, i, "v#{i}"}}
proplist = SessionRegistry.merge_info(:proplist, [], pairs)
map = Map.new(pairs)
update = [{:key3, :new}, {:key7, :new}, {:key11, :added}]
n = 50_000

ets_words = fn info ->
  tab = :ets.new(:info_memory, [:set])
  for sid <- 1..100, do: :ets.insert(tab, {sid, info})
  words = :ets.info(tab, :memory)
  :ets.delete(tab)
  Bench.value(words, "words")
end

demo
|> Bench.table("session info, 10 pairs (per operation)", ["proplist", "map"], per_op: true)
|> Bench.row(
  "lookup of the 7th key",
  %{
    "proplist" => fn -> for _ <- 1..n, do: SessionRegistry.lookup(:proplist, proplist, :key7) end,
    "map" => fn -> for _ <- 1..n, do: SessionRegistry.lookup(:map, map, :key7) end
  },
  runs: 7,
  ops: n
)
|> Bench.row(
  "merge_info (3 pairs into 10)",
  %{
    "proplist" => fn ->
      for _ <- 1..n, do: SessionRegistry.merge_info(:proplist, proplist, update)
    end,
    "map" => fn -> for _ <- 1..n, do: SessionRegistry.merge_info(:map, map, update) end
  },
  runs: 7,
  ops: n
)
|> Bench.table("ETS memory, 100 records of 10 pairs", ["proplist", "map"])
|> Bench.row("ETS words", %{"proplist" => ets_words.(proplist), "map" => ets_words.(map)})
