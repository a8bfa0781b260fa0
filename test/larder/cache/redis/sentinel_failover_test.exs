defmodule Larder.Cache.RedisSentinelFailoverTest do
  # Larder.Cache.Redis under Sentinel, each test on a Sentinel set of its
  # own (test/support/redis_sentinel.ex: a master, a replica, three sentinels,
  # down-after 1 s), since a failover uses up the replica: the master
  # SIGKILLed while 8 processes on 2 nodes read and write; tracking
  # redirected again on the new master; the subscriber's connection killed
  # (CLIENT KILL TYPE pubsub) with :pubsub and :tracking invalidation.
  use ExUnit.Case, async: false

  import Larder.Test.Eventually

  alias Larder.Cache
  alias Larder.Cache.{Remote, Runtime, Store}
  alias Larder.Test.{RedisSentinel, RedisServer}

  @moduletag :redis
  @moduletag :capture_log

  # the set's down-after-milliseconds and failover-timeout (its defaults)
  @down_after 1_000
  @failover_timeout 5_000
  # what the first write after the kill may take beyond them, on a loaded
  # 2-core machine: a bound, not a measurement (bench/cache_topology_bench.exs
  # measures it)
  @margin 10_000

  setup do
    opts = [down_after: @down_after, failover_timeout: @failover_timeout]
    %{set: Larder.Test.RedisSetup.start(RedisSentinel, opts)}
  end

  test "the master SIGKILLed while 8 processes on 2 nodes read and write: writes resume " <>
         "within the failover, only :l2_unavailable meanwhile, no node goes back",
       ctx do
    nodes = start_nodes(ctx, [:a, :b])
    # 2 writers per node, each the only writer of its 4 keys, putting
    # increasing versions; 2 readers per node
    writers = for w <- 0..3, do: {w, Enum.at(nodes, div(w, 2))}
    # per key (index w * 4 + i): the newest version a put that started
    # after the kill got acknowledged (so by the new master)
    acked = :atomics.new(16, [])
    # 1: stop; 2: the old master is dead; 3: when the first put after the
    # kill returned :ok (monotonic ms)
    control = :atomics.new(3, [])
    test_pid = self()

    tasks =
      for({w, node} <- writers, do: Task.async(fn -> write(node, w, acked, control, 1) end)) ++
        for r <- 0..3 do
          node = Enum.at(nodes, rem(r, 2))
          own = for {w, ^node} <- writers, i <- 0..3, do: {w, i}
          Task.async(fn -> read(node, own, acked, control, test_pid) end)
        end

    Process.sleep(500)
    killed_at = System.monotonic_time(:millisecond)
    old = RedisSentinel.kill_master(ctx.set)
    :atomics.put(control, 2, 1)
    new = RedisSentinel.wait_failover(ctx.set, old)
    assert new.port != old.port

    # writes resume: some put returns :ok within the failover's bound
    bound = @down_after + @failover_timeout + @margin
    eventually(fn -> :atomics.get(control, 3) != 0 end, div(bound, 20), 20)
    assert :atomics.get(control, 3) - killed_at <= bound

    # every writer writes on the new master, for a while, then all stop
    eventually(fn -> Enum.all?(writers, fn {w, _} -> :atomics.get(acked, w * 4 + 1) > 0 end) end)
    Process.sleep(500)
    :atomics.put(control, 1, 1)
    results = Enum.map(tasks, &Task.await(&1, 30_000))

    # every put returned :ok or the one error an outage gives
    for {:writer, outcomes} <- results do
      assert Map.keys(outcomes) -- [:ok, :l2_unavailable] == [], inspect(outcomes)
    end

    # no reader saw a version older than one its node's writer had had
    # acknowledged by the new master before the read started
    refute_received {:older, _node, _key, _floor, _got}
    refute_received {:not_a_version, _node, _key, _got}

    # once both nodes are on the new master, neither serves a version older
    # than the newest acknowledged one, whichever node wrote it (a miss is
    # allowed: a pending repair deletes a key whose earlier put failed)
    for node <- nodes, {w, _} <- writers, i <- 0..3 do
      floor = :atomics.get(acked, w * 4 + i + 1)

      eventually(fn ->
        got = Cache.get(node, {w, i})
        got == nil or got >= floor
      end)
    end

    # and each hears the other's writes there (a put that races a
    # generation renewed on the new master is lost to a miss: put again)
    for {from, to} <- [{hd(nodes), List.last(nodes)}, {List.last(nodes), hd(nodes)}] do
      eventually(fn ->
        seen = Cache.stats(to).invalidations
        n = System.unique_integer([:positive])

        Cache.put(from, :after, n) == :ok and
          (
            eventually(fn -> Cache.stats(to).invalidations > seen end)
            Cache.get(to, :after) == n
          )
      end)
    end
  end

  test "a node moves its subscription at once, whatever its reconnection backoff: " <>
         "once a put on the new master has returned, no node serves the old value",
       ctx do
    # a 60 s backoff: a subscription that waited it out after its master's
    # death would keep b's L1 (and its old value) far past this test
    [a, b] = start_nodes(ctx, [:a, :b], reconnect_sleep: 60_000)
    share(a, b, "k", :old)

    old = RedisSentinel.kill_master(ctx.set)
    RedisSentinel.wait_failover(ctx.set, old)

    # the first successful put after the kill
    eventually(fn -> Cache.put(a, "k", :new) == :ok end, 250, 20)
    # b moved too: its subscription is up on the new master and its L1
    # no longer holds what it read from the old one
    eventually(fn -> Cache.get(b, "k") != :old end, 250, 20)
    eventually(fn -> Cache.put(a, "k", :newer) == :ok and Cache.get(b, "k") == :newer end)
  end

  test "a node that makes no L2 calls drops its L1 as the failover begins: once a " <>
         "sentinel names the new master (before any put there can return), it holds no old value",
       ctx do
    [a, b] = start_nodes(ctx, [:a, :b])
    share(a, b, "k", :old)

    old = RedisSentinel.kill_master(ctx.set)
    replica = Enum.find(ctx.set.data, &(&1.port != old.port))

    # Until a sentinel names the replica, no node can move there, so no put
    # there can have returned. b reads nothing from the L2 meanwhile: it
    # hears +switch-master only after that, so only the failover events the
    # leading sentinel publishes before it promotes the replica can have
    # dropped "k" from its L1 by then. (b's L1 is read after the sentinels.)
    sockets = Enum.map(ctx.set.sentinels, &connect/1)
    assert held_when_named(sockets, ctx.set.name, replica.port, b) == false
    Enum.each(sockets, &:gen_tcp.close/1)

    # and the first successful put after the kill does not bring it back
    eventually(fn -> Cache.put(a, "k", :new) == :ok end, 250, 20)
    refute Cache.get(b, "k") == :old
    eventually(fn -> Cache.put(a, "k", :newer) == :ok and Cache.get(b, "k") == :newer end)
  end

  test "invalidation: :tracking: after a failover every data connection is redirected " <>
         "to the subscriber on the new master, and a foreign SET there drops the key",
       ctx do
    [a, b] = start_nodes(ctx, [:a, :b], invalidation: :tracking)
    await_tracking(RedisSentinel.master(ctx.set), 4)

    old = RedisSentinel.kill_master(ctx.set)
    new = RedisSentinel.wait_failover(ctx.set, old)

    # each node's 2 data connections track, redirected to a subscriber that
    # lives on the new master (a new client id)
    await_tracking(new, 4)

    # loaded into both L1s after the move (which cleared them)
    for node <- [a, b], do: eventually(fn -> Cache.put(node, :warm, 0) == :ok end, 250)
    # Each node moved to a new generation there (an INCR, left to a repair
    # when the new master did not answer at once) and hears the other's:
    # "k" is shared once both are on Redis's generation with nothing
    # pending, so that no later INCR takes it out of their reach.
    eventually(fn -> settled?(new, [a, b]) end, 250)
    share(a, b, "k", :old)

    "+OK\r\n" =
      RedisServer.command(new, [
        "SET",
        Remote.l2_key(config(a), "k"),
        :erlang.term_to_binary(:new)
      ])

    eventually(fn -> Cache.get(a, "k") == :new and Cache.get(b, "k") == :new end)

    "+OK\r\n" = RedisServer.command(new, ["FLUSHALL"])
    eventually(fn -> Store.entries(config(a)) == 0 and Store.entries(config(b)) == 0 end)
  end

  for mode <- [:pubsub, :tracking] do
    test "invalidation: #{inspect(mode)}: the subscriber's connection killed " <>
           "(CLIENT KILL TYPE pubsub): L1 is cleared, it resubscribes, invalidations flow",
         ctx do
      mode = unquote(mode)
      [a, b] = start_nodes(ctx, [:a, :b], invalidation: mode)
      master = RedisSentinel.master(ctx.set)
      if mode == :tracking, do: await_tracking(master, 4)
      share(a, b, "k", :v)
      seen = Map.new([a, b], &{&1, Cache.stats(&1).l1_misses})

      # (the sentinels' own pub/sub links to the master go too)
      ":" <> _ = RedisServer.command(master, ["CLIENT", "KILL", "TYPE", "pubsub"])

      # each node resubscribes and clears its L1: "k" is an L1 miss again
      eventually(fn -> Store.entries(config(a)) == 0 and Store.entries(config(b)) == 0 end)
      if mode == :tracking, do: await_tracking(master, 4)
      assert Cache.get(b, "k") == :v
      assert Cache.stats(b).l1_misses > seen[b]

      # a's invalidations reach b again, through its new subscription
      share(a, b, "k2", 1)
      :ok = Cache.put(a, "k2", 2)
      eventually(fn -> Cache.get(b, "k2") == 2 end)

      if mode == :tracking do
        share(a, b, "k3", :old)
        l2_key = Remote.l2_key(config(a), "k3")
        bin = :erlang.term_to_binary(:new)
        "+OK\r\n" = RedisServer.command(master, ["SET", l2_key, bin])
        eventually(fn -> Cache.get(a, "k3") == :new and Cache.get(b, "k3") == :new end)
      end
    end
  end

  ## Helpers

  defp start_nodes(ctx, suffixes, opts \\ []) do
    {redis_opts, cache_opts} = Keyword.split(opts, [:reconnect_sleep])
    sentinel = [sentinels: RedisSentinel.addresses(ctx.set), master: ctx.set.name]
    l2 = {Cache.Redis, [timeout: 500, sentinel: sentinel] ++ redis_opts}

    for suffix <- suffixes do
      name = :"#{ctx.module}.#{ctx.test}.#{suffix}"
      opts = [name: name, l2: l2, namespace: "#{ctx.test}"] ++ cache_opts
      start_supervised!({Cache, opts}, id: name)
      # subscribed (invalidations published before are not heard)
      eventually(fn -> :sys.get_state(Process.whereis(name)).subscribed_before end)
      name
    end
  end

  defp write(node, w, acked, control, version, outcomes \\ %{}) do
    if :atomics.get(control, 1) == 1 do
      {:writer, outcomes}
    else
      outcomes =
        Enum.reduce(0..3, outcomes, fn i, outcomes ->
          after_kill? = :atomics.get(control, 2) == 1

          outcome =
            case Cache.put(node, {w, i}, version) do
              :ok ->
                if after_kill? do
                  :atomics.put(acked, w * 4 + i + 1, version)
                  now = System.monotonic_time(:millisecond)
                  :atomics.compare_exchange(control, 3, 0, now)
                end

                :ok

              {:error, %Larder.Error{reason: reason}} ->
                reason

              other ->
                {:unexpected, other}
            end

          Map.update(outcomes, outcome, 1, &(&1 + 1))
        end)

      Process.sleep(1)
      write(node, w, acked, control, version + 1, outcomes)
    end
  end

  defp read(node, own, acked, control, test_pid) do
    if :atomics.get(control, 1) == 1 do
      :reader
    else
      for {w, i} = key <- own do
        floor = :atomics.get(acked, w * 4 + i + 1)

        case Cache.get(node, key) do
          nil -> :ok
          got when is_integer(got) and got >= floor -> :ok
          got when is_integer(got) -> send(test_pid, {:older, node, key, floor, got})
          got -> send(test_pid, {:not_a_version, node, key, got})
        end
      end

      Process.sleep(1)
      read(node, own, acked, control, test_pid)
    end
  end

  # b holds a's value for key in L1 (loaded from L2 once every report of
  # a's put has come: a's message, and with tracking Redis's report on each
  # of the 2 tracking connections of each node, which drop the key).
  defp share(a, b, key, value) do
    reports = if config(a).invalidation == :tracking, do: 2, else: 0
    seen = Map.new([a, b], &{&1, Cache.stats(&1).invalidations})
    :ok = Cache.put(a, key, value)

    eventually(fn ->
      Cache.stats(a).invalidations >= seen[a] + reports and
        Cache.stats(b).invalidations >= seen[b] + 1 + reports
    end)

    for node <- [a, b],
        do: eventually(fn -> Cache.get(node, key) == value and in_l1?(node, key) end)

    :ok
  end

  # Polls the sentinels (one connection each, every millisecond) until one
  # names the node on `port` as the master, then says whether `node`'s L1
  # still held "k" (read after the sentinels).
  defp held_when_named(sockets, name, port, node) do
    named? = Enum.any?(sockets, &(master_port(&1, name) == port))
    held? = in_l1?(node, "k")

    if named? do
      held?
    else
      Process.sleep(1)
      held_when_named(sockets, name, port, node)
    end
  end

  defp connect(%RedisServer{port: port}) do
    {:ok, socket} = :gen_tcp.connect(~c"127.0.0.1", port, [:binary, active: false], 5_000)
    socket
  end

  defp master_port(socket, name) do
    :ok =
      :gen_tcp.send(
        socket,
        Larder.Redis.RESP.command(["SENTINEL", "get-master-addr-by-name", name])
      )

    reply(socket, "")
  end

  # the port in "*2 $<n> <host> $<n> <port>", read whole
  defp reply(socket, acc) do
    {:ok, data} = :gen_tcp.recv(socket, 0, 5_000)
    acc = acc <> data

    case Regex.run(~r/\A\*2\r\n\$\d+\r\n[^\r]*\r\n\$\d+\r\n(\d+)\r\n\z/, acc) do
      [_, port] -> String.to_integer(port)
      nil -> reply(socket, acc)
    end
  end

  defp in_l1?(name, key), do: match?([_], :ets.lookup(config(name).data, key))

  # n data connections of the master track, each redirected to a pub/sub
  # connection of that master (CLIENT LIST: flag t, redir=<its id>). After
  # a failover that is each keeper's move (hearing +switch-master, new
  # connections, a subscriber, CLIENT TRACKING on each): about 1 s with two
  # busy loops beside the test, so it gets 10 s, not eventually/1's 2 s.
  defp await_tracking(master, n), do: eventually(fn -> tracking?(master, n) end, 500)

  defp tracking?(master, n) do
    subscribers =
      master
      |> RedisServer.command(["CLIENT", "LIST", "TYPE", "pubsub"])
      |> then(&Regex.scan(~r/\bid=(\d+) /, &1))
      |> MapSet.new(fn [_, id] -> id end)

    redirects =
      master
      |> RedisServer.command(["CLIENT", "LIST", "TYPE", "normal"])
      |> String.split("\n")
      |> Enum.flat_map(fn line ->
        case Regex.run(~r/ flags=\S*t\S* .* redir=(\d+)/, line) do
          [_, id] -> [id]
          nil -> []
        end
      end)

    length(redirects) == n and Enum.all?(redirects, &MapSet.member?(subscribers, &1))
  end

  # Every node on the generation `master` holds, with no repair pending.
  defp settled?(master, nodes) do
    key = Remote.generation_key(config(hd(nodes)))
    "$" <> reply = RedisServer.command(master, ["GET", key])
    [_length, redis | _] = String.split(reply, "\r\n")

    Enum.all?(nodes, fn node ->
      owner = :sys.get_state(Process.whereis(node))

      match?(%{keys: keys, all: nil} when keys == %{}, owner.pending) and
        Integer.to_string(:atomics.get(config(node).generation, 1)) == redis
    end)
  end

  defp config(name), do: Runtime.get(name)
end
