# The eviction policy: when :max_entries or :max_bytes is exceeded, the
# oldest writes go first (FIFO over the index of versions, not LRU: a hit
# writes nothing). Change the policy here.
defmodule Larder.Cache.Eviction do
  @moduledoc false

  alias Larder.Cache.{Stats, Store}
  alias Larder.Telemetry

  # Oldest write first, until both limits hold; each victim is removed under
  # its own slot, taken after the writer released its own (never two slots
  # at once).
  def evict(%{max_entries: :infinity, max_bytes: :infinity}), do: :ok

  def evict(cfg) do
    if over_limits?(cfg) do
      case :ets.first(cfg.index) do
        :"$end_of_table" ->
          :ok

        version ->
          case :ets.lookup(cfg.index, version) do
            [{_, key, _size}] -> evict_version(cfg, key, version)
            [] -> :ok
          end

          evict(cfg)
      end
    else
      :ok
    end
  end

  # The event goes out after the slot is released.
  defp evict_version(cfg, key, version) do
    evicted? = Store.with_key(cfg, key, fn slot -> evict_locked(cfg, slot, key, version) end)

    if evicted? do
      Telemetry.execute(cfg.telemetry, [:larder, :cache, :eviction], %{count: 1}, %{
        cache: cfg.name,
        key: key
      })
    end
  end

  defp evict_locked(cfg, slot, key, version) do
    case :ets.lookup(cfg.data, key) do
      [{_, ^version, _, _, _}] = old ->
        Store.step(cfg, slot, key, old, nil)
        Stats.count(cfg, :evictions)
        true

      _ ->
        # An index row whose value is gone cannot outlive a repair; drop it
        # rather than stop evicting if one ever does.
        Store.drop_index(cfg, slot, key, version)
        false
    end
  end

  defp over_limits?(cfg) do
    (cfg.max_entries != :infinity and Store.entries(cfg) > cfg.max_entries) or
      (cfg.max_bytes != :infinity and Store.bytes(cfg) > cfg.max_bytes)
  end
end
