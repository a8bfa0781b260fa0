# The 64-bit fingerprint of a Larder.Bag pair, computed the same way here
# (insert/3, delete/2,3, repairs) and in the NIF (insert_many/2, load/2).
defmodule Larder.Bag.Fingerprint do
  @moduledoc false

  import Bitwise

  # Bits 63..37: phash2(key); 36..10: phash2({key, value}); 9..0: the low
  # bits of phash2([key | value]). erlang:phash2/1 is the NIF's
  # ERL_NIF_PHASH2; it agrees with =:= (0.0 and -0.0 hash alike, 1 and 1.0
  # need not) and is a trapping BIF, so a huge term never blocks a
  # scheduler. The key hash alone picks the lock slot, so every fingerprint
  # of a key lives in the NIF shard of the slot its writers hold.
  #
  # Erlang sees a fingerprint as two small integers, the key hash and the
  # low 37 bits (the whole would be a bignum); lists of whole fingerprints
  # go to the NIF only on rare paths (delete/2, repairs).

  @low (1 <<< 37) - 1

  @doc "The mask that keeps every low bit (tests narrow it to force collisions)."
  @spec full_mask() :: non_neg_integer()
  def full_mask, do: @low

  @doc "The key hash of `key` (the fingerprint's high 27 bits)."
  @spec key_hash(term()) :: non_neg_integer()
  def key_hash(key), do: :erlang.phash2(key)

  @doc "The low 37 bits of the fingerprint of `{key, value}`, ANDed with `mask`."
  @spec low(term(), term(), non_neg_integer()) :: non_neg_integer()
  def low(key, value, mask) do
    ((:erlang.phash2({key, value}) <<< 10) ||| (:erlang.phash2([key | value]) &&& 1023)) &&&
      mask
  end

  @doc "The whole fingerprint of `{key, value}`."
  @spec whole(term(), term(), non_neg_integer()) :: non_neg_integer()
  def whole(key, value, mask), do: (key_hash(key) <<< 37) ||| low(key, value, mask)

  @doc "The 1-based lock slot of a key hash among `slots`."
  @spec slot(non_neg_integer(), pos_integer()) :: pos_integer()
  def slot(key_hash, slots), do: rem(key_hash, slots) + 1
end
