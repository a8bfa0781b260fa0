defmodule Larder.Bag.OrderTest do
  # Larder.Bag.Order: a list of objects goes into a :duplicate_bag in list
  # order (ETS alone reverses a long list when the caller is low on
  # reductions), for lists of up to 8,000 objects.
  use ExUnit.Case, async: true

  alias Larder.Bag
  alias Larder.Bag.Order

  test "a batch's values of one key keep their order whatever reductions the caller has left" do
    # ETS takes a yielding path that reverses a list when the caller is
    # low on reductions; Larder.Bag.Order yields first. Burning a random
    # number of reductions before each call varies what is left. 8,000:
    # the longest batch whose order insert_many/2's doc promises.
    for {n, runs} <- [{40, 1_000}, {1_000, 200}, {8_000, 40}] do
      values = Enum.to_list(1..n)
      batch = for v <- values, do: {:k, v}

      for _ <- 1..runs do
        Enum.reduce(1..:rand.uniform(4_000), 0, &(&1 + &2))
        dedup = Bag.new()
        plain = Bag.new(dedup: false)
        Bag.insert_many(dedup, batch)
        Enum.reduce(1..:rand.uniform(4_000), 0, &(&1 + &2))
        Bag.insert_many(plain, batch)
        assert Bag.lookup(dedup, :k) == Enum.reverse(values)
        assert Bag.lookup(plain, :k) == values
        Bag.drop(dedup)
        Bag.drop(plain)
      end
    end
  end

  test "insert/2 keeps list order in a :duplicate_bag, a single object and duplicates too" do
    # Burning a random number of reductions before each call varies what
    # the caller has left, which decides the path ETS takes.
    for n <- [1, 2, 40, 1_000, 8_000], _ <- 1..20 do
      tab = :ets.new(:order, [:duplicate_bag, :public])
      objects = for v <- 1..n, do: {:k, rem(v, 7), v}
      Enum.reduce(1..:rand.uniform(4_000), 0, &(&1 + &2))
      assert Order.insert(tab, objects) == true
      assert :ets.lookup(tab, :k) == objects
      :ets.delete(tab)
    end
  end

  test "insert/2 of a list of several keys keeps each key's objects in list order" do
    tab = :ets.new(:order, [:duplicate_bag, :public])
    objects = for v <- 1..3_000, do: {rem(v, 3), v}
    Order.insert(tab, objects)

    for k <- 0..2 do
      assert :ets.lookup(tab, k) == Enum.filter(objects, &(elem(&1, 0) == k))
    end
  end
end
