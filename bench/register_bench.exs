# Larder.Register against ETS (and :persistent_term) on hot-key workloads.
# "ETS" is a raw {key, value} table; "plain ETS" is the Register's API on one
# ETS record {key, version, value} per key (bench/support/register_plain.ex).
#
#   mix run bench/register_bench.exs [--quick] [--json PATH]
#
# Every mix row runs 16 parallel runners; each does `ops` operations on 1 or
# 16 keys holding 100-integer lists, a put every 10th (90/10), 100th (99/1)
# or 2nd (50/50) operation. Runners are fresh processes each run, so their
# local copies start empty. Figures are per operation.

alias Larder.Bench
alias Larder.Register

alias Larder.RegisterBench.Work

bench = Bench.start("Larder.Register: hot-key values")
runners = 16
ops = Bench.pick(bench, 5_000, 50_000)
runs = Bench.pick(bench, 5, 9)
value = Enum.to_list(1..100)

ets =
  :ets.new(:register_bench_ets, [:set, :public, read_concurrency: true, write_concurrency: true])

plain = Larder.RegisterBench.Plain.new()
reg = Register.new()

contenders = %{
  "ETS" => Work.contender(:ets, ets),
  "plain ETS" => Work.contender(:plain, plain),
  "Register" => Work.contender(:register, reg),
  ":persistent_term" => Work.contender(:persistent_term)
}

# Keys are tuples, as in practice, and already built: reading allocates nothing.
keys_of = fn n -> List.to_tuple(for i <- 1..n, do: {Larder.RegisterBench, i}) end

seed = fn names, keys ->
  for name <- names, key <- Tuple.to_list(keys) do
    {_get, put} = contenders[name]
    put.(key, value)
  end
end

title = "#{runners} runners, 100-integer lists, per operation"
columns = ["ETS", "plain ETS", "Register", ":persistent_term"]
bench = Bench.table(bench, title, columns, anchor: "ETS", per_op: true)

rows = [
  {"1 key, 90/10 get/put (hot key)", 1, 10, false},
  {"16 keys, 90/10 get/put", 16, 10, false},
  {"1 key, 99/1 get/put", 1, 100, true},
  {"16 keys, 99/1 get/put", 16, 100, true},
  {"1 key, 50/50 get/put", 1, 2, false},
  {"16 keys, 50/50 get/put", 16, 2, false}
]

bench =
  Enum.reduce(rows, bench, fn {label, nkeys, every, pt?}, bench ->
    keys = keys_of.(nkeys)
    names = if pt?, do: columns, else: columns -- [":persistent_term"]

    cells =
      for name <- names, into: %{} do
        c = contenders[name]

        {name,
         {fn _state, r -> Work.mix(c, keys, every, value, ops, r) end,
          setup: fn -> seed.([name], keys) end}}
      end

    Bench.row(bench, label, cells, parallel: runners, ops: ops, runs: runs)
  end)

single = "one process re-reading an unchanged 100-integer list"
bench = Bench.table(bench, single, columns, anchor: "ETS", per_op: true)
reread_ops = Bench.pick(bench, 200_000, 2_000_000)
key = {Larder.RegisterBench, 1}
seed.(columns, {key})

bench =
  Bench.row(
    bench,
    "get, per read",
    for name <- columns, into: %{} do
      c = contenders[name]
      {name, fn -> Work.reread(c, key, reread_ops) end}
    end,
    ops: reread_ops,
    runs: runs
  )

# The same reads, each timed on its own (each:), so the tail under the
# median is a real p99 of single reads (each sample includes one clock read).
bench =
  Bench.row(
    bench,
    "get, each read timed",
    for(name <- columns, into: %{}, do: {name, Work.read_once(contenders[name], key)}),
    each: Bench.pick(bench, 10_000, 100_000),
    runs: runs
  )

heap_reads = 100_000

heap =
  for name <- columns, into: %{}, do: {name, Work.heap_cost(contenders[name], key, heap_reads)}

bench =
  Bench.row(
    bench,
    "minor GCs in #{heap_reads} reads (10k-word heap)",
    Map.new(heap, fn {name, {gcs, _}} -> {name, Bench.value(gcs, "GCs")} end)
  )

bench =
  Bench.row(
    bench,
    "heap growth over #{heap_reads} reads",
    Map.new(heap, fn {name, {_, growth}} -> {name, Bench.value(growth, "words")} end)
  )

speedup = fn label ->
  case Bench.ratio(bench, title, label, "Register") do
    nil -> nil
    r -> 1 / r
  end
end

per_read = Bench.result(bench, single, "get, per read", "Register").per_op_median_us
{gcs, _} = heap["Register"]

bench
|> Bench.target(
  "hot key, 1 key 90/10: speed-up over ETS",
  speedup.("1 key, 90/10 get/put (hot key)"),
  :>=,
  2.5
)
|> Bench.target("16 keys 90/10: speed-up over ETS", speedup.("16 keys, 90/10 get/put"), :>=, 1.0)
|> Bench.target("get of an unchanged 100-element list, us", per_read, :<=, 0.2)
|> Bench.target("minor GCs in #{heap_reads} cached reads", gcs, :<=, 0)
|> Bench.finish()

Register.drop(reg)
:ets.delete(plain)
