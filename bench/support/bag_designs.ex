# Prototypes of the Larder.Bag designs compared by bench/bag_designs_bench.exs.
# Each module is a minimal bag with :bag semantics (=:=, insertion order where
# the design keeps it): new/0, insert/3, insert_many/2, memory/1 (words) and
# drop/1. Writers of a key hold its Larder.Lock slot in every design that
# needs it, so the prototypes pay what a correct implementation pays. The
# design Larder.Bag ships (a :duplicate_bag plus a NIF fingerprint set) is
# measured through Larder.Bag itself.

# Design 0, the previous Larder.Bag: each pair is the key of one ETS
# ordered_set object {[key | value]}. Unique by construction; equality is ==
# and lookup/2 returns term order (both differ from :bag).
defmodule Larder.Bench.BagDesigns.OrderedSet do
  @moduledoc false

  def new, do: :ets.new(__MODULE__, [:ordered_set, :public])
  def insert(t, k, v), do: :ets.insert(t, {[k | v]})
  def insert_many(t, pairs), do: :ets.insert(t, for({k, v} <- pairs, do: {[k | v]}))
  def memory(t), do: :ets.info(t, :memory)
  def drop(t), do: :ets.delete(t)
end

# The lock of the designs that need one: a Larder.Lock of 256 slots, a key's
# slot picked as Larder.Bag picks it, and a batch's slots taken in order.
defmodule Larder.Bench.BagDesigns.Locked do
  @moduledoc false

  alias Larder.Bag.Fingerprint, as: F
  alias Larder.Lock

  @slots 256

  def new, do: Lock.new(@slots)

  @doc "The lock's memory, in words."
  def words, do: @slots

  def slot(key), do: F.slot(F.key_hash(key), @slots)
  def slot_of_hash(key_hash), do: F.slot(key_hash, @slots)

  def with_slot(lock, slot, fun), do: Lock.with_slot(lock, slot, fn -> :ok end, fun)

  def with_batch(lock, pairs, fun) do
    slots = pairs |> Enum.map(fn {k, _} -> slot(k) end) |> Enum.uniq() |> Enum.sort()
    Lock.with_slots(lock, slots, fn _ -> :ok end, fun)
  end
end

# Design 2: a :duplicate_bag for the pairs plus an ETS set {fingerprint,
# count} (the fingerprints Larder.Bag computes, whole). insert_new/2 is the
# test-and-set; a present fingerprint takes the exact check.
defmodule Larder.Bench.BagDesigns.EtsFingerprints do
  @moduledoc false

  alias Larder.Bag.Fingerprint, as: F
  alias Larder.Bench.BagDesigns.Locked

  def new do
    {:ets.new(__MODULE__, [:duplicate_bag, :public]), :ets.new(__MODULE__, [:set, :public]),
     Locked.new()}
  end

  def insert({tab, fps, lock}, k, v) do
    hash = F.key_hash(k)
    fp = Bitwise.bsl(hash, 32) + F.value_hash(v, F.full_mask())

    Locked.with_slot(lock, Locked.slot_of_hash(hash), fn ->
      if :ets.insert_new(fps, {fp, 1}) do
        :ets.insert(tab, {k, v})
      else
        :lists.member({k, v}, :ets.lookup(tab, k)) or
          (:ets.update_counter(fps, fp, 1) > 0 and :ets.insert(tab, {k, v}))
      end
    end)
  end

  # The batch's slots taken in order; one insert_new per pair, then one
  # insert of the batch (the within-batch check is left out: it only
  # matters for batches that repeat a pair).
  def insert_many({tab, fps, lock}, pairs) do
    Locked.with_batch(lock, pairs, fn ->
      kept =
        for {k, v} = pair <- pairs,
            :ets.insert_new(fps, {F.whole(k, v, F.full_mask()), 1}) or
              not :lists.member(pair, :ets.lookup(tab, k)),
            do: pair

      :ets.insert(tab, kept)
    end)
  end

  def memory({tab, fps, _}),
    do: :ets.info(tab, :memory) + :ets.info(fps, :memory) + Locked.words()

  def drop({tab, fps, _}), do: :ets.delete(tab) and :ets.delete(fps)
end

# Design 3: batch dedup without fingerprints. A :duplicate_bag; insert_many
# sorts and deduplicates the batch in one pass, then checks each distinct
# pair against its key's objects (the comparison ETS :bag makes, done here)
# and inserts the survivors in one call. insert/3 is the same check for one
# pair.
defmodule Larder.Bench.BagDesigns.BatchSort do
  @moduledoc false

  alias Larder.Bench.BagDesigns.Locked

  def new, do: {:ets.new(__MODULE__, [:duplicate_bag, :public]), Locked.new()}

  def insert({tab, lock}, k, v) do
    Locked.with_slot(lock, Locked.slot(k), fn ->
      :lists.member({k, v}, :ets.lookup(tab, k)) or :ets.insert(tab, {k, v})
    end)
  end

  def insert_many({tab, lock}, pairs) do
    # Sorting groups a key's pairs: one lookup per key of the batch. (Term
    # order puts 1 and 1.0 side by side; usort compares with ==, so the
    # prototype would merge them: a real one must dedup with =:=.)
    sorted = :lists.usort(pairs)

    Locked.with_batch(lock, sorted, fn ->
      kept =
        sorted
        |> Enum.chunk_by(&elem(&1, 0))
        |> Enum.flat_map(fn [{k, _} | _] = group ->
          have = :ets.lookup(tab, k)
          Enum.reject(group, &:lists.member(&1, have))
        end)

      :ets.insert(tab, kept)
    end)
  end

  def memory({tab, _}), do: :ets.info(tab, :memory) + Locked.words()
  def drop({tab, _}), do: :ets.delete(tab)
end

# Design 4 (own): no fingerprints, exact by construction. A :duplicate_bag
# for the pairs plus an ETS set whose keys are the pairs themselves
# ({{key, value}}): insert_new/2 compares with =:= and decides alone, so
# there is no collision path; the price is a second copy of every pair.
defmodule Larder.Bench.BagDesigns.PairSet do
  @moduledoc false

  alias Larder.Bench.BagDesigns.Locked

  def new do
    {:ets.new(__MODULE__, [:duplicate_bag, :public]), :ets.new(__MODULE__, [:set, :public]),
     Locked.new()}
  end

  def insert({tab, seen, lock}, k, v) do
    Locked.with_slot(lock, Locked.slot(k), fn ->
      :ets.insert_new(seen, {{k, v}}) and :ets.insert(tab, {k, v})
    end)
  end

  def insert_many({tab, seen, lock}, pairs) do
    Locked.with_batch(lock, pairs, fn ->
      :ets.insert(tab, for(pair <- pairs, :ets.insert_new(seen, {pair}), do: pair))
    end)
  end

  def memory({tab, seen, _}),
    do: :ets.info(tab, :memory) + :ets.info(seen, :memory) + Locked.words()

  def drop({tab, seen, _}), do: :ets.delete(tab) and :ets.delete(seen)
end
