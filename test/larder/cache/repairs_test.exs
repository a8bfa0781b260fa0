defmodule Larder.Cache.RepairsTest do
  # The owner's pending L2 repairs: the bound on pending keys, as a value;
  # and, on a real redis-server that one node cannot reach, that failed
  # writes in tight loops cost the cache's process a bounded mailbox and
  # flat memory, and are still repaired once the server answers again.
  #
  # Not async: the VM's memory is measured, which other tests would move.
  use ExUnit.Case, async: false

  import Larder.Test.Eventually

  alias Larder.Cache
  alias Larder.Cache.{Remote, Repairs, Runtime}
  alias Larder.Test.{RedisServer, TcpProxy}

  # a cache without an L2: nothing is started, the items only pile up
  @no_l2 %{l2: nil}

  defp add_keys(p, keys), do: Enum.reduce(keys, p, &Repairs.add(&2, @no_l2, {:key, &1}))

  test "up to 1_000 keys are kept one by one, the next new one degrades to one invalidate-all" do
    p = add_keys(Repairs.new(), 1..1_000)
    assert map_size(p.keys) == 1_000
    assert p.all == nil

    # a key already pending moves to its latest failure, within the bound
    again = Repairs.add(p, @no_l2, {:key, 1})
    assert map_size(again.keys) == 1_000
    assert again.keys[1] > p.keys[1]
    assert again.all == nil

    over = Repairs.add(p, @no_l2, {:key, :one_more})
    assert over.keys == %{}
    assert is_integer(over.all)

    # while an invalidate-all is pending it covers every key
    assert add_keys(over, 1..10).keys == %{}
  end

  test "an invalidate-all replaces the pending keys; anything else is ignored" do
    p = add_keys(Repairs.new(), 1..3)
    all = Repairs.add(p, @no_l2, :all)
    assert all.keys == %{}
    assert is_integer(all.all)
    assert Repairs.add(all, @no_l2, {:not, :an, :item}) == all
  end

  describe "Redis refusing one node's connections, writers in tight loops" do
    @describetag :redis
    @describetag :capture_log

    import Larder.Test.RedisSetup, only: [redis_server: 1, test_prefix: 1]

    setup [:redis_server, :test_prefix]

    # Node a reaches Redis through a proxy that the test closes (its
    # connections are refused); node b reaches it directly and keeps its
    # subscription, so only a's repairs can make b drop what a's failed
    # writes replaced.
    setup ctx do
      proxy = TcpProxy.start(ctx.server.port)
      on_exit(fn -> TcpProxy.stop(proxy) end)
      a = start_node(ctx, :a, proxy.port)
      b = start_node(ctx, :b, ctx.server.port)
      %{proxy: proxy, a: a, b: b}
    end

    test "25 writers of a bounded set of keys: mailbox and memory stay flat, each key is repaired",
         ctx do
      %{a: a, b: b} = ctx
      share(a, b, :k, :old)
      TcpProxy.refuse(ctx.proxy)
      eventually(fn -> Cache.put(a, :probe, 1) != :ok end)

      # 25 x 20 keys and :k: under the bound of pending keys, so each key
      # is repaired on its own (DEL and PUBLISH)
      peaks =
        hammer(a, 25, 3_000, fn writer, n ->
          if rem(n, 2) == 0, do: :k, else: {:w, writer, rem(n, 20)}
        end)

      assert_flat(peaks)
      assert Cache.get(a, :k) != :old
      # b heard nothing yet: a could not publish
      assert Cache.get(b, :k) == :old

      TcpProxy.listen(ctx.proxy)
      # a's repair deletes :k in Redis and publishes it: b drops :old
      await(fn -> Cache.get(b, :k) != :old end)
      await(fn -> pending(a) == %{keys: %{}, all: nil} end)
      assert redis_get(ctx, a, :k) != :erlang.term_to_binary(:old)
      for _ <- 1..20, do: assert(Cache.get(b, :k) != :old)
    end

    test "1,000 writers of 5,000 keys, pausing 1 ms: flat, and repaired as one invalidate-all",
         ctx do
      %{a: a, b: b} = ctx
      share(a, b, :k, :old)
      TcpProxy.refuse(ctx.proxy)
      eventually(fn -> Cache.put(a, :probe, 1) != :ok end)

      peaks =
        hammer(a, 1_000, 3_000, fn writer, n ->
          Process.sleep(1)
          if n == 0 and writer == 0, do: :k, else: {:w, writer, rem(n, 5)}
        end)

      assert_flat(peaks)
      assert Cache.get(b, :k) == :old

      TcpProxy.listen(ctx.proxy)
      # more keys than the bound: one pending invalidate-all, which moves
      # every node to a new generation
      await(fn -> Cache.get(b, :k) == nil end)
      await(fn -> pending(a) == %{keys: %{}, all: nil} end)
      assert generation(a) == generation(b)
    end
  end

  ## Helpers

  defp start_node(ctx, suffix, port) do
    name = :"#{ctx.prefix}.#{suffix}"
    l2 = {Cache.Redis, port: port, timeout: 500, reconnect_sleep: 50}
    start_supervised!({Cache, name: name, l2: l2, namespace: ctx.prefix}, id: name)
    eventually(fn -> :sys.get_state(Process.whereis(name)).subscribed_before end, 250)
    name
  end

  # a puts key; once b has heard of that put, b reads it into its L1
  defp share(a, b, key, value) do
    seen = Cache.stats(b).invalidations
    :ok = Cache.put(a, key, value)
    await(fn -> Cache.stats(b).invalidations > seen end)
    assert Cache.get(b, key) == value
    assert [_] = :ets.lookup(Runtime.get(b).data, key)
  end

  # `writers` processes put on `cache` for `ms` ms, each in a loop with
  # the key key_fun.(writer, n) gives; meanwhile the cache's process's
  # message queue and memory, and the VM's memory, are sampled every 20
  # ms. Returns their peaks over what they were before.
  defp hammer(cache, writers, ms, key_fun) do
    owner = Process.whereis(cache)
    :erlang.garbage_collect(owner)
    vm_before = :erlang.memory(:total)
    owner_before = memory(owner)
    stop = System.monotonic_time(:millisecond) + ms

    tasks =
      for writer <- 0..(writers - 1) do
        Task.async(fn -> write_loop(cache, writer, 0, stop, key_fun) end)
      end

    peaks = sample(owner, stop, %{queue: 0, owner: 0, vm: 0}, owner_before, vm_before)
    Enum.each(tasks, &Task.await(&1, 30_000))
    peaks
  end

  defp write_loop(cache, writer, n, stop, key_fun) do
    if System.monotonic_time(:millisecond) < stop do
      Cache.put(cache, key_fun.(writer, n), n)
      write_loop(cache, writer, n + 1, stop, key_fun)
    end
  end

  defp sample(owner, stop, peaks, owner_before, vm_before) do
    if System.monotonic_time(:millisecond) < stop do
      {:message_queue_len, queue} = Process.info(owner, :message_queue_len)

      peaks = %{
        queue: max(peaks.queue, queue),
        owner: max(peaks.owner, memory(owner) - owner_before),
        vm: max(peaks.vm, :erlang.memory(:total) - vm_before)
      }

      Process.sleep(20)
      sample(owner, stop, peaks, owner_before, vm_before)
    else
      peaks
    end
  end

  # Bounds far below what one message per failed write reaches (over a
  # million messages and hundreds of MB in a few seconds), and generous
  # for a machine where other tests allocate meanwhile.
  defp assert_flat(peaks) do
    assert peaks.queue <= 1_000, "the cache's process held #{peaks.queue} messages"
    assert peaks.owner <= 16_000_000, "the cache's process grew by #{peaks.owner} bytes"
    assert peaks.vm <= 64_000_000, "the VM grew by #{peaks.vm} bytes"
  end

  defp memory(pid), do: pid |> Process.info(:memory) |> elem(1)

  defp pending(name) do
    name
    |> Process.whereis()
    |> :sys.get_state()
    |> Map.fetch!(:pending)
    |> Map.take([:keys, :all])
  end

  defp generation(name), do: :atomics.get(Runtime.get(name).generation, 1)

  defp redis_get(ctx, cache, key) do
    case RedisServer.command(ctx.server, ["GET", Remote.l2_key(Runtime.get(cache), key)]) do
      "$-1\r\n" ->
        nil

      "$" <> rest ->
        [length, tail] = String.split(rest, "\r\n", parts: 2)
        binary_part(tail, 0, String.to_integer(length))
    end
  end

  defp await(fun), do: eventually(fun, 500, 20)
end
