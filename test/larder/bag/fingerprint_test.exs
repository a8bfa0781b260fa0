defmodule Larder.Bag.FingerprintTest do
  # Larder.Bag.Fingerprint: a pair's 64-bit fingerprint (key hash, value
  # hash), its batch encoding for the NIF, and a key's lock slot.
  use ExUnit.Case, async: true

  import Bitwise

  alias Larder.Bag.Fingerprint
  alias Larder.Test.PropEr

  test "a fingerprint is the key's hash over the value's, masked" do
    full = Fingerprint.full_mask()
    assert full == (1 <<< 32) - 1

    for {key, value} <- [{:a, 1}, {"k", %{x: [1, 2]}}, {{1, 2}, "v"}, {[], 0.5}] do
      whole = Fingerprint.whole(key, value, full)
      assert whole >>> 32 == :erlang.phash2(key)
      assert (whole &&& full) == :erlang.phash2(value, 1 <<< 32)
      assert Fingerprint.key_hash(key) == :erlang.phash2(key)
      assert Fingerprint.value_hash(value, full) == :erlang.phash2(value, 1 <<< 32)
      # A narrower mask keeps only its bits: 0 makes every value collide.
      assert Fingerprint.whole(key, value, 0) == :erlang.phash2(key) <<< 32
      assert Fingerprint.value_hash(value, 0xFF) == (:erlang.phash2(value, 1 <<< 32) &&& 0xFF)
    end
  end

  test "values that are =:= hash alike (0.0 and -0.0), so the exact check decides the rest" do
    assert Fingerprint.value_hash(0.0, Fingerprint.full_mask()) ==
             Fingerprint.value_hash(-0.0, Fingerprint.full_mask())
  end

  test "property: the batch binary is each pair's fingerprint as a big-endian u64, in order" do
    pair = {:proper_types.any(), :proper_types.any()}
    mask = :proper_types.oneof([0, 1, 0xFFFF, Fingerprint.full_mask()])

    PropEr.check(
      PropEr.forall({:proper_types.list(pair), mask}, fn {pairs, mask} ->
        expected = for {k, v} <- pairs, into: <<>>, do: <<Fingerprint.whole(k, v, mask)::64>>
        whole = for {k, v} <- pairs, do: Fingerprint.whole(k, v, mask)

        Fingerprint.binary(pairs, mask) == expected and
          Enum.all?(whole, &(&1 >= 0 and &1 < 1 <<< 59))
      end),
      max_size: 30
    )
  end

  test "slot/2 is 1-based and in range, the same for the same key" do
    for slots <- [1, 2, 7, 256], key <- [:a, 1, "x", {1, 2}, make_ref()] do
      slot = Fingerprint.slot(Fingerprint.key_hash(key), slots)
      assert slot in 1..slots
      assert slot == Fingerprint.slot(Fingerprint.key_hash(key), slots)
    end

    assert Fingerprint.slot(0, 256) == 1
    assert Fingerprint.slot(255, 256) == 256
    assert Fingerprint.slot(256, 256) == 1
  end
end
