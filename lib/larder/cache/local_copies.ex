# The copies of large values a process keeps for its repeat hits, bounded
# per process and per cache by :local_copy_max_bytes.
defmodule Larder.Cache.LocalCopies do
  @moduledoc false

  # {cfg.data, key} => {version, value} in the reading process's dictionary,
  # and {__MODULE__, cfg.data} => {total_size, %{key => size}}: the copies
  # of one cache in one process never add up to more than
  # local_copy_max_bytes (external sizes). A copy is dropped when its
  # process reads the key and finds no value, and to make room for a newer
  # copy.

  def keep(cfg, key, version, size, value) do
    {total, sizes} = drop(cfg, key)
    max = cfg.local_copy_max_bytes

    if size <= max do
      {total, sizes} = make_room(cfg, total, sizes, max - size)
      Process.put({cfg.data, key}, {version, value})
      Process.put({__MODULE__, cfg.data}, {total + size, Map.put(sizes, key, size)})
    end

    :ok
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
end
