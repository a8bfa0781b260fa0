# Larder.Bag: fill 1M {key, value} rows over 10k random keys into an ETS :bag,
# an ETS :duplicate_bag and a Larder.Bag, one row per insert and in batches of
# 1,000 (one run each; the :bag takes several seconds per fill). The full
# comparison, with repeated runs and every target: bench/bag_bench.exs.
alias Larder.Bench

bench = Bench.start("Larder.Bag: ETS :bag semantics at close to :duplicate_bag speed", [])

:rand.seed(:exsss, {2026, 11, 21})
# The rows live off this process's heap (Bench.off_heap/2), so that garbage
# collections during the timed fills do not copy them.
rows =
  Bench.off_heap(
    :bag_rows,
    for(_ <- 1..1_000_000, do: {:rand.uniform(10_000), :rand.uniform(1_000_000_000)})
  )

batches = Bench.off_heap(:bag_batches, Enum.chunk_every(rows, 1_000))
:erlang.garbage_collect()

cell = fn fill, new, drop -> {fill, setup: new, teardown: drop} end
ets_new = fn type -> fn -> :ets.new(:demo, [type, :public]) end end

cells = fn ets_fill, bag_fill ->
  %{
    "ETS :duplicate_bag" => cell.(ets_fill, ets_new.(:duplicate_bag), &:ets.delete/1),
    "ETS :bag" => cell.(ets_fill, ets_new.(:bag), &:ets.delete/1),
    "Larder.Bag" => cell.(bag_fill, fn -> Larder.Bag.new() end, &Larder.Bag.drop/1)
  }
end

title = "fill 1M rows over 10k keys"
one = "insert/3, one row at a time"
many = "insert_many/2, batches of 1,000"

bench =
  bench
  |> Bench.table(title, ["ETS :duplicate_bag", "ETS :bag", "Larder.Bag"],
    anchor: "ETS :duplicate_bag"
  )
  |> Bench.row(
    one,
    cells.(
      fn t -> Enum.each(rows, &:ets.insert(t, &1)) end,
      fn b -> Enum.each(rows, fn {k, v} -> Larder.Bag.insert(b, k, v) end) end
    ),
    warmup: 0,
    runs: 1
  )
  |> Bench.row(
    many,
    cells.(
      fn t -> Enum.each(batches, &:ets.insert(t, &1)) end,
      fn b -> Enum.each(batches, &Larder.Bag.insert_many(b, &1)) end
    ),
    warmup: 0,
    runs: 1
  )

for label <- [one, many] do
  larder = Bench.ratio(bench, title, label, "Larder.Bag")
  bag = Bench.ratio(bench, title, label, "ETS :bag")

  IO.puts(
    "#{label}: Larder.Bag keeps ETS :bag's semantics (each pair once by =:=, " <>
      "values in insertion order) and fills #{Bench.fmt_ratio(bag / larder)}x faster " <>
      "than ETS :bag, at #{Bench.fmt_ratio(larder)}x the time of a :duplicate_bag " <>
      "(which keeps repeats)."
  )
end

Bench.release_off_heap()
