# The snapshot file format of Larder.Bag: checksummed chunks, atomic writes,
# and a load that checks the whole file before it creates the table.
defmodule Larder.Bag.Snapshot do
  @moduledoc false

  # File layout (integers big-endian):
  #
  #   "LARDERBAG" <<version::8, dedup::8>>
  #   chunk*      <<size::32, count::32, crc32::32, payload::binary-size(size)>>
  #   trailer     <<0::32, total::64>>
  #
  # `payload` is term_to_binary/1 of a list of `count` ETS objects; `crc32`
  # covers it. The trailer holds the total number of objects, so a file cut
  # at a chunk boundary is caught too. Nothing may follow the trailer.

  @magic "LARDERBAG"
  @version 1

  @doc """
  Writes the chunks (lists of ETS objects) to a temporary file next to
  `path`, then renames it over `path`.
  """
  @spec dump(Enumerable.t(), boolean(), Path.t()) :: :ok | {:error, Larder.Error.t()}
  def dump(chunks, dedup, path) do
    tmp = "#{path}.tmp-#{System.unique_integer([:positive])}"

    with {:ok, io} <- open(tmp, path) do
      result =
        try do
          with :ok <- write(io, tmp, [@magic, @version, if(dedup, do: 1, else: 0)]),
               {:ok, total} <- write_chunks(io, tmp, chunks),
               :ok <- write(io, tmp, <<0::32, total::64>>),
               :ok <- close(io, tmp) do
            rename(tmp, path)
          end
        after
          # Closing twice is harmless; this also closes on a raise.
          File.close(io)
        end

      if result != :ok, do: File.rm(tmp)
      result
    end
  end

  defp write_chunks(io, tmp, chunks) do
    Enum.reduce_while(chunks, {:ok, 0}, fn objects, {:ok, total} ->
      payload = :erlang.term_to_binary(objects)
      count = length(objects)
      header = <<byte_size(payload)::32, count::32, :erlang.crc32(payload)::32>>

      case write(io, tmp, [header, payload]) do
        :ok -> {:cont, {:ok, total + count}}
        error -> {:halt, error}
      end
    end)
  catch
    # The bag was deleted during the dump: leave no temporary file behind.
    kind, reason ->
      File.close(io)
      File.rm(tmp)
      :erlang.raise(kind, reason, __STACKTRACE__)
  end

  defp open(tmp, path) do
    case File.open(tmp, [:write, :raw, :binary, :delayed_write]) do
      {:ok, io} -> {:ok, io}
      {:error, posix} -> file_error("cannot create the temporary file", path, tmp, posix)
    end
  end

  defp write(io, tmp, data) do
    case IO.binwrite(io, data) do
      :ok -> :ok
      {:error, posix} -> file_error("cannot write", tmp, tmp, posix)
    end
  end

  defp close(io, tmp) do
    case File.close(io) do
      :ok -> :ok
      {:error, posix} -> file_error("cannot write", tmp, tmp, posix)
    end
  end

  defp rename(tmp, path) do
    case File.rename(tmp, path) do
      :ok -> :ok
      {:error, posix} -> file_error("cannot rename the temporary file", path, tmp, posix)
    end
  end

  defp file_error(message, path, tmp, posix) do
    {:error,
     Larder.Error.new(:file_error, "#{message}: #{:file.format_error(posix)}",
       path: path,
       tmp: tmp,
       posix: posix
     )}
  end

  @doc """
  Reads the snapshot at `path` into a new bag created with `opts` (validated
  `Larder.Bag.new/1` options without `:dedup`).
  """
  @spec load(Path.t(), keyword()) :: {:ok, Larder.Bag.t()} | {:error, Larder.Error.t()}
  def load(path, opts) do
    with {:ok, data} <- read(path),
         {:ok, dedup, chunks} <- parse(data, path) do
      bag = Larder.Bag.create(Keyword.put(opts, :dedup, dedup))
      fill(bag, chunks, path)
    end
  end

  defp read(path) do
    case File.read(path) do
      {:ok, data} ->
        {:ok, data}

      {:error, posix} ->
        {:error,
         Larder.Error.new(:file_error, "cannot read: #{:file.format_error(posix)}",
           path: path,
           posix: posix
         )}
    end
  end

  defp parse(<<@magic, @version, dedup, rest::binary>>, path) when dedup in [0, 1] do
    with {:ok, chunks} <- parse_chunks(rest, [], 0, path), do: {:ok, dedup == 1, chunks}
  end

  defp parse(<<@magic, version, _::binary>>, path) when version != @version do
    corrupt("unsupported snapshot version #{version}", path)
  end

  defp parse(_data, path), do: corrupt("not a Larder.Bag snapshot", path)

  defp parse_chunks(<<0::32, total::64>>, acc, total, _path), do: {:ok, Enum.reverse(acc)}

  defp parse_chunks(<<0::32, total::64>>, _acc, seen, path),
    do: corrupt("the trailer announces #{total} pairs, the chunks hold #{seen}", path)

  defp parse_chunks(<<0::32, _::64, _extra, _::binary>>, _acc, _seen, path),
    do: corrupt("unexpected bytes after the trailer", path)

  defp parse_chunks(
         <<size::32, count::32, crc::32, payload::binary-size(size), rest::binary>>,
         acc,
         seen,
         path
       )
       when size > 0 do
    if :erlang.crc32(payload) == crc do
      parse_chunks(rest, [{count, payload} | acc], seen + count, path)
    else
      corrupt("checksum mismatch in the chunk at pair #{seen}", path)
    end
  end

  defp parse_chunks(_rest, _acc, seen, path),
    do: corrupt("truncated after #{seen} pairs", path)

  defp fill(bag, chunks, path) do
    Enum.each(chunks, fn {count, payload} ->
      objects = :erlang.binary_to_term(payload)
      length(objects) == count || throw(:count_mismatch)
      Larder.Bag.insert_objects(bag, objects)
    end)

    {:ok, bag}
  catch
    kind, reason ->
      Larder.Bag.delete_table(bag)

      case {kind, reason} do
        {:throw, :count_mismatch} -> corrupt("a chunk holds a wrong number of pairs", path)
        {:error, %ArgumentError{} = e} -> corrupt(Exception.message(e), path)
        {:error, reason} -> corrupt(inspect(reason), path)
        _ -> :erlang.raise(kind, reason, __STACKTRACE__)
      end
  end

  defp corrupt(message, path) do
    {:error, Larder.Error.new(:corrupt_snapshot, message, path: path)}
  end
end
