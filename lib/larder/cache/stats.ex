# The cache's counters (one :counters array per cache, written by every
# process without a lock) and the stats/1 snapshot built from them.
defmodule Larder.Cache.Stats do
  @moduledoc false

  alias Larder.Cache.Store

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

  # A counter's index in the array (Loader's hit path adds to :l1_hits
  # itself, with the index as a compile-time constant).
  for {name, index} <- Enum.with_index(@stats, 1) do
    def index(unquote(name)), do: unquote(index)
  end

  def new, do: :counters.new(length(@stats), [:write_concurrency])

  def count(rt, stat), do: :counters.add(rt.stats, index(stat), 1)

  def get(rt, stat), do: :counters.get(rt.stats, index(stat))

  # Every counter, plus the L1's current entries and bytes.
  def snapshot(rt) do
    @stats
    |> Map.new(&{&1, get(rt, &1)})
    |> Map.merge(%{entries: Store.entries(rt), bytes: Store.bytes(rt)})
  end
end
