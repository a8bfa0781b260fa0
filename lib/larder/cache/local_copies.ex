# The copies of large values a process keeps for its repeat hits, bounded
# per process and per cache by :local_copy_max_bytes. Copies of a cache
# that stopped are reclaimed by Larder.LocalCopies.
defmodule Larder.Cache.LocalCopies do
  @moduledoc false

  @behaviour Larder.LocalCopies

  # {cfg.data, key} => {version, value} in the reading process's dictionary,
  # and {__MODULE__, cfg.data} => {total_size, %{key => size}}: the copies
  # of one cache in one process never add up to more than
  # local_copy_max_bytes (external sizes). A copy is dropped when its
  # process reads the key and finds no value, and to make room for a newer
  # copy.
  #
  # cfg.data, the data table, names one incarnation of a cache: a process's
  # first copy of an incarnation holds it in Larder.LocalCopies, and the
  # incarnation is dead once that table is gone (died/1 deletes it when the
  # cache stops; a killed cache's process takes it along). Every new copy
  # reclaims the copies of dead incarnations (and dead registers).

  alias Larder.LocalCopies

  def keep(cfg, key, version, size, value) do
    id = {__MODULE__, cfg.data}
    held? = Process.get(id) != nil
    {total, sizes} = drop(cfg, key)
    max = cfg.local_copy_max_bytes

    if size <= max do
      {total, sizes} = make_room(cfg, total, sizes, max - size)
      Process.put({cfg.data, key}, {version, value})
      Process.put(id, {total + size, Map.put(sizes, key, size)})
    end

    # Stored before it is held: if the cache stopped meanwhile, the sweep
    # of hold/4 drops this copy too.
    cond do
      held? -> LocalCopies.reclaim(LocalCopies.deaths())
      size <= max -> LocalCopies.hold(LocalCopies.deaths(), id, __MODULE__, cfg.data)
      true -> LocalCopies.reclaim(LocalCopies.deaths())
    end
  end

  defp make_room(cfg, total, sizes, limit) do
    if total <= limit do
      {total, sizes}
    else
      Enum.reduce_while(sizes, {total, sizes}, fn {key, size}, {total, sizes} ->
        Process.delete({cfg.data, key})
        acc = {total - size, Map.delete(sizes, key)}
        if total - size <= limit, do: {:halt, acc}, else: {:cont, acc}
      end)
    end
  end

  # Drops key's copy, if any; returns the bookkeeping without it.
  def drop(cfg, key) do
    case Process.get({__MODULE__, cfg.data}) do
      nil ->
        {0, %{}}

      {total, sizes} = copies ->
        case Map.pop(sizes, key) do
          {nil, _} ->
            copies

          {size, sizes} ->
            Process.delete({cfg.data, key})
            copies = {total - size, sizes}
            Process.put({__MODULE__, cfg.data}, copies)
            copies
        end
    end
  end

  # Called by the cache's process as it stops: the incarnation is dead for
  # good once its data table is gone, and every process that holds copies
  # of it drops them at its next new copy or Register miss.
  def died(cfg) do
    :ets.delete(cfg.data)
    LocalCopies.died(LocalCopies.deaths())
  end

  @impl LocalCopies
  def live?(data), do: :ets.info(data, :id) != :undefined

  @impl LocalCopies
  def drop_copies({__MODULE__, data} = id) do
    case Process.delete(id) do
      {_total, sizes} -> Enum.each(sizes, fn {key, _size} -> Process.delete({data, key}) end)
      nil -> :ok
    end

    :ok
  end
end
