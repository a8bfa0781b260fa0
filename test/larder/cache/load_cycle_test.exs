defmodule Larder.Cache.LoadCycleTest do
  # Loaders that wait for each other's loads (issue 16, item 7): the wait
  # that closes the cycle answers {:error, :load_cycle} instead of hanging,
  # whatever the caches involved, and nothing else is ever taken for a
  # cycle. The receive timeouts below only detect a hang; they time nothing.
  use ExUnit.Case, async: true

  import Larder.Test.Eventually

  alias Larder.Cache
  alias Larder.Lock.Waits

  # A hang of the code under test shows as a failure after this long.
  @hang_ms 20_000

  defp start_cache(ctx, suffix \\ "") do
    name = :"#{ctx.test}#{suffix}"
    {:ok, pid} = Cache.start_link(name: name)
    Process.unlink(pid)
    on_exit(fn -> if Process.alive?(pid), do: GenServer.stop(pid) end)
    name
  end

  # A loader that tells the test it holds its key's marker, waits for the
  # go, then fetches the next key of the cycle and returns what it got.
  defp cyclic_loader(test, {cache, key}) do
    fn ->
      send(test, {:loading, self()})
      receive do: (:go -> :ok)

      case Cache.fetch(cache, key, fn -> {:ok, {:inner, key}} end) do
        {:ok, value} -> {:ok, {:outer, value}}
        {:error, error} -> {:error, error}
      end
    end
  end

  # Starts one fetch per {cache, key} of `ring`, each one's loader fetching
  # the next one's key, once all of them hold their markers; returns the
  # fetches' results.
  defp close_ring(ring) do
    test = self()
    nexts = tl(ring) ++ [hd(ring)]

    tasks =
      for {{cache, key}, next} <- Enum.zip(ring, nexts) do
        Task.async(fn -> Cache.fetch(cache, key, cyclic_loader(test, next)) end)
      end

    loaders = for _ <- ring, do: assert_receive({:loading, pid}, @hang_ms) && pid
    for pid <- loaders, do: send(pid, :go)
    Task.await_many(tasks, @hang_ms)
  end

  defp cycle_error?(%Larder.Error{reason: :load_cycle}), do: true
  defp cycle_error?(%Larder.Error{details: %{reason: reason}}), do: cycle_error?(reason)
  defp cycle_error?(_other), do: false

  # Every fetch of the ring returned an error that comes from a refused
  # wait, and the keys load normally afterwards.
  defp assert_broken(ring) do
    results = close_ring(ring)
    for result <- results, do: assert({:error, %Larder.Error{}} = result)
    assert Enum.all?(results, fn {:error, error} -> cycle_error?(error) end)

    for {cache, key} <- ring do
      assert Cache.fetch(cache, key, fn -> {:ok, :later} end) == {:ok, :later}
    end
  end

  test "two loaders of one cache fetching each other's key, 300 rounds", ctx do
    cache = start_cache(ctx)
    for i <- 1..300, do: assert_broken([{cache, {:a, i}}, {cache, {:b, i}}])
  end

  test "two loaders of two caches fetching each other's key, 300 rounds", ctx do
    one = start_cache(ctx, "_one")
    two = start_cache(ctx, "_two")
    for i <- 1..300, do: assert_broken([{one, {:a, i}}, {two, {:b, i}}])
  end

  test "a cycle of three loads over three caches, 200 rounds", ctx do
    caches = for s <- ["_x", "_y", "_z"], do: start_cache(ctx, s)

    for i <- 1..200 do
      assert_broken(for {cache, k} <- Enum.zip(caches, [:x, :y, :z]), do: {cache, {k, i}})
    end
  end

  test "the caller that closes the cycle gets the :load_cycle error itself", ctx do
    cache = start_cache(ctx)
    test = self()

    # :a's loader waits (for ever, but for the cycle) for :b, whose loader
    # fetches :a only once :a's loader is waiting
    a =
      Task.async(fn ->
        Cache.fetch(cache, :a, fn ->
          send(test, {:a_loading, self()})
          receive do: (:go -> :ok)
          Cache.fetch(cache, :b, fn -> {:ok, :unused} end)
        end)
      end)

    assert_receive {:a_loading, a_pid}, @hang_ms

    b =
      Task.async(fn ->
        Cache.fetch(cache, :b, fn ->
          send(a_pid, :go)
          # :a's loader waits for this load now (or is about to)
          eventually(fn -> :ets.member(Waits, a_pid) end)
          {:inner, Cache.fetch(cache, :a, fn -> {:ok, :unused} end)}
        end)
      end)

    assert {:error, %Larder.Error{reason: :loader_failed, details: details}} =
             Task.await(b, @hang_ms)

    assert {:inner, {:error, %Larder.Error{reason: :load_cycle}}} = details.returned
    assert {:error, %Larder.Error{}} = Task.await(a, @hang_ms)
    assert Cache.fetch(cache, :a, fn -> {:ok, 1} end) == {:ok, 1}
  end

  test "the wait record of a loader killed while it waits goes away", ctx do
    cache = start_cache(ctx)
    test = self()

    Task.start(fn ->
      Cache.fetch(cache, :slow, fn ->
        send(test, :slow_loading)
        receive do: (:never -> {:ok, 1})
      end)
    end)

    assert_receive :slow_loading, @hang_ms

    {:ok, waiter} =
      Task.start(fn ->
        Cache.fetch(cache, :outer, fn -> Cache.fetch(cache, :slow, fn -> {:ok, 2} end) end)
      end)

    eventually(fn -> :ets.member(Waits, waiter) end)
    Process.exit(waiter, :kill)
    eventually(fn -> not :ets.member(Waits, waiter) end)
  end

  # Loaders of key n fetch key n - 1 (and n - 2): chains of waits, always
  # downwards, so never a cycle; with deletes racing them, loads keep
  # starting and ending, and processes that just stopped waiting for each
  # other start new waits at once.
  test "no cycle is reported where there is none, under concurrent nested loads", ctx do
    caches = for s <- ["_p", "_q"], do: start_cache(ctx, s)
    top = 8

    cache_of = fn n -> Enum.at(caches, rem(n, 2)) end

    loader = fn loader, n ->
      fn ->
        for _ <- 1..10, do: :erlang.yield()

        if n < 2 do
          {:ok, 1}
        else
          with {:ok, a} <- Cache.fetch(cache_of.(n - 1), n - 1, loader.(loader, n - 1)),
               {:ok, b} <- Cache.fetch(cache_of.(n - 2), n - 2, loader.(loader, n - 2)) do
            {:ok, a + b}
          end
        end
      end
    end

    fetchers =
      for seed <- 1..16 do
        Task.async(fn ->
          :rand.seed(:exsss, {seed, 1, 2})

          for _ <- 1..500 do
            gone = :rand.uniform(top)
            :ok = Cache.delete(cache_of.(gone), gone)
            n = :rand.uniform(top)
            Cache.fetch(cache_of.(n), n, loader.(loader, n))
          end
        end)
      end

    results = List.flatten(Task.await_many(fetchers, 60_000))
    fib = Stream.unfold({1, 1}, fn {a, b} -> {a, {b, a + b}} end) |> Enum.take(top + 1)
    for result <- results, do: assert({:ok, v} = result) && assert(v in fib)
  end
end
