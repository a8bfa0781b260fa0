defmodule Larder.LockTest do
  use ExUnit.Case, async: true

  import Larder.Test.Scheduler, only: [yields: 1]

  alias Larder.Lock
  alias Larder.Lock.Holders

  describe "mutual exclusion" do
    test "many processes on one slot never overlap and lose no increment" do
      lock = Lock.new(1)
      inside = :atomics.new(1, signed: true)
      counter = :ets.new(:counter, [:public])
      :ets.insert(counter, {:n, 0})
      overlaps = :atomics.new(1, signed: true)

      tasks =
        for _ <- 1..16 do
          Task.async(fn ->
            for _ <- 1..500 do
              Lock.with_slot(lock, 1, fn -> flunk("nobody died") end, fn ->
                if :atomics.add_get(inside, 1, 1) != 1, do: :atomics.add(overlaps, 1, 1)
                [{:n, n}] = :ets.lookup(counter, :n)
                :erlang.yield()
                :ets.insert(counter, {:n, n + 1})
                :atomics.sub(inside, 1, 1)
              end)
            end
          end)
        end

      Enum.each(tasks, &Task.await(&1, 120_000))
      assert :ets.lookup(counter, :n) == [{:n, 8_000}]
      assert :atomics.get(overlaps, 1) == 0
      assert :atomics.get(lock.atomics, 1) == 0
    end

    test "slots are independent, and keys map to slots in range" do
      lock = Lock.new(8)
      for key <- [:a, 1, "b", {:c}, [1 | 2], self()], do: assert(Lock.slot(lock, key) in 1..8)
      assert Lock.slot(lock, {:x, 1}) == Lock.slot(lock, {:x, 1})

      assert Lock.acquire(lock, 1) == :acquired
      parent = self()

      spawn_link(fn ->
        send(parent, {:other, Lock.with_slot(lock, 2, fn -> :took end, fn -> :ran end)})
      end)

      assert_receive {:other, :ran}, 5_000
      assert Lock.release(lock, 1) == :ok
      assert :atomics.get(lock.atomics, 1) == 0
    end

    test "acquire waits for a live holder's release" do
      lock = Lock.new(1)
      assert Lock.acquire(lock, 1) == :acquired
      parent = self()
      waiter = spawn_link(fn -> send(parent, {:got, Lock.acquire(lock, 1)}) end)
      refute_receive {:got, _}, 50
      assert Process.alive?(waiter)
      :ok = Lock.release(lock, 1)
      assert_receive {:got, :acquired}, 5_000
    end

    test "release/2 by a process that does not hold the slot leaves it held" do
      lock = Lock.new(1)
      :acquired = Lock.acquire(lock, 1)
      held = :atomics.get(lock.atomics, 1)
      assert Task.await(Task.async(fn -> Lock.release(lock, 1) end)) == :ok
      assert :atomics.get(lock.atomics, 1) == held
      :ok = Lock.release(lock, 1)
    end

    test "with_slot/5 stops waiting when overtaken, without running fun or taking the slot" do
      lock = Lock.new(1)
      :acquired = Lock.acquire(lock, 1)
      go = :atomics.new(1, signed: false)
      overtaken = fn -> if :atomics.get(go, 1) == 1, do: {:overtaken, :skipped}, else: false end

      waiter =
        Task.async(fn -> Lock.with_slot(lock, 1, fn -> :ok end, fn -> :ran end, overtaken) end)

      refute Task.yield(waiter, 50)
      :atomics.put(go, 1, 1)
      assert Task.await(waiter) == :skipped
      # still held by this process
      assert Lock.holder(lock, 1) == :alive
      :ok = Lock.release(lock, 1)
      # a free slot is taken at once; overtaken is never asked
      assert Lock.with_slot(lock, 1, fn -> :ok end, fn -> :ran end, fn -> raise "asked" end) ==
               :ran
    end

    test "with_slot/4 releases when fun raises or throws" do
      lock = Lock.new(1)

      assert_raise RuntimeError, fn ->
        Lock.with_slot(lock, 1, fn -> :ok end, fn -> raise "x" end)
      end

      assert :atomics.get(lock.atomics, 1) == 0
      assert catch_throw(Lock.with_slot(lock, 1, fn -> :ok end, fn -> throw(:t) end)) == :t
      assert :atomics.get(lock.atomics, 1) == 0
    end
  end

  describe "with_slots/4" do
    test "holds every slot while fun runs and releases them all after" do
      lock = Lock.new(8)
      parent = self()

      result =
        Lock.with_slots(lock, [2, 5, 7], fn _ -> flunk("nobody died") end, fn ->
          for slot <- 1..8, do: send(parent, {slot, Lock.holder(lock, slot)})
          :ran
        end)

      assert result == :ran
      for slot <- [2, 5, 7], do: assert_received({^slot, :alive})
      for slot <- [1, 3, 4, 6, 8], do: assert_received({^slot, :free})
      for slot <- 1..8, do: assert(:atomics.get(lock.atomics, slot) == 0)
      assert Lock.with_slots(lock, [], fn _ -> :ok end, fn -> :empty end) == :empty
    end

    test "batches of overlapping slot sets never overlap on a slot and never deadlock" do
      lock = Lock.new(6)
      inside = :atomics.new(6, signed: true)
      overlaps = :atomics.new(1, signed: true)

      tasks =
        for _ <- 1..8 do
          Task.async(fn ->
            for _ <- 1..300 do
              slots = Enum.filter(1..6, fn _ -> :rand.uniform(2) == 1 end)

              Lock.with_slots(lock, slots, fn _ -> flunk("nobody died") end, fn ->
                for s <- slots,
                    :atomics.add_get(inside, s, 1) != 1,
                    do: :atomics.add(overlaps, 1, 1)

                :erlang.yield()
                for s <- slots, do: :atomics.sub(inside, s, 1)
              end)
            end
          end)
        end

      Enum.each(tasks, &Task.await(&1, 120_000))
      assert :atomics.get(overlaps, 1) == 0
      for slot <- 1..6, do: assert(:atomics.get(lock.atomics, slot) == 0)
    end

    test "runs on_takeover for each slot a dead holder left, and releases on raise" do
      lock = Lock.new(4)
      parent = self()

      kill(holding(&Lock.with_slots(lock, [1, 3], fn _ -> :ok end, &1)))

      assert Lock.with_slots(lock, [1, 2, 3], &send(parent, {:took_over, &1}), fn -> :ran end) ==
               :ran

      assert_received {:took_over, 1}
      assert_received {:took_over, 3}
      refute_received {:took_over, _}

      assert_raise RuntimeError, fn ->
        Lock.with_slots(lock, [2, 4], fn _ -> :ok end, fn -> raise "x" end)
      end

      for slot <- 1..4, do: assert(:atomics.get(lock.atomics, slot) == 0)
    end

    test "a slot list that is not strictly increasing, or out of range, raises and holds nothing" do
      lock = Lock.new(4)
      ok = fn -> :ok end

      for bad <- [[2, 1], [1, 1], [0], [5], [1, :a], [1 | 2], :x] do
        assert_raise ArgumentError, ~r/slots/, fn ->
          Lock.with_slots(lock, bad, fn _ -> :ok end, ok)
        end

        for slot <- 1..4, do: assert(:atomics.get(lock.atomics, slot) == 0)
      end

      assert_raise ArgumentError, ~r/got: \[1, 3, 2\]/, fn ->
        Lock.with_slots(lock, [1, 3, 2], fn _ -> :ok end, ok)
      end

      assert_raise ArgumentError, ~r/on_takeover/, fn -> Lock.with_slots(lock, [1], ok, ok) end

      assert_raise ArgumentError, ~r/lock/, fn ->
        Lock.with_slots(:x, [1], fn _ -> :ok end, ok)
      end

      # A slot the caller holds already raises too, and releases the others.
      assert_raise ArgumentError, ~r/already held by this process/, fn ->
        Lock.with_slot(lock, 3, ok, fn -> Lock.with_slots(lock, [1, 3], fn _ -> :ok end, ok) end)
      end

      for slot <- 1..4, do: assert(:atomics.get(lock.atomics, slot) == 0)
    end
  end

  describe "takeover" do
    test "a holder that dies holding the slot is taken over, and on_takeover runs once" do
      lock = Lock.new(1)
      parent = self()

      for _ <- 1..200 do
        kill(holding(&Lock.with_slot(lock, 1, fn -> :ok end, &1)))

        assert Lock.with_slot(lock, 1, fn -> send(parent, :took_over) end, fn -> :ran end) == :ran
        assert_received :took_over
        refute_received :took_over
        # The next holder finds a released slot.
        assert Lock.with_slot(lock, 1, fn -> send(parent, :took_over) end, fn -> :ran end) == :ran
        refute_received :took_over
      end
    end

    test "when on_takeover raises, the next acquirer takes over and repairs again" do
      lock = Lock.new(1)
      parent = self()

      kill(holding(&acquire_then(lock, &1)))

      assert_raise RuntimeError, "repair failed", fn ->
        Lock.with_slot(lock, 1, fn -> raise "repair failed" end, fn -> flunk("ran") end)
      end

      assert Lock.with_slot(lock, 1, fn -> send(parent, :repaired) end, fn -> :ran end) == :ran
      assert_received :repaired
      assert :atomics.get(lock.atomics, 1) == 0
    end

    test "a holder that exits after releasing is not taken over" do
      lock = Lock.new(1)
      Task.await(Task.async(fn -> Lock.with_slot(lock, 1, fn -> :ok end, fn -> :ok end) end))
      assert Lock.acquire(lock, 1) == :acquired
      :ok = Lock.release(lock, 1)
    end

    test "a waiter takes over when the holder is killed while it waits" do
      lock = Lock.new(1)
      parent = self()

      holder = holding(&acquire_then(lock, &1))
      waiter = spawn_link(fn -> send(parent, {:got, Lock.acquire(lock, 1)}) end)
      refute_receive {:got, _}, 50
      kill(holder)
      assert_receive {:got, :taken_over}, 5_000
      refute Process.alive?(waiter)
    end

    # Workers loop on one slot and are killed at arbitrary points (suspended,
    # then killed). on_takeover must run exactly when the killed worker held
    # the slot, which the slot itself shows while the worker is suspended.
    test "kills at arbitrary points: on_takeover runs exactly when the dead held the slot" do
      lock = Lock.new(1)
      parent = self()
      took_over = :counters.new(1, [])

      {held, free} =
        Enum.reduce(1..2_000, {0, 0}, fn i, {held, free} ->
          worker =
            spawn(fn ->
              send(parent, {:id, Holders.id()})
              loop_with_slot(lock, 0)
            end)

          assert_receive {:id, id}, 5_000
          yields(rem(i, 4))
          :erlang.suspend_process(worker)
          holding? = :atomics.get(lock.atomics, 1) == id
          kill(worker)

          before = :counters.get(took_over, 1)
          Lock.with_slot(lock, 1, fn -> :counters.add(took_over, 1, 1) end, fn -> :ok end)
          assert :counters.get(took_over, 1) - before == if(holding?, do: 1, else: 0)
          if holding?, do: {held + 1, free}, else: {held, free + 1}
        end)

      # Both cases happened.
      assert held > 0
      assert free > 0
    end

    test "concurrent waiters: exactly one takes a dead holder's slot over" do
      lock = Lock.new(1)
      parent = self()

      for _ <- 1..50 do
        holder = holding(&acquire_then(lock, &1))

        waiters =
          for _ <- 1..4 do
            spawn_link(fn ->
              took = fn -> send(parent, :took_over) end
              send(parent, {:waiter, Lock.with_slot(lock, 1, took, fn -> :ran end)})
            end)
          end

        kill(holder)
        for _ <- waiters, do: assert_receive({:waiter, :ran}, 5_000)
        assert_received :took_over
        refute_received :took_over
      end
    end
  end

  describe "bad arguments raise ArgumentError naming them" do
    test "new/1" do
      # new/1's documented bound: 2^20 slots.
      max_slots = 1_048_576

      for bad <- [0, -1, :x, 1.0, nil, max_slots + 1, 10 ** 12] do
        assert_raise ArgumentError, ~r/slots/, fn -> Lock.new(bad) end
      end

      assert %Lock{} = Lock.new(max_slots)
    end

    test "slot/2, acquire/2, release/2, with_slot/4" do
      lock = Lock.new(4)
      ok = fn -> :ok end

      for bad_lock <- [:x, nil, {:lock}, %{atomics: nil, slots: 1}] do
        assert_raise ArgumentError, ~r/lock/, fn -> Lock.slot(bad_lock, :k) end
        assert_raise ArgumentError, ~r/lock/, fn -> Lock.acquire(bad_lock, 1) end
        assert_raise ArgumentError, ~r/lock/, fn -> Lock.release(bad_lock, 1) end
        assert_raise ArgumentError, ~r/lock/, fn -> Lock.with_slot(bad_lock, 1, ok, ok) end
      end

      for bad_slot <- [0, 5, -1, :a, 1.0, nil, 2 ** 70] do
        assert_raise ArgumentError, ~r/slot/, fn -> Lock.acquire(lock, bad_slot) end
        assert_raise ArgumentError, ~r/slot/, fn -> Lock.release(lock, bad_slot) end
        assert_raise ArgumentError, ~r/slot/, fn -> Lock.with_slot(lock, bad_slot, ok, ok) end
      end

      assert_raise ArgumentError, ~r/on_takeover/, fn -> Lock.with_slot(lock, 1, :x, ok) end
      assert_raise ArgumentError, ~r/fun/, fn -> Lock.with_slot(lock, 1, ok, fn _ -> :ok end) end
      assert_raise ArgumentError, ~r/overtaken/, fn -> Lock.with_slot(lock, 1, ok, ok, :x) end
      for slot <- 1..4, do: assert(:atomics.get(lock.atomics, slot) == 0)
    end

    test "a nested acquire of a held slot raises instead of waiting for ever" do
      lock = Lock.new(1)

      assert_raise ArgumentError, ~r/already held by this process/, fn ->
        Lock.with_slot(lock, 1, fn -> :ok end, fn -> Lock.acquire(lock, 1) end)
      end

      assert :atomics.get(lock.atomics, 1) == 0
    end
  end

  # Yields inside the slot on even rounds, outside it on odd ones, so that a
  # suspension finds the worker holding the slot or not.
  defp loop_with_slot(lock, n) do
    Lock.with_slot(lock, 1, fn -> :ok end, fn -> if rem(n, 2) == 0, do: :erlang.yield() end)
    if rem(n, 2) == 1, do: :erlang.yield()
    loop_with_slot(lock, n + 1)
  end

  # A process that runs `hold.(sleep)`, where `sleep` tells the test it holds
  # what `hold` took and then sleeps for ever; returns once it holds.
  defp holding(hold) do
    parent = self()

    holder =
      spawn(fn ->
        hold.(fn ->
          send(parent, :holding)
          Process.sleep(:infinity)
        end)
      end)

    assert_receive :holding, 5_000
    holder
  end

  defp acquire_then(lock, fun) do
    :acquired = Lock.acquire(lock, 1)
    fun.()
  end

  defp kill(pid) do
    ref = Process.monitor(pid)
    Process.exit(pid, :kill)
    assert_receive {:DOWN, ^ref, :process, ^pid, _}, 5_000
  end
end
