# Larder.Register against Ane (github.com/gyson/ane, atomics + ETS hot
# values) on Ane's own workload, Ane compiled from a copy you fetched:
#
#   git clone https://github.com/gyson/ane /tmp/ane
#   ANE_PATH=/tmp/ane mix run bench/register_vs_ane_bench.exs [--quick] [--json PATH]
#
# Without ANE_PATH the Register rows still run and the bench says that Ane
# was not measured. Ane's lib/*.ex are compiled into this VM only; nothing
# of Ane is part of Larder.
#
# The workload of Ane's bench/comparison.exs: 16 parallel runners, one
# instance with `size` keys (Ane: read_concurrency and write_concurrency;
# the Register: its defaults), a list of 10,000 operations generated once
# per row (a read with the row's probability, else a put of 100 random
# integers in 1..1000, on a uniform random key) that every runner replays,
# rows {1 key, 16 keys} x {90%, 99%, 50% reads}. Ane's keys are its indexes
# 1..size; the Register gets the same integers (it takes any term). A
# sample is the wall time until all 16 runners have replayed the list
# `reps` times; in each round Register and Ane take one sample each, the
# one going first alternating, and the round's ratio is Ane's time over
# the Register's (above 1: the Register is faster). Each row prints every
# round, the median ratio and its spread (the lowest and highest round).
#
# Two tables: "runners" replay in one process each (the Register's copies
# live across the runner's replays), "fresh runners" replay each time in a
# new process (the copies start empty at every replay, as Ane's handle
# does). The targets are the issue's: the Register at least 1.2x Ane on
# every row of both.

alias Larder.Bench
alias Larder.Register

ane_path = System.get_env("ANE_PATH")

ane? =
  case ane_path do
    nil ->
      false

    path ->
      files = Path.wildcard(Path.join(Path.expand(path), "lib/**/*.ex"))

      if files == [] do
        raise ArgumentError, "ANE_PATH=#{path} holds no lib/**/*.ex (a checkout of gyson/ane?)"
      end

      {:ok, _modules, _warnings} = Kernel.ParallelCompiler.compile(files)
      Code.ensure_loaded?(Ane) or raise ArgumentError, "ANE_PATH=#{path} did not define Ane"
  end

alias Larder.RegisterBench.Ane, as: Work

bench = Bench.start("Larder.Register against Ane, Ane's workload")

if ane? do
  IO.puts("# Ane compiled from #{ane_path}")
else
  IO.puts("# Ane was NOT measured: set ANE_PATH to a checkout of github.com/gyson/ane")
end

loadavg = fn ->
  "load average " <>
    (File.read!("/proc/loadavg") |> String.split() |> Enum.take(3) |> Enum.join(" "))
end

IO.puts("# #{loadavg.()}")

runners = 16
n_ops = 10_000
reps = Bench.pick(bench, 1, 2)
rounds = Bench.pick(bench, 3, 7)

rows = [
  {"1 key, 90% reads", 1, 90},
  {"16 keys, 90% reads", 16, 90},
  {"1 key, 99% reads", 1, 99},
  {"16 keys, 99% reads", 16, 99},
  {"1 key, 50% reads", 1, 50},
  {"16 keys, 50% reads", 16, 50}
]

columns = if ane?, do: ["Ane", "Register"], else: ["Register"]

# One sample: all runners replay the list `reps` times.
measure = fn run ->
  Bench.measure(run, runs: 1, warmup: 0, parallel: runners, ops: n_ops * reps)
end

# One table: every row, Register and Ane in interleaved rounds; returns the
# bench and, per row, {label, median ratio, lowest, highest}.
run_table = fn bench, title, run_opts ->
  bench = Bench.table(bench, title, columns, anchor: hd(columns), per_op: true)

  Enum.reduce(rows, {bench, []}, fn {label, size, read_percent}, {bench, summary} ->
    ops =
      Bench.off_heap(
        {:ane_ops, label},
        Work.operations(size, read_percent, n_ops, {size, read_percent, 28})
      )

    reg = Register.new()
    Work.seed_register(reg, size)

    runs = %{
      "Register" => fn _state, _i -> Work.run_register(reg, ops, reps, run_opts) end
    }

    runs =
      if ane? do
        a = Ane.new(size, read_concurrency: true, write_concurrency: true)
        Work.seed_ane(a, size)
        Map.put(runs, "Ane", fn _state, _i -> Work.run_ane(a, ops, reps, run_opts) end)
      else
        runs
      end

    # One untimed warm-up of each, then the timed rounds.
    for col <- columns, do: measure.(runs[col])

    samples =
      for round <- 1..rounds do
        order = if rem(round, 2) == 1, do: columns, else: Enum.reverse(columns)
        times = Map.new(order, fn col -> {col, measure.(runs[col]).median_us} end)

        line =
          Enum.map_join(columns, "  ", fn col ->
            "#{col} #{Bench.fmt_us(times[col] / (n_ops * reps))}/op"
          end)

        ratio =
          if ane?,
            do: "  Register/Ane #{Bench.fmt_ratio(times["Ane"] / times["Register"])}x",
            else: ""

        IO.puts("  #{label}, round #{round}: #{line}#{ratio}")
        times
      end

    results =
      for col <- columns, into: %{} do
        {col, Bench.summarize(Enum.map(samples, & &1[col]), n_ops * reps, runners)}
      end

    Register.drop(reg)
    bench = Bench.row(bench, label, results)

    summary =
      if ane? do
        ratios = samples |> Enum.map(&(&1["Ane"] / &1["Register"])) |> Enum.sort()
        median = Bench.percentile(ratios, 50)

        IO.puts(
          "  #{label}: Register/Ane median #{Bench.fmt_ratio(median)}x, " <>
            "spread #{Bench.fmt_ratio(hd(ratios))}x-#{Bench.fmt_ratio(List.last(ratios))}x over #{rounds} rounds"
        )

        summary ++ [{label, median, hd(ratios), List.last(ratios)}]
      else
        summary
      end

    {bench, summary}
  end)
end

each = "#{runners} runners, 100-integer values, #{n_ops} operations x #{reps} per runner"
{bench, summary} = run_table.(bench, each, [])

fresh_title =
  "fresh runners: #{runners} runners, 100-integer values, #{n_ops} operations x #{reps}, " <>
    "each replay in a new process"

{bench, fresh_summary} = run_table.(bench, fresh_title, fresh: true)

print_summary = fn title, summary ->
  IO.puts("\n## #{title}: Register speed over Ane's (Ane's time / Register's time, per round)")

  if ane? do
    for {label, median, lo, hi} <- summary do
      IO.puts(
        "  #{String.pad_trailing(label, 20)} median #{Bench.fmt_ratio(median)}x  " <>
          "(rounds #{Bench.fmt_ratio(lo)}x-#{Bench.fmt_ratio(hi)}x)"
      )
    end
  else
    IO.puts("  Ane was not measured (no ANE_PATH): only the Register's times above.")
  end
end

print_summary.("runners", summary)
print_summary.("fresh runners", fresh_summary)
IO.puts("# #{loadavg.()}")

bench =
  Enum.reduce(
    Enum.map(summary, &{"", &1}) ++ Enum.map(fresh_summary, &{"fresh runners, ", &1}),
    bench,
    fn {table, {label, median, _lo, _hi}}, bench ->
      Bench.target(
        bench,
        "#{table}#{label}: Register speed over Ane's (median)",
        median,
        :>=,
        1.2
      )
    end
  )

Bench.finish(bench)
Bench.release_off_heap()
