# The copies of large values a process keeps for its repeat hits, bounded
# per process and per cache by :local_copy_max_bytes: the cache's kind of
# Larder.LocalCopies, which reclaims the copies of a cache that stopped, as
# it does a dead register's, at the process's next miss or new copy.
defmodule Larder.Cache.LocalCopies do
  @moduledoc false

  @behaviour Larder.LocalCopies

  # {rt.data, key} => {version, value} in the reading process's dictionary,
  # and {__MODULE__, rt.data} => {total_size, %{key => size}}: the copies
  # of one cache in one process never add up to more than
  # local_copy_max_bytes (external sizes). A copy is dropped when its
  # process reads the key and finds no value, and to make room for a newer
  # copy.
  #
  # rt.data, the data table, names one incarnation of a cache: a process's
  # first copy of an incarnation holds it in Larder.LocalCopies, and the
  # incarnation is dead once that table is gone (died/1 deletes it when the
  # cache stops; a killed cache's process takes it along). Every miss and
  # every new copy reclaims the copies of dead incarnations (and dead
  # registers), as a Register's misses do.

  alias Larder.LocalCopies

  # This process's copy of key: {version, value}, or nil.
  def get(rt, key), do: Process.get({rt.data, key})

  # On a miss: drops this process's copies of dead structures, if one died
  # since it last looked (one atomics read when none did).
  def reclaim(rt), do: LocalCopies.reclaim(rt.deaths)

  def keep(rt, key, version, size, value) do
    id = {__MODULE__, rt.data}
    held? = Process.get(id) != nil
    {total, sizes} = drop(rt, key)
    max = rt.local_copy_max_bytes

    if size <= max do
      {total, sizes} = make_room(rt, total, sizes, max - size)
      Process.put({rt.data, key}, {version, value})
      Process.put(id, {total + size, Map.put(sizes, key, size)})
    end

    # Stored before it is held: if the cache stopped meanwhile, the sweep
    # of hold/4 drops this copy too.
    if not held? and size <= max,
      do: LocalCopies.hold(rt.deaths, id, __MODULE__, rt.data),
      else: LocalCopies.reclaim(rt.deaths)
  end

  defp make_room(rt, total, sizes, limit) do
    if total <= limit do
      {total, sizes}
    else
      Enum.reduce_while(sizes, {total, sizes}, fn {key, size}, {total, sizes} ->
        Process.delete({rt.data, key})
        acc = {total - size, Map.delete(sizes, key)}
        if total - size <= limit, do: {:halt, acc}, else: {:cont, acc}
      end)
    end
  end

  # Drops key's copy, if any; returns the bookkeeping without it.
  def drop(rt, key) do
    case Process.get({__MODULE__, rt.data}) do
      nil ->
        {0, %{}}

      {total, sizes} = copies ->
        case Map.pop(sizes, key) do
          {nil, _} ->
            copies

          {size, sizes} ->
            Process.delete({rt.data, key})
            copies = {total - size, sizes}
            Process.put({__MODULE__, rt.data}, copies)
            copies
        end
    end
  end

  # Called by the cache's process as it stops: the incarnation is dead for
  # good once its data table is gone, and every process that holds copies
  # of it drops them at its next miss or new copy.
  def died(rt) do
    :ets.delete(rt.data)
    LocalCopies.died(rt.deaths)
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
