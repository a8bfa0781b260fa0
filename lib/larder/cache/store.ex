# The L1: ETS rows with a version per write, written under per-key slot
# locks with a journal that makes every write repairable, and loading
# markers. Eviction (Eviction), the expiry clock and sweep (Expiry) and the
# counters (Stats) have their own files.
defmodule Larder.Cache.Store do
  @moduledoc false

  alias Larder.Cache.{Eviction, Expiry, LocalCopies}
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

  @slots 64

  # The L1's tables and lock, created by the cache's process (which owns
  # them) and kept in the cache's Config.
  def new_tables(compressed?) do
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
      seq: :atomics.new(1, signed: true)
    }
  end

  defp zero_bytes, do: List.to_tuple([:bytes | List.duplicate(0, @slots + 1)])

  def next_version(cfg), do: :atomics.add_get(cfg.seq, 1, 1)

  ## Reads (lock-free)

  # {:hit, value} | :miss | {:loading, pid, ref}
  def lookup(cfg, key) do
    case :ets.lookup(cfg.data, key) do
      [{_, version, expires, size, value}] when is_integer(size) ->
        if Expiry.live?(cfg, expires) do
          {:hit, value}
        else
          expire(cfg, key, version)
        end

      [{_, version, expires, {:large, size}, _}] ->
        if Expiry.live?(cfg, expires) do
          large_hit(cfg, key, version, size)
        else
          expire(cfg, key, version)
        end

      [{_, :loading, pid, ref, _}] ->
        LocalCopies.drop(cfg, key)
        {:loading, pid, ref}

      [] ->
        LocalCopies.drop(cfg, key)
        :miss
    end
  end

  defp expire(cfg, key, version) do
    LocalCopies.drop(cfg, key)
    delete_version(cfg, key, version)
    :miss
  end

  # A large value lives in its own table under {key, version}; the reading
  # process keeps the copy it made (LocalCopies), and reuses it while the
  # version holds.
  defp large_hit(cfg, key, version, size) do
    case Process.get({cfg.data, key}) do
      {^version, value} ->
        {:hit, value}

      _ ->
        case :ets.lookup(cfg.large, {key, version}) do
          [{_, value}] ->
            LocalCopies.keep(cfg, key, version, size, value)
            {:hit, value}

          [] ->
            # replaced or deleted since we read the row
            lookup(cfg, key)
        end
    end
  end

  ## Writes (under the key's slot)

  # Writes a value unconditionally (put).
  def write(cfg, key, value, ttl) do
    new = new_value(cfg, value, ttl)

    with_key(cfg, key, fn slot ->
      old = :ets.lookup(cfg.data, key)
      step(cfg, slot, key, old, new)
    end)

    Eviction.evict(cfg)
  end

  # Takes the loading marker for key, or returns false.
  def lock(cfg, key, ref), do: :ets.insert_new(cfg.data, {key, :loading, self(), ref, nil})

  # Replaces our loading marker by the value, only if the marker is still
  # ours: a put, delete or invalidation in between removed it, and wins.
  def fill(cfg, key, ref, value, ttl) do
    new = new_value(cfg, value, ttl)
    me = self()

    filled? =
      with_key(cfg, key, fn slot ->
        case :ets.lookup(cfg.data, key) do
          [{_, :loading, ^me, ^ref, _}] = old ->
            step(cfg, slot, key, old, new)
            true

          _ ->
            false
        end
      end)

    if filled?, do: Eviction.evict(cfg)
    filled?
  end

  # Removes the loading marker of pid's load ref, if it is still there.
  def unlock(cfg, key, pid, ref) do
    with_key(cfg, key, fn _slot ->
      case :ets.lookup(cfg.data, key) do
        [{_, :loading, ^pid, ^ref, _} = row] -> :ets.delete_object(cfg.data, row)
        _ -> true
      end
    end)

    :ok
  end

  # Deletes key whatever its row: a value or a loading marker.
  def delete(cfg, key) do
    with_key(cfg, key, fn slot ->
      case :ets.lookup(cfg.data, key) do
        [{_, :loading, _, _, _} = row] -> :ets.delete_object(cfg.data, row)
        [] -> :ok
        old -> step(cfg, slot, key, old, nil)
      end
    end)

    :ok
  end

  # Deletes key's value if it is still the given version.
  def delete_version(cfg, key, version) do
    with_key(cfg, key, fn slot ->
      case :ets.lookup(cfg.data, key) do
        [{_, ^version, _, _, _}] = old ->
          step(cfg, slot, key, old, nil)
          true

        _ ->
          false
      end
    end)
  end

  # Empties the L1. Runs in the owner, which holds every slot meanwhile:
  # no write is half done, and killing a caller cannot stop a clear half way.
  # (Data rows go first, so a reader never finds a row without its value.)
  def clear(%{owner: owner} = cfg) when owner == self() do
    try do
      Enum.each(1..@slots, &acquire(cfg, &1))
      :ets.delete_all_objects(cfg.data)
      :ets.delete_all_objects(cfg.large)
      :ets.delete_all_objects(cfg.index)
      :ets.insert(cfg.meta, zero_bytes())
    after
      # releasing a slot we do not hold is a no-op
      Enum.each(1..@slots, &Lock.release(cfg.lock, &1))
    end

    :ok
  end

  def clear(cfg) do
    GenServer.call(cfg.owner, :clear_l1, :infinity)
  catch
    :exit, _ -> Larder.Instance.unknown!(Larder.Cache, cfg.name)
  end

  # Repairs the slots whose holder died mid-write (the next writer of the
  # slot would, but it may never come); called by the sweep.
  def repair_dead_writers(cfg) do
    journals = [{{:"$1", :_, :_, :_, :_, :_, :_}, [{:is_integer, :"$1"}], [:"$1"]}]

    for slot <- :ets.select(cfg.meta, journals) do
      Lock.with_slot(cfg.lock, slot, fn -> repair(cfg, slot) end, fn -> :ok end)
    end

    :ok
  end

  def entries(cfg), do: :ets.info(cfg.index, :size)
  def bytes(cfg), do: :ets.lookup_element(cfg.meta, :bytes, 2)

  ## The journalled step

  # {row, version, size, large_value_or_nil}, made before taking the slot.
  defp new_value(cfg, value, ttl) do
    value = unshare(value)
    version = next_version(cfg)
    size = :erlang.external_size(value)

    if size >= cfg.local_copy_min_bytes do
      {{nil, version, Expiry.expires_at(ttl), {:large, size}, nil}, version, size, {value}}
    else
      {{nil, version, Expiry.expires_at(ttl), size, value}, version, size, nil}
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
  def with_key(cfg, key, fun) do
    slot = Lock.slot(cfg.lock, key)
    Lock.with_slot(cfg.lock, slot, fn -> repair(cfg, slot) end, fn -> fun.(slot) end)
  end

  defp acquire(cfg, slot) do
    case Lock.acquire(cfg.lock, slot) do
      :acquired -> :ok
      :taken_over -> repair(cfg, slot)
    end
  end

  # Replaces key's rows `old` (the lookup result) by `new` (nil: none).
  # Only under key's slot (with_key/3).
  def step(cfg, slot, key, old, new) do
    {old_version, old_size} = version_size(old)

    {new_version, new_size} =
      case new do
        nil -> {nil, 0}
        {_row, version, size, _large} -> {version, size}
      end

    :ets.insert(
      cfg.meta,
      {slot, key, old_version, old_size, new_version, new_size, slot_bytes(cfg, slot)}
    )

    case new do
      nil ->
        if old_version, do: :ets.delete_object(cfg.data, hd(old))

      {row, version, size, large} ->
        if large, do: :ets.insert(cfg.large, {{key, version}, elem(large, 0)})
        :ets.insert(cfg.data, put_elem(row, 0, key))
        :ets.insert(cfg.index, {version, key, size})
    end

    if old_version do
      :ets.delete(cfg.large, {key, old_version})
      :ets.delete(cfg.index, old_version)
    end

    add_bytes(cfg, slot, new_size - old_size)
    :ets.delete(cfg.meta, slot)
    :ok
  end

  defp version_size([{_, version, _, {:large, size}, _}]), do: {version, size}
  defp version_size([{_, version, _, size, _}]) when is_integer(version), do: {version, size}
  defp version_size(_none_or_loading), do: {nil, 0}

  defp slot_bytes(cfg, slot), do: :ets.lookup_element(cfg.meta, :bytes, 2 + slot)

  defp add_bytes(_cfg, _slot, 0), do: :ok

  defp add_bytes(cfg, slot, delta) do
    :ets.update_counter(cfg.meta, :bytes, [{2, delta}, {2 + slot, delta}])
    :ok
  end

  # Finishes or undoes the step a dead holder of slot left half done: the
  # data row says which version won; the other's rows go, the winner's index
  # row is put back, and the slot's bytes are set from the journal.
  defp repair(cfg, slot) do
    case :ets.lookup(cfg.meta, slot) do
      [] ->
        :ok

      [{_, key, old_version, old_size, new_version, new_size, before}] ->
        {current, _size} = version_size(:ets.lookup(cfg.data, key))

        {kept, kept_size, dropped, target} =
          if current == new_version,
            do: {new_version, new_size, old_version, before + new_size - old_size},
            else: {old_version, old_size, new_version, before}

        if kept, do: :ets.insert(cfg.index, {kept, key, kept_size})

        if dropped do
          :ets.delete(cfg.large, {key, dropped})
          :ets.delete(cfg.index, dropped)
        end

        add_bytes(cfg, slot, target - slot_bytes(cfg, slot))
        :ets.delete(cfg.meta, slot)
        :ok
    end
  end

  # Drops an index row (and its large row and bytes) whose data row is
  # gone; under key's slot. Eviction calls it so that one stray index row
  # cannot stop it.
  def drop_index(cfg, slot, key, version) do
    case :ets.take(cfg.index, version) do
      [{_, _, size}] ->
        :ets.delete(cfg.large, {key, version})
        add_bytes(cfg, slot, -size)

      [] ->
        :ok
    end
  end
end
