defmodule Larder.Replica.Target.BagTest do
  # A replica's Bag target on its own: the ops it takes, its writes in
  # order, when a snapshot may dump it while the replica writes
  # (deduplicating, fed by a pure function) and when not, and a dump of the
  # other dedup mode refused at load, its bag dropped.
  use ExUnit.Case, async: true

  alias Larder.Bag
  alias Larder.Replica.Target

  @moduletag :capture_log

  setup ctx do
    path = Path.join(System.tmp_dir!(), "larder-target-bag-#{System.unique_integer([:positive])}")
    on_exit(fn -> File.rm(path) end)
    target = Target.new!({Bag, name: :"#{ctx.test}"})
    %{target: target, bag: Target.create(target), path: path}
  end

  test "check/2 takes inserts of pairs and deletes of keys or pairs, in a proper list", ctx do
    assert Target.check(ctx.target, [{:insert, :k, 1}, {:delete, :k}, {:delete, :k, 1}])
    assert Target.check(ctx.target, [])
    refute Target.check(ctx.target, [{:insert, %{id: 1}}])
    refute Target.check(ctx.target, [{:insert, :k, 1} | :tail])
    refute Target.check(ctx.target, [{:put, :k, 1}])
  end

  test "write/2 applies the ops in order", ctx do
    ops = [{:insert, :a, 1}, {:insert, :a, 2}, {:delete, :a, 1}, {:insert, :b, 1}, {:delete, :b}]
    assert Target.write(ctx.target, ctx.bag, ops) == :ok
    assert Bag.lookup(ctx.bag, :a) == [2]
    assert Bag.lookup(ctx.bag, :b) == []
  end

  test "dumped concurrently only when deduplicating and fed by an arity-1 function", ctx do
    assert Target.dump_mode(ctx.target, 1) == :concurrent
    assert Target.dump_mode(ctx.target, 2) == :exclusive
    assert Target.dump_mode(Target.new!({Bag, dedup: false}), 1) == :exclusive
    assert Target.identity(ctx.target, :replica) == {:bag, ctx.test}
    assert Target.identity(Target.new!({Bag, []}), :replica) == {:bag, :replica}
  end

  test "a dump round trip, and a dump of the other mode refused at load, its bag dropped", ctx do
    :ok = Target.write(ctx.target, ctx.bag, [{:insert, :a, 1}])
    {:ok, cut} = Target.start_dump(ctx.target, ctx.bag, ctx.path, self())
    assert Target.finish_dump(ctx.target, ctx.bag, ctx.path, cut) == :ok
    Bag.drop(ctx.bag)

    assert {:ok, bag} = Target.load(ctx.target, ctx.path)
    assert Bag.lookup(bag, :a) == [1]
    Bag.drop(bag)

    other = Target.new!({Bag, name: ctx.test, dedup: false})

    assert {:error, %Larder.Error{reason: :definition_mismatch}} = Target.load(other, ctx.path)
    # the name is free again
    assert %Bag{} = Target.create(ctx.target)
  end
end
