defmodule Larder.Cache.GenerationTest do
  # Races on the generation: invalidate_all/1 called from many processes at
  # once, on a local-only cache and on two nodes sharing a real redis-server.
  # Each runs thousands of rounds, since the races they guard against showed
  # up only now and then (the review that found them: about once in 1,500
  # rounds).
  use ExUnit.Case, async: true

  alias Larder.Cache
  alias Larder.Cache.{Remote, Runtime}
  alias Larder.Test.RedisServer

  import Larder.Test.Eventually

  test "local-only: concurrent invalidate_all/1 returns only once L1 is clear", ctx do
    name = :"#{ctx.module}.#{ctx.test}"
    start_supervised!({Cache, name: name})

    # Every round: a value, then callers that each invalidate and read at
    # once; none may read the value after its own :ok.
    stale =
      for round <- 1..2_500, reduce: 0 do
        stale ->
          :ok = Cache.put(name, :k, {:old, round})

          reads =
            1..6
            |> Enum.map(fn _ ->
              Task.async(fn ->
                :ok = Cache.invalidate_all(name)
                Cache.get(name, :k)
              end)
            end)
            |> Task.await_many(:infinity)

          stale + Enum.count(reads, &(&1 != nil))
      end

    assert stale == 0, "#{stale} reads after :ok saw the old value"
  end

  describe "two nodes on one redis-server" do
    @describetag :redis

    setup ctx do
      server = RedisServer.start()
      on_exit(fn -> RedisServer.stop(server) end)
      prefix = "#{inspect(ctx.module)}.#{ctx.test}"
      # Every one of the 24,000 INCRs and PUBLISHes below must be answered
      # within this, and a loaded machine stalls for seconds now and then.
      l2 = {Cache.Redis, port: server.port, timeout: 5_000}

      nodes =
        for suffix <- [:a, :b] do
          name = :"#{prefix}.#{suffix}"
          start_supervised!({Cache, name: name, l2: l2, namespace: prefix}, id: name)
          name
        end

      for name <- nodes do
        eventually(fn -> :sys.get_state(Process.whereis(name)).subscribed_before end)
      end

      %{server: server, nodes: nodes}
    end

    # (30 s on a quiet machine, 60 s beside two busy loops: more than 300 s
    # is possible in a loaded CI run, and is no failure of what it checks)
    @tag timeout: 900_000
    test "racing invalidate_all/1 calls leave both nodes on Redis's generation", ctx do
      [a, b] = ctx.nodes
      gen_key = Remote.generation_key(config(a))

      # 4 callers split over the two nodes, for 6,000 rounds (on this shared
      # 2-core machine the old race showed up once in some 30,000 such
      # rounds, so GenerationWriterTest below pins its cause); after each
      # round both nodes must come to Redis's generation (messages are
      # asynchronous, so they get a moment) and share one L2 key.
      behind =
        for round <- 1..6_000, reduce: [] do
          behind ->
            results = race(4, fn i -> Cache.invalidate_all(Enum.at([a, b], rem(i, 2))) end)

            assert Enum.all?(results, &(&1 == :ok))

            redis = redis_generation(ctx.server, gen_key)

            if settled?(fn -> generation(a) == redis and generation(b) == redis end),
              do: behind,
              else: [{round, redis, generation(a), generation(b)} | behind]
        end

      assert behind == [], "nodes left off Redis's generation: #{inspect(Enum.take(behind, 5))}"

      :ok = Cache.put(a, :k, :shared)
      assert Cache.get(b, :k) == :shared
    end
  end

  # Runs fun.(i) for i in 1..n in n processes released together; their results.
  defp race(n, fun) do
    parent = self()
    go = make_ref()

    tasks =
      for i <- 1..n do
        Task.async(fn ->
          send(parent, {:ready, go})
          receive do: ({^go, :go} -> fun.(i))
        end)
      end

    for _ <- 1..n, do: receive(do: ({:ready, ^go} -> :ok))
    for %Task{pid: pid} <- tasks, do: send(pid, {go, :go})
    Task.await_many(tasks, :infinity)
  end

  defp config(name), do: Runtime.get(name)
  defp generation(name), do: :atomics.get(config(name).generation, 1)

  defp settled_after_sleep(fun, tries) do
    Process.sleep(5)
    settled?(fun, tries - 1)
  end

  defp redis_generation(server, key) do
    <<"$", rest::binary>> = RedisServer.command(server, ["GET", key])
    [_len, value | _] = String.split(rest, "\r\n")
    String.to_integer(value)
  end

  # true once fun holds, polling for at least 5 s (a stuck node stays
  # stuck; a loaded machine can hold a message back for seconds)
  defp settled?(fun, tries \\ 1_000) do
    cond do
      fun.() -> true
      tries == 0 -> false
      true -> settled_after_sleep(fun, tries)
    end
  end
end

defmodule Larder.Cache.GenerationWriterTest do
  # The cause of the generation races, checked directly: only the cache's
  # process ever writes its generation, whoever calls invalidate_all/1 and
  # whatever other nodes publish. Traces every :atomics.put/3 in the VM, so
  # it runs alone.
  use ExUnit.Case, async: false

  alias Larder.Cache
  alias Larder.Cache.Runtime
  alias Larder.Test.MemoryL2

  test "only the cache's process writes its generation", ctx do
    l2 = start_supervised!(MemoryL2)
    prefix = "#{inspect(ctx.module)}.#{ctx.test}"

    caches =
      for {suffix, l2_opt} <- [a: {MemoryL2, server: l2}, b: {MemoryL2, server: l2}, local: nil] do
        name = :"#{prefix}.#{suffix}"
        start_supervised!({Cache, name: name, l2: l2_opt}, id: name)
        name
      end

    owners = Map.new(caches, &{config(&1).generation, Process.whereis(&1)})

    :erlang.trace_pattern({:atomics, :put, 3}, true, [:global])
    :erlang.trace(:all, true, [:call, {:tracer, self()}])

    try do
      for _round <- 1..50 do
        caches
        |> Enum.flat_map(&List.duplicate(&1, 4))
        |> Enum.map(&Task.async(fn -> Cache.invalidate_all(&1) end))
        |> Task.await_many(:infinity)
      end

      # the messages of the last round have been handled
      for cache <- caches, do: :sys.get_state(cache)
    after
      :erlang.trace(:all, false, [:call])
      :erlang.trace_pattern({:atomics, :put, 3}, false, [:global])
    end

    writers = writers(owners, [])
    assert writers != [], "no generation was written"
    assert for({ref, pid} <- writers, Map.fetch!(owners, ref) != pid, do: pid) == []
  end

  defp writers(owners, acc) do
    receive do
      {:trace, pid, :call, {:atomics, :put, [ref, 1, _value]}} when is_map_key(owners, ref) ->
        writers(owners, [{ref, pid} | acc])

      {:trace, _pid, :call, _other} ->
        writers(owners, acc)
    after
      0 -> acc
    end
  end

  defp config(name), do: Runtime.get(name)
end
