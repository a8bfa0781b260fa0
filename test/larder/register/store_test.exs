defmodule Larder.Register.StoreTest do
  # Larder.Register.Store, the storage protocol: a record per key and a
  # commit counter per slot; readers return only committed records; what a
  # killed writer left is committed by the slot's next holder; a waiting
  # put may end without writing once a write of its key committed.
  use ExUnit.Case, async: true

  alias Larder.Register
  alias Larder.Register.Store

  test "a tombstone left by a killed delete reads as absent and is dropped" do
    reg = Register.new()
    :ok = Register.put(reg, :k, 1)
    tab = reg.tab
    # What delete/2 leaves when killed after committing its tombstone
    # (version 1, at or below the slot counter) and before dropping it.
    :ets.insert(tab, {:k, 1})
    Register.forget(reg)
    assert Register.get(reg, :k, :none) == :none
    assert :ets.lookup(tab, :k) == []
    assert Register.size(reg) == 0
    assert Register.keys(reg) == []
  end

  test "a write left half done by a dead lock holder is committed by the next lock holder" do
    reg = Register.new(slots: 1)
    :ok = Register.put(reg, :a, :old)
    assert Register.get(reg, :a) == :old
    # White box: what a writer killed between its insert and its bump
    # leaves - a record above the slot counter, and the slot held by the
    # holder id of a dead process.
    %{tab: tab, lock: lock, versions: versions} = reg
    dead_id = Task.await(Task.async(&Larder.Lock.Holders.id/0))
    tag = :atomics.get(versions, 1)
    :ets.insert(tab, {:a, tag + 1, :new})
    :atomics.put(lock.atomics, 1, dead_id)

    # The half-done write is not visible to a process holding a copy...
    assert Register.get(reg, :a) == :old
    # ...until a writer of the slot takes the lock over, even one that
    # then writes nothing (deleting an absent key).
    :ok = Register.delete(reg, :absent)
    task = Task.async(fn -> Register.get(reg, :a) end)
    assert Task.await(task, 5_000) == :new
    assert Register.get(reg, :a) == :new
    assert :atomics.get(lock.atomics, 1) == 0
  end

  test "a put waiting for its slot ends without writing once another write of its key commits" do
    reg = Register.new(slots: 1)
    :ok = Register.put(reg, :a, :old)
    # White box: this process plays a writer of :a that holds the slot.
    %{tab: tab, lock: lock, versions: versions} = reg
    :acquired = Larder.Lock.acquire(lock, 1)
    waiter = Task.async(fn -> Register.put(reg, :a, :waiter) end)
    refute Task.yield(waiter, 100)

    # The holder commits its write of :a: the waiting put is overtaken
    # and returns while the slot is still held, without writing.
    tag = :atomics.get(versions, 1)
    :ets.insert(tab, {:a, tag + 1, :holder})
    :ok = :atomics.compare_exchange(versions, 1, tag, tag + 1)
    assert Task.await(waiter, 5_000) == :ok
    assert :ets.lookup(tab, :a) == [{:a, tag + 1, :holder}]
    assert Register.get(reg, :a) == :holder
    :ok = Larder.Lock.release(lock, 1)
  end

  test "a put waiting for its slot while another key of the slot is written still writes" do
    reg = Register.new(slots: 1)
    :ok = Register.put(reg, :a, :old)
    %{tab: tab, lock: lock, versions: versions} = reg
    :acquired = Larder.Lock.acquire(lock, 1)
    waiter = Task.async(fn -> Register.put(reg, :a, :waiter) end)

    # The holder writes :b; an uncommitted write of :a proves nothing yet.
    tag = :atomics.get(versions, 1)
    :ets.insert(tab, {:b, tag + 1, :b})
    :ok = :atomics.compare_exchange(versions, 1, tag, tag + 1)
    :ets.insert(tab, {:a, tag + 2, :uncommitted})
    refute Task.yield(waiter, 100)
    # The holder drops its write of :a (as a conflicting update would not
    # have made it) and leaves: the waiter takes the slot and writes.
    :ets.insert(tab, {:a, tag, :old})
    :ok = Larder.Lock.release(lock, 1)
    assert Task.await(waiter, 5_000) == :ok
    assert Register.get(reg, :a) == :waiter
    assert Register.get(reg, :b) == :b
  end

  test "keys sharing a slot never see each other's values" do
    reg = Register.new(slots: 1)
    for i <- 1..50, do: :ok = Register.put(reg, i, {:v, i})

    for round <- 1..3, i <- 1..50 do
      assert Register.get(reg, i) == {:v, i}
      if rem(i, 7) == round, do: :ok = Register.put(reg, i, {:v, i})
    end
  end

  test "swap/4 writes only over the expected version (nil: absent)" do
    reg = Register.new(slots: 4)
    assert {slot, 1} = Store.swap(reg, :k, nil, :a)
    assert slot == Store.slot(reg, :k)
    assert Store.swap(reg, :k, nil, :b) == :conflict
    assert {:ok, 1, :a} = Store.read(reg, :k)
    assert {^slot, 2} = Store.swap(reg, :k, 1, :b)
    assert Store.swap(reg, :k, 1, :c) == :conflict
    assert {:ok, 2, :b} = Store.read(reg, :k)
  end

  test "remove/2 of an absent key writes nothing; of a present one leaves no record" do
    reg = Register.new(slots: 1)
    assert {1, 0} = Store.remove(reg, :absent)
    assert {1, 1} = Store.write(reg, :k, :v)
    assert {1, 2} = Store.remove(reg, :k)
    assert :ets.lookup(reg.tab, :k) == []
    assert Store.read(reg, :k) == :error
  end

  test "slot/2 is in 1..slots" do
    reg = Register.new(slots: 3)
    for key <- [:a, 1, "x", {1}, make_ref()], do: assert(Store.slot(reg, key) in 1..3)
  end

  test "kill/1 marks every slot dead first: reads and writes then raise unknown Larder.Register" do
    {:ok, pid} = Register.start_link(name: :"#{__MODULE__}.kill")
    reg = GenServer.call(pid, :handle)
    {_slot, _version} = Store.write(reg, :k, 1)
    :ok = Register.drop(reg)
    assert Enum.all?(1..reg.slots, &(:atomics.get(reg.versions, &1) == -1))
    assert_raise ArgumentError, ~r/unknown Larder.Register/, fn -> Store.read(reg, :k) end
    assert_raise ArgumentError, ~r/unknown Larder.Register/, fn -> Store.write(reg, :k, 2) end
  end
end
