# The write protocol of a deduplicating Larder.Bag: an ETS :duplicate_bag
# holds the pairs, a NIF set counts their fingerprints, and the writers of a
# key take its Larder.Lock slot, so that the two never disagree for long.
defmodule Larder.Bag.Dedup do
  @moduledoc false

  # Invariant: every pair in the table has its fingerprint counted in the
  # set (the set may count more, never less). A writer keeps it by the order
  # of its two steps: an insert counts the fingerprint before it inserts the
  # pair, a delete deletes the pair before it uncounts the fingerprint.
  #
  # So a fingerprint the set does not hold proves the pair absent: the
  # insert takes it (the NIF's add is a test-and-set) and inserts the pair
  # without comparing anything. A fingerprint the set holds means the pair,
  # or one colliding with it, may be there: the exact check compares the
  # pair with =:= to the key's objects (:ets.lookup/2 + :lists.member/2)
  # and inserts it only if absent, counting it once more.
  #
  # The writers of one key hold its slot of the bag's Larder.Lock, so the
  # check and the insert of one writer never interleave with another's on
  # the same key. A writer killed between its two steps leaves at most an
  # extra count (a stale fingerprint): never a duplicate, never a missing
  # count. The next writer of that slot takes it over and first rebuilds
  # the slot's shard of the set from the table (repair/2), which removes it.
  #
  # Fingerprints of a key live in the NIF shard of its slot, so a writer
  # changes only shards whose slots it holds, and repair/2 can rebuild one
  # shard while writers of other slots go on.

  alias Larder.Bag.Fingerprint
  alias Larder.Bag.Order
  alias Larder.Lock
  alias Larder.Native

  @slots 256
  # The NIF's batch calls take at most this many fingerprints.
  @nif_batch 4_096

  @typedoc "The fingerprint set and the lock of one bag."
  @type state :: {reference(), Lock.t()}

  @doc "A fingerprint set and a lock for a new bag."
  @spec new() :: {term(), Lock.t()}
  def new, do: {Native.bag_fps_new(@slots), Lock.new(@slots)}

  @doc "Inserts `{key, value}` unless a pair =:= to it is in the table."
  @spec insert(:ets.tid() | atom(), term(), Lock.t(), non_neg_integer(), term(), term()) :: true
  def insert(tab, fps, lock, mask, key, value) do
    hash = Fingerprint.key_hash(key)
    low = Fingerprint.value_hash(value, mask)
    slot = Fingerprint.slot(hash, @slots)

    Lock.with_slot(lock, slot, fn -> repair(tab, fps, mask, slot) end, fn ->
      if add(fps, hash, low) do
        :ets.insert(tab, {key, value})
      else
        pair = {key, value}

        :lists.member(pair, :ets.lookup(tab, key)) or
          (incr(fps, hash, low) and :ets.insert(tab, pair))
      end
    end)
  end

  # The NIFs that change the set answer :dirty rather than resize a big
  # table on a normal scheduler; their dirty variants then do it.
  defp add(fps, hash, low) do
    case Native.bag_fps_add(fps, hash, low) do
      :dirty -> Native.bag_fps_add_dirty(fps, hash, low)
      new? -> new?
    end
  end

  defp incr(fps, hash, low) do
    with :dirty <- Native.bag_fps_incr(fps, hash, low),
         do: Native.bag_fps_incr_dirty(fps, hash, low)

    true
  end

  defp remove(fps, hash, low) do
    with :dirty <- Native.bag_fps_remove(fps, hash, low),
         do: Native.bag_fps_remove_dirty(fps, hash, low)

    :ok
  end

  defp add_chunk(fps, bin) do
    with :dirty <- Native.bag_fps_add_bin(fps, bin), do: Native.bag_fps_add_bin_dirty(fps, bin)
  end

  defp incr_many(fps, list) do
    with :dirty <- Native.bag_fps_incr_many(fps, list),
         do: Native.bag_fps_incr_many_dirty(fps, list)
  end

  defp remove_many(fps, list) do
    with :dirty <- Native.bag_fps_remove_many(fps, list),
         do: Native.bag_fps_remove_many_dirty(fps, list)
  end

  @doc """
  Inserts the pairs (a checked proper list of 2-tuples) that are neither in
  the table nor earlier in the batch, in one :ets.insert/2 call made while
  holding the slots of every key of the batch.
  """
  @spec insert_many(:ets.tid() | atom(), term(), Lock.t(), non_neg_integer(), list()) :: true
  def insert_many(_tab, _fps, _lock, _mask, []), do: true

  def insert_many(tab, fps, lock, mask, pairs) do
    # ETS :bag inserts a list from its last element to its first, each new
    # pair after its key's others (and the last of two =:= pairs wins): the
    # reversed batch, deduplicated first-wins, appended in order, is that.
    pairs = :lists.reverse(pairs)
    fingerprints = Fingerprint.binary(pairs, mask)

    Lock.with_slots(lock, slots(fingerprints, []), &repair(tab, fps, mask, &1), fn ->
      case add_bin(fps, fingerprints, 0, []) do
        [] -> Order.insert(tab, pairs)
        present -> Order.insert(tab, checked(tab, fps, mask, pairs, present))
      end
    end)
  end

  # The sorted distinct slots of the fingerprints' keys.
  defp slots(bin, acc) when byte_size(bin) > @nif_batch * 8 do
    <<chunk::binary-size(@nif_batch * 8), rest::binary>> = bin
    slots(rest, [Native.bag_fps_slots(chunk, @slots) | acc])
  end

  defp slots(bin, []), do: Native.bag_fps_slots(bin, @slots)

  defp slots(bin, acc),
    do: [Native.bag_fps_slots(bin, @slots) | acc] |> Enum.concat() |> Enum.sort() |> Enum.dedup()

  # Adds the fingerprints of the binary, in NIF-sized chunks; the positions
  # (in the whole binary) of those that were present.
  defp add_bin(fps, bin, base, acc) when byte_size(bin) > @nif_batch * 8 do
    <<chunk::binary-size(@nif_batch * 8), rest::binary>> = bin
    present = for i <- add_chunk(fps, chunk), do: i + base
    add_bin(fps, rest, base + @nif_batch, [acc | present])
  end

  defp add_bin(fps, bin, base, acc) do
    present = for i <- add_chunk(fps, bin), do: i + base
    List.flatten([acc | present])
  end

  # The pairs of the batch to insert when some fingerprints were present
  # (positions `present`, increasing): a present one is kept only if no
  # pair =:= to it is in the table or kept earlier in the batch, and its
  # fingerprint is then counted once more.
  defp checked(tab, fps, mask, pairs, present) do
    {kept, extra} = check(pairs, 0, present, tab, %{}, [], [])

    extra
    |> Enum.map(fn {key, value} -> Fingerprint.whole(key, value, mask) end)
    |> Enum.chunk_every(@nif_batch)
    |> Enum.each(&incr_many(fps, &1))

    kept
  end

  defp check([pair | rest], i, [i | present], tab, seen, kept, extra) do
    {key, _value} = pair

    if Map.has_key?(seen, pair) or :lists.member(pair, :ets.lookup(tab, key)) do
      check(rest, i + 1, present, tab, seen, kept, extra)
    else
      check(rest, i + 1, present, tab, Map.put(seen, pair, []), [pair | kept], [pair | extra])
    end
  end

  defp check([pair | rest], i, present, tab, seen, kept, extra),
    do: check(rest, i + 1, present, tab, Map.put(seen, pair, []), [pair | kept], extra)

  defp check([], _i, _present, _tab, _seen, kept, extra), do: {Enum.reverse(kept), extra}

  @doc "Deletes the pair `{key, value}` (one =:= to it) if it is there."
  @spec delete(:ets.tid() | atom(), term(), Lock.t(), non_neg_integer(), term(), term()) :: :ok
  def delete(tab, fps, lock, mask, key, value) do
    hash = Fingerprint.key_hash(key)
    slot = Fingerprint.slot(hash, @slots)

    Lock.with_slot(lock, slot, fn -> repair(tab, fps, mask, slot) end, fn ->
      pair = {key, value}

      if :lists.member(pair, :ets.lookup(tab, key)) do
        :ets.delete_object(tab, pair)
        remove(fps, hash, Fingerprint.value_hash(value, mask))
      end

      :ok
    end)
  end

  @doc "Deletes every pair under `key`."
  @spec delete_key(:ets.tid() | atom(), term(), Lock.t(), non_neg_integer(), term()) :: :ok
  def delete_key(tab, fps, lock, mask, key) do
    slot = Fingerprint.slot(Fingerprint.key_hash(key), @slots)

    Lock.with_slot(lock, slot, fn -> repair(tab, fps, mask, slot) end, fn ->
      tab
      |> :ets.take(key)
      |> Enum.map(fn {key, value} -> Fingerprint.whole(key, value, mask) end)
      |> Enum.chunk_every(@nif_batch)
      |> Enum.each(&remove_many(fps, &1))
    end)
  end

  @doc """
  Rebuilds the shard of `slot` from the table: run by the writer that took
  the slot over from a dead one. Scans the whole table (O(n)); idempotent.
  """
  @spec repair(:ets.tid() | atom(), term(), non_neg_integer(), pos_integer()) :: :ok
  def repair(tab, fps, mask, slot) do
    Native.bag_fps_clear(fps, slot - 1)
    :ets.safe_fixtable(tab, true)

    try do
      tab
      |> :ets.select([{:_, [], [:"$_"]}], @nif_batch)
      |> repair_chunks(fps, mask, slot)
    after
      :ets.safe_fixtable(tab, false)
    end
  end

  defp repair_chunks(:"$end_of_table", _fps, _mask, _slot), do: :ok

  defp repair_chunks({objects, cont}, fps, mask, slot) do
    mine =
      for {key, value} <- objects,
          hash = Fingerprint.key_hash(key),
          Fingerprint.slot(hash, @slots) == slot,
          do: Bitwise.bsl(hash, 32) + Fingerprint.value_hash(value, mask)

    if mine != [], do: incr_many(fps, mine)
    repair_chunks(:ets.select(cont), fps, mask, slot)
  end

  @doc """
  Counts the fingerprints of a snapshot chunk (pairs) in the set of a bag
  nobody else uses yet; the pairs to insert: those of the chunk that are
  neither in the table nor earlier in the chunk (a file written while the
  bag changed may hold a pair twice).
  """
  @spec load(:ets.tid() | atom(), term(), non_neg_integer(), list()) :: list()
  def load(tab, fps, mask, pairs) do
    case add_bin(fps, Fingerprint.binary(pairs, mask), 0, []) do
      [] -> pairs
      present -> checked(tab, fps, mask, pairs, present)
    end
  end

  @doc """
  Frees the fingerprint set's memory (every shard) at once, even while
  handles to it remain: run by `Larder.Bag.drop/1`, after the table is gone.
  """
  @spec free(term()) :: :ok
  def free(fps) do
    for shard <- 0..(@slots - 1), do: Native.bag_fps_clear(fps, shard)
    :ok
  end

  @doc "The bytes of the fingerprint set and the lock."
  @spec bytes(term()) :: non_neg_integer()
  def bytes(fps), do: Native.bag_fps_memory(fps) + @slots * 8
end
