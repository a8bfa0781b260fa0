defmodule Larder.Cache.RepairsTest do
  # The owner's pending L2 repairs as a value: the bound on pending keys
  # (the Redis fault test checks the same against a paused server).
  use ExUnit.Case, async: true

  alias Larder.Cache.Repairs

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
end
