# Larder.Bag against ETS :bag and :duplicate_bag, measured in the same run.
#
#   mix run bench/bag_bench.exs [--quick] [--json PATH]
#
# --quick scales every workload down 5x (200k rows over 2k keys keeps the
# ~100 values per key of the full 1M over 10k) and takes fewer runs.

alias Larder.Bench
alias Larder.Bag

bench = Bench.start("Larder.Bag vs ETS :bag / :duplicate_bag")

scale = Bench.pick(bench, 5, 1)
rows_n = div(1_000_000, scale)
runs = Bench.pick(bench, 3, 5)
base_opts = [warmup: 1, runs: runs]
# ETS :bag takes ~9 s to fill 1M rows over 10k keys: one timed run is enough
# to show the gap.
slow_opts = [warmup: 0, runs: 1]

# The machine is shared and noisy: every row takes its runs in rounds, one
# run of each column per round in a rotating order (Bench.interleave/2), so
# a burst of load hits all columns alike.
row = fn bench, label, cells, opts -> Bench.row(bench, label, Bench.interleave(cells, opts)) end

bag = "ETS :bag"
dup = "ETS :duplicate_bag"
larder = "Larder.Bag"
nodedup = "Larder.Bag dedup: false"
columns = [dup, bag, larder, nodedup]

:rand.seed(:exsss, {2026, 11, 21})

gen_rows = fn n, keys ->
  for _ <- 1..n, do: {:rand.uniform(keys), :rand.uniform(1_000_000_000)}
end

# Workload data lives off the bench process's heap (Bench.off_heap/2): with
# millions of rows on the heap, every garbage collection during a timed run
# would copy them, and the contender that allocates (Larder.Bag builds its
# ETS object) would pay for the data set's size rather than for its own work.
stash = &Bench.off_heap/2

ets_table = fn type -> fn -> :ets.new(:bench, [type, :public]) end end
larder_bag = fn opts -> fn -> Bag.new(opts) end end
drop_ets = &:ets.delete/1
drop_bag = &Bag.drop/1

# The four columns of a fill row: `ets_fill` fills an ETS table, `bag_fill`
# a Larder.Bag; each run starts from an empty table.
fill_row = fn ets_fill, bag_fill ->
  %{
    dup => {ets_fill, setup: ets_table.(:duplicate_bag), teardown: drop_ets},
    bag => {ets_fill, [setup: ets_table.(:bag), teardown: drop_ets] ++ slow_opts},
    larder => {bag_fill, setup: larder_bag.([]), teardown: drop_bag},
    nodedup => {bag_fill, setup: larder_bag.(dedup: false), teardown: drop_bag}
  }
end

fill_cells = fn rows ->
  fill_row.(
    fn t -> Enum.each(rows, &:ets.insert(t, &1)) end,
    fn b -> Enum.each(rows, fn {k, v} -> Bag.insert(b, k, v) end) end
  )
end

fill_many_cells = fn name, rows ->
  batches = stash.({:batches, name}, Enum.chunk_every(rows, 1_000))

  fill_row.(
    fn t -> Enum.each(batches, &:ets.insert(t, &1)) end,
    fn b -> Enum.each(batches, &Bag.insert_many(b, &1)) end
  )
end

## Fill

fill = "fill #{rows_n} rows"
bench = Bench.table(bench, fill, columns, anchor: dup)

rows_10k = stash.(:rows_10k, gen_rows.(rows_n, div(10_000, scale)))
rows_1k = stash.(:rows_1k, gen_rows.(rows_n, div(1_000, scale)))
rows_unique = stash.(:rows_unique, Enum.map(1..rows_n, &{&1, &1}))
:erlang.garbage_collect()

label_10k = "#{div(10_000, scale)} keys, insert"
label_10k_many = "#{div(10_000, scale)} keys, insert_many x1000"

bench =
  bench
  |> row.(label_10k, fill_cells.(rows_10k), base_opts)
  |> row.(label_10k_many, fill_many_cells.(:rows_10k, rows_10k), base_opts)
  # ETS :bag over 1k keys (~1,000 values a key) is the slowest cell of the
  # whole benchmark (a minute or more at full size): one run.
  |> row.("#{div(1_000, scale)} keys, insert", fill_cells.(rows_1k), base_opts)
  |> row.(
    "#{div(1_000, scale)} keys, insert_many x1000",
    fill_many_cells.(:rows_1k, rows_1k),
    base_opts
  )
  |> row.("unique keys, insert", fill_cells.(rows_unique), base_opts)
  |> row.(
    "unique keys, insert_many x1000",
    fill_many_cells.(:rows_unique, rows_unique),
    base_opts
  )

## Prefilled tables for the steady-state, lookup and memory rows

prefill_ets = fn type ->
  t = :ets.new(:bench, [type, :public])
  :ets.insert(t, rows_10k)
  t
end

prefill_bag = fn opts ->
  b = Bag.new(opts)
  Bag.insert_many(b, rows_10k)
  b
end

IO.puts("\n(prefilling the ETS :bag: a few seconds)")

pre = %{
  bag => prefill_ets.(:bag),
  dup => prefill_ets.(:duplicate_bag),
  larder => prefill_bag.([]),
  nodedup => prefill_bag.(dedup: false)
}

keys_n = div(10_000, scale)
# Fresh pairs: values above the prefill's range, so every insert adds one.
new_pairs = for i <- 1..10_000, do: {:rand.uniform(keys_n), 1_000_000_000 + i}
lookup_keys = for _ <- 1..10_000, do: :rand.uniform(keys_n)

steady = "10k inserts into a prefilled #{rows_n}-row table"
bench = Bench.table(bench, steady, columns, anchor: dup)

ets_steady = fn t ->
  {fn -> Enum.each(new_pairs, &:ets.insert(t, &1)) end,
   teardown: fn _ -> Enum.each(new_pairs, &:ets.delete_object(t, &1)) end}
end

bag_steady = fn b ->
  {fn -> Enum.each(new_pairs, fn {k, v} -> Bag.insert(b, k, v) end) end,
   teardown: fn _ -> Enum.each(new_pairs, fn {k, v} -> Bag.delete(b, k, v) end) end}
end

bench =
  row.(
    bench,
    "10k inserts",
    %{
      bag => ets_steady.(pre[bag]),
      dup => ets_steady.(pre[dup]),
      larder => bag_steady.(pre[larder]),
      nodedup => bag_steady.(pre[nodedup])
    },
    # 10k inserts take milliseconds: more runs steady the median.
    Keyword.put(base_opts, :runs, runs * 3)
  )

lookups = "lookup of 10k random keys (~100 values each)"
bench = Bench.table(bench, lookups, columns, anchor: bag)

ets_lookup = fn t -> fn -> Enum.each(lookup_keys, &:ets.lookup(t, &1)) end end
bag_lookup = fn b -> fn -> Enum.each(lookup_keys, &Bag.lookup(b, &1)) end end

bench =
  row.(
    bench,
    "lookup",
    %{
      bag => ets_lookup.(pre[bag]),
      dup => ets_lookup.(pre[dup]),
      larder => bag_lookup.(pre[larder]),
      nodedup => bag_lookup.(pre[nodedup])
    },
    Keyword.put(base_opts, :runs, runs * 2)
  )

memory = "memory of the prefilled table"
bench = Bench.table(bench, memory, columns, anchor: bag)
ets_words = fn t -> Bench.value(:ets.info(t, :memory), "words") end
bag_words = fn b -> Bench.value(Bag.memory(b), "words") end

bench =
  Bench.row(bench, "#{rows_n} rows over #{keys_n} keys", %{
    bag => ets_words.(pre[bag]),
    dup => ets_words.(pre[dup]),
    larder => bag_words.(pre[larder]),
    nodedup => bag_words.(pre[nodedup])
  })

Enum.each([pre[bag], pre[dup]], &:ets.delete/1)
Enum.each([pre[larder], pre[nodedup]], &Bag.drop/1)

## Restart: load a snapshot versus re-inserting the rows

reinsert = "re-insert with insert/3"
load = "load/2 the snapshot"
dump = "dump/2 (for reference)"
restart = "restart with #{rows_n} rows over #{keys_n} keys"
bench = Bench.table(bench, restart, [reinsert, load, dump], anchor: reinsert)

dir = Path.join(System.tmp_dir!(), "larder_bag_bench_#{System.os_time()}")
File.mkdir_p!(dir)

restart_row = fn bench, label, opts ->
  path = Path.join(dir, "#{label}.bag" |> String.replace(~r/\W+/, "_"))
  source = prefill_bag.(opts)
  :ok = Bag.dump(source, path)

  bench =
    row.(
      bench,
      label,
      %{
        reinsert =>
          {fn b -> Enum.each(rows_10k, fn {k, v} -> Bag.insert(b, k, v) end) end,
           setup: larder_bag.(opts), teardown: drop_bag},
        load => {fn -> Bag.load!(path) end, teardown: fn _ -> :ok end},
        dump => fn -> :ok = Bag.dump(source, path) end
      },
      base_opts
    )

  Bag.drop(source)
  bench
end

# load/2's bags are owned by the measuring process and die with it; delete
# them between runs so memory does not pile up.
bench =
  bench
  |> restart_row.("Larder.Bag", [])
  |> restart_row.("Larder.Bag dedup: false", dedup: false)

File.rm_rf!(dir)

## Targets (ratios of medians from this run)

ratio = fn title, label, col -> Bench.ratio(bench, title, label, col) end
over = fn a, b -> if a && b && b > 0, do: a / b end

bench
|> Bench.target(
  "fill #{label_10k}: Larder.Bag / :duplicate_bag",
  ratio.(fill, label_10k, larder),
  :<=,
  1.5
)
|> Bench.target(
  "fill #{label_10k}: ETS :bag / Larder.Bag (speed-up)",
  over.(ratio.(fill, label_10k, bag), ratio.(fill, label_10k, larder)),
  :>=,
  7
)
|> Bench.target(
  "fill #{label_10k_many}: Larder.Bag / :duplicate_bag",
  ratio.(fill, label_10k_many, larder),
  :<=,
  1.3
)
|> Bench.target(
  "steady-state insert: Larder.Bag / :duplicate_bag",
  ratio.(steady, "10k inserts", larder),
  :<=,
  1.5
)
|> Bench.target("lookup: Larder.Bag / ETS :bag", ratio.(lookups, "lookup", larder), :<=, 1.2)
|> Bench.target(
  "memory: Larder.Bag / ETS :bag",
  ratio.(memory, "#{rows_n} rows over #{keys_n} keys", larder),
  :<=,
  1.5
)
|> Bench.target(
  "fill #{label_10k}: dedup: false / :duplicate_bag",
  ratio.(fill, label_10k, nodedup),
  :<=,
  1.1
)
|> Bench.target(
  "fill #{label_10k_many}: dedup: false / :duplicate_bag",
  ratio.(fill, label_10k_many, nodedup),
  :<=,
  1.1
)
|> Bench.target(
  "steady-state insert: dedup: false / :duplicate_bag",
  ratio.(steady, "10k inserts", nodedup),
  :<=,
  1.1
)
|> Bench.target(
  "restart: re-insert / load/2 (speed-up)",
  over.(1, ratio.(restart, "Larder.Bag", load)),
  :>=,
  5
)
|> Bench.finish()

Bench.release_off_heap()
