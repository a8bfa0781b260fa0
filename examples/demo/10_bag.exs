# Larder.Bag: fill 1M {key, value} rows over 10k random keys into an ETS :bag,
# an ETS :duplicate_bag and a Larder.Bag (one run each; the :bag takes ~9 s).
# The full comparison, with repeated runs and every target: bench/bag_bench.exs.
alias Larder.Bench

bench = Bench.start("Larder.Bag: :bag semantics without :bag's insert cost", [])

:rand.seed(:exsss, {2026, 11, 21})
# The rows live in persistent_term, off this process's heap, so that garbage
# collections during the timed fills do not copy them (see bench/bag_bench.exs).
:persistent_term.put(
  {:larder_demo, :bag_rows},
  for(_ <- 1..1_000_000, do: {:rand.uniform(10_000), :rand.uniform(1_000_000_000)})
)

rows = :persistent_term.get({:larder_demo, :bag_rows})
:erlang.garbage_collect()

ets_fill = fn type ->
  {fn t -> Enum.each(rows, &:ets.insert(t, &1)) end,
   setup: fn -> :ets.new(:demo, [type, :public]) end, teardown: &:ets.delete/1}
end

title = "fill 1M rows over 10k keys, one insert per row"
label = "fill"

bench
|> Bench.table(title, ["ETS :duplicate_bag", "ETS :bag", "Larder.Bag"],
  anchor: "ETS :duplicate_bag"
)
|> Bench.row(
  label,
  %{
    "ETS :duplicate_bag" => ets_fill.(:duplicate_bag),
    "ETS :bag" => ets_fill.(:bag),
    "Larder.Bag" =>
      {fn bag -> Enum.each(rows, fn {k, v} -> Larder.Bag.insert(bag, k, v) end) end,
       setup: fn -> Larder.Bag.new() end, teardown: &Larder.Bag.delete_table/1}
  },
  warmup: 0,
  runs: 1
)
|> then(fn bench ->
  larder = Bench.ratio(bench, title, label, "Larder.Bag")
  bag = Bench.ratio(bench, title, label, "ETS :bag")

  IO.puts(
    "Larder.Bag keeps :bag semantics (each pair once) and fills " <>
      "#{Bench.fmt_ratio(bag / larder)}x faster than ETS :bag, " <>
      "at #{Bench.fmt_ratio(larder)}x the time of a :duplicate_bag (which keeps repeats)."
  )
end)

:persistent_term.erase({:larder_demo, :bag_rows})
