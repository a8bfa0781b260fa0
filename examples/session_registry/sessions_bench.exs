# The session registry example: session info as a map against info as a
# proplist (what MongooseIM moved away from), measured in this run: lookup of
# a key that is not first, merge_info, create_session through the registry,
# and ETS memory for 100 records of 10 pairs.
#
#   mix run examples/session_registry/sessions_bench.exs [--quick] [--json PATH]
Code.require_file("session_registry.ex", __DIR__)

alias Larder.Bench

bench = Bench.start("Session registry: map info vs proplist info")

pairs = for i <- 1..10, do: {:"key#{i}", {:value, i, "v#{i}"}}
proplist = SessionRegistry.merge_info(:proplist, [], pairs)
map = Map.new(pairs)
update = [{:key3, :new}, {:key7, :new}, {:key11, :added}]
# The 7th key: not first, where MongooseIM saw proplists lose most.
key = :key7
n = Bench.pick(bench, 20_000, 200_000)

lookup = fn kind, info ->
  fn -> for _ <- 1..n, do: SessionRegistry.lookup(kind, info, key) end
end

merge = fn kind, info ->
  fn -> for _ <- 1..n, do: SessionRegistry.merge_info(kind, info, update) end
end

runs = [warmup: 1, runs: Bench.pick(bench, 7, 21), ops: n]

bench =
  bench
  |> Bench.table("session info, 10 pairs (per operation)", ["proplist", "map"], per_op: true)
  |> Bench.row(
    "lookup of the 7th key",
    %{"proplist" => lookup.(:proplist, proplist), "map" => lookup.(:map, map)},
    runs
  )
  |> Bench.row(
    "merge_info (3 pairs into 10)",
    %{"proplist" => merge.(:proplist, proplist), "map" => merge.(:map, map)},
    runs
  )

# Through the registry: create_session on existing sessions merges their info.
sessions = Bench.pick(bench, 2_000, 10_000)

registry = fn kind ->
  reg = SessionRegistry.new(info: kind)

  for sid <- 1..sessions,
      do:
        :ok =
          SessionRegistry.create_session(reg, sid, "user#{rem(sid, 500)}@host", "res", 1, pairs)

  reg
end

regs = %{"proplist" => registry.(:proplist), "map" => registry.(:map)}

reg_runs = [warmup: 1, runs: Bench.pick(bench, 5, 15), ops: sessions]

bench =
  bench
  |> Bench.row(
    "create_session on an existing session",
    Map.new(regs, fn {col, reg} ->
      {col,
       fn ->
         for sid <- 1..sessions,
             do:
               SessionRegistry.create_session(
                 reg,
                 sid,
                 "user#{rem(sid, 500)}@host",
                 "res",
                 1,
                 update
               )
       end}
    end),
    reg_runs
  )
  |> Bench.row(
    "get_info of the 7th key",
    Map.new(regs, fn {col, reg} ->
      {col, fn -> for sid <- 1..sessions, do: SessionRegistry.get_info(reg, sid, key) end}
    end),
    reg_runs
  )
  |> Bench.row(
    "get_sessions(user) through the index",
    Map.new(regs, fn {col, reg} ->
      {col,
       fn ->
         for u <- 1..sessions, do: SessionRegistry.get_sessions(reg, "user#{rem(u, 500)}@host")
       end}
    end),
    reg_runs
  )

# MongooseIM's memory comparison: 100 records of 10 pairs in ETS, in words.
ets_words = fn info ->
  tab = :ets.new(:info_memory, [:set])
  for sid <- 1..100, do: :ets.insert(tab, {sid, info})
  words = :ets.info(tab, :memory)
  :ets.delete(tab)
  words
end

bench =
  bench
  |> Bench.table("ETS memory, 100 records of 10 pairs", ["proplist", "map"])
  |> Bench.row("ETS words", %{
    "proplist" => Bench.value(ets_words.(proplist), "words"),
    "map" => Bench.value(ets_words.(map), "words")
  })

IO.puts("")

[lookup_row, merge_row | _] = Enum.find(bench.tables, &(&1.title =~ "10 pairs (per")).rows

bench
|> Bench.target(
  "lookup: proplist time / map time (MongooseIM: up to 20)",
  1 / Bench.ratio(bench, "session info, 10 pairs (per operation)", lookup_row.label, "map"),
  :>=,
  1
)
|> Bench.target(
  "merge_info: proplist time / map time (MongooseIM: 9)",
  1 / Bench.ratio(bench, "session info, 10 pairs (per operation)", merge_row.label, "map"),
  :>=,
  1
)
|> Bench.target(
  "ETS words: map / proplist (MongooseIM: 3411/6011 = 0.57)",
  Bench.ratio(bench, "ETS memory, 100 records of 10 pairs", "ETS words", "map"),
  :<=,
  1
)
|> Bench.finish()
