# The eviction policy, above the Store: when :max_entries or :max_bytes is
# exceeded, the oldest writes go first (FIFO over the index of versions,
# not LRU: a hit writes nothing). Change the policy here. Called after a
# write by the actions that write (Writes, Loader) and by the sweep.
defmodule Larder.Cache.Eviction do
  @moduledoc false

  alias Larder.Cache.{Stats, Store}
  alias Larder.Telemetry

  # Oldest write first, until both limits hold; each victim is removed under
  # its own slot, taken after the writer released its own (never two slots
  # at once).
  def evict(%{max_entries: :infinity, max_bytes: :infinity}), do: :ok

  def evict(rt) do
    with true <- over_limits?(rt),
         {version, key} <- Store.oldest(rt) do
      if Store.delete_version(rt, key, version), do: evicted(rt, key)
      evict(rt)
    else
      _ -> :ok
    end
  end

  # The event goes out after the slot is released.
  defp evicted(rt, key) do
    Stats.count(rt, :evictions)

    Telemetry.execute(rt.telemetry, [:larder, :cache, :eviction], %{count: 1}, %{
      cache: rt.name,
      key: key
    })
  end

  defp over_limits?(rt) do
    (rt.max_entries != :infinity and Store.entries(rt) > rt.max_entries) or
      (rt.max_bytes != :infinity and Store.bytes(rt) > rt.max_bytes)
  end
end
