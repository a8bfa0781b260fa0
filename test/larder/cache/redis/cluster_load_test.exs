defmodule Larder.Cache.RedisClusterLoadTest do
  # Larder.Cache.Redis on a real Redis Cluster while it changes under load:
  # a replica promoted with CLUSTER FAILOVER, 1,000 slots resharded with
  # redis-cli --cluster reshard, and one slot halfway through a migration
  # (ASK). 16 runners write and read their own keys through the L2: no read
  # returns a value other than one its runner wrote last (or whose write
  # failed since), and the only errors are the documented ones.
  use ExUnit.Case, async: false

  alias Larder.Cache.Redis
  alias Larder.Redis.Cluster
  alias Larder.Test.RedisCluster

  @moduletag :redis
  @moduletag :capture_log
  @moduletag timeout: 180_000

  @runners 16
  @keys 40

  setup do
    cluster = Larder.Test.RedisSetup.start(RedisCluster)

    {:ok, l2} =
      Larder.Test.L2Process.start(Redis, [cluster: RedisCluster.seeds(cluster)], self(), "ch")

    %{cluster: cluster, l2: l2}
  end

  test "CLUSTER FAILOVER of two masters under 16 runners: no wrong value", ctx do
    under_runners(ctx, fn ->
      [first, second | _] = RedisCluster.replicas(ctx.cluster)
      failover(ctx.cluster, first, 4)
      Process.sleep(200)
      failover(ctx.cluster, second, 4)
    end)
  end

  test "reshard of 1,000 slots under 16 runners: no wrong value, errors <= 1% of calls", ctx do
    under_runners(ctx, fn ->
      [from, to | _] = RedisCluster.masters(ctx.cluster)
      :ok = RedisCluster.reshard(ctx.cluster, from, to, 1_000)
    end)
  end

  # Runs `change` (of the cluster) while the runners call, 200 ms after
  # they start and 200 ms before they stop: no runner reads a wrong value,
  # they make over 1,000 calls, and at most 1% fail, all :l2_unavailable.
  defp under_runners(ctx, change) do
    runners = start_runners(ctx.l2)
    Process.sleep(200)
    change.()
    Process.sleep(200)

    %{calls: calls, errors: errors, wrong: wrong, reasons: reasons} = stop_runners(runners)
    assert wrong == [], inspect(Enum.take(wrong, 5))
    assert calls > 1_000
    assert Enum.all?(reasons, &(&1 in [:l2_unavailable])), inspect(reasons)
    assert errors <= calls / 100, "#{errors} errors in #{calls} calls"
  end

  # The report of issue 25: after a live reshard, a master SIGKILLed under
  # two caches' load. The cluster promotes its replica; the dead master
  # never answers (no MOVED), so only the keeper's own reading of the map
  # can move its slots' keys to the promoted replica.
  test "a master SIGKILLed after a reshard, under load: every key's put succeeds again", ctx do
    seeds = RedisCluster.seeds(ctx.cluster)

    caches =
      for n <- [:a, :b] do
        name = :"#{ctx.test}.#{n}"
        l2 = {Redis, timeout: 500, cluster: seeds}
        start_supervised!({Larder.Cache, name: name, l2: l2, namespace: "kill"}, id: name)
        name
      end

    [a, _b] = caches
    cfg = Larder.Cache.Runtime.get(a)
    loaders = for c <- caches, r <- 1..4, do: spawn_link(fn -> load(c, r) end)

    [from, to | _] = RedisCluster.masters(ctx.cluster)
    :ok = RedisCluster.reshard(ctx.cluster, from, to, 300)

    # The victim serves neither the caches' channel nor their generation
    # key (a lost subscription makes the keeper read the map again, which
    # would hide the fault): only some keys' slots die with it.
    map = slot_map(seeds)
    names = [Larder.Cache.Remote.channel(cfg), Larder.Cache.Remote.generation_key(cfg)]
    busy = Enum.map(names, &Cluster.master(map, Cluster.slot(&1)))

    victim =
      Enum.find([to, from | RedisCluster.masters(ctx.cluster)], fn m ->
        {"127.0.0.1", m.port} not in busy
      end)

    keys = for i <- 1..300, do: {:key, i}

    dead_keys =
      Enum.filter(keys, fn key ->
        slot = Cluster.slot(Larder.Cache.Remote.l2_key(cfg, key))
        Cluster.master(map, slot) == {"127.0.0.1", victim.port}
      end)

    assert dead_keys != [] and length(dead_keys) < length(keys)
    parent = self()

    probe = fn ->
      spawn_link(fn -> send(parent, {:first_put, first_put(a, hd(dead_keys))}) end)
    end

    kill = RedisCluster.kill_master(ctx.cluster, victim, probe)

    # every key, on both caches, within 15 s of the cluster saying ok
    deadline = System.monotonic_time(:millisecond) + 15_000
    failing = put_until_ok(for(c <- caches, k <- keys, do: {c, k}), deadline)

    first_put =
      receive do
        {:first_put, at} -> at
      after
        0 -> nil
      end

    for pid <- loaders, ref = Process.monitor(pid) do
      send(pid, :stop)
      assert_receive {:DOWN, ^ref, _, _, _}, 5_000
    end

    ms = fn at -> at && div(at - kill.killed_at, 1_000) end

    assert failing == [],
           "#{length(failing)} of #{2 * length(keys)} puts still fail 15 s after " <>
             "cluster_state:ok (promotion #{ms.(kill.promoted_at)} ms and ok " <>
             "#{ms.(kill.ok_at)} ms after the kill), e.g. #{inspect(Enum.take(failing, 2))}"

    assert first_put,
           "no put on the dead master's slots (promotion #{ms.(kill.promoted_at)} ms)"
  end

  # Puts of `key` every 5 ms until one returns :ok: when (monotonic us).
  defp first_put(cache, key) do
    case Larder.Cache.put(cache, key, :probe) do
      :ok ->
        System.monotonic_time(:microsecond)

      {:error, %Larder.Error{}} ->
        Process.sleep(5)
        first_put(cache, key)
    end
  end

  # Puts each {cache, key} again (10 ms apart) until it returns :ok or the
  # deadline passes: the pairs that never did.
  defp put_until_ok(pairs, deadline) do
    left = Enum.reject(pairs, fn {c, k} -> Larder.Cache.put(c, k, :after) == :ok end)

    if left == [] or System.monotonic_time(:millisecond) > deadline do
      left
    else
      Process.sleep(10)
      put_until_ok(left, deadline)
    end
  end

  # One writer of a cache's keys, 2 ms apart, until told to stop.
  defp load(cache, r) do
    receive do
      :stop -> :ok
    after
      2 ->
        Larder.Cache.put(cache, {:load, r, :rand.uniform(100)}, r)
        load(cache, r)
    end
  end

  defp slot_map([{host, port} | _]) do
    {:ok, conn} = Larder.Redis.Connection.start_link(String.to_charlist(host), port)
    {:ok, reply} = Larder.Redis.Connection.q(conn, ["CLUSTER", "SLOTS"])
    GenServer.stop(conn)
    {:ok, map} = Cluster.slot_map(reply, host)
    map
  end

  test "a slot halfway through a migration: reads and writes follow ASK", ctx do
    key = "{ask-slot}:k"
    slot = Cluster.slot(key)
    :ok = Redis.put(ctx.l2, key, "v1", :infinity, :always)
    [from] = Enum.filter(RedisCluster.masters(ctx.cluster), &owns?(&1, key))
    to = Enum.find(RedisCluster.masters(ctx.cluster), &(&1 != from))

    :ok = RedisCluster.begin_migration(ctx.cluster, slot, from, to)
    assert RedisCluster.migrate_keys(ctx.cluster, slot, from, to) == 1
    # the key is on the importing node now: a GET there needs ASKING
    assert Redis.get(ctx.l2, key) == {:ok, "v1"}
    # a new key of the slot is created on the importing node (ASK)
    assert :ok = Redis.put(ctx.l2, "{ask-slot}:new", "n", :infinity, :always)
    assert Redis.get(ctx.l2, "{ask-slot}:new") == {:ok, "n"}
    assert :ok = Redis.put(ctx.l2, key, "v2", :infinity, :always)
    :ok = RedisCluster.finish_migration(ctx.cluster, slot, to)
    assert Redis.get(ctx.l2, key) == {:ok, "v2"}
    assert Redis.get(ctx.l2, "{ask-slot}:new") == {:ok, "n"}
    assert {:ok, ["v2"]} = RedisCluster.cli(to, ["GET", key])
  end

  # CLUSTER FAILOVER gives up (silently) when the replica does not catch up
  # with its master within 5 s, as on a loaded machine: ask again.
  defp failover(cluster, replica, tries) do
    {:ok, ["OK"]} = RedisCluster.cli(replica, ~w(CLUSTER FAILOVER))

    promoted? =
      Enum.any?(1..80, fn _ ->
        Process.sleep(100)
        RedisCluster.role(replica) == "master"
      end)

    cond do
      promoted? -> RedisCluster.wait_ok(cluster)
      tries > 1 -> failover(cluster, replica, tries - 1)
      true -> flunk("#{replica.port} was not promoted")
    end
  end

  defp owns?(node, key), do: RedisCluster.cli(node, ["EXISTS", key]) == {:ok, ["1"]}

  # Each runner writes its own keys (a counter) and reads one back: the
  # value read must be the last one written with :ok, or one whose write
  # failed since (it may have reached Redis).
  defp start_runners(l2) do
    parent = self()

    for r <- 1..@runners do
      spawn_link(fn ->
        run(l2, r, parent, %{}, 0, %{calls: 0, errors: 0, wrong: [], reasons: []})
      end)
    end
  end

  defp run(l2, r, parent, known, n, acc) do
    receive do
      :stop -> send(parent, {:runner, self(), acc})
    after
      0 ->
        key = "runner:#{r}:#{rem(n, @keys)}"
        value = Integer.to_string(n)
        {last, failed} = Map.get(known, key, {nil, []})

        {known, acc} =
          case Redis.put(l2, key, value, :infinity, :always) do
            :ok -> {Map.put(known, key, {value, []}), call(acc)}
            {:error, e} -> {Map.put(known, key, {last, [value | failed]}), error(acc, e)}
          end

        read_key = "runner:#{r}:#{rem(n * 7 + 3, @keys)}"
        {last, failed} = Map.get(known, read_key, {nil, []})

        acc =
          case Redis.get(l2, read_key) do
            {:ok, got} -> check(acc, read_key, got, [last | failed])
            :miss -> check(acc, read_key, nil, [last | failed])
            {:error, e} -> error(acc, e)
          end

        # (a pause: 16 busy runners would starve the nodes of a 2-core
        # machine, and a failover waits for its replica to catch up)
        Process.sleep(1)
        run(l2, r, parent, known, n + 1, acc)
    end
  end

  defp call(acc), do: %{acc | calls: acc.calls + 1}

  defp check(acc, key, got, allowed) do
    if got in allowed,
      do: call(acc),
      else: %{call(acc) | wrong: [{key, got, allowed} | acc.wrong]}
  end

  defp error(acc, e) do
    %{call(acc) | errors: acc.errors + 1, reasons: Enum.uniq([e.reason | acc.reasons])}
  end

  defp stop_runners(runners) do
    for pid <- runners, do: send(pid, :stop)

    Enum.reduce(runners, %{calls: 0, errors: 0, wrong: [], reasons: []}, fn pid, total ->
      receive do
        {:runner, ^pid, acc} ->
          %{
            calls: total.calls + acc.calls,
            errors: total.errors + acc.errors,
            wrong: total.wrong ++ acc.wrong,
            reasons: Enum.uniq(total.reasons ++ acc.reasons)
          }
      after
        10_000 -> flunk("runner did not stop")
      end
    end)
  end
end
