defmodule Larder.Cache.RedisTrackingTest do
  # invalidation: :tracking on a real redis-server: writes by a program
  # other than Larder (a raw SET, FLUSHALL) drop the key from every node's
  # L1; the subscriber's and the data connections' loss; hostile messages on
  # the tracking channel; codec: :raw fronting another program's keys; the
  # L2 conformance suite with tracking on.
  use ExUnit.Case, async: true
  use Larder.Test.L2Conformance

  alias Larder.Cache
  alias Larder.Cache.{Remote, Runtime, Store}
  alias Larder.Test.RedisServer

  import Larder.Test.Eventually

  @moduletag :redis
  @moduletag :capture_log

  import Larder.Test.RedisSetup, only: [redis_server: 1, test_prefix: 1]

  setup [:redis_server, :test_prefix]

  setup %{server: server} do
    %{
      l2_module: Larder.Cache.Redis,
      l2_opts: [port: server.port, timeout: 500, tracking_prefix: "Elixir."]
    }
  end

  test "a foreign SET drops the key from every node's L1", ctx do
    [a, b] = start_nodes(ctx, [:a, :b])
    share(a, b, "k", :old)
    share(a, b, {:user, 1}, :old)

    foreign_set(ctx, a, "k", :new)
    foreign_set(ctx, a, {:user, 1}, :new)

    await(fn -> Cache.get(a, "k") == :new and Cache.get(b, "k") == :new end)
    await(fn -> Cache.get(a, {:user, 1}) == :new and Cache.get(b, {:user, 1}) == :new end)
  end

  test "readers racing 1,600 foreign writes never keep an old value", ctx do
    # one data connection each: one report per write, so no second report
    # can hide a value kept past the first
    [a, b] = start_nodes(ctx, [:a, :b], pool_size: 1)
    l2_key = Remote.l2_key(config(a), "k")
    {:ok, writer} = :gen_tcp.connect(~c"127.0.0.1", ctx.server.port, [:binary, active: false])
    stop = :atomics.new(1, [])

    # readers load "k" into L1 again and again, racing each report
    readers =
      for node <- [a, b] do
        Task.async(fn -> read_until(node, stop) end)
      end

    # Rounds of a few writes in a row: after the first one drops the key,
    # the readers' loads are under way when the next ones land, so their
    # reports race the loads' fills.
    for round <- 1..400 do
      last = round * 4

      for i <- (last - 3)..last do
        bin = :erlang.term_to_binary(i)
        args = ["SET", l2_key, bin]

        :ok =
          :gen_tcp.send(writer, ["*3\r\n" | Enum.map(args, &"$#{byte_size(&1)}\r\n#{&1}\r\n")])

        {:ok, "+OK\r\n"} = :gen_tcp.recv(writer, 0, 5_000)
        Process.sleep(Enum.random([0, 0, 1]))
      end

      # polled every ms: a value kept past its report never gets there
      eventually(fn -> Cache.get(a, "k") == last and Cache.get(b, "k") == last end, 5_000, 1)
    end

    :atomics.put(stop, 1, 1)
    Enum.each(readers, &Task.await(&1, 10_000))
  end

  test "the invalidation-received event names the key", ctx do
    [a] = start_nodes(ctx, [:a])
    test_pid = self()
    id = {__MODULE__, ctx.test}

    :telemetry.attach_many(
      id,
      [[:larder, :cache, :invalidation, :received]],
      fn _event, measurements, meta, _ -> send(test_pid, {:received, measurements, meta}) end,
      nil
    )

    on_exit(fn -> :telemetry.detach(id) end)
    :ok = Cache.put(a, "k", :old)
    foreign_set(ctx, a, "k", :new)
    assert_receive {:received, %{count: 1}, %{cache: ^a, message: {:key, "k"}}}, 5_000
  end

  test "FLUSHALL clears every node's L1", ctx do
    [a, b] = start_nodes(ctx, [:a, :b])
    share(a, b, "k", :old)
    "+OK\r\n" = RedisServer.command(ctx.server, ["FLUSHALL"])
    await(fn -> Cache.get(a, "k") == nil and Cache.get(b, "k") == nil end)
  end

  test "the subscriber killed: L1 is cleared and tracking comes back", ctx do
    [a, b] = start_nodes(ctx, [:a, :b])
    share(a, b, "k", :old)
    await_tracking(ctx, 4)

    ":2\r\n" = RedisServer.command(ctx.server, ["CLIENT", "KILL", "TYPE", "pubsub"])
    # (a resubscription clears L1: our write of "k" itself drops it anyway)
    await(fn -> Store.entries(config(a)) == 0 and Store.entries(config(b)) == 0 end)
    await_tracking(ctx, 4)

    share(a, b, "k2", :old)
    foreign_set(ctx, a, "k2", :new)
    await(fn -> Cache.get(a, "k2") == :new and Cache.get(b, "k2") == :new end)
  end

  test "a data connection killed comes back with tracking on", ctx do
    [a, b] = start_nodes(ctx, [:a, :b])
    await_tracking(ctx, 4)

    # SKIPME yes (the default): our own connection survives
    reply = RedisServer.command(ctx.server, ["CLIENT", "KILL", "TYPE", "normal"])
    assert reply =~ ~r/^:[1-9]/
    await_tracking(ctx, 4)

    share(a, b, "k", :old)
    foreign_set(ctx, a, "k", :new)
    await(fn -> Cache.get(a, "k") == :new and Cache.get(b, "k") == :new end)
  end

  test "hostile publishes on the tracking channel are counted and ignored", ctx do
    [a, b] = start_nodes(ctx, [:a, :b])
    share(a, b, "k", :v)

    payloads = ["", "garbage", String.duplicate("x", 100_000), :erlang.term_to_binary([1, 2])]

    for payload <- payloads do
      RedisServer.command(ctx.server, ["PUBLISH", "__redis__:invalidate", payload])
    end

    await(fn -> Cache.stats(a).bad_messages == 4 and Cache.stats(b).bad_messages == 4 end)
    assert Cache.get(a, "k") == :v and Cache.get(b, "k") == :v
    assert Store.entries(config(a)) == 1
  end

  test "invalidation messages of the wrong shape or with foreign keys are counted and ignored",
       ctx do
    [a] = start_nodes(ctx, [:a])
    count_before = Cache.stats(a).invalidations
    :ok = Cache.put(a, "k", :v)
    own_write_reported(a, count_before)
    await(fn -> Cache.get(a, "k") == :v end)
    cfg = config(a)
    good = Remote.l2_key(cfg, "k")
    base = Cache.stats(a)
    g = Integer.to_string(:atomics.get(cfg.generation, 1))

    bad = [
      :bad,
      "not a list",
      [1, 2],
      ["other:prefix:" <> good],
      [cfg.prefix <> ":x:b:k"],
      [cfg.prefix <> ":0"],
      [cfg.prefix <> ":#{g}:z:k"],
      [cfg.prefix <> ":#{g}:t:" <> <<131, 255, 0>>],
      [cfg.prefix <> ":#{g}:t:" <> :erlang.term_to_binary(fn -> :ok end)],
      List.duplicate(cfg.prefix <> ":#{g}:junk", 200_000)
    ]

    for keys <- bad, do: send(cfg.owner, {:larder_cache_l2, :invalidated, keys})
    # another generation's key and the generation key: not bad, not ours
    send(cfg.owner, {:larder_cache_l2, :invalidated, [cfg.prefix <> ":#{g}9:b:k"]})
    send(cfg.owner, {:larder_cache_l2, :invalidated, [Remote.generation_key(cfg)]})

    await(fn -> Cache.stats(a).bad_messages == base.bad_messages + length(bad) end)
    assert Store.entries(cfg) == 1
    assert Cache.stats(a).invalidations == base.invalidations
    assert Process.alive?(cfg.owner)
  end

  test "invalidation: :tracking is checked at start_link", ctx do
    assert_raise ArgumentError, ~r/:invalidation to be one of/, fn ->
      Cache.start_link(name: :bad_invalidation, invalidation: :bogus)
    end

    assert_raise ArgumentError, ~r/expected an :l2 with invalidation: :tracking/, fn ->
      Cache.start_link(name: :bad_invalidation, invalidation: :tracking)
    end

    _ = ctx
  end

  describe "codec: :raw" do
    test "fronts keys another program writes, and writes the bytes as they are", ctx do
      [a, b] = start_nodes(ctx, [:a, :b], codec: :raw, key_prefix: "app:")
      "+OK\r\n" = RedisServer.command(ctx.server, ["SET", "app:user:1", "alice"])

      assert Cache.get(a, "user:1") == "alice"
      assert Cache.get(b, "user:1") == "alice"
      assert :ok = Cache.put(a, "user:2", <<0, 255, "bob">>)

      assert RedisServer.command(ctx.server, ["GET", "app:user:2"]) ==
               "$5\r\n" <> <<0, 255, "bob">> <> "\r\n"

      # tracking covers :key_prefix: the other program's write reaches both L1s
      "+OK\r\n" = RedisServer.command(ctx.server, ["SET", "app:user:1", "alice2"])
      await(fn -> Cache.get(a, "user:1") == "alice2" and Cache.get(b, "user:1") == "alice2" end)
    end

    test "an empty :key_prefix tracks every key", ctx do
      [a, b] = start_nodes(ctx, [:a, :b], codec: :raw)
      "+OK\r\n" = RedisServer.command(ctx.server, ["SET", "user:9", "old"])
      assert Cache.get(a, "user:9") == "old" and Cache.get(b, "user:9") == "old"

      "+OK\r\n" = RedisServer.command(ctx.server, ["SET", "user:9", "new"])
      await(fn -> Cache.get(a, "user:9") == "new" and Cache.get(b, "user:9") == "new" end)
    end

    test "invalidate_all/1 clears every node's L1 and leaves the keys in Redis", ctx do
      [a, b] = start_nodes(ctx, [:a, :b], codec: :raw, key_prefix: "app:")
      "+OK\r\n" = RedisServer.command(ctx.server, ["SET", "app:k", "v"])
      assert Cache.get(a, "k") == "v" and Cache.get(b, "k") == "v"

      assert :ok = Cache.invalidate_all(a)
      await(fn -> Store.entries(config(a)) == 0 and Store.entries(config(b)) == 0 end)
      assert RedisServer.command(ctx.server, ["GET", "app:k"]) == "$1\r\nv\r\n"
      assert Cache.get(b, "k") == "v"
    end

    test "keys and values that are not binaries are refused", ctx do
      [a] = start_nodes(ctx, [:a], codec: :raw, key_prefix: "app:")

      assert_raise ArgumentError, ~r/expected key to be a binary/, fn -> Cache.put(a, :k, "v") end

      assert_raise ArgumentError, ~r/expected value to be a binary/, fn ->
        Cache.put(a, "k", :v)
      end

      assert_raise ArgumentError, ~r/expected key to be a binary/, fn -> Cache.get(a, {:k}) end
      assert_raise ArgumentError, ~r/expected key to be a binary/, fn -> Cache.delete(a, 1) end

      assert {:error, %Larder.Error{reason: :loader_failed}} =
               Cache.fetch(a, "k", fn -> {:ok, 42} end)

      assert Store.entries(config(a)) == 0
    end

    test "a value above :max_value_bytes is not served, and not replaced", ctx do
      [a] = start_nodes(ctx, [:a], codec: :raw, key_prefix: "app:", max_value_bytes: 1024)
      big = String.duplicate("x", 2048)
      "+OK\r\n" = RedisServer.command(ctx.server, ["SET", "app:big", big])

      assert Cache.get(a, "big") == nil
      assert Cache.fetch(a, "big", fn -> {:ok, "small"} end) == {:ok, "small"}
      assert Cache.stats(a).decode_errors >= 1
      reply = RedisServer.command(ctx.server, ["STRLEN", "app:big"])
      assert reply == ":2048\r\n"
    end

    test ":key_prefix needs codec: :raw" do
      assert_raise ArgumentError, ~r/:key_prefix only with codec: :raw/, fn ->
        Cache.start_link(name: :bad_key_prefix, key_prefix: "app:")
      end

      assert_raise ArgumentError, ~r/:codec to be one of/, fn ->
        Cache.start_link(name: :bad_codec, codec: :json)
      end
    end
  end

  describe "a Redis user that may not use tracking" do
    # A user with every permission tracking needs, to take some away from
    # mid-run, and the cache's options for it.
    setup ctx do
      "+OK\r\n" = RedisServer.command(ctx.server, ~w(ACL SETUSER app on >pw ~* &* +@all))

      :ok
    end

    for {what, acl, needs} <- [
          {"CLIENT at all", ~w(-client), "+client|tracking"},
          {"CLIENT TRACKING", ~w(-client|tracking), "+client|tracking"},
          {"the channel __redis__:invalidate", ~w(resetchannels &Elixir.*),
           "&__redis__:invalidate"}
        ] do
      test "start_link/1 refuses to start without #{what}, naming the server, user and permission",
           ctx do
        "+OK\r\n" =
          RedisServer.command(
            ctx.server,
            ~w(ACL SETUSER limited on >pw ~* &* +@all) ++ unquote(acl)
          )

        name = :"#{ctx.prefix}.limited"
        parent = self()

        # from a plain process that does not trap exits
        {pid, ref} =
          spawn_monitor(fn ->
            send(parent, {:started, Cache.start_link(tracking_opts(ctx, name, "limited"))})
          end)

        assert_receive {:started, {:error, %Larder.Error{} = error}}, 10_000
        assert_receive {:DOWN, ^ref, :process, ^pid, :normal}
        message = Exception.message(error)
        assert message =~ "127.0.0.1:#{ctx.server.port}"
        assert message =~ ~s(user "limited")
        assert message =~ unquote(needs)
        assert message =~ "invalidation: :pubsub"
        assert Process.whereis(name) == nil
      end
    end

    test "tracking refused mid-run (ACL changed, connections renewed): no old value, " <>
           "L1 back once it is allowed again",
         ctx do
      name = :"#{ctx.prefix}.app"
      start_supervised!({Cache, tracking_opts(ctx, name, "app")}, id: name)
      await(fn -> Cache.stats(name).l2_errors == 0 end)
      await_tracking(ctx, 2)
      errors = Cache.stats(name).l2_errors

      # The user loses CLIENT TRACKING, and every connection of the cache
      # is renewed (a restart of the server, a failover, a network blip):
      # the new ones cannot track.
      "+OK\r\n" = RedisServer.command(ctx.server, ~w(ACL SETUSER app -client|tracking))
      RedisServer.command(ctx.server, ~w(CLIENT KILL USER app))
      assert_no_old_value(ctx, name, errors)

      # allowed again: the data connections track again, and L1 is used
      "+OK\r\n" = RedisServer.command(ctx.server, ~w(ACL SETUSER app +client|tracking))
      await(fn -> l1_used?(name, {:again, System.unique_integer()}) end)
      share_one(ctx, name, "again")
    end

    test "CLIENT refused mid-run (the subscription cannot start): no old value", ctx do
      name = :"#{ctx.prefix}.app"
      start_supervised!({Cache, tracking_opts(ctx, name, "app")}, id: name)
      await(fn -> Cache.stats(name).l2_errors == 0 end)
      await_tracking(ctx, 2)
      errors = Cache.stats(name).l2_errors

      "+OK\r\n" = RedisServer.command(ctx.server, ~w(ACL SETUSER app -client))
      RedisServer.command(ctx.server, ~w(CLIENT KILL USER app))
      assert_no_old_value(ctx, name, errors)
    end

    @tag timeout: 180_000
    test "a cluster master that refuses tracking mid-run: no old value, from any master", ctx do
      cluster = Larder.Test.RedisSetup.start(Larder.Test.RedisCluster)
      name = :"#{ctx.prefix}.cluster"
      l2 = {Cache.Redis, cluster: Larder.Test.RedisCluster.seeds(cluster), timeout: 500}
      opts = [name: name, l2: l2, namespace: ctx.prefix, invalidation: :tracking]
      start_supervised!({Cache, opts}, id: name)
      await(fn -> :sys.get_state(Process.whereis(name)).subscribed_before end)
      errors = Cache.stats(name).l2_errors

      # ACLs are each node's own: one master's default user loses CLIENT
      # TRACKING, and its connections are renewed
      [master | _] = Larder.Test.RedisCluster.masters(cluster)
      "+OK\r\n" = RedisServer.command(master, ~w(ACL SETUSER default -client|tracking))
      RedisServer.command(master, ~w(CLIENT KILL TYPE normal))
      RedisServer.command(master, ~w(CLIENT KILL TYPE pubsub))
      set = &cluster_set(cluster, name, &1, &2)

      # a key loaded now, then written by another program: the new value
      # is served (at once, once the cache has found tracking refused)
      {:ok, _} = Cache.fetch(name, "k", fn -> {:ok, :old} end)
      set.("k", :new)
      await(fn -> Cache.get(name, "k") == :new end)
      await(fn -> Cache.stats(name).l2_errors > errors end)

      # keys on every master
      for i <- 1..12 do
        key = "k#{i}"
        {:ok, :old} = Cache.fetch(name, key, fn -> {:ok, :old} end)
        set.(key, :new)
        for _ <- 1..5, do: assert(Cache.get(name, key) == :new)
      end

      assert Store.entries(config(name)) == 0
    end
  end

  # Tracking was just refused (the connections are being renewed): a key
  # loaded now, then written by another program, is served new (at once,
  # once the cache has found the refusal, which it counts as an L2 error);
  # from then on L1 holds nothing, and every read after a foreign SET, 50
  # over a second, returns the new value.
  defp assert_no_old_value(ctx, name, errors) do
    {:ok, _} = Cache.fetch(name, "k", fn -> {:ok, :old} end)
    foreign_set(ctx, name, "k", :new)
    await(fn -> Cache.get(name, "k") == :new end)
    await(fn -> Cache.stats(name).l2_errors > errors end)

    assert {:ok, :old} = Cache.fetch(name, "k2", fn -> {:ok, :old} end)
    assert Cache.get(name, "k2") == :old
    assert Store.entries(config(name)) == 0
    foreign_set(ctx, name, "k2", :new)

    for _ <- 1..50 do
      assert Cache.get(name, "k2") == :new
      Process.sleep(20)
    end

    assert Store.entries(config(name)) == 0
  end

  # A value read twice is served from L1 (it is in the L1 table).
  defp l1_used?(name, key) do
    {:ok, 1} = Cache.fetch(name, key, fn -> {:ok, 1} end)
    match?([_], :ets.lookup(config(name).data, key))
  end

  # L1 holds a key (read again once the report of the load's own L2 write
  # has dropped it); a foreign write drops it.
  defp share_one(ctx, name, key) do
    {:ok, :old} = Cache.fetch(name, key, fn -> {:ok, :old} end)

    await(fn ->
      Cache.get(name, key) == :old and match?([_], :ets.lookup(config(name).data, key))
    end)

    foreign_set(ctx, name, key, :new)
    await(fn -> Cache.get(name, key) == :new end)
  end

  defp tracking_opts(ctx, name, user) do
    l2 = {Cache.Redis, port: ctx.server.port, timeout: 500, username: user, password: "pw"}
    [name: name, l2: l2, namespace: ctx.prefix, invalidation: :tracking]
  end

  # A SET by another program, on the master of the key's slot.
  defp cluster_set(cluster, name, key, value) do
    l2_key = Remote.l2_key(config(name), key)
    {Cache.Redis, %{table: table}} = config(name).l2
    [{_slot, {_host, port}}] = :ets.lookup(table, Larder.Redis.Cluster.slot(l2_key))
    node = Enum.find(cluster.nodes, &(&1.port == port))
    "+OK\r\n" = RedisServer.command(node, ["SET", l2_key, :erlang.term_to_binary(value)])
  end

  ## Helpers

  defp start_nodes(ctx, suffixes, cache_opts \\ []) do
    {pool_size, cache_opts} = Keyword.pop(cache_opts, :pool_size, 2)
    l2 = {Cache.Redis, port: ctx.server.port, timeout: 500, pool_size: pool_size}

    names =
      for suffix <- suffixes do
        name = :"#{ctx.prefix}.#{suffix}"
        opts = [name: name, l2: l2, namespace: ctx.prefix, invalidation: :tracking] ++ cache_opts
        start_supervised!({Cache, opts}, id: name)
        name
      end

    for name <- names, do: await(fn -> Cache.stats(name).l2_errors == 0 end)
    # tracking is on on every data connection
    await_tracking(ctx, pool_size * length(names))
    names
  end

  # Both nodes hold value for key in L1 (b loaded it from L2).
  defp share(a, b, key, value) do
    counts = Map.new([a, b], &{&1, Cache.stats(&1).invalidations})
    :ok = Cache.put(a, key, value)
    own_write_reported(a, counts[a])
    # b also counts a's pub/sub message
    own_write_reported(b, counts[b] + 1)

    for node <- [a, b] do
      await(fn ->
        Cache.get(node, key) == value and match?([_], :ets.lookup(config(node).data, key))
      end)
    end
  end

  # Redis reports a write once per tracking connection of a node (BCAST on
  # each of its :pool_size connections), and each report drops the key from
  # its L1: wait until all have come, so that none drops a copy read after.
  defp own_write_reported(node, count_before) do
    {_mod, %{pool_size: reports}} = config(node).l2
    await(fn -> Cache.stats(node).invalidations >= count_before + reports end)
  end

  # A write by another program: the L2 key set straight through RESP.
  defp foreign_set(ctx, node, key, value) do
    l2_key = Remote.l2_key(config(node), key)
    bin = :erlang.term_to_binary(value)
    "+OK\r\n" = RedisServer.command(ctx.server, ["SET", l2_key, bin])
  end

  # n data connections track with a redirect (CLIENT LIST: flag t).
  defp await_tracking(ctx, n) do
    await(fn ->
      list = RedisServer.command(ctx.server, ["CLIENT", "LIST", "TYPE", "normal"])

      tracked =
        list
        |> String.split("\n")
        |> Enum.count(&(&1 =~ ~r/ flags=\S*t\S* / and &1 =~ ~r/ redir=[1-9]/))

      tracked == n
    end)
  end

  defp read_until(node, stop) do
    if :atomics.get(stop, 1) == 0 do
      Cache.get(node, "k")
      :erlang.yield()
      read_until(node, stop)
    end
  end

  defp config(name), do: Runtime.get(name)

  defp await(fun), do: eventually(fun, 500, 20)
end
