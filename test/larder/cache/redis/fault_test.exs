defmodule Larder.Cache.RedisFaultTest do
  # The fault suite on a real redis-server: a server paused mid-write,
  # killed and restarted, a fake server that answers garbage, a hostile
  # publisher on the invalidation channel, oversized and zip-bomb values.
  # Each checks that every node converges and that memory stays bounded.
  use ExUnit.Case, async: true

  alias Larder.Cache
  alias Larder.Cache.Runtime
  alias Larder.Test.RedisServer
  alias Larder.Test.GarbageServer

  import ExUnit.CaptureLog
  import Larder.Test.Eventually

  @moduletag :redis
  @moduletag :capture_log

  import Larder.Test.RedisSetup, only: [redis_server: 1, test_prefix: 1]

  setup [:redis_server, :test_prefix]

  describe "Redis paused (SIGSTOP) mid-write" do
    test "put/4: the other node stops serving the old value once Redis answers", ctx do
      [a, b] = start_nodes(ctx, [:a, :b], timeout: 200)
      share(a, b, :k, :old)
      share(a, b, :gone, :old)

      RedisServer.pause(ctx.server)
      on_exit(fn -> RedisServer.resume(ctx.server) end)

      # the SET (or DEL) is sent and may land later: its outcome is unknown
      assert {:error, %Larder.Error{reason: :l2_unavailable}} = Cache.put(a, :k, :new)
      assert {:error, %Larder.Error{reason: :l2_unavailable}} = Cache.delete(a, :gone)
      assert Cache.get(a, :k) == :new
      assert Cache.get(b, :k) == :old
      # paused for 2 s in all, as in the report that found this
      Process.sleep(1_500)
      assert Cache.get(b, :k) == :old

      RedisServer.resume(ctx.server)
      resumed = System.monotonic_time(:millisecond)

      # b drops its copy; what L2 holds then is a's value or nothing
      await(fn -> Cache.get(b, :k) in [:new, nil] and Cache.get(b, :gone) == nil end)
      report("put/delete convergence after SIGCONT", resumed)
      assert Cache.get(b, :k) in [:new, nil]
      # The repair's reply reaches a's owner after b has seen its message.
      await(fn -> pending(a) == %{keys: %{}, all: nil} end)
    end

    test "invalidate_all/1: every node moves to a new generation once Redis answers", ctx do
      [a, b] = start_nodes(ctx, [:a, :b], timeout: 200)
      share(a, b, :k, :old)

      RedisServer.pause(ctx.server)
      on_exit(fn -> RedisServer.resume(ctx.server) end)
      assert {:error, %Larder.Error{reason: :l2_unavailable}} = Cache.invalidate_all(a)
      assert Cache.get(a, :k) == nil
      assert Cache.get(b, :k) == :old

      RedisServer.resume(ctx.server)
      resumed = System.monotonic_time(:millisecond)
      await(fn -> Cache.get(b, :k) == nil end)
      report("invalidate_all convergence after SIGCONT", resumed)
      assert generation(a) == generation(b)
      assert generation(a) >= 1
    end

    test "many keys written while paused degrade to one invalidate-all; memory stays bounded",
         ctx do
      # the file's 500 ms timeout: every L2 call before the pause and after
      # it must succeed, which a loaded machine may not give within 100 ms
      [a, b] = start_nodes(ctx, [:a, :b], pool_size: 1)
      share(a, b, :k, :old)
      owner = Process.whereis(a)
      memory_before = process_memory(owner)

      RedisServer.pause(ctx.server)
      on_exit(fn -> RedisServer.resume(ctx.server) end)

      # put/4 waits one timeout per call: enough callers to pass the bound
      # of 1_000 pending keys (Larder.Cache.Repairs), all at once, so that
      # the pause lasts one timeout. Each reports its key to the owner
      # before it returns. (A larger bound fails the test: no
      # invalidate-all would be pending.)
      puts = 1_000 + 10

      1..puts
      |> Task.async_stream(&Cache.put(a, {:key, &1}, &1),
        max_concurrency: puts,
        timeout: :infinity
      )
      |> Stream.run()

      eventually(fn -> pending(a).all != nil end)
      assert pending(a).keys == %{}
      assert process_memory(owner) < memory_before + 1_000_000

      RedisServer.resume(ctx.server)
      await(fn -> Cache.get(b, :k) == nil end)
      # The repair's reply reaches a's owner after b has seen its message.
      await(fn -> pending(a) == %{keys: %{}, all: nil} end)
      assert Process.whereis(a) == owner
    end
  end

  test "Redis killed and restarted: pending writes are repaired, nothing restarts", ctx do
    [a, b] = start_nodes(ctx, [:a, :b], timeout: 200)
    owner = Process.whereis(a)
    share(a, b, :k, :old)
    :ok = RedisServer.kill(ctx.server)

    assert {:error, %Larder.Error{}} = Cache.put(a, :k, :new)
    assert pending(a).keys != %{}
    server = RedisServer.restart(ctx.server)
    on_exit(fn -> RedisServer.stop(server) end)

    await(fn -> Cache.get(b, :k) in [:new, nil] end)
    eventually(fn -> pending(a) == %{keys: %{}, all: nil} end, 250)
    assert Process.whereis(a) == owner
    assert :ets.info(config(a).data, :memory) < 100_000
  end

  describe "a server that is not Redis" do
    for mode <- [:random, :wrong_types, :endless, :close_mid_reply, :silent] do
      test "#{mode}: the cache starts, every call returns an error or a miss, L1 serves", ctx do
        garbage = GarbageServer.start(unquote(mode))
        on_exit(fn -> GarbageServer.stop(garbage) end)
        l2 = {Cache.Redis, port: garbage.port, timeout: 200, max_reply_bytes: 1_048_576}
        name = :"#{ctx.prefix}.garbage"
        start_supervised!({Cache, name: name, l2: l2, namespace: ctx.prefix})
        owner = Process.whereis(name)

        for round <- 1..3 do
          assert {:ok, {:loaded, ^round}} =
                   Cache.fetch(name, {:k, round}, fn -> {:ok, {:loaded, round}} end)

          assert Cache.get(name, {:k, round}) == {:loaded, round}
          assert_ok_or_error(Cache.put(name, :p, round))
          assert Cache.get(name, :p) == round
          assert_ok_or_error(Cache.delete(name, :p))
          assert Cache.get(name, :p) == nil
          assert_ok_or_error(Cache.invalidate_all(name))
          Process.sleep(100)
        end

        # Larder.Cache.Redis's own functions
        {:ok, state} =
          Larder.Test.L2Process.start(
            Cache.Redis,
            [port: garbage.port, timeout: 200],
            self(),
            "ch"
          )

        for _ <- 1..3 do
          assert_miss_or_error(Cache.Redis.get(state, "k"))
          assert_ok_or_error(Cache.Redis.put(state, "k", "v", 100, :new))
          assert_ok_or_error(Cache.Redis.delete(state, "k"))
          assert_ok_or_error(Cache.Redis.incr(state, "k"))
          assert_ok_or_error(Cache.Redis.publish(state, "ch", "x"))
        end

        # an endless reply is refused at its header (it declares 1 GB, above
        # max_reply_bytes): no connection buffers it
        for _ <- 1..10 do
          assert l2_client_memory(name) < 64_000_000
          Process.sleep(50)
        end

        :ok = Cache.Redis.stop(state)
        assert Process.whereis(name) == owner
        assert Cache.get(name, {:k, 3}) == nil or Cache.get(name, {:k, 3}) == {:loaded, 3}
      end
    end
  end

  test "an L2 process that dies is restarted in place; the owner and L1 stay", ctx do
    [a] = start_nodes(ctx, [:a])
    owner = Process.whereis(a)
    :ok = Cache.put(a, :k, 1)
    l2 = config(a).l2
    keeper = keeper(a)
    Process.exit(keeper, :kill)

    assert Cache.get(a, :k) == 1
    eventually(fn -> keeper(a) not in [nil, keeper] end)
    # the state callers use did not change: the new keeper filled its table
    assert config(a).l2 == l2
    # The new keeper is in the table before its connections are: a put
    # then fails, and its repair (a DEL of :k) may land after a later put
    # that succeeded. The put that counts is one made with no repair
    # pending, so b must read its value.
    eventually(
      fn -> pending(a) == %{keys: %{}, all: nil} and Cache.put(a, :k, 2) == :ok end,
      250
    )

    assert Process.whereis(a) == owner
    [b] = start_nodes(ctx, [:b])
    assert Cache.get(b, :k) == 2
  end

  test "the subscriber's connection killed (CLIENT KILL TYPE pubsub): L1 is cleared, " <>
         "it resubscribes, invalidations flow again",
       ctx do
    [a, b] = start_nodes(ctx, [:a, :b])
    share(a, b, :k, 1)
    {:ok, :in_l1} = Cache.fetch(b, :only_b, fn -> {:ok, :in_l1} end)
    owners = Enum.map([a, b], &Process.whereis/1)

    ":2\r\n" = RedisServer.command(ctx.server, ["CLIENT", "KILL", "TYPE", "pubsub"])

    # messages published meanwhile are lost to them: each clears its L1
    # once it has subscribed again
    eventually(fn ->
      :ets.lookup(config(a).data, :k) == [] and :ets.lookup(config(b).data, :k) == [] and
        :ets.lookup(config(b).data, :only_b) == []
    end)

    # a's invalidations reach b through its new subscription
    share(a, b, :k2, 1)
    :ok = Cache.put(a, :k2, 2)
    eventually(fn -> Cache.get(b, :k2) == 2 end)
    assert Enum.map([a, b], &Process.whereis/1) == owners
  end

  describe "the server's password changes mid-run (CONFIG SET requirepass)" do
    test "the pub/sub connection backs off without crashing, L1 serves, it recovers", ctx do
      [a, b] = start_nodes(ctx, [:a, :b], timeout: 200)
      share(a, b, :k, 1)
      owner = Process.whereis(b)
      keeper = keeper(b)
      :erlang.trace(keeper, true, [:procs])

      log =
        capture_log(fn ->
          # connections made before keep their authentication: close them all
          ["+OK\r\n", "+OK\r\n", _pubsub, _normal] =
            commands(ctx.server, [
              ["CONFIG", "SET", "requirepass", "secret"],
              ["AUTH", "secret"],
              ["CLIENT", "KILL", "TYPE", "pubsub"],
              ["CLIENT", "KILL", "TYPE", "normal"]
            ])

          # the data connections reconnect unauthenticated: Redis refuses
          # their commands (NOAUTH), an error, not a crash
          eventually(fn ->
            match?({:error, %Larder.Error{reason: :l2_failed}}, Cache.put(a, :p, 1))
          end)

          # a's and b's pub/sub connections fail (NOAUTH) for 2 s
          Process.sleep(2_000)
          assert Cache.get(b, :k) in [1, nil]
          assert Cache.fetch(b, :l1, fn -> {:ok, :served} end) == {:ok, :served}
          assert Cache.get(b, :l1) == :served

          # a node given the password subscribes and writes
          [c] = start_nodes(ctx, [:c], password: "secret")
          assert Cache.put(c, :c, 1) == :ok

          ["+OK\r\n", "+OK\r\n"] =
            commands(ctx.server, [["AUTH", "secret"], ["CONFIG", "SET", "requirepass", ""]])

          # the subscription comes back: an invalidation from a arrives again
          await(fn ->
            seen = Cache.stats(b).invalidations
            Cache.put(a, :k, 2)
            Process.sleep(50)
            Cache.stats(b).invalidations > seen
          end)
        end)

      assert Process.whereis(b) == owner
      assert keeper(b) == keeper
      # no crash report of this test's processes (the log is global: other
      # async tests' crash reports are theirs), and no process of the
      # keeper's restarted in a loop
      port = Integer.to_string(ctx.server.port)

      ours =
        log
        |> String.split(~r/\n(?=\d\d:\d\d:\d\d\.\d{3} \[)/)
        |> Enum.filter(&(&1 =~ "terminating"))
        |> Enum.filter(&(&1 =~ ctx.prefix or &1 =~ "port: #{port}" or &1 =~ ":#{port}"))

      assert ours == []
      spawned = spawns(keeper)
      assert length(spawned) <= 2, "the keeper started #{length(spawned)} processes"
      # one warning per cache for the failing subscription, not one per
      # attempt (other tests' caches log too: count this test's channel)
      channel = Regex.escape(inspect(ctx.prefix <> ":1:invalidate"))
      assert length(Regex.scan(~r/pub\/sub connection of channel #{channel} failed/, log)) == 2
      assert log =~ "NOAUTH"
      await(fn -> Cache.put(a, :k, 3) == :ok and Cache.get(b, :k) in [3, nil] end)
    end
  end

  describe "a hostile publisher on the invalidation channel" do
    test "bad messages are ignored and counted; good ones still work", ctx do
      [a, b] = start_nodes(ctx, [:a, :b], max_value_bytes: 100_000)
      share(a, b, :k, 1)
      generation = generation(b)
      owner = Process.whereis(b)
      memory_before = process_memory(owner)
      node = :crypto.strong_rand_bytes(16)
      channel = Larder.Cache.Remote.channel(config(b))

      payloads =
        [
          # the examples that took the owner down: out-of-range generations
          msg(node, {:all, 2 ** 70}),
          msg(node, {:all, -1}),
          msg(node, {:all, 1.5}),
          msg(node, {:all, 10 ** 100}),
          msg(node, {:all, 2 ** 62}),
          # wrong shapes
          msg("short", {:all, 1}),
          msg(:node, {:key, :k}),
          msg(node, {:key}),
          msg(node, {:all, 1, 2}),
          :erlang.term_to_binary({:larder_cache, node}),
          :erlang.term_to_binary({:other, node, {:key, :k}}),
          :erlang.term_to_binary(fn -> :k end),
          <<131, 80, 0, 0, 0, 10, 1, 2, 3>>,
          "",
          "not a term",
          # a zip bomb and a message above :max_value_bytes
          <<131, 80, 5_000_006::32>> <>
            :zlib.compress(<<108, 5_000_000::32>> <> :binary.copy(<<106>>, 5_000_001)),
          :binary.copy("x", 200_000)
        ] ++ for(_ <- 1..50, do: :crypto.strong_rand_bytes(:rand.uniform(200)))

      for payload <- payloads do
        publish(ctx.server, channel, payload)
      end

      eventually(fn -> Cache.stats(b).bad_messages == length(payloads) end)
      assert Cache.get(b, :k) == 1
      assert generation(b) == generation
      assert Process.whereis(b) == owner
      :erlang.garbage_collect(owner)
      assert process_memory(owner) < memory_before + 1_000_000

      # a well-formed invalidation from another node still applies
      :ok = Cache.put(a, :k, 2)
      eventually(fn -> Cache.get(b, :k) == 2 end)

      # A message above the Redis L2's :max_message_bytes: its pub/sub
      # client is cut off (and reconnects, which clears L1) or the owner
      # counts it; either way invalidations keep flowing.
      publish(ctx.server, channel, :binary.copy("x", 3_000_000))
      :ok = Cache.put(a, :k, 3)
      await(fn -> Cache.get(b, :k) == 3 end)
      assert Process.whereis(b) == owner
    end

    test "a huge number in the generation key is counted and replaced; the cache starts", ctx do
      server = ctx.server
      gen_key = ctx.prefix <> ":1:gen"
      "+OK\r\n" = RedisServer.command(server, ["SET", gen_key, String.duplicate("9", 100)])
      [a] = start_nodes(ctx, [:a])
      assert Cache.stats(a).decode_errors >= 1
      # a fresh generation took its place
      assert generation(a) == redis_generation(server, gen_key)
      assert Cache.fetch(a, :k, fn -> {:ok, 1} end) == {:ok, 1}
      assert Cache.invalidate_all(a) == :ok
      assert generation(a) == redis_generation(server, gen_key)
    end
  end

  describe "Redis loses the generation key" do
    test "FLUSHALL: invalidate_all/1 moves every node to a fresh generation", ctx do
      [a, b] = start_nodes(ctx, [:a, :b])
      :ok = Cache.invalidate_all(a)
      await(fn -> generation(b) == generation(a) end)
      used = generation(a)
      share(a, b, :k, :old)

      "+OK\r\n" = RedisServer.command(ctx.server, ["FLUSHALL"])
      # written to L2 after the flush, under the generation both nodes hold
      :ok = Cache.put(a, :before_call, :stale)
      await(fn -> Cache.get(b, :before_call) == :stale end)

      assert Cache.invalidate_all(a) == :ok
      assert Cache.get(a, :k) == nil
      assert Cache.get(a, :before_call) == nil
      await(fn -> Cache.get(b, :k) == nil and Cache.get(b, :before_call) == nil end)
      gen_key = Larder.Cache.Remote.generation_key(config(a))
      assert generation(a) == generation(b)
      assert generation(a) == redis_generation(ctx.server, gen_key)
      # above every generation used before, so old L2 keys never come back
      assert generation(a) > used

      # later calls, from either node, keep both on Redis's generation
      for node <- [b, a, b] do
        assert Cache.invalidate_all(node) == :ok
        g = redis_generation(ctx.server, gen_key)
        await(fn -> generation(a) == g and generation(b) == g end)
      end

      :ok = Cache.put(b, :k, :new)
      assert Cache.get(a, :k) == :new
    end

    test "restarted empty: a node started afterwards and the old one agree", ctx do
      [a] = start_nodes(ctx, [:a])
      for _ <- 1..3, do: :ok = Cache.invalidate_all(a)
      :ok = Cache.put(a, :k, :old)

      :ok = RedisServer.kill(ctx.server)
      server = RedisServer.restart(ctx.server)
      on_exit(fn -> RedisServer.stop(server) end)
      [c] = start_nodes(ctx, [:c])

      await(fn -> generation(a) == generation(c) end)
      gen_key = Larder.Cache.Remote.generation_key(config(a))
      assert generation(c) == redis_generation(server, gen_key)

      # one set of L2 keys: what one writes, the other reads
      :ok = Cache.put(c, :k, :new)
      await(fn -> Cache.get(a, :k) == :new end)
      :ok = Cache.put(a, :j, 1)
      assert Cache.get(c, :j) == 1
    end

    test "a key that holds no generation, written mid-run: invalidate_all/1 still works", ctx do
      [a, b] = start_nodes(ctx, [:a, :b])
      share(a, b, :k, :old)
      gen_key = Larder.Cache.Remote.generation_key(config(a))
      "+OK\r\n" = RedisServer.command(ctx.server, ["SET", gen_key, "not a generation"])

      assert Cache.invalidate_all(a) == :ok
      assert Cache.get(a, :k) == nil
      await(fn -> Cache.get(b, :k) == nil end)
      g = redis_generation(ctx.server, gen_key)
      await(fn -> generation(a) == g and generation(b) == g end)

      assert Cache.invalidate_all(b) == :ok
      g = redis_generation(ctx.server, gen_key)
      await(fn -> generation(a) == g and generation(b) == g end)
      # nothing is left to repair
      assert pending(a) == %{keys: %{}, all: nil}
    end
  end

  describe "values in L2 that must not be decoded" do
    test "oversized, zip-bomb and fun values are a miss plus a decode error", ctx do
      [writer] = start_nodes(ctx, [:writer], max_value_bytes: 1_073_741_824)
      [reader] = start_nodes(ctx, [:reader], max_value_bytes: 1_048_576)
      owner = Process.whereis(reader)

      # written by a node with a larger bound: too large to read here
      big = :binary.copy("x", 2_000_000)
      :ok = Cache.put(writer, :big, big)
      assert Cache.get(reader, :big) == nil

      bombs = %{
        # 5M elements of [] compress to ~5 KB and would decode to 5M cons
        # cells: the declared size (5 MB) is over the bound
        nil_list: zip(nil_list(5_000_000)),
        # 500 KB of external bytes (under the bound) that would decode to
        # 8 MB of cons cells: the walk's memory estimate is over the bound
        nil_list_small: zip(nil_list(500_000)),
        # 100 MB of zeros, ~100 KB compressed
        big_binary: zip(<<109, 100_000_000::32>> <> :binary.copy(<<0>>, 100_000_000)),
        # declares a small size and inflates past it
        lying_size: <<131, 80, 0, 0, 0, 8>> <> :zlib.compress(:binary.copy(<<106>>, 1_000_000)),
        fun: :erlang.term_to_binary(fn -> :boom end),
        nested_fun: :erlang.term_to_binary(%{a: [1, {2, &Enum.map/2}]}),
        # uncompressed and under the bound, but 16 bytes of heap per 2 bytes
        small_ints: <<131, 108, 200_000::32>> <> :binary.copy(<<97, 1>>, 200_000) <> <<106>>
      }

      for {key, bin} <- bombs do
        raw_set(ctx.server, reader, key, bin)
        {:memory, before} = Process.info(self(), :memory)
        assert Cache.get(reader, key) == nil, "#{key} was decoded"
        :erlang.garbage_collect()
        {:memory, after_} = Process.info(self(), :memory)
        assert after_ < before + 1_000_000
      end

      stats = Cache.stats(reader)
      assert stats.decode_errors == map_size(bombs) + 1
      assert stats.entries == 0
      assert Process.whereis(reader) == owner

      # a value too large for the writer's own bound stays in its L1 only
      [small] = start_nodes(ctx, [:small], max_value_bytes: 1024)
      assert :ok = Cache.put(small, :big, big)
      assert Cache.get(small, :big) == big
      assert Cache.get(reader, :big) == nil
    end
  end

  ## Helpers

  defp start_nodes(ctx, suffixes, opts \\ []) do
    {redis_opts, cache_opts} = Keyword.split(opts, [:timeout, :pool_size, :password])
    l2 = {Cache.Redis, Keyword.merge([port: ctx.server.port, timeout: 500], redis_opts)}

    names =
      for suffix <- suffixes do
        name = :"#{ctx.prefix}.#{suffix}"
        opts = [name: name, l2: l2, namespace: ctx.prefix] ++ cache_opts
        start_supervised!({Cache, opts}, id: name)
        name
      end

    for name <- names do
      eventually(fn -> :sys.get_state(Process.whereis(name)).subscribed_before end)
    end

    names
  end

  # a puts key; once b has heard of that put, b reads it into its L1
  defp share(a, b, key, value) do
    seen = Cache.stats(b).invalidations
    :ok = Cache.put(a, key, value)
    eventually(fn -> Cache.stats(b).invalidations > seen end)
    assert Cache.get(b, key) == value
  end

  defp config(name), do: Runtime.get(name)
  defp generation(name), do: :atomics.get(config(name).generation, 1)

  defp redis_generation(server, key) do
    <<"$", rest::binary>> = RedisServer.command(server, ["GET", key])
    [_length, value | _] = String.split(rest, "\r\n")
    String.to_integer(value)
  end

  defp pending(name) do
    name
    |> Process.whereis()
    |> :sys.get_state()
    |> Map.fetch!(:pending)
    |> Map.take([:keys, :all])
  end

  # external term bytes (no 131) of a list of n empty lists
  defp nil_list(0), do: ""
  defp nil_list(n), do: <<108, n::32>> <> :binary.copy(<<106>>, n + 1)

  defp zip(plain),
    do: <<131, 80, byte_size(plain)::32>> <> :zlib.compress(plain)

  defp msg(node, message), do: :erlang.term_to_binary({:larder_cache, node, message})

  defp publish(server, channel, payload) do
    <<":", _::binary>> = RedisServer.command(server, ["PUBLISH", channel, payload])
  end

  defp raw_set(server, cache, key, bin) do
    "+OK\r\n" =
      RedisServer.command(server, ["SET", Larder.Cache.Remote.l2_key(config(cache), key), bin])
  end

  # Commands sent one after the other on one connection (so AUTH holds).
  defp commands(server, commands) do
    {:ok, socket} = :gen_tcp.connect(~c"127.0.0.1", server.port, [:binary, active: false])

    try do
      for args <- commands do
        payload = ["*#{length(args)}\r\n" | Enum.map(args, &"$#{byte_size(&1)}\r\n#{&1}\r\n")]
        :ok = :gen_tcp.send(socket, payload)
        {:ok, reply} = :gen_tcp.recv(socket, 0, 1_000)
        reply
      end
    after
      :gen_tcp.close(socket)
    end
  end

  # the processes the traced keeper started (a pub/sub client it restarted)
  defp spawns(keeper) do
    receive do
      {:trace, ^keeper, :spawn, pid, _mfa} -> [pid | spawns(keeper)]
      {:trace, ^keeper, _event, _pid} -> spawns(keeper)
      {:trace, ^keeper, _event, _pid, _} -> spawns(keeper)
    after
      0 -> []
    end
  end

  defp process_memory(pid), do: pid |> Process.info(:memory) |> elem(1)

  # The keeper publishes its pid in the table callers read.
  defp keeper(name) do
    {Cache.Redis, %{table: table}} = config(name).l2

    case :ets.lookup(table, :manager) do
      [{:manager, pid}] -> if Process.alive?(pid), do: pid
      [] -> nil
    end
  end

  defp l2_client_memory(name) do
    {Cache.Redis, %{table: table}} = config(name).l2

    for {slot, pid} when is_integer(slot) and is_pid(pid) <- :ets.tab2list(table), reduce: 0 do
      acc ->
        case Process.info(pid, [:memory, :binary]) do
          [memory: m, binary: bins] -> max(acc, m + Enum.sum(for {_, s, _} <- bins, do: s))
          nil -> acc
        end
    end
  end

  defp assert_ok_or_error(:ok), do: :ok
  defp assert_ok_or_error({:ok, _}), do: :ok
  defp assert_ok_or_error({:error, %Larder.Error{}}), do: :ok
  defp assert_ok_or_error(other), do: flunk("unexpected: #{inspect(other)}")

  defp assert_miss_or_error(:miss), do: :ok
  defp assert_miss_or_error(other), do: assert_ok_or_error(other)

  # Convergence: polled for up to 10 s (no assertion on speed).
  defp await(fun), do: eventually(fun, 500, 20)

  defp report(what, since) do
    if System.get_env("LARDER_REPORT_CONVERGENCE") do
      IO.puts("#{what}: #{System.monotonic_time(:millisecond) - since} ms")
    end
  end
end
