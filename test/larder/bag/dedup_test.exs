defmodule Larder.Bag.DedupTest do
  # Larder.Bag.Dedup, the write protocol of a deduplicating bag: the table
  # holds each pair once (=:=, as ETS :bag), and the fingerprint set counts
  # every pair of the table; forced collisions go through the exact check;
  # a slot's shard is rebuilt from the table by repair/4.
  use ExUnit.Case, async: true

  alias Larder.Bag
  alias Larder.Bag.{Dedup, Fingerprint, Order}
  alias Larder.Native
  alias Larder.Test.PropEr

  test "forced fingerprint collisions: the exact check keeps set semantics" do
    # fp_mask: 0 gives every pair of a key the same fingerprint, so every
    # insert after a key's first goes through the exact check.
    bag = %{Bag.new() | mask: 0}
    ets = :ets.new(:model, [:bag])
    ops = for _ <- 1..3, k <- [:a, 1, 1.0], v <- [1, 2, 1.0, 0.0, -0.0, %{m: 1}], do: {k, v}

    for {{k, v}, i} <- Enum.with_index(ops) do
      if rem(i, 2) == 0,
        do: Bag.insert(bag, k, v),
        else: Bag.insert_many(bag, [{k, v}, {k, v}])

      :ets.insert(ets, {k, v})
    end

    for k <- [:a, 1, 1.0] do
      assert Bag.lookup(bag, k) == for({_, v} <- :ets.lookup(ets, k), do: v)
    end

    # Deleting one of several pairs sharing a fingerprint keeps the others
    # findable, and a deleted one can come back.
    Bag.delete(bag, :a, 2)
    Bag.insert(bag, :a, 1)
    assert Bag.lookup(bag, :a) == [1, 1.0, 0.0, %{m: 1}]
    Bag.insert(bag, :a, 2)
    assert Bag.lookup(bag, :a) == [1, 1.0, 0.0, %{m: 1}, 2]
    assert fingerprints(bag) == Bag.size(bag)
    Bag.delete(bag, :a)
    assert fingerprints(bag) == Bag.size(bag)

    # The same through a snapshot.
    path = Path.join(System.tmp_dir!(), "larder_collide_#{System.unique_integer([:positive])}")
    Bag.dump!(bag, path)
    copy = Bag.load!(path)
    File.rm!(path)
    assert Enum.to_list(Bag.stream(copy)) == Enum.to_list(Bag.stream(bag))
  end

  test "one key with enough values to make its fingerprint table big (resized on a dirty scheduler)" do
    bag = Bag.new()
    empty = Bag.memory(bag)
    ets_empty = :ets.info(bag.tab, :memory)
    # 70k fingerprints in one shard: past the 65,536-bucket table that a
    # normal-scheduler call may not resize.
    for v <- 1..70_000, do: Bag.insert(bag, :one, v)
    Bag.insert(bag, :one, 1)
    assert Bag.count(bag, :one) == 70_000
    assert fingerprints(bag) == 70_000
    Bag.delete(bag, :one)
    assert Bag.size(bag) == 0 and fingerprints(bag) == 0
    # The fingerprint table shrank back (the ETS table keeps some buckets).
    assert Bag.memory(bag) - :ets.info(bag.tab, :memory) == empty - ets_empty

    # Single adds and removes answer :dirty instead of resizing it on a
    # normal scheduler; their dirty variants do it.
    alias Larder.Native
    set = Native.bag_fps_new(1)

    dirty = fn call, dirty_call, v ->
      with :dirty <- call.(set, 7, v), do: {:dirty, dirty_call.(set, 7, v)}
    end

    adds = for v <- 1..70_000, do: dirty.(&Native.bag_fps_add/3, &Native.bag_fps_add_dirty/3, v)
    assert {:dirty, true} in adds
    # A shard keeps 32 bits of each fingerprint: among 70k, about one pair
    # of them collides there (add answers false, the value is present).
    assert Enum.all?(adds, &(&1 in [true, false, {:dirty, true}, {:dirty, false}]))
    assert Enum.count(adds, &(&1 in [false, {:dirty, false}])) <= 5

    removes =
      for v <- 1..70_000,
          do: dirty.(&Native.bag_fps_remove/3, &Native.bag_fps_remove_dirty/3, v)

    assert {:dirty, :ok} in removes and Enum.all?(removes, &(&1 in [:ok, {:dirty, :ok}]))
    assert_fps_emptied(set, 1)
  end

  describe "against an ETS :bag (PropEr)" do
    # A value and a key drawn from few terms, some =:= and some == only, so
    # that pairs repeat and collide; the mask narrows the value hash down to
    # nothing (every pair of a key collides) or keeps all of it.
    defp term_gen, do: :proper_types.oneof([1, 1.0, 0.0, -0.0, :a, "a", {1}, [1], %{a: 1}])

    defp op_gen do
      pair = {term_gen(), term_gen()}

      :proper_types.frequency([
        {4, {:insert, pair}},
        {3, {:insert_many, :proper_types.list(pair)}},
        {2, {:delete, pair}},
        {1, {:delete_key, term_gen()}},
        {1, {:load, :proper_types.list(pair)}},
        {1, {:stale, pair}}
      ])
    end

    test "every sequence of writes leaves the table an ETS :bag's and the set counting it" do
      PropEr.check(
        PropEr.forall(
          {:proper_types.list(op_gen()), :proper_types.oneof([0, 1, Fingerprint.full_mask()])},
          fn {ops, mask} -> run(ops, mask) end
        ),
        numtests: 300
      )
    end

    defp run(ops, mask) do
      tab = :ets.new(:dedup, [:duplicate_bag, :public])
      model = :ets.new(:model, [:bag])
      {fps, lock} = Dedup.new()

      try do
        Enum.each(ops, fn op -> apply_op(op, tab, model, fps, lock, mask) end)
        keys = for k <- :ets.select(tab, [{{:"$1", :_}, [], [:"$1"]}]), uniq: true, do: k

        # Same pairs in the same order per key, and the set counts exactly
        # the table (a stale extra count was repaired away).
        :proper.equals(
          {Enum.sort(:ets.tab2list(tab)), per_key(tab, keys), Native.bag_fps_count(fps)},
          {Enum.sort(:ets.tab2list(model)), per_key(model, keys), :ets.info(tab, :size)}
        )
      after
        Dedup.free(fps)
        :ets.delete(tab)
        :ets.delete(model)
      end
    end

    defp per_key(tab, keys), do: for(k <- keys, do: :ets.lookup(tab, k))

    defp apply_op({:insert, {k, v}}, tab, model, fps, lock, mask) do
      Dedup.insert(tab, fps, lock, mask, k, v)
      :ets.insert(model, {k, v})
    end

    defp apply_op({:insert_many, pairs}, tab, model, fps, lock, mask) do
      Dedup.insert_many(tab, fps, lock, mask, pairs)
      :ets.insert(model, pairs)
    end

    defp apply_op({:delete, {k, v}}, tab, model, fps, lock, mask) do
      Dedup.delete(tab, fps, lock, mask, k, v)
      :ets.delete_object(model, {k, v})
    end

    defp apply_op({:delete_key, k}, tab, model, fps, lock, mask) do
      Dedup.delete_key(tab, fps, lock, mask, k)
      :ets.delete(model, k)
    end

    # A snapshot's chunk loaded into the bag: load/4 says which pairs go in,
    # in the file's order (each pair after those before it).
    defp apply_op({:load, pairs}, tab, model, fps, _lock, mask) do
      Order.insert(tab, Dedup.load(tab, fps, mask, pairs))
      for pair <- pairs, do: :ets.insert(model, pair)
    end

    # What a writer killed between its two steps leaves: a fingerprint
    # counted with no pair in the table. The slot's next writer after a
    # takeover repairs the shard; here repair/4 runs at once.
    defp apply_op({:stale, {k, v}}, tab, _model, fps, _lock, mask) do
      hash = Fingerprint.key_hash(k)
      Native.bag_fps_incr(fps, hash, Fingerprint.value_hash(v, mask))
      Dedup.repair(tab, fps, mask, Fingerprint.slot(hash, 256))
    end
  end

  test "repair/4 rebuilds one slot's shard from the table and leaves the others" do
    tab = :ets.new(:dedup, [:duplicate_bag, :public])
    {fps, lock} = Dedup.new()
    mask = Fingerprint.full_mask()
    for k <- 1..500, do: Dedup.insert(tab, fps, lock, mask, k, k)
    assert Native.bag_fps_count(fps) == 500

    # Stale counts in the shard of key 1's slot, and in another slot's.
    slot = Fingerprint.slot(Fingerprint.key_hash(1), 256)

    other = Enum.find(2..500, &(Fingerprint.slot(Fingerprint.key_hash(&1), 256) != slot))

    Native.bag_fps_incr(fps, Fingerprint.key_hash(1), Fingerprint.value_hash(:gone, mask))
    Native.bag_fps_incr(fps, Fingerprint.key_hash(other), Fingerprint.value_hash(:gone, mask))
    assert Native.bag_fps_count(fps) == 502

    assert Dedup.repair(tab, fps, mask, slot) == :ok
    assert Native.bag_fps_count(fps) == 501
    # Idempotent.
    assert Dedup.repair(tab, fps, mask, slot) == :ok
    assert Native.bag_fps_count(fps) == 501
  end

  test "free/1 empties every shard; bytes/1 counts the set and the lock" do
    tab = :ets.new(:dedup, [:duplicate_bag, :public])
    {fps, lock} = Dedup.new()
    empty = Dedup.bytes(fps)
    assert empty >= 256 * 8
    Dedup.insert_many(tab, fps, lock, Fingerprint.full_mask(), for(k <- 1..5_000, do: {k, k}))
    assert Dedup.bytes(fps) > empty
    assert Dedup.free(fps) == :ok
    assert Native.bag_fps_count(fps) == 0
    assert Dedup.bytes(fps) == empty
  end

  defp fingerprints(%Bag{fps: fps}), do: Native.bag_fps_count(fps)

  # The fingerprint set of `shards` shards holds nothing and has shrunk back
  # to a new one's memory.
  defp assert_fps_emptied(set, shards) do
    assert Native.bag_fps_count(set) == 0
    assert Native.bag_fps_memory(set) == Native.bag_fps_memory(Native.bag_fps_new(shards))
  end
end
