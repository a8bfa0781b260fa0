# The L1: ETS rows with a version per write, loading locks, eviction and the
# process-local copies of large values.
defmodule Larder.Cache.Store do
  @moduledoc false

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

  @stats [
    :l1_hits,
    :l1_misses,
    :l2_hits,
    :l2_misses,
    :loads,
    :load_errors,
    :l2_errors,
    :decode_errors,
    :evictions,
    :invalidations,
    :bad_messages
  ]

  for {name, index} <- Enum.with_index(@stats, 1) do
    def stat_index(unquote(name)), do: unquote(index)
  end

  def stat_names, do: @stats

  def new_counters, do: :counters.new(length(@stats), [:write_concurrency])

  def count(cfg, stat), do: :counters.add(cfg.stats, stat_index(stat), 1)

  def now, do: System.monotonic_time(:millisecond)

  # Hits compare expiry with the owner's clock, an atomic it moves forward
  # every tick: reading the system clock on every hit cost more than the
  # rest of the hit. It lags real time by at most a tick (and the owner's
  # scheduling delay), so an entry may be served that much past its ttl,
  # never before.
  def tick_ms, do: 10

  def coarse_now(cfg), do: :atomics.get(cfg.clock, 1)

  def tick(cfg), do: :atomics.put(cfg.clock, 1, now())

  def expires_at(:infinity), do: :infinity
  def expires_at(ttl), do: now() + ttl

  def next_version(cfg), do: :atomics.add_get(cfg.seq, 1, 1)

  # {:hit, value} | :miss | {:loading, pid, ref}
  def lookup(cfg, key) do
    case :ets.lookup(cfg.data, key) do
      [{_, version, expires, size, value}] when is_integer(size) ->
        if live?(cfg, expires) do
          {:hit, value}
        else
          delete_version(cfg, key, version)
          :miss
        end

      [{_, version, expires, {:large, _}, _}] ->
        if live?(cfg, expires) do
          large_hit(cfg, key, version)
        else
          delete_version(cfg, key, version)
          :miss
        end

      [{_, :loading, pid, ref, _}] ->
        {:loading, pid, ref}

      [] ->
        :miss
    end
  end

  # A large value lives in its own table under {key, version}; the reading
  # process keeps the copy it made, and reuses it while the version holds.
  defp large_hit(cfg, key, version) do
    case Process.get({cfg.data, key}) do
      {^version, value} ->
        {:hit, value}

      _ ->
        case :ets.lookup(cfg.large, {key, version}) do
          [{_, value}] ->
            Process.put({cfg.data, key}, {version, value})
            {:hit, value}

          [] ->
            # replaced or deleted since we read the row
            lookup(cfg, key)
        end
    end
  end

  defp live?(_cfg, :infinity), do: true
  defp live?(cfg, expires), do: expires > coarse_now(cfg)

  # The row for a value: small ones inline, large ones in the large table
  # (written first, so a reader that sees the row finds the value).
  defp row(cfg, key, version, ttl, value) do
    size = :erlang.external_size(value)

    if size >= cfg.local_copy_min_bytes do
      :ets.insert(cfg.large, {{key, version}, value})
      {{key, version, expires_at(ttl), {:large, size}, nil}, size}
    else
      {{key, version, expires_at(ttl), size, value}, size}
    end
  end

  # Writes a value unconditionally (put).
  def write(cfg, key, value, ttl) do
    version = next_version(cfg)
    old = value_versions(cfg, key)
    {row, size} = row(cfg, key, version, ttl, value)
    :ets.insert(cfg.data, row)
    index(cfg, version, key, size)
    Enum.each(old, &drop_index(cfg, &1))
    evict(cfg)
    :ok
  end

  # Takes the loading lock for key, or returns false.
  def lock(cfg, key, ref), do: :ets.insert_new(cfg.data, {key, :loading, self(), ref, nil})

  # Replaces our loading lock by the value, only if the lock is still ours: a
  # put, delete or invalidation in between removed it, and wins.
  def fill(cfg, key, ref, value, ttl) do
    version = next_version(cfg)
    {{_, _, expires, size_field, stored}, size} = row(cfg, key, version, ttl, value)
    new_row = {{:const, key}, version, expires, {:const, size_field}, {:const, stored}}
    spec = [{{key, :loading, self(), ref, :_}, [], [{new_row}]}]

    case :ets.select_replace(cfg.data, spec) do
      1 ->
        index(cfg, version, key, size)
        evict(cfg)
        true

      0 ->
        :ets.delete(cfg.large, {key, version})
        false
    end
  end

  # Removes our loading lock, if it is still there.
  def unlock(cfg, key, pid, ref) do
    :ets.select_delete(cfg.data, [{{key, :loading, pid, ref, :_}, [], [true]}])
  end

  # Deletes key whatever its row: a value or a loading lock.
  def delete(cfg, key) do
    old = value_versions(cfg, key)
    :ets.delete(cfg.data, key)
    Enum.each(old, &drop_index(cfg, &1))
    :ok
  end

  def clear(cfg) do
    :ets.delete_all_objects(cfg.data)
    :ets.delete_all_objects(cfg.index)
    :ets.delete_all_objects(cfg.large)
    :atomics.put(cfg.bytes, 1, 0)
    :ok
  end

  # Deletes the rows whose time is up (called periodically by the owner).
  def sweep(cfg) do
    now = now()

    spec = [
      {{:"$1", :"$2", :"$3", :_, :_}, [{:is_integer, :"$2"}, {:"=<", :"$3", now}],
       [{{:"$1", :"$2"}}]}
    ]

    for {key, version} <- :ets.select(cfg.data, spec), do: delete_version(cfg, key, version)
    :ok
  end

  def entries(cfg), do: :ets.info(cfg.index, :size)
  def bytes(cfg), do: :atomics.get(cfg.bytes, 1)

  defp delete_version(cfg, key, version) do
    :ets.select_delete(cfg.data, [{{key, version, :_, :_, :_}, [], [true]}])
    drop_index(cfg, version)
  end

  defp value_versions(cfg, key) do
    :ets.select(cfg.data, [{{key, :"$1", :_, :_, :_}, [{:is_integer, :"$1"}], [:"$1"]}])
  end

  defp index(cfg, version, key, size) do
    :ets.insert(cfg.index, {version, key, size})
    :atomics.add(cfg.bytes, 1, size)
  end

  # Retires a version: its index entry, its bytes, its large value if any.
  defp drop_index(cfg, version) do
    case :ets.take(cfg.index, version) do
      [{_, key, size}] ->
        :atomics.sub(cfg.bytes, 1, size)
        :ets.delete(cfg.large, {key, version})

      [] ->
        :ok
    end
  end

  # Oldest write first, until both limits hold. ets:take makes each index
  # entry handled once even when writers evict concurrently.
  defp evict(%{max_entries: :infinity, max_bytes: :infinity}), do: :ok

  defp evict(cfg) do
    if over_limits?(cfg) do
      case :ets.first(cfg.index) do
        :"$end_of_table" ->
          :ok

        version ->
          case :ets.take(cfg.index, version) do
            [{_, key, size}] ->
              :atomics.sub(cfg.bytes, 1, size)
              :ets.delete(cfg.large, {key, version})

              if :ets.select_delete(cfg.data, [{{key, version, :_, :_, :_}, [], [true]}]) == 1 do
                count(cfg, :evictions)
              end

            [] ->
              :ok
          end

          evict(cfg)
      end
    else
      :ok
    end
  end

  defp over_limits?(cfg) do
    (cfg.max_entries != :infinity and entries(cfg) > cfg.max_entries) or
      (cfg.max_bytes != :infinity and bytes(cfg) > cfg.max_bytes)
  end
end
