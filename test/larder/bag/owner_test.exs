defmodule Larder.Bag.OwnerTest do
  # Larder.Bag.Owner, the process behind Larder.Bag.start_link/1: it holds
  # the bag's name and owns its table; a drop, a shutdown or a crash of the
  # owner frees the bag, and stray messages change nothing.
  use ExUnit.Case, async: true

  alias Larder.Bag
  alias Larder.Bag.Store

  # Not restarted, so that what an exit leaves can be seen.
  defp start(ctx) do
    name = :"#{ctx.test}"
    pid = start_supervised!(Supervisor.child_spec({Bag, name: name}, restart: :temporary))
    {name, pid, :persistent_term.get({Bag, name})}
  end

  test "the owner holds the name and owns the table", ctx do
    {name, pid, bag} = start(ctx)
    assert Larder.Instance.whereis(Bag, name) == pid
    assert :ets.info(bag.tab, :owner) == pid
    assert bag.owner == pid
    Bag.insert(name, :k, 1)
    assert Bag.lookup(name, :k) == [1]
  end

  test "a drop frees the bag and the owner exits normally", ctx do
    {name, pid, bag} = start(ctx)
    ref = Process.monitor(pid)
    assert Bag.drop(name) == :ok
    assert_receive {:DOWN, ^ref, :process, ^pid, :normal}
    assert Store.table(bag) == :gone
    assert Larder.Instance.whereis(Bag, name) == nil
  end

  test "a shutdown frees the bag and its fingerprint set", ctx do
    {name, _pid, bag} = start(ctx)
    Bag.insert_many(name, for(k <- 1..100, do: {k, k}))
    stop_supervised!({Bag, name})
    assert Store.table(bag) == :gone
    assert Larder.Native.bag_fps_count(bag.fps) == 0
    assert :persistent_term.get({Bag, name}, :none) == :none
  end

  test "a killed owner takes its table with it; the name can be taken again", ctx do
    {name, pid, bag} = start(ctx)
    ref = Process.monitor(pid)
    Process.exit(pid, :kill)
    assert_receive {:DOWN, ^ref, :process, ^pid, :killed}
    assert Store.table(bag) == :gone
    assert_raise ArgumentError, fn -> Bag.lookup(bag, :k) end
    assert %Bag{} = other = Bag.new(name: name)
    Bag.drop(other)
  end

  test "stray messages and calls leave the bag as it was", ctx do
    {name, pid, _bag} = start(ctx)
    Bag.insert(name, :k, 1)
    send(pid, :stray)
    send(pid, {:DOWN, make_ref(), :process, self(), :normal})
    _ = :sys.get_state(pid)
    assert Process.alive?(pid)
    assert Bag.lookup(name, :k) == [1]
  end
end
