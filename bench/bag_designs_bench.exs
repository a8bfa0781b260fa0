# The Larder.Bag designs side by side (prototypes in
# bench/support/bag_designs.ex), against ETS :duplicate_bag and :bag in the
# same run:
#
#   mix run bench/bag_designs_bench.exs [--quick] [--json PATH]
#
# Full size: 1M rows over 10k keys (~100 values a key); --quick: 200k rows
# over 2k keys. Runs are interleaved across columns (Bench.interleave/2).

alias Larder.Bench
alias Larder.Bench.BagDesigns

bench = Bench.start("Larder.Bag designs vs ETS :duplicate_bag / :bag")

scale = Bench.pick(bench, 5, 1)
rows_n = div(1_000_000, scale)
keys_n = div(10_000, scale)
runs = Bench.pick(bench, 3, 5)
opts = [warmup: 1, runs: runs, interleave: true]

:rand.seed(:exsss, {2026, 11, 22})

rows =
  Bench.off_heap(
    :rows,
    for(_ <- 1..rows_n, do: {:rand.uniform(keys_n), :rand.uniform(1_000_000_000)})
  )

batches = Bench.off_heap(:batches, Enum.chunk_every(rows, 1_000))
:erlang.garbage_collect()

ets = fn type ->
  %{
    new: fn -> :ets.new(:bench, [type, :public]) end,
    insert: fn t, k, v -> :ets.insert(t, {k, v}) end,
    insert_many: &:ets.insert/2,
    memory: &:ets.info(&1, :memory),
    drop: &:ets.delete/1
  }
end

mod = fn m ->
  %{
    new: &m.new/0,
    insert: &m.insert/3,
    insert_many: &m.insert_many/2,
    memory: &m.memory/1,
    drop: &m.drop/1
  }
end

larder = %{
  new: fn -> Larder.Bag.new() end,
  insert: &Larder.Bag.insert/3,
  insert_many: &Larder.Bag.insert_many/2,
  memory: &Larder.Bag.memory/1,
  drop: &Larder.Bag.drop/1
}

designs = [
  {"dup_bag", ets.(:duplicate_bag)},
  {"ETS :bag", ets.(:bag)},
  {"0 ordered_set", mod.(BagDesigns.OrderedSet)},
  {"1 NIF fps", larder},
  {"2 ETS fps", mod.(BagDesigns.EtsFingerprints)},
  {"3 batch sort", mod.(BagDesigns.BatchSort)},
  {"4 pair set", mod.(BagDesigns.PairSet)}
]

columns = Enum.map(designs, &elem(&1, 0))
# ETS :bag and the design without fingerprints pay :bag's per-key scan:
# one timed run each.
slow = fn name -> if name in ["ETS :bag", "3 batch sort"], do: [warmup: 0, runs: 1], else: [] end

fill = fn how ->
  Map.new(designs, fn {name, d} ->
    fun =
      case how do
        :insert -> fn t -> Enum.each(rows, fn {k, v} -> d.insert.(t, k, v) end) end
        :many -> fn t -> Enum.each(batches, &d.insert_many.(t, &1)) end
      end

    {name, {fun, [setup: d.new, teardown: d.drop] ++ slow.(name)}}
  end)
end

title = "fill #{rows_n} rows over #{keys_n} keys"

bench =
  bench
  |> Bench.table(title, columns, anchor: "dup_bag")
  |> Bench.row("insert/3", fill.(:insert), opts)
  |> Bench.row("insert_many x1000", fill.(:many), opts)

IO.puts("\n(prefilling every design)")

pre =
  Map.new(designs, fn {name, d} ->
    t = d.new.()
    Enum.each(batches, &d.insert_many.(t, &1))
    {name, t}
  end)

# Fresh pairs for every run (values above the prefill's range), made
# untimed in the setup: every insert adds a pair.
fresh = fn ->
  for _ <- 1..10_000,
      do: {:rand.uniform(keys_n), 1_000_000_000 + System.unique_integer([:positive])}
end

steady_title = "10k inserts into #{rows_n} rows"

steady =
  Map.new(designs, fn {name, d} ->
    t = pre[name]
    {name, {fn pairs -> Enum.each(pairs, fn {k, v} -> d.insert.(t, k, v) end) end, setup: fresh}}
  end)

bench =
  bench
  |> Bench.table(steady_title, columns, anchor: "dup_bag")
  |> Bench.row("10k fresh inserts", steady, Keyword.put(opts, :runs, runs * 3))
  |> Bench.table("memory of #{rows_n} rows", columns, anchor: "ETS :bag")
  |> Bench.row(
    "words",
    Map.new(designs, fn {name, d} -> {name, Bench.value(d.memory.(pre[name]), "words")} end)
  )

Enum.each(designs, fn {name, d} -> d.drop.(pre[name]) end)
Bench.finish(bench)
Bench.release_off_heap()
