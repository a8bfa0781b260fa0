defmodule Larder.Redis.ProcessTreeTest do
  # Every process of a Cache's Redis L2 (the topology's manager, its pools
  # of command connections and its pub/sub connections) is an OTP process: :sys.get_state/1 answers for each, on a
  # single server, a Sentinel set and a Cluster. The tree is walked from the
  # Cache's supervisor down, and from each process to the processes linked
  # to it.
  use ExUnit.Case, async: false

  import Larder.Test.Eventually

  alias Larder.Cache
  alias Larder.Test.{RedisCluster, RedisSentinel, RedisServer}
  alias Larder.Test.RedisSetup

  @moduletag :redis
  @moduletag :capture_log

  defp start_cache(ctx, l2_opts) do
    name = :"#{ctx.module}.#{ctx.test}"
    pid = start_supervised!({Cache, name: name, l2: {Cache.Redis, [timeout: 1_000] ++ l2_opts}})
    eventually(fn -> :sys.get_state(Process.whereis(name)).subscribed_before end, 500, 20)
    pid
  end

  # The Redis processes of the tree under `top`: supervisors' children,
  # and the processes linked to Larder's own processes (the L2 runner
  # starts the L2's supervisor linked, the topology's manager its pools and
  # pub/sub connections, a pool its connections).
  defp redis_processes(top), do: top |> walk(MapSet.new()) |> Enum.filter(&redis?/1)

  defp walk(pid, seen) do
    cond do
      MapSet.member?(seen, pid) or not Process.alive?(pid) ->
        seen

      match?({:supervisor, _, _}, initial_call(pid)) ->
        children = for {_, c, _, _} <- Supervisor.which_children(pid), is_pid(c), do: c
        Enum.reduce(children, MapSet.put(seen, pid), &walk/2)

      larder?(pid) ->
        {:links, links} = Process.info(pid, :links)
        Enum.reduce(for(p <- links, is_pid(p), do: p), MapSet.put(seen, pid), &walk/2)

      true ->
        MapSet.put(seen, pid)
    end
  end

  defp initial_call(pid) do
    case Process.info(pid, :dictionary) do
      {:dictionary, dict} -> dict[:"$initial_call"]
      nil -> nil
    end
  end

  # A process of Larder's own (its links lead down to the processes it
  # started, and up to its supervisor, seen before it).
  defp larder?(pid) do
    case initial_call(pid) do
      {mod, _, _} -> String.starts_with?(inspect(mod), "Larder.")
      _ -> false
    end
  end

  defp redis?(pid) do
    case initial_call(pid) do
      {mod, _, _} -> String.starts_with?(inspect(mod), ["Larder.Cache.Redis.", "Larder.Redis."])
      _ -> false
    end
  end

  defp assert_all_answer(top) do
    pids = redis_processes(top)
    initial = Enum.map(pids, &initial_call/1)
    # the topology's manager and its command connections at least
    keepers = [Larder.Redis.Topology.Server, Larder.Redis.Topology.Cluster]
    assert Enum.any?(initial, fn {mod, _, _} -> mod in keepers end), inspect(initial)
    assert {Larder.Redis.Connection, :init, 1} in initial, inspect(initial)

    for pid <- pids do
      assert is_map(:sys.get_state(pid, 5_000)), "no state from #{inspect(pid)}"
    end
  end

  test "a single server", ctx do
    server = RedisSetup.start(RedisServer)
    assert_all_answer(start_cache(ctx, port: server.port))
  end

  test "a Sentinel set", ctx do
    set = RedisSetup.start(RedisSentinel)

    top = start_cache(ctx, sentinel: [sentinels: RedisSentinel.addresses(set), master: set.name])

    assert_all_answer(top)
  end

  test "a Cluster", ctx do
    cluster = RedisSetup.start(RedisCluster)
    assert_all_answer(start_cache(ctx, cluster: RedisCluster.seeds(cluster)))
  end
end
