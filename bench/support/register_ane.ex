# Ane's own workload (github.com/gyson/ane, bench/comparison.exs) for
# bench/register_vs_ane_bench.exs: a list of operations generated as Ane's
# benchmark generates it, and one runner loop per contender over that list.
# Compiled (a closure in a script would be interpreted). Ane itself is not
# part of Larder: the script compiles it from ANE_PATH before this file, and
# nothing here calls it unless it was.
defmodule Larder.RegisterBench.Ane do
  @moduledoc false

  # Ane exists only when the script compiled it from ANE_PATH.
  @compile {:no_warn_undefined, Ane}

  alias Larder.Register

  @doc """
  Ane's operation list: `n` operations, each a read `{:get, i}` with
  probability `read_percent / 100`, else a write `{:put, i, value}` of 100
  random integers in 1..1000; `i` is uniform in 1..size. Seeded, so every
  run of a row replays the same list.
  """
  def operations(size, read_percent, n, seed) do
    :rand.seed(:exsss, seed)
    ratio = read_percent / 100

    for _ <- 1..n do
      if :rand.uniform() < ratio do
        {:get, :rand.uniform(size)}
      else
        {:put, :rand.uniform(size), Enum.map(1..100, fn _ -> :rand.uniform(1000) end)}
      end
    end
  end

  @doc "Ane's initial values: a random float in every key, as its benchmark puts."
  def seed_ane(a, size), do: for(i <- 1..size, do: Ane.put(a, i, :rand.uniform()))

  def seed_register(reg, size), do: for(i <- 1..size, do: Register.put(reg, i, :rand.uniform()))

  # A runner replays the list `reps` times. Ane's benchmark starts every
  # replay from the handle Ane.new/2 returned (an empty local cache), in a
  # runner process that lives across replays; the Register's runner does
  # the same, so its process-dictionary copies live across replays as
  # Ane's would in a handle kept by the runner. Reads' results are
  # discarded, as in Ane's benchmark.
  #
  # With `fresh: true` every replay runs in a new process (started and
  # awaited by the runner), so the Register's copies start empty at every
  # replay, as Ane's handle does, and each replay pays a first read of
  # every key in that process.

  def run_ane(a, ops, reps, opts \\ []),
    do: replays(reps, opts, fn -> ane_loop(ops, a) end)

  def run_register(reg, ops, reps, opts \\ []),
    do: replays(reps, opts, fn -> register_loop(ops, reg) end)

  defp replays(reps, opts, replay) do
    if Keyword.get(opts, :fresh, false),
      do: for(_ <- 1..reps, do: in_fresh_process(replay)),
      else: for(_ <- 1..reps, do: replay.())
  end

  defp in_fresh_process(fun) do
    {pid, ref} = spawn_monitor(fun)

    receive do
      {:DOWN, ^ref, :process, ^pid, :normal} -> :ok
      {:DOWN, ^ref, :process, ^pid, reason} -> exit(reason)
    end
  end

  defp ane_loop([{:get, i} | rest], a) do
    {a, _value} = Ane.get(a, i)
    ane_loop(rest, a)
  end

  defp ane_loop([{:put, i, v} | rest], a) do
    Ane.put(a, i, v)
    ane_loop(rest, a)
  end

  defp ane_loop([], a), do: a

  defp register_loop([{:get, i} | rest], reg) do
    Register.get(reg, i)
    register_loop(rest, reg)
  end

  defp register_loop([{:put, i, v} | rest], reg) do
    Register.put(reg, i, v)
    register_loop(rest, reg)
  end

  defp register_loop([], _reg), do: :ok
end
