# The L1's rows, at the bottom of the cache: ETS rows with a version per
# write, written under per-key slot locks with a journal that makes every
# write repairable, and loading markers. It holds rows and calls nothing of
# the cache above it: its callers decide what has expired (Expiry, which
# owns the clock), what to evict (Eviction) and what a reading process
# keeps (LocalCopies).
defmodule Larder.Cache.Store do
  @moduledoc false

  alias Larder.Lock

  # Rows of the data table (a :set):
  #   {key, version, expires_at, size, value}  a value; version is a unique,
  #                                             increasing integer per write
  #   {key, version, expires_at, {:large, size}, nil}
  #                                            a value of at least
  #                                            local_copy_min_bytes; the value
  #                                            is in the large table, as
  #                                            {{key, version}, value}
  #   {key, :loading, pid, ref, nil}           a loader is running for key
  # The index (an :ordered_set) holds {version, key, size} for every value
  # row, oldest write first: eviction pops from its head.
  # The meta table (a :set) holds
  #   {:bytes, total, bytes_of_slot_1, ..., bytes_of_slot_N}
  #   {slot, key, old_version, old_size, new_version, new_size, slot_bytes_before}
  #                                            the journal of the write in
  #                                            progress under that slot
  #
  # The hit path (Larder.Cache.Loader.read/3) matches a small value row
  # itself, to save a call and a tuple per hit: a change to that row's
  # layout changes it too.
  #
  # Keys are never put in a match pattern: every access to a key's rows is
  # key-exact (lookup, insert, delete, delete_object), so a key such as :_
  # or :"$1" is just a key.
  #
  # Every change to a key's value rows (put, load fill, delete, expiry,
  # eviction) happens under the key's slot of a Larder.Lock, as one
  # journalled step: the journal row goes in first and out last. A writer
  # killed mid-step leaves its journal row and its slot; the next holder of
  # the slot repairs the step (repair/2): whichever version the data row
  # holds is kept, the other one's index and large rows are dropped, and the
  # slot's byte count is set to what it was plus the kept step's change.
  # Byte counts live in one ETS row, total and per slot, changed together by
  # one update_counter, so the repair can tell whether the count moved.
  # Loading markers are taken lock-free (insert_new, only where no row
  # exists) and removed or replaced under the slot lock.
  # clear/1 runs in the owner, holding every slot.
  #
  # The L1 can be turned off (off/1, by the owner: nothing would invalidate
  # what it holds, as when Redis refuses tracking): the flag is set, then
  # the L1 cleared; every write checks the flag under its slot, so once
  # off/1 returns no value is written until on/1. Reads need no check: the
  # table is empty.

  @slots 64

  # The L1's tables and lock (and the version counter), created by the
  # cache's process, which owns them, at its start: they go into the
  # cache's Larder.Cache.Runtime.
  def new(compressed?) do
    # read_concurrency without write_concurrency: adding write_concurrency
    # measurably slowed every lookup, and a cache is read-heavy.
    table_opts =
      [:set, :public, read_concurrency: true] ++ if(compressed?, do: [:compressed], else: [])

    meta = :ets.new(:larder_cache_meta, [:set, :public, write_concurrency: true])
    :ets.insert(meta, zero_bytes())

    %{
      data: :ets.new(:larder_cache, table_opts),
      index: :ets.new(:larder_cache_index, [:ordered_set, :public, write_concurrency: true]),
      large: :ets.new(:larder_cache_large, table_opts),
      waiters:
        :ets.new(:larder_cache_waiters, [:duplicate_bag, :public, write_concurrency: true]),
      meta: meta,
      lock: Lock.new(@slots),
      seq: :atomics.new(1, signed: true),
      l1_off: :atomics.new(1, signed: false)
    }
  end

  defp zero_bytes, do: List.to_tuple([:bytes | List.duplicate(0, @slots + 1)])

  defp next_version(rt), do: :atomics.add_get(rt.seq, 1, 1)

  ## Reads (lock-free)

  # What key's row holds:
  #   {:hit, value}                        a value that never expires
  #   {:value, version, expires_at, value} a value with an expiry time,
  #                                        which the caller compares with
  #                                        the clock
  #   {:large, version, expires_at, size}  the value is in large/3
  #   {:loading, pid, ref} | :none
  def lookup(rt, key) do
    case :ets.lookup(rt.data, key) do
      [{_, _version, :infinity, size, value}] when is_integer(size) ->
        {:hit, value}

      [{_, version, expires, size, value}] when is_integer(size) ->
        {:value, version, expires, value}

      [{_, version, expires, {:large, size}, _}] ->
        {:large, version, expires, size}

      [{_, :loading, pid, ref, _}] ->
        {:loading, pid, ref}

      [] ->
        :none
    end
  end

  # The large value of key's version: {:ok, value}, or :none once that
  # version was replaced or deleted.
  def large(rt, key, version) do
    case :ets.lookup(rt.large, {key, version}) do
      [{_, value}] -> {:ok, value}
      [] -> :none
    end
  end

  # The oldest write's {version, key}, or nil when there is none:
  # eviction's next victim.
  def oldest(rt) do
    case :ets.first(rt.index) do
      :"$end_of_table" ->
        nil

      version ->
        case :ets.lookup(rt.index, version) do
          [{_, key, _size}] -> {version, key}
          # removed since first/1: look again
          [] -> oldest(rt)
        end
    end
  end

  # The rows a sweep looks at, `limit` at a time: {[row], continuation}
  # or :"$end_of_table", row being {:expired, key, version} (expires_at at
  # or before now), {:loading, key, pid, ref}, or false (any other row,
  # counted in the slice). Call fix(rt, true) first: the continuation of a
  # table that changed between two slices is only safe over a fixed table.
  def stale(rt, now, limit) do
    spec = [
      {{:"$1", :"$2", :"$3", :_, :_},
       [{:is_integer, :"$2"}, {:is_integer, :"$3"}, {:"=<", :"$3", now}],
       [{{:expired, :"$1", :"$2"}}]},
      {{:"$1", :loading, :"$2", :"$3", :_}, [], [{{:loading, :"$1", :"$2", :"$3"}}]},
      {:_, [], [false]}
    ]

    :ets.select(rt.data, spec, limit)
  end

  def stale(continuation), do: :ets.select(continuation)

  def fix(rt, fixed?), do: :ets.safe_fixtable(rt.data, fixed?)

  ## Writes (under the key's slot)

  # Writes a value unconditionally (put); the caller evicts. With the L1
  # off, removes key's row instead (a value or a loading marker).
  def write(rt, key, value, expires_at) do
    new = new_value(rt, value, expires_at)

    with_key(rt, key, fn slot ->
      if off?(rt) do
        delete_row(rt, slot, key)
      else
        old = :ets.lookup(rt.data, key)
        step(rt, slot, key, old, new)
      end
    end)
  end

  # Takes the loading marker for key, or returns false.
  def lock(rt, key, ref), do: :ets.insert_new(rt.data, {key, :loading, self(), ref, nil})

  # Replaces our loading marker by the value, only if the marker is still
  # ours: a put, delete or invalidation in between removed it, and wins.
  # True when it wrote (the caller evicts then); :off when the marker was
  # ours but the L1 is off (the marker is removed, nothing written).
  def fill(rt, key, ref, value, expires_at) do
    new = new_value(rt, value, expires_at)
    me = self()

    with_key(rt, key, fn slot ->
      case :ets.lookup(rt.data, key) do
        [{_, :loading, ^me, ^ref, _} = marker] = old ->
          if off?(rt) do
            :ets.delete_object(rt.data, marker)
            :off
          else
            step(rt, slot, key, old, new)
            true
          end

        _ ->
          false
      end
    end)
  end

  # Removes the loading marker of pid's load ref, if it is still there.
  def unlock(rt, key, pid, ref) do
    with_key(rt, key, fn _slot ->
      case :ets.lookup(rt.data, key) do
        [{_, :loading, ^pid, ^ref, _} = row] -> :ets.delete_object(rt.data, row)
        _ -> true
      end
    end)

    :ok
  end

  # Deletes key whatever its row: a value or a loading marker.
  def delete(rt, key) do
    with_key(rt, key, fn slot -> delete_row(rt, slot, key) end)
    :ok
  end

  # Under key's slot.
  defp delete_row(rt, slot, key) do
    case :ets.lookup(rt.data, key) do
      [{_, :loading, _, _, _} = row] -> :ets.delete_object(rt.data, row)
      [] -> :ok
      old -> step(rt, slot, key, old, nil)
    end
  end

  # Deletes key's value if it is still the given version (an expired row,
  # eviction's victim); true if it did. Otherwise that version's index row,
  # if any, has lost its value: it cannot outlive a repair, but if one ever
  # did, dropping it (and its large row and bytes) keeps it from stopping
  # eviction.
  def delete_version(rt, key, version) do
    with_key(rt, key, fn slot ->
      case :ets.lookup(rt.data, key) do
        [{_, ^version, _, _, _}] = old ->
          step(rt, slot, key, old, nil)
          true

        _ ->
          drop_index(rt, slot, key, version)
          false
      end
    end)
  end

  # Empties the L1. Runs in the owner, which holds every slot meanwhile:
  # no write is half done, and killing a caller cannot stop a clear half way.
  # (Data rows go first, so a reader never finds a row without its value.)
  def clear(%{owner: owner} = rt) when owner == self() do
    try do
      Enum.each(1..@slots, &acquire(rt, &1))
      :ets.delete_all_objects(rt.data)
      :ets.delete_all_objects(rt.large)
      :ets.delete_all_objects(rt.index)
      :ets.insert(rt.meta, zero_bytes())
    after
      # releasing a slot we do not hold is a no-op
      Enum.each(1..@slots, &Lock.release(rt.lock, &1))
    end

    :ok
  end

  # Repairs the slots whose holder died mid-write (the next writer of the
  # slot would, but it may never come); called by the sweep.
  def repair_dead_writers(rt) do
    journals = [{{:"$1", :_, :_, :_, :_, :_, :_}, [{:is_integer, :"$1"}], [:"$1"]}]

    for slot <- :ets.select(rt.meta, journals) do
      Lock.with_slot(rt.lock, slot, fn -> repair(rt, slot) end, fn -> :ok end)
    end

    :ok
  end

  # The owner turns the L1 off (then it is empty, and stays so) or on again.
  def off(%{owner: owner} = rt) when owner == self() do
    :atomics.put(rt.l1_off, 1, 1)
    clear(rt)
  end

  def on(%{owner: owner} = rt) when owner == self() do
    # (a load that read the L2 before now has its marker cleared: it
    # writes nothing)
    clear(rt)
    :atomics.put(rt.l1_off, 1, 0)
    :ok
  end

  def off?(rt), do: :atomics.get(rt.l1_off, 1) == 1

  def entries(rt), do: :ets.info(rt.index, :size)
  def bytes(rt), do: :ets.lookup_element(rt.meta, :bytes, 2)

  ## The journalled step

  # {row, version, size, large_value_or_nil}, made before taking the slot.
  defp new_value(rt, value, expires_at) do
    value = unshare(value)
    version = next_version(rt)
    size = :erlang.external_size(value)

    if size >= rt.local_copy_min_bytes do
      {{nil, version, expires_at, {:large, size}, nil}, version, size, {value}}
    else
      {{nil, version, expires_at, size, value}, version, size, nil}
    end
  end

  # A binary that is a small part of a larger one (a sub-binary) would keep
  # the whole of that one alive in ETS, while its size counts only the
  # part: store a copy of the part alone, O(its size). Sub-binaries inside
  # other terms are left as they are (finding them means walking the value).
  defp unshare(value) when is_binary(value) do
    if :binary.referenced_byte_size(value) > 2 * byte_size(value),
      do: :binary.copy(value),
      else: value
  end

  defp unshare(value), do: value

  # Runs fun.(slot) holding key's slot, after repairing what a dead holder
  # of the slot left half done.
  defp with_key(rt, key, fun) do
    slot = Lock.slot(rt.lock, key)
    Lock.with_slot(rt.lock, slot, fn -> repair(rt, slot) end, fn -> fun.(slot) end)
  end

  defp acquire(rt, slot) do
    case Lock.acquire(rt.lock, slot) do
      :acquired -> :ok
      :taken_over -> repair(rt, slot)
    end
  end

  # Replaces key's rows `old` (the lookup result) by `new` (nil: none).
  # Only under key's slot (with_key/3).
  defp step(rt, slot, key, old, new) do
    {old_version, old_size} = version_size(old)

    {new_version, new_size} =
      case new do
        nil -> {nil, 0}
        {_row, version, size, _large} -> {version, size}
      end

    :ets.insert(
      rt.meta,
      {slot, key, old_version, old_size, new_version, new_size, slot_bytes(rt, slot)}
    )

    case new do
      nil ->
        if old_version, do: :ets.delete_object(rt.data, hd(old))

      {row, version, size, large} ->
        if large, do: :ets.insert(rt.large, {{key, version}, elem(large, 0)})
        :ets.insert(rt.data, put_elem(row, 0, key))
        :ets.insert(rt.index, {version, key, size})
    end

    if old_version do
      :ets.delete(rt.large, {key, old_version})
      :ets.delete(rt.index, old_version)
    end

    add_bytes(rt, slot, new_size - old_size)
    :ets.delete(rt.meta, slot)
    :ok
  end

  defp version_size([{_, version, _, {:large, size}, _}]), do: {version, size}
  defp version_size([{_, version, _, size, _}]) when is_integer(version), do: {version, size}
  defp version_size(_none_or_loading), do: {nil, 0}

  defp slot_bytes(rt, slot), do: :ets.lookup_element(rt.meta, :bytes, 2 + slot)

  defp add_bytes(_rt, _slot, 0), do: :ok

  defp add_bytes(rt, slot, delta) do
    :ets.update_counter(rt.meta, :bytes, [{2, delta}, {2 + slot, delta}])
    :ok
  end

  # Finishes or undoes the step a dead holder of slot left half done: the
  # data row says which version won; the other's rows go, the winner's index
  # row is put back, and the slot's bytes are set from the journal.
  defp repair(rt, slot) do
    case :ets.lookup(rt.meta, slot) do
      [] ->
        :ok

      [{_, key, old_version, old_size, new_version, new_size, before}] ->
        {current, _size} = version_size(:ets.lookup(rt.data, key))

        {kept, kept_size, dropped, target} =
          if current == new_version,
            do: {new_version, new_size, old_version, before + new_size - old_size},
            else: {old_version, old_size, new_version, before}

        if kept, do: :ets.insert(rt.index, {kept, key, kept_size})

        if dropped do
          :ets.delete(rt.large, {key, dropped})
          :ets.delete(rt.index, dropped)
        end

        add_bytes(rt, slot, target - slot_bytes(rt, slot))
        :ets.delete(rt.meta, slot)
        :ok
    end
  end

  # (versions are unique across keys: an index row of version is key's)
  defp drop_index(rt, slot, key, version) do
    case :ets.take(rt.index, version) do
      [{_, _, size}] ->
        :ets.delete(rt.large, {key, version})
        add_bytes(rt, slot, -size)

      [] ->
        :ok
    end
  end
end
