# Larder.Register on the hot-key workload: 16 processes share one key holding
# a 100-integer list, 90% get / 10% put, against plain ETS in the same run.

alias Larder.Bench
alias Larder.Register
alias Larder.RegisterBench.Work

bench = Bench.start("Larder.Register: one hot key read by 16 processes", [])
value = Enum.to_list(1..100)
keys = {{Larder.RegisterBench, 1}}
ets = :ets.new(:register_demo, [:set, :public, read_concurrency: true, write_concurrency: true])
reg = Register.new()

contenders = %{
  "ETS" => Work.contender(:ets, ets),
  "Larder.Register" => Work.contender(:register, reg)
}

for {_name, {_get, put}} <- contenders, do: put.(elem(keys, 0), value)
title = "hot key, 90% get / 10% put, 16 runners"
bench = Bench.table(bench, title, Map.keys(contenders) |> Enum.sort(), per_op: true)

bench =
  Bench.row(
    bench,
    "per operation (wall / ops per runner)",
    Map.new(contenders, fn {name, c} ->
      {name, fn _state, r -> Work.mix(c, keys, 10, value, 20_000, r) end}
    end),
    parallel: 16,
    ops: 20_000,
    runs: 5
  )

ratio = Bench.ratio(bench, title, "per operation (wall / ops per runner)", "Larder.Register")
IO.puts("Larder.Register is #{Bench.fmt_ratio(1 / ratio)}x as fast as ETS on the hot key.")
Register.drop(reg)
:ets.delete(ets)
