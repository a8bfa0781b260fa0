defmodule Larder.Lock.WaitsTest do
  # Larder.Lock.Waits, the wait-for graph: a wait that would close a cycle
  # is refused (:cycle) and leaves no row; a wait that has ended (its
  # waiter gone from the awaited process's table, or dead) closes none.
  use ExUnit.Case, async: true

  import Larder.Test.Eventually

  alias Larder.Lock.Waits

  # Each "awaited" process takes its waiters from a :bag of {ref, waiter}.
  defp waiters, do: :ets.new(:waiters, [:bag, :public])

  # A process that waits for `awaited` (its row in, not yet ended) and
  # reports what wait_for/3 said; it waits until told to stop.
  defp waiter(awaited, tab) do
    test = self()

    pid =
      spawn(fn ->
        ref = make_ref()
        :ets.insert(tab, {ref, self()})
        send(test, {:waiting, self(), Waits.wait_for(awaited, tab, ref)})
        receive do: (:stop -> Waits.done())
      end)

    assert_receive {:waiting, ^pid, result}
    {pid, result}
  end

  defp row?(pid), do: :ets.member(Waits, pid)

  test "a wait with no cycle is recorded; done/0 deletes it" do
    tab = waiters()
    other = spawn(fn -> receive do: (:stop -> :ok) end)
    {pid, :ok} = waiter(other, tab)
    assert row?(pid)
    send(pid, :stop)
    eventually(fn -> not row?(pid) end)
    send(other, :stop)
  end

  test "the wait that closes a cycle of two is refused and leaves no row" do
    tab = waiters()
    {b, :ok} = waiter(self(), tab)
    ref = make_ref()
    :ets.insert(tab, {ref, self()})
    assert Waits.wait_for(b, tab, ref) == :cycle
    refute row?(self())
    send(b, :stop)
  end

  test "a cycle through a chain of processes is found" do
    tab = waiters()
    # c waits for the test, b for c, a for b: the test waiting for a closes it.
    {c, :ok} = waiter(self(), tab)
    {b, :ok} = waiter(c, tab)
    {a, :ok} = waiter(b, tab)
    ref = make_ref()
    :ets.insert(tab, {ref, self()})
    assert Waits.wait_for(a, tab, ref) == :cycle
    for pid <- [a, b, c], do: send(pid, :stop)
  end

  test "a wait that has ended does not make a cycle" do
    tab = waiters()
    {b, :ok} = waiter(self(), tab)
    # b's awaited process took its waiters: b's wait is over, its row not
    # yet deleted.
    :ets.delete_all_objects(tab)
    assert row?(b)
    ref = make_ref()
    :ets.insert(tab, {ref, self()})
    assert Waits.wait_for(b, tab, ref) == :ok
    assert Waits.done() == :ok
    send(b, :stop)
  end

  test "a dead waiter's row is forgotten, and never makes a cycle" do
    tab = waiters()
    {b, :ok} = waiter(self(), tab)
    ref = Process.monitor(b)
    Process.exit(b, :kill)
    assert_receive {:DOWN, ^ref, :process, ^b, :killed}
    own = make_ref()
    :ets.insert(tab, {own, self()})
    assert Waits.wait_for(b, tab, own) == :ok
    Waits.done()
    # The holder registry's janitor deletes the dead waiter's row.
    eventually(fn -> not row?(b) end)
    assert Waits.forget(self()) == :ok
  end

  test "a wait whose table is gone is over" do
    tab = waiters()
    {b, :ok} = waiter(self(), tab)
    :ets.delete(tab)
    tab2 = waiters()
    ref = make_ref()
    :ets.insert(tab2, {ref, self()})
    assert Waits.wait_for(b, tab2, ref) == :ok
    Waits.done()
    send(b, :stop)
  end

  test "a chain is followed for max_steps/0 steps: a longer cycle is not looked for to its end" do
    tab = waiters()
    steps = Waits.max_steps()

    # A chain of `length` waiting processes back to the test, closed by the
    # test's wait: found when the chain is at most max_steps long.
    close = fn length ->
      pids =
        Enum.reduce(1..length, [self()], fn _, [last | _] = acc ->
          {pid, :ok} = waiter(last, tab)
          [pid | acc]
        end)

      ref = make_ref()
      :ets.insert(tab, {ref, self()})
      result = Waits.wait_for(hd(pids), tab, ref)
      Waits.done()
      for pid <- pids, pid != self(), do: send(pid, :stop)
      result
    end

    assert close.(steps) == :cycle
    assert close.(steps + 1) == :ok
  end
end
