defmodule Larder.Bag.StoreTest do
  # Larder.Bag.Store: how a bag is made (its table, its fingerprint set, its
  # name claimed and published), filled from a snapshot's chunks, and freed
  # once, whoever frees it; and what a handle's table is now.
  use ExUnit.Case, async: true

  alias Larder.Bag
  alias Larder.Bag.Store
  alias Larder.Native

  @defaults [
    name: nil,
    dedup: true,
    read_concurrency: false,
    write_concurrency: false,
    compressed: false,
    telemetry: false
  ]

  defp create(opts), do: Store.create(Keyword.merge(@defaults, opts))

  test "create/2 makes a public :duplicate_bag, with a fingerprint set when it deduplicates" do
    bag = create([])
    assert :ets.info(bag.tab, :type) == :duplicate_bag
    assert :ets.info(bag.tab, :protection) == :public
    assert :ets.info(bag.tab, :owner) == self()
    assert bag.dedup and is_reference(bag.fps) and bag.mask == Larder.Bag.Fingerprint.full_mask()
    assert Store.table(bag) == :bag

    plain = create(dedup: false, compressed: true, read_concurrency: true)
    refute plain.dedup
    assert plain.fps == nil and plain.lock == nil
    assert :ets.info(plain.tab, :compressed)
    assert :ets.info(plain.tab, :read_concurrency)
    assert Store.table(plain) == :bag
  end

  test "create/2 claims and publishes a name for the caller; a taken name raises", ctx do
    name = :"#{ctx.test}"
    bag = create(name: name)
    assert Larder.Instance.whereis(Bag, name) == self()
    assert :persistent_term.get({Bag, name}) == bag
    assert_raise ArgumentError, ~r/#{inspect(name)}/, fn -> create(name: name) end

    assert Store.destroy(bag) == :ok
    assert Larder.Instance.whereis(Bag, name) == nil
    assert :persistent_term.get({Bag, name}, :none) == :none
    # The name is free again.
    assert %Bag{} = again = create(name: name)
    Store.destroy(again)
  end

  test "destroy/1 frees the table and the fingerprint set once; again it does nothing" do
    bag = create([])
    Bag.insert_many(bag, for(k <- 1..1_000, do: {k, k}))
    assert Native.bag_fps_count(bag.fps) == 1_000

    assert Store.destroy(bag) == :ok
    assert :ets.info(bag.tab) == :undefined
    assert Native.bag_fps_count(bag.fps) == 0
    assert Store.table(bag) == :gone
    assert Store.destroy(bag) == :ok
  end

  test "destroy/1 from another process than the table's owner frees it too" do
    bag = create([])
    assert Task.await(Task.async(fn -> Store.destroy(bag) end)) == :ok
    assert Store.table(bag) == :gone
  end

  test "table/1 tells a handle whose table is not a bag's (forged) from a gone one" do
    bag = create([])
    set = :ets.new(:set, [:set, :public])
    protected = :ets.new(:protected, [:duplicate_bag, :protected])
    assert Store.table(%{bag | tab: set}) == :other
    assert Store.table(%{bag | tab: protected}) == :other
    assert Store.table(%{bag | fps: make_ref()}) == :other
    assert_raise ArgumentError, fn -> Store.destroy(%{bag | tab: set}) end
    # Nothing was freed by the refused destroy.
    assert :ets.info(set, :type) == :set
  end

  test "insert_loaded/2: a deduplicating bag skips pairs it holds or the chunk repeats" do
    bag = create([])
    Bag.insert(bag, :k, 1)
    Store.insert_loaded(bag, [{:k, 1}, {:k, 2}, {:k, 2}, {:k, 1.0}, {:j, 3}])
    assert Bag.lookup(bag, :k) == [1, 2, 1.0]
    assert Bag.lookup(bag, :j) == [3]
    assert Native.bag_fps_count(bag.fps) == Bag.size(bag)

    plain = create(dedup: false)
    Store.insert_loaded(plain, [{:k, 1}, {:k, 1}])
    assert Bag.lookup(plain, :k) == [1, 1]
  end
end
