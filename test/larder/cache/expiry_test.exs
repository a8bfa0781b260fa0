defmodule Larder.Cache.ExpiryTest do
  # The expiry clock and the sweep against a busy cache process: the clock
  # is its own process, and a sweep of a large table goes in slices with
  # the cache's other messages handled in between.
  use ExUnit.Case, async: true

  import Larder.Test.Eventually

  alias Larder.Cache
  alias Larder.Cache.{Expiry, Runtime, Stats, Store}

  # The rows of a sweep slice in Larder.Cache.Expiry (another value fails
  # "a sweep goes in slices", which counts what one slice deleted).
  @slice_rows 1_000

  defp start_cache(ctx) do
    name = :"#{ctx.test}"
    start_supervised!({Cache, name: name, telemetry: false})
    name
  end

  defp cfg(cache), do: Runtime.get(cache)
  defp clock(cache), do: :atomics.get(cfg(cache).clock, 1)

  defp clock_process(cache), do: Larder.Cache.Supervisor.child(cache, :clock)

  # Resumes the suspended process `pid` and has it handle the system
  # `request` (:suspend, {:replace_state, fun}) right after the next message
  # in its mailbox: both system messages go in before it runs (the format
  # is :sys's, {:system, from, request}), so whatever that next message
  # makes the process send itself comes after them.
  defp after_next_message(pid, request) do
    resume = make_ref()
    next = make_ref()
    send(pid, {:system, {self(), resume}, :resume})
    send(pid, {:system, {self(), next}, request})
    assert_receive {^resume, :ok}, 5_000
    assert_receive {^next, _reply}, 5_000
    :ok
  end

  defp fill(cache, n, opts) do
    for i <- 1..n, do: :ok = Cache.put(cache, i, i, opts)
    :ok
  end

  test "the clock moves while the cache's process is held in the middle of a sweep", ctx do
    cache = start_cache(ctx)
    # several slices' worth of live rows
    fill(cache, 10 * @slice_rows, [])
    :ok = Cache.put(cache, :short, 1, ttl: 50)
    owner = Process.whereis(cache)

    # The sweep starts, and the cache's process is stopped right after its
    # first slice (before this fix, after the whole sweep, with the clock
    # standing still while it ran; and the clock was the process's own).
    :ok = :sys.suspend(owner)
    on_exit(fn -> Process.alive?(owner) and :sys.resume(owner) end)
    send(owner, :sweep)
    after_next_message(owner, :suspend)

    # hits keep seeing time pass: the short entry stops being served
    before = clock(cache)
    eventually(fn -> clock(cache) > before + 50 end)
    eventually(fn -> Cache.get(cache, :short) == nil end)
    assert Cache.get(cache, 1) == 1
    assert :sys.get_state(owner).sweeping

    :ok = :sys.resume(owner)
    eventually(fn -> not :sys.get_state(owner).sweeping end)
    assert Cache.stats(cache).entries == 10 * @slice_rows
  end

  test "a sweep goes in slices: the cache's process handles its messages in between", ctx do
    cache = start_cache(ctx)
    n = 20 * @slice_rows
    fill(cache, n, ttl: 1)
    # every row has expired by the clock hits read
    deadline = Expiry.now() + 1
    eventually(fn -> clock(cache) > deadline end)
    owner = Process.whereis(cache)
    test = self()

    # The sweep's message, then a message from the L2 (not a valid one: it
    # is counted), then a look at the table from inside the cache's process
    # when it gets there. All three are in its mailbox before it starts.
    :ok = :sys.suspend(owner)
    send(owner, :sweep)
    send(owner, {:larder_cache_l2, :message, "not an invalidation"})

    after_next_message(
      owner,
      {:replace_state,
       fn state ->
         send(test, {:seen, Store.entries(state.rt), Stats.get(state.rt, :bad_messages)})
         state
       end}
    )

    # one slice, then the messages that were waiting, then the rest
    assert_received {:seen, entries, 1}
    assert entries == n - @slice_rows, "the whole sweep ran before the messages behind it"

    # and the sweep finishes
    eventually(fn -> Cache.stats(cache).entries == 0 end, 500)
    refute :sys.get_state(owner).sweeping
  end

  test "sweeps while the table changes under them (writes, deletes, clears) stay consistent",
       ctx do
    cache = start_cache(ctx)
    owner = Process.whereis(cache)
    stop = :atomics.new(1, [])

    writers =
      for w <- 1..4 do
        Task.async(fn ->
          Stream.iterate(0, &(&1 + 1))
          |> Enum.take_while(fn i ->
            key = rem(i * 7 + w, 20_000)

            case rem(i, 3) do
              0 -> Cache.delete(cache, key)
              _ -> Cache.put(cache, key, i, ttl: 1 + rem(i, 5))
            end

            :atomics.get(stop, 1) == 0
          end)
        end)
      end

    for round <- 1..30 do
      send(owner, :sweep)
      if rem(round, 10) == 0, do: :ok = Cache.invalidate_all(cache)
      eventually(fn -> not :sys.get_state(owner).sweeping end)
    end

    :atomics.put(stop, 1, 1)
    Enum.each(writers, &Task.await(&1, 10_000))
    send(owner, :sweep)
    eventually(fn -> not :sys.get_state(owner).sweeping end)

    # the index, the byte count and the data rows agree; nothing restarted
    cfg = cfg(cache)
    assert Process.whereis(cache) == owner
    assert Store.entries(cfg) == :ets.info(cfg.data, :size)

    assert Store.bytes(cfg) ==
             :ets.foldl(fn {_, _, _, size, _}, acc -> acc + size end, 0, cfg.data)
  end

  test "the clock is an OTP process: :sys.get_state/1 answers with its atomic", ctx do
    cache = start_cache(ctx)
    assert :sys.get_state(clock_process(cache)) == cfg(cache).clock
  end

  test "the clock process ends with the cache and is replaced if killed", ctx do
    cache = start_cache(ctx)
    owner = Process.whereis(cache)
    clock_pid = clock_process(cache)
    Process.exit(clock_pid, :kill)

    eventually(fn ->
      pid = clock_process(cache)
      is_pid(pid) and pid != clock_pid and Process.alive?(pid)
    end)

    before = clock(cache)
    eventually(fn -> clock(cache) > before end)
    # the cache's process (and its tables) stayed
    assert Process.whereis(cache) == owner

    new_clock = clock_process(cache)
    ref = Process.monitor(new_clock)
    :ok = stop_supervised({Cache, cache})
    assert_receive {:DOWN, ^ref, :process, ^new_clock, _}
  end

  # A hit compares a row's expiry time with the clock's atomic: served while
  # expires_at > clock, a miss (and the row deleted) from the tick that
  # reaches expires_at on. The clock process is suspended so that the test
  # alone moves the clock.
  describe "a hit against the clock" do
    defp hold_clock(cache) do
      pid = clock_process(cache)
      true = :erlang.suspend_process(pid)
      on_exit(fn -> Process.alive?(pid) and :erlang.resume_process(pid) end)
      :ok
    end

    defp expires_at(cache, key) do
      [{^key, _version, expires_at, _size, _value}] = :ets.lookup(cfg(cache).data, key)
      expires_at
    end

    defp set_clock(cache, time), do: :atomics.put(cfg(cache).clock, 1, time)

    test "is served until the clock reaches the deadline, and misses from then on", ctx do
      cache = start_cache(ctx)
      hold_clock(cache)
      :ok = Cache.put(cache, :k, %{small: true}, ttl: 60_000)
      deadline = expires_at(cache, :k)

      set_clock(cache, deadline - 1)
      assert Cache.fetch(cache, :k, fn -> {:ok, :loaded} end) == {:ok, %{small: true}}
      assert Cache.get(cache, :k) == %{small: true}

      set_clock(cache, deadline)
      assert Cache.get(cache, :k) == nil
      assert Cache.stats(cache).entries == 0
      assert %{l1_hits: 2, l1_misses: 1} = Cache.stats(cache)
      assert Cache.fetch(cache, :k, fn -> {:ok, :loaded} end) == {:ok, :loaded}
    end

    test "a large value and a value without a ttl go by the same rule", ctx do
      cache = :"#{ctx.test}"
      start_supervised!({Cache, name: cache, telemetry: false, local_copy_min_bytes: 100})
      hold_clock(cache)
      large = :binary.copy("x", 1_000)
      :ok = Cache.put(cache, :large, large, ttl: 60_000)
      :ok = Cache.put(cache, :forever, 1)
      [{_, _, deadline, {:large, _}, _}] = :ets.lookup(cfg(cache).data, :large)

      set_clock(cache, deadline - 1)
      assert Cache.get(cache, :large) == large
      set_clock(cache, deadline)
      assert Cache.get(cache, :large) == nil

      set_clock(cache, deadline + 1_000_000_000)
      assert Cache.get(cache, :forever) == 1
    end

    test "hits from many processes are each counted once", ctx do
      cache = start_cache(ctx)
      :ok = Cache.put(cache, :plain, 1)
      :ok = Cache.put(cache, :timed, 2, ttl: 3_600_000)
      processes = 16
      each = 1_000

      1..processes
      |> Enum.map(fn i ->
        Task.async(fn ->
          for j <- 1..each do
            key = if rem(i + j, 2) == 0, do: :plain, else: :timed
            {:ok, _} = Cache.fetch(cache, key, fn -> raise "a hit must not load" end)
          end
        end)
      end)
      |> Enum.each(&Task.await(&1, 60_000))

      assert %{l1_hits: hits, l1_misses: 0, loads: 0} = Cache.stats(cache)
      assert hits == processes * each
    end
  end
end
