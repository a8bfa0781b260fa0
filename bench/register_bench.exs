# Larder.Register against ETS (and :persistent_term) on hot-key workloads.
#
#   mix run bench/register_bench.exs [--quick] [--json PATH]
#
# Every mix row runs 16 parallel runners; each does `ops` operations on 1 or
# 16 keys holding 100-integer lists, a put every 10th (90/10), 100th (99/1)
# or 2nd (50/50) operation. Runners are fresh processes each run, so their
# local copies start empty. Figures are per operation.
Code.require_file("support/bench.ex", __DIR__)

alias Larder.Bench
alias Larder.Register

# The workloads, compiled (closures in a script would be interpreted).
defmodule Larder.RegisterBench.Work do
  @moduledoc false

  # One contender: how it reads and writes a key.
  def contender(:ets, tab),
    do: {fn k -> ets_get(tab, k) end, fn k, v -> :ets.insert(tab, {k, v}) end}

  def contender(:register, reg),
    do: {fn k -> Register.get(reg, k) end, &Register.put(reg, &1, &2)}

  def contender(:persistent_term) do
    {fn k -> :persistent_term.get(k) end, fn k, v -> :persistent_term.put(k, v) end}
  end

  defp ets_get(tab, key) do
    case :ets.lookup(tab, key) do
      [{_, value}] -> value
      [] -> nil
    end
  end

  # Runner `r` does `ops` operations; operation i touches key rem(i + r, n)
  # and is a put when rem(i + r, every) == 0, so runners write at different
  # moments.
  def mix({get, put}, keys, every, value, ops, r) do
    mix_loop(get, put, keys, tuple_size(keys), every, value, ops, r, 0)
  end

  defp mix_loop(_get, _put, _keys, _n, _every, _value, ops, _r, ops), do: :ok

  defp mix_loop(get, put, keys, n, every, value, ops, r, i) do
    key = elem(keys, rem(i + r, n))

    if rem(i + r, every) == 0 do
      put.(key, [i | value])
    else
      get.(key)
    end

    mix_loop(get, put, keys, n, every, value, ops, r, i + 1)
  end

  def reread({get, _put}, key, ops), do: reread_loop(get, key, ops)

  defp reread_loop(_get, _key, 0), do: :ok

  defp reread_loop(get, key, n) do
    get.(key)
    reread_loop(get, key, n - 1)
  end

  # Heap cost of re-reading an unchanged value in a fresh process with a
  # fixed 10k-word young heap: minor GCs during `n` reads (0 means nothing was
  # allocated that did not fit in that heap) and the growth of the total heap.
  def heap_cost(contender, key, n) do
    parent = self()

    :erlang.spawn_opt(
      fn ->
        {get, _} = contender
        get.(key)
        :erlang.garbage_collect()
        gcs0 = minor_gcs()
        {:total_heap_size, heap0} = :erlang.process_info(self(), :total_heap_size)
        reread(contender, key, n)
        {:total_heap_size, heap1} = :erlang.process_info(self(), :total_heap_size)
        send(parent, {:heap_cost, minor_gcs() - gcs0, heap1 - heap0})
      end,
      min_heap_size: 10_000
    )

    receive do
      {:heap_cost, gcs, growth} -> {gcs, growth}
    end
  end

  defp minor_gcs do
    {:garbage_collection, info} = :erlang.process_info(self(), :garbage_collection)
    Keyword.fetch!(info, :minor_gcs)
  end
end

alias Larder.RegisterBench.Work

bench = Bench.start("Larder.Register: hot-key values")
runners = 16
ops = Bench.pick(bench, 5_000, 50_000)
runs = Bench.pick(bench, 5, 9)
value = Enum.to_list(1..100)

ets =
  :ets.new(:register_bench_ets, [:set, :public, read_concurrency: true, write_concurrency: true])

reg_ets = Register.new(mode: :ets)
reg = Register.new()

contenders = %{
  "ETS" => Work.contender(:ets, ets),
  "Register :ets" => Work.contender(:register, reg_ets),
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
columns = ["ETS", "Register :ets", "Register", ":persistent_term"]
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

Register.delete_register(reg)
Register.delete_register(reg_ets)
