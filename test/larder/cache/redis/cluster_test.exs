defmodule Larder.Cache.RedisClusterTest do
  # Larder.Cache.Redis on a real six-node Redis Cluster
  # (test/support/redis_cluster.ex): the L2 conformance suite passes, commands
  # follow their key's slot, invalidations travel by sharded pub/sub, the
  # subscriber comes back after CLIENT KILL TYPE pubsub (the cache clearing
  # its L1), and garbage answers to CLUSTER SLOTS are ignored and counted.
  # Failover and resharding under load: cluster_load_test.exs.
  use ExUnit.Case, async: false
  use Larder.Test.L2Conformance

  import Larder.Test.Eventually

  alias Larder.Cache
  alias Larder.Redis.{Cluster, Topology}
  alias Larder.Test.{RedisCluster, RedisServer}
  alias Larder.Test.GarbageServer

  @moduletag :redis
  @moduletag :capture_log

  import Larder.Test.RedisSetup, only: [redis_cluster: 1]

  setup_all :redis_cluster

  setup ctx do
    %{l2_module: Cache.Redis, l2_opts: [timeout: 500, cluster: RedisCluster.seeds(ctx.cluster)]}
  end

  defp start_nodes(ctx, suffixes, opts \\ [], cache_opts \\ []) do
    for suffix <- suffixes do
      name = :"#{ctx.module}.#{ctx.test}.#{suffix}"
      l2 = {Cache.Redis, [timeout: 500, cluster: RedisCluster.seeds(ctx.cluster)] ++ opts}
      cache = [name: name, l2: l2, namespace: "#{ctx.test}"] ++ cache_opts
      start_supervised!({Cache, cache}, id: name)
      eventually(fn -> :sys.get_state(Process.whereis(name)).subscribed_before end)
      name
    end
  end

  test "the :cluster option is checked in the caller" do
    for {bad, message} <- [
          {[cluster: []], ~r/:cluster/},
          {[cluster: [{"h", 0}]], ~r/:cluster/},
          {[cluster: [{~c"h", 1}]], ~r/:cluster/},
          {[cluster: List.duplicate({"h", 1}, 17)], ~r/:cluster/},
          {[cluster: :nope], ~r/:cluster/},
          {[cluster: [{"h", 1}], host: "x"], ~r/:cluster excludes :host/},
          {[cluster: [{"h", 1}], port: 1], ~r/:cluster excludes :port/},
          {[cluster: [{"h", 1}], sentinel: [sentinels: [{"h", 1}], master: "m"]],
           ~r/:cluster excludes :sentinel/},
          {[cluster: [{"h", 1}], database: 1], ~r/:database/}
        ] do
      assert_raise ArgumentError, message, fn ->
        Cache.start_link(name: :cluster_opts, l2: {Cache.Redis, bad})
      end
    end
  end

  test "keys of every master are written and read through the cache, across nodes", ctx do
    [a, b] = start_nodes(ctx, [:a, :b])

    for i <- 1..300, do: :ok = Cache.put(a, {:k, i}, i)
    for i <- 1..300, do: assert(Cache.get(b, {:k, i}) == i)

    # the keys landed on every master
    counts =
      for m <- RedisCluster.masters(ctx.cluster) do
        {:ok, [n]} = RedisCluster.cli(m, ["DBSIZE"])
        String.to_integer(n)
      end

    assert Enum.all?(counts, &(&1 > 0)), inspect(counts)

    :ok = Cache.put(a, {:k, 1}, :new)
    eventually(fn -> Cache.get(b, {:k, 1}) == :new end)
    :ok = Cache.invalidate_all(a)
    eventually(fn -> Cache.get(b, {:k, 2}) == nil end)
  end

  test "CLIENT KILL TYPE pubsub: the subscriber comes back, the cache clears L1", ctx do
    [a, b] = start_nodes(ctx, [:a, :b])
    {:ok, :in_l1} = Cache.fetch(b, :only_b, fn -> {:ok, :in_l1} end)
    assert Cache.stats(b).entries == 1

    killed =
      for m <- RedisCluster.masters(ctx.cluster) do
        {:ok, [n]} = RedisCluster.cli(m, ["CLIENT", "KILL", "TYPE", "pubsub"])
        String.to_integer(n)
      end

    # both nodes' subscriptions were on the channel's master
    assert Enum.sum(killed) == 2

    # every node resubscribes and clears its L1
    eventually(fn -> Cache.stats(b).entries == 0 end)
    assert Cache.get(b, :only_b) == :in_l1

    # invalidations flow again
    eventually(
      fn ->
        seen = Cache.stats(b).invalidations
        :ok = Cache.put(a, :k, System.unique_integer())
        Process.sleep(50)
        Cache.stats(b).invalidations > seen
      end,
      200,
      0
    )
  end

  test "garbage CLUSTER SLOTS answers are ignored and counted; the good seed is used", ctx do
    garbage =
      for mode <- [
            :random,
            :wrong_types,
            :close_mid_reply,
            fn _ -> "-ERR This instance has cluster support disabled\r\n" end,
            fn _ -> "*1\r\n*3\r\n:0\r\n:99999\r\n*2\r\n$9\r\n127.0.0.1\r\n:1\r\n" end
          ] do
        GarbageServer.start(mode)
      end

    on_exit(fn -> Enum.each(garbage, &GarbageServer.stop/1) end)
    seeds = Enum.map(garbage, &{"127.0.0.1", &1.port}) ++ RedisCluster.seeds(ctx.cluster)

    # Every garbage seed answers (or closes) at once, so the timeout is the
    # real nodes' and the calls': a loaded machine may not answer in 300 ms.
    {:ok, state} =
      Larder.Test.L2Process.start(Cache.Redis, [timeout: 1_000, cluster: seeds], self(), "ch")

    assert :ok = Cache.Redis.put(state, "garbage:k", "v", :infinity, :always)
    assert Cache.Redis.get(state, "garbage:k") == {:ok, "v"}
    # :random, :wrong_types (1 to 3 each), the error reply and the bad
    # range; a close mid-reply is a lost connection, not a bad answer
    assert Topology.bad_replies(state) >= 4
  end

  test "only garbage seeds: the L2 starts, its calls fail with documented errors", ctx do
    garbage = GarbageServer.start(:wrong_types)
    on_exit(fn -> GarbageServer.stop(garbage) end)
    name = :"#{ctx.module}.#{ctx.test}"
    l2 = {Cache.Redis, timeout: 200, cluster: [{"127.0.0.1", garbage.port}]}
    start_supervised!({Cache, name: name, l2: l2})

    for round <- 1..3 do
      assert {:error, %Larder.Error{}} = Cache.put(name, :k, round)
      assert Cache.get(name, :k) == round
    end
  end

  test "values whose text reads like a redirect or a cluster error are values", ctx do
    {:ok, state} =
      Larder.Test.L2Process.start(
        Cache.Redis,
        [timeout: 1_000, cluster: RedisCluster.seeds(ctx.cluster)],
        self(),
        "ch"
      )

    key = "looks-like:#{System.unique_integer([:positive])}"
    slot = Cluster.slot(key)
    other = hd(RedisCluster.masters(ctx.cluster))

    for value <- [
          "MOVED #{slot} 127.0.0.1:#{other.port}",
          "ASK #{slot} 127.0.0.1:#{other.port}",
          "TRYAGAIN Multiple keys request during rehashing of slot",
          "CLUSTERDOWN The cluster is down",
          "CLUSTERDOWN Hash slot not served"
        ] do
      assert :ok = Cache.Redis.put(state, key, value, :infinity, :always)
      assert Cache.Redis.get(state, key) == {:ok, value}
    end
  end

  test "an error reply that arrives in two TCP reads is still a redirect", ctx do
    key = "split:#{System.unique_integer([:positive])}"
    slot = Cluster.slot(key)

    owner =
      Enum.find(
        RedisCluster.masters(ctx.cluster),
        &(RedisCluster.cli(&1, ["SET", key, "real"]) == {:ok, ["OK"]})
      )

    # A node that claims the key's slot (every other slot is the owner's)
    # and answers MOVED to the owner, in two TCP segments.
    fake =
      GarbageServer.start(fn request ->
        if String.contains?(request, "SLOTS") do
          self_port = :persistent_term.get({__MODULE__, :fake_port})

          ranges =
            [{slot, slot, self_port}] ++
              if(slot > 0, do: [{0, slot - 1, owner.port}], else: []) ++
              if slot < 16_383, do: [{slot + 1, 16_383, owner.port}], else: []

          ["*#{length(ranges)}\r\n"] ++
            for {first, last, port} <- ranges do
              "*3\r\n:#{first}\r\n:#{last}\r\n*2\r\n$9\r\n127.0.0.1\r\n:#{port}\r\n"
            end
        else
          {:chunks, ["-MOV", "ED #{slot} 127.0.0.1:#{owner.port}\r\n"]}
        end
      end)

    :persistent_term.put({__MODULE__, :fake_port}, fake.port)
    on_exit(fn -> GarbageServer.stop(fake) end)

    {:ok, state} =
      Larder.Test.L2Process.start(
        Cache.Redis,
        [timeout: 1_000, cluster: [{"127.0.0.1", fake.port}]],
        self(),
        "ch"
      )

    assert Cache.Redis.get(state, key) == {:ok, "real"}
  end

  test "the channel's slot moves: the subscriber follows it (:disconnected, :connected)", ctx do
    channel = "moving-#{System.unique_integer([:positive])}"
    slot = Cluster.slot(channel)
    seeds = RedisCluster.seeds(ctx.cluster)
    {:ok, a} = Larder.Test.L2Process.start(Cache.Redis, [cluster: seeds], self(), channel)
    assert_receive {:larder_cache_l2, :connected}

    masters = RedisCluster.masters(ctx.cluster)
    # the channel's master has it among its sharded channels
    from =
      Enum.find(masters, fn m ->
        RedisServer.command(m, ["PUBSUB", "SHARDCHANNELS", channel]) =~ channel
      end)

    to = Enum.find(masters, &(&1 != from))
    # a key of the channel's slot whose bytes a command line would mangle
    # (NUL, CR LF), as the conformance suite's keys may be: it moves too
    key = "{#{channel}}:" <> <<0, 255, "k", 13, 10>>
    {:ok, "OK"} = RedisServer.request(from, ["SET", key, "v"])
    :ok = RedisCluster.begin_migration(ctx.cluster, slot, from, to)
    assert RedisCluster.migrate_keys(ctx.cluster, slot, from, to) >= 1
    :ok = RedisCluster.finish_migration(ctx.cluster, slot, to)
    assert RedisServer.request(to, ["GET", key]) == {:ok, "v"}

    assert_receive {:larder_cache_l2, :disconnected}
    assert_receive {:larder_cache_l2, :connected}
    assert RedisServer.command(to, ["PUBSUB", "SHARDCHANNELS", channel]) =~ channel

    :ok = Cache.Redis.publish(a, channel, "after the move")
    assert_receive {:larder_cache_l2, :message, "after the move"}
  end

  test "MOVED from many callers: the map is read again at most once per :reconnect_sleep",
       ctx do
    {:ok, state} =
      Larder.Test.L2Process.start(
        Cache.Redis,
        [timeout: 2_000, reconnect_sleep: 60_000, cluster: RedisCluster.seeds(ctx.cluster)],
        self(),
        "ch"
      )

    key = "{moved-#{System.unique_integer([:positive])}}:k"
    slot = Cluster.slot(key)
    :ok = Cache.Redis.put(state, key, "v", :infinity, :always)
    masters = RedisCluster.masters(ctx.cluster)
    from = Enum.find(masters, &(RedisServer.command(&1, ["EXISTS", key]) == ":1\r\n"))
    to = Enum.find(masters, &(&1 != from))

    # the slot moves behind the L2's back: its map is stale for that slot
    :ok = RedisCluster.begin_migration(ctx.cluster, slot, from, to)
    1 = RedisCluster.migrate_keys(ctx.cluster, slot, from, to)
    :ok = RedisCluster.finish_migration(ctx.cluster, slot, to)
    before = slots_calls(masters)

    # 50 callers x 20 reads, each a MOVED followed to the new owner
    1..50
    |> Task.async_stream(fn _ -> for _ <- 1..20, do: Cache.Redis.get(state, key) end,
      max_concurrency: 50
    )
    |> Enum.each(fn {:ok, replies} -> assert Enum.all?(replies, &(&1 == {:ok, "v"})) end)

    # the keeper read the map at most once (the start's read was less than
    # :reconnect_sleep ago: none yet)
    assert slots_calls(masters) - before <= 1
  end

  test "the keeper killed: the cache starts another, which fills the table again", ctx do
    [a] = start_nodes(ctx, [:a])
    :ok = Cache.put(a, :k, 1)
    cfg = Larder.Cache.Runtime.get(a)
    {Cache.Redis, state} = cfg.l2
    [{:manager, keeper}] = :ets.lookup(state.table, :manager)
    Process.exit(keeper, :kill)

    eventually(fn ->
      match?([{:manager, pid}] when pid != keeper, :ets.lookup(state.table, :manager))
    end)

    eventually(fn -> Cache.put(a, :k, 2) == :ok end)
    assert Cache.Redis.get(state, Cache.Remote.l2_key(cfg, :k)) |> elem(0) == :ok
  end

  test ":username: every connection to every master logs in as that ACL user", ctx do
    for node <- ctx.cluster.nodes do
      "+OK\r\n" = RedisServer.command(node, ~w(ACL SETUSER larder_app on >pw ~* &* +@all))
    end

    {:ok, state} =
      Larder.Test.L2Process.start(
        Cache.Redis,
        [username: "larder_app", password: "pw", cluster: RedisCluster.seeds(ctx.cluster)],
        self(),
        "acl-ch"
      )

    for i <- 1..30, do: :ok = Cache.Redis.put(state, "acl:#{i}", "v", :infinity, :always)
    assert_receive {:larder_cache_l2, :connected}

    users =
      for m <- RedisCluster.masters(ctx.cluster) do
        {:ok, lines} = RedisCluster.cli(m, ~w(CLIENT LIST))
        Enum.count(lines, &(&1 =~ ~r/ user=larder_app /))
      end

    # each master: its pool (2), and one of them the sharded subscriber too
    assert Enum.sort(users) == [2, 2, 3]
  end

  describe "a user that may not SSUBSCRIBE on the channel's master (invalidation: :pubsub)" do
    # A user of its own, allowed everything on every node but SSUBSCRIBE on
    # the master of the cache's channel (ACLs are each node's own).
    setup ctx do
      user = "larder_sub_#{System.unique_integer([:positive])}"

      for node <- ctx.cluster.nodes do
        "+OK\r\n" = RedisServer.command(node, ~w(ACL SETUSER #{user} on >pw ~* &* +@all))
      end

      namespace = "#{ctx.test}"
      channel = namespace <> ":1:invalidate"

      {:ok, {_host, port}} =
        Larder.Redis.Topology.locate([cluster: RedisCluster.seeds(ctx.cluster)], channel, 2_000)

      master = Enum.find(ctx.cluster.nodes, &(&1.port == port))
      l2 = {Cache.Redis, timeout: 500, cluster: RedisCluster.seeds(ctx.cluster)}
      %{user: user, master: master, namespace: namespace, l2: l2}
    end

    test "start_link/1 refuses to start, naming the master, the user and the grant", ctx do
      "+OK\r\n" = RedisServer.command(ctx.master, ~w(ACL SETUSER #{ctx.user} -ssubscribe))
      {mod, opts} = ctx.l2
      l2 = {mod, opts ++ [username: ctx.user, password: "pw"]}
      name = :"#{ctx.module}.#{ctx.test}"

      assert {:error, %Larder.Error{reason: :l2_failed} = error} =
               Cache.start_link(name: name, l2: l2, namespace: ctx.namespace)

      message = Exception.message(error)
      assert message =~ "127.0.0.1:#{ctx.master.port}"
      assert message =~ "refused SSUBSCRIBE"
      assert message =~ "ACL SETUSER #{ctx.user} +ssubscribe &#{ctx.namespace}:1:invalidate"
      assert Process.whereis(name) == nil
    end

    test "refused mid-run: no old value in L1, which is back once allowed", ctx do
      {mod, opts} = ctx.l2
      name = :"#{ctx.module}.#{ctx.test}.a"
      l2 = {mod, opts ++ [username: ctx.user, password: "pw"]}
      start_supervised!({Cache, name: name, l2: l2, namespace: ctx.namespace}, id: name)
      eventually(fn -> :sys.get_state(Process.whereis(name)).subscribed_before end)
      [b] = start_nodes(ctx, [:b])
      errors = Cache.stats(name).l2_errors

      "+OK\r\n" = RedisServer.command(ctx.master, ~w(ACL SETUSER #{ctx.user} -ssubscribe))
      RedisServer.command(ctx.master, ~w(CLIENT KILL USER #{ctx.user}))
      eventually(fn -> Cache.stats(name).l2_errors > errors end, 250)

      # what b writes, the refused node reads: it keeps nothing in its L1
      for round <- 1..10 do
        eventually(fn -> Cache.put(b, :k, round) == :ok end)
        eventually(fn -> Cache.get(name, :k) == round end)
        assert Cache.get(name, :k) == round
        assert Cache.stats(name).entries == 0
      end

      "+OK\r\n" = RedisServer.command(ctx.master, ~w(ACL SETUSER #{ctx.user} +ssubscribe))

      eventually(
        fn ->
          {:ok, 1} = Cache.fetch(name, :again, fn -> {:ok, 1} end)
          Cache.stats(name).entries > 0
        end,
        250
      )
    end
  end

  describe "a node that answers every command with" do
    # A one-node "cluster" serving every slot, whose reply to a request is
    # `reply.(its port, request)`; counts the requests that name the key
    # "k" (not CLUSTER SLOTS, nor the pub/sub connection's).
    defp fake_node(reply) do
      count = :counters.new(1, [])
      port = :atomics.new(1, [])

      fake =
        GarbageServer.start(fn request ->
          if String.contains?(request, "SLOTS") do
            p = :atomics.get(port, 1)
            "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:#{p}\r\n"
          else
            if String.contains?(request, "$1\r\nk\r\n"), do: :counters.add(count, 1, 1)
            reply.(:atomics.get(port, 1), request)
          end
        end)

      :atomics.put(port, 1, fake.port)
      on_exit(fn -> GarbageServer.stop(fake) end)

      {:ok, state} =
        Larder.Test.L2Process.start(
          Cache.Redis,
          [timeout: 300, pool_size: 1, cluster: [{"127.0.0.1", fake.port}]],
          self(),
          "ch"
        )

      {state, count}
    end

    test "MOVED to itself: 5 redirects followed, then :l2_unavailable" do
      slot = Cluster.slot("k")
      {state, count} = fake_node(fn port, _ -> "-MOVED #{slot} 127.0.0.1:#{port}\r\n" end)

      assert {:error, %Larder.Error{reason: :l2_unavailable, details: details}} =
               Cache.Redis.get(state, "k")

      assert {:too_many_redirects, _} = details[:error]
      assert :counters.get(count, 1) == 6
    end

    test "ASK to itself: ASKING and the command pipelined, 5 times, then :l2_unavailable" do
      slot = Cluster.slot("k")

      {state, count} =
        fake_node(fn port, request ->
          ask = "-ASK #{slot} 127.0.0.1:#{port}\r\n"

          cond do
            not String.contains?(request, "ASKING") -> ask
            String.contains?(request, "$1\r\nk\r\n") -> "+OK\r\n" <> ask
            true -> "+OK\r\n"
          end
        end)

      assert {:error, %Larder.Error{reason: :l2_unavailable}} = Cache.Redis.get(state, "k")
      assert :counters.get(count, 1) == 6
    end

    for text <- ["CLUSTERDOWN The cluster is down", "TRYAGAIN Multiple keys request"] do
      test "#{text}: retried until the timeout, then :l2_unavailable" do
        {state, count} = fake_node(fn _, _ -> "-#{unquote(text)}\r\n" end)

        assert {:error, %Larder.Error{reason: :l2_unavailable}} =
                 Cache.Redis.put(state, "k", "v", :infinity, :always)

        assert :counters.get(count, 1) > 1
      end
    end

    test "another error: :l2_failed at once" do
      {state, count} = fake_node(fn _, _ -> "-WRONGTYPE Operation against a key\r\n" end)
      assert {:error, %Larder.Error{reason: :l2_failed}} = Cache.Redis.get(state, "k")
      assert :counters.get(count, 1) == 1
    end
  end

  # CLUSTER SLOTS calls served, over the given nodes (INFO commandstats)
  defp slots_calls(nodes) do
    for node <- nodes, reduce: 0 do
      acc ->
        info = RedisServer.command(node, ["INFO", "commandstats"])

        case Regex.run(~r/cmdstat_cluster\|slots:calls=(\d+)/, info) do
          [_, n] -> acc + String.to_integer(n)
          nil -> acc
        end
    end
  end

  describe "invalidation: :tracking on the cluster (per master)" do
    defp tracking_nodes(ctx, suffixes) do
      names = start_nodes(ctx, suffixes, [], invalidation: :tracking)
      # every master tracks for every data connection of its pool (2 a node)
      eventually(fn -> tracked(ctx) == 3 * 2 * length(names) end)
      names
    end

    defp tracked(ctx) do
      for m <- RedisCluster.masters(ctx.cluster), reduce: 0 do
        acc ->
          {:ok, lines} = RedisCluster.cli(m, ~w(CLIENT LIST TYPE normal))
          acc + Enum.count(lines, &(&1 =~ ~r/ flags=\S*t\S* / and &1 =~ ~r/ redir=[1-9]/))
      end
    end

    defp share(a, b, key, value) do
      :ok = Cache.put(a, key, value)

      for node <- [a, b],
          do: eventually(fn -> Cache.get(node, key) == value and held?(node, key) end)
    end

    defp held?(node, key),
      do: match?([_], :ets.lookup(Larder.Cache.Runtime.get(node).data, key))

    # a SET by another client, on the master that owns the key (the others
    # answer MOVED)
    defp foreign_set(ctx, node, key, value) do
      l2_key = Cache.Remote.l2_key(Larder.Cache.Runtime.get(node), key)
      bin = :erlang.term_to_binary(value)

      assert Enum.any?(
               RedisCluster.masters(ctx.cluster),
               &(RedisServer.command(&1, ["SET", l2_key, bin]) == "+OK\r\n")
             )
    end

    test "a foreign SET of keys on every master drops them from every node's L1", ctx do
      [a, b] = tracking_nodes(ctx, [:a, :b])
      keys = for i <- 1..12, do: {:user, i}
      for key <- keys, do: share(a, b, key, :old)
      for key <- keys, do: foreign_set(ctx, a, key, :new)

      for key <- keys, node <- [a, b], do: eventually(fn -> Cache.get(node, key) == :new end)
    end

    test "FLUSHALL on every master clears every node's L1", ctx do
      [a, b] = tracking_nodes(ctx, [:a, :b])
      share(a, b, "k", :old)
      for m <- RedisCluster.masters(ctx.cluster), do: RedisCluster.cli(m, ["FLUSHALL"])
      eventually(fn -> not held?(a, "k") and not held?(b, "k") end)
      assert Cache.get(a, "k") == nil
    end

    test "CLIENT KILL TYPE pubsub: L1 is cleared and tracking comes back on every master", ctx do
      [a, b] = tracking_nodes(ctx, [:a, :b])
      share(a, b, "k", :old)

      for m <- RedisCluster.masters(ctx.cluster),
          do: RedisCluster.cli(m, ~w(CLIENT KILL TYPE pubsub))

      eventually(fn -> not held?(b, "k") end)
      eventually(fn -> tracked(ctx) == 12 end)
      share(a, b, "k2", :old)
      foreign_set(ctx, a, "k2", :new)
      eventually(fn -> Cache.get(b, "k2") == :new end)
    end
  end
end
