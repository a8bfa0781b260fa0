# The 64-bit fingerprint of a Larder.Bag pair and the lock slot of its key.
defmodule Larder.Bag.Fingerprint do
  @moduledoc false

  # A fingerprint is key_hash <<< 32 ||| value_hash, with
  # key_hash = phash2(key) (27 bits) and value_hash = phash2(value, 2^32):
  # two pairs share one only if both their keys' and their values' hashes
  # do. The key hash takes phash2/1, which is cheaper than phash2/2: it only
  # spreads keys over lock slots and NIF shards, while the 32-bit value hash
  # tells a key's values apart. A whole fingerprint (below 2^59) is a small
  # integer.
  # erlang:phash2/2 agrees with =:= (0.0 and -0.0 hash alike; 1 and 1.0
  # need not) and is a trapping BIF, so a huge term never blocks a
  # scheduler. The key hash alone picks the lock slot, so every fingerprint
  # of a key lives in the NIF shard of the slot its writers hold.
  #
  # Erlang passes a single fingerprint to the NIF as its two halves (small
  # integers; the whole would be a bignum), and a batch as a binary of
  # big-endian u64.

  import Bitwise, only: [<<<: 2, &&&: 2, |||: 2]

  @range 1 <<< 32

  @doc "The mask that keeps every bit of the value hash (tests narrow it to force collisions)."
  @spec full_mask() :: non_neg_integer()
  def full_mask, do: @range - 1

  @doc "The key half of a fingerprint."
  @spec key_hash(term()) :: non_neg_integer()
  def key_hash(key), do: :erlang.phash2(key)

  @doc "The value half of a fingerprint, ANDed with `mask`."
  @spec value_hash(term(), non_neg_integer()) :: non_neg_integer()
  def value_hash(value, mask), do: :erlang.phash2(value, @range) &&& mask

  @doc "The whole fingerprint of `{key, value}` (an integer below 2^59)."
  @spec whole(term(), term(), non_neg_integer()) :: non_neg_integer()
  def whole(key, value, mask), do: key_hash(key) <<< 32 ||| value_hash(value, mask)

  @doc "The fingerprints of a proper list of pairs, as a binary of big-endian u64."
  @spec binary([{term(), term()}], non_neg_integer()) :: binary()
  def binary(pairs, mask) do
    for {key, value} <- pairs, into: <<>> do
      <<:erlang.phash2(key)::32, :erlang.phash2(value, @range) &&& mask::32>>
    end
  end

  @doc "The 1-based lock slot of a key hash among `slots`."
  @spec slot(non_neg_integer(), pos_integer()) :: pos_integer()
  def slot(key_hash, slots), do: rem(key_hash, slots) + 1
end
