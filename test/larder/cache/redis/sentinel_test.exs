defmodule Larder.Cache.RedisSentinelTest do
  # Larder.Cache.Redis under Sentinel, on a real Sentinel set (a master, a
  # replica, three sentinels; test/support/redis_sentinel.ex): the L2
  # conformance suite passes, the master is
  # found through the sentinels and checked with ROLE, every node follows a
  # failover (the master SIGKILLed) with all its connections, its
  # subscription included, and clears its L1 when it moves.
  use ExUnit.Case, async: false
  use Larder.Test.L2Conformance

  import Larder.Test.Eventually

  alias Larder.Cache
  alias Larder.Redis.RESP
  alias Larder.Test.RedisSentinel

  @moduletag :redis
  @moduletag :capture_log

  import Larder.Test.RedisSetup, only: [redis_sentinel: 1]

  setup_all :redis_sentinel

  setup ctx do
    %{
      l2_module: Cache.Redis,
      l2_opts: [
        timeout: 500,
        sentinel: [sentinels: RedisSentinel.addresses(ctx.set), master: ctx.set.name]
      ]
    }
  end

  defp start_nodes(ctx, suffixes) do
    for suffix <- suffixes do
      name = :"#{ctx.module}.#{ctx.test}.#{suffix}"

      l2 =
        {Cache.Redis,
         timeout: 500,
         sentinel: [sentinels: RedisSentinel.addresses(ctx.set), master: ctx.set.name]}

      start_supervised!({Cache, name: name, l2: l2, namespace: "#{ctx.test}"}, id: name)
      # subscribed (invalidations published before are not heard)
      eventually(fn -> :sys.get_state(Process.whereis(name)).subscribed_before end)
      name
    end
  end

  test "the :sentinel option is checked in the caller" do
    for bad <- [
          [master: "m"],
          [sentinels: [], master: "m"],
          [sentinels: [{"h", 0}], master: "m"],
          [sentinels: [{"h", 1}]],
          [sentinels: [{"h", 1}], master: "m", bogus: 1],
          :not_a_list
        ] do
      assert_raise ArgumentError, ~r/sentinel/, fn ->
        Cache.start_link(name: :sentinel_opts, l2: {Cache.Redis, sentinel: bad})
      end
    end
  end

  test "a cache finds the master through the sentinels", ctx do
    [a, b] = start_nodes(ctx, [:a, :b])
    :ok = Cache.put(a, :k, 1)
    assert Cache.get(b, :k) == 1
    :ok = Cache.put(a, :k, 2)
    eventually(fn -> Cache.get(b, :k) == 2 end)
  end

  test "the master SIGKILLed: every node moves to the new one, clears L1, writes resume",
       ctx do
    [a, b] = start_nodes(ctx, [:a, :b])
    :ok = Cache.put(a, :k, 1)
    {:ok, :in_l1} = Cache.fetch(b, :only_b, fn -> {:ok, :in_l1} end)
    assert Cache.get(b, :only_b) == :in_l1

    old = RedisSentinel.kill_master(ctx.set)
    new = RedisSentinel.wait_failover(ctx.set, old)
    assert new.port != old.port

    # writes resume on the new master
    eventually(fn -> Cache.put(a, :k, 2) == :ok end, 500, 20)

    # b hears a's writes again: its subscription moved to the new master
    # (messages published since the kill reach b through it only)
    eventually(
      fn ->
        seen = Cache.stats(b).invalidations
        :ok = Cache.put(a, :k, 3)
        Process.sleep(50)
        Cache.stats(b).invalidations > seen
      end,
      200,
      0
    )

    # (the generation key may have been lost with the old master: the nodes
    # then agree on a fresh one, and a's write is read once they do)
    eventually(fn -> Cache.put(a, :k, 4) == :ok and Cache.get(b, :k) == 4 end)

    # b cleared its L1 when it subscribed there: :only_b, untouched since,
    # is an L1 miss (its L2 copy may be lost with the old master, since
    # replication is asynchronous)
    misses = Cache.stats(b).l1_misses
    assert Cache.get(b, :only_b) in [:in_l1, nil]
    assert Cache.stats(b).l1_misses == misses + 1
  end

  test "failover events for another master, or naming none, leave L1 alone; " <>
         "the latter are counted as bad messages",
       ctx do
    # a fourth "sentinel" that answers the subscription with those events
    # (the real ones, asked first, name the master)
    events =
      Enum.map(
        [
          {"+try-failover", "master other 127.0.0.1 1"},
          {"+selected-slave", "slave 127.0.0.1:2 127.0.0.1 2 @ other 127.0.0.1 1"},
          {"+sdown", "master #{ctx.set.name} 127.0.0.1 1"},
          {"+odown", "master #{ctx.set.name} 127.0.0.1 1 #quorum 2/2"},
          {"+elected-leader", "#{ctx.set.name}"},
          {"+promoted-slave", "slave @ #{ctx.set.name}"}
        ],
        fn {channel, payload} -> RESP.command(["message", channel, payload]) end
      )

    test_pid = self()

    fake =
      Larder.Test.GarbageServer.start(fn request ->
        if request =~ "SUBSCRIBE" do
          send(test_pid, {:subscribed, self()})
          receive do: (:go -> events)
        else
          ""
        end
      end)

    on_exit(fn -> Larder.Test.GarbageServer.stop(fake) end)
    name = :"#{ctx.module}.#{ctx.test}"
    sentinels = RedisSentinel.addresses(ctx.set) ++ [{"127.0.0.1", fake.port}]
    l2 = {Cache.Redis, timeout: 500, sentinel: [sentinels: sentinels, master: ctx.set.name]}
    start_supervised!({Cache, name: name, l2: l2, namespace: "#{ctx.test}"})
    eventually(fn -> :sys.get_state(Process.whereis(name)).subscribed_before end)
    :ok = Cache.put(name, :k, 1)
    assert Cache.get(name, :k) == 1
    misses = Cache.stats(name).l1_misses

    # the events reach the keeper; the 2 that name no master (the last
    # ones) are counted
    assert_receive {:subscribed, handler}, 5_000
    send(handler, :go)
    eventually(fn -> Cache.stats(name).bad_messages == 2 end)

    # and nothing cleared L1: :k is still an L1 hit
    assert Cache.get(name, :k) == 1
    assert Cache.stats(name).l1_misses == misses
  end

  describe "sentinels that are not Redis, or name a bad master" do
    for mode <- [:random, :wrong_types, :endless, :close_mid_reply, :silent, :bad_address] do
      test "#{mode}: the cache starts, serves L1, its L2 calls fail with errors", ctx do
        garbage =
          case unquote(mode) do
            :bad_address ->
              Larder.Test.GarbageServer.start(fn _ ->
                "*2\r\n$9\r\n127.0.0.1\r\n$6\r\n999999\r\n"
              end)

            mode ->
              Larder.Test.GarbageServer.start(mode)
          end

        on_exit(fn -> Larder.Test.GarbageServer.stop(garbage) end)
        name = :"#{ctx.module}.#{ctx.test}"
        sentinel = [sentinels: [{"127.0.0.1", garbage.port}], master: "m"]

        start_supervised!(
          {Cache, name: name, l2: {Cache.Redis, timeout: 200, sentinel: sentinel}}
        )

        owner = Process.whereis(name)
        keeper = keeper(name)

        for round <- 1..3 do
          assert {:error, %Larder.Error{}} = Cache.put(name, :k, round)
          assert Cache.get(name, :k) == round
          assert Cache.fetch(name, {:l, round}, fn -> {:ok, round} end) == {:ok, round}
          Process.sleep(100)
        end

        assert Process.whereis(name) == owner
        # the keeper runs, and was never restarted
        assert is_pid(keeper) and keeper(name) == keeper and Process.alive?(keeper)
        assert Cache.stats(name).l2_errors >= 3
      end
    end
  end

  test "no master (a sentinel that never answers), writers in tight loops: the keeper's " <>
         "mailbox stays bounded",
       ctx do
    # Every failed call hints the keeper to ask the sentinels again, and
    # the keeper is held up meanwhile asking one that does not answer
    # (:timeout each time): one hint on its way at a time, whatever the
    # number of callers.
    garbage = Larder.Test.GarbageServer.start(:silent)
    on_exit(fn -> Larder.Test.GarbageServer.stop(garbage) end)
    name = :"#{ctx.module}.#{ctx.test}"
    sentinel = [sentinels: [{"127.0.0.1", garbage.port}], master: "m"]
    l2 = {Cache.Redis, timeout: 300, reconnect_sleep: 10, sentinel: sentinel}
    start_supervised!({Cache, name: name, l2: l2})
    keeper = keeper(name)
    stop = System.monotonic_time(:millisecond) + 2_000

    writers =
      for w <- 1..25 do
        Task.async(fn -> put_until(name, {:w, w, 0}, stop) end)
      end

    peak = peak_queue(keeper, stop, 0)
    Enum.each(writers, &Task.await(&1, 30_000))
    assert peak <= 100, "the keeper held #{peak} messages"
    assert keeper(name) == keeper
  end

  defp put_until(name, {:w, w, n}, stop) do
    if System.monotonic_time(:millisecond) < stop do
      {:error, %Larder.Error{}} = Cache.put(name, {:w, w, rem(n, 10)}, n)
      put_until(name, {:w, w, n + 1}, stop)
    end
  end

  defp peak_queue(pid, stop, peak) do
    if System.monotonic_time(:millisecond) < stop do
      {:message_queue_len, queue} = Process.info(pid, :message_queue_len)
      Process.sleep(10)
      peak_queue(pid, stop, max(peak, queue))
    else
      peak
    end
  end

  defp keeper(name) do
    {Cache.Redis, %{table: table}} = Larder.Cache.Runtime.get(name).l2
    [{:manager, pid}] = :ets.lookup(table, :manager)
    pid
  end
end
