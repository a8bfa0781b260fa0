# The snapshot file format of Larder.Bag: checksummed chunks, atomic and
# durable writes, and a load that checks the file's framing before it creates
# the table and the shape of every object before it inserts it.
defmodule Larder.Bag.Snapshot do
  @moduledoc false

  # File layout (integers big-endian):
  #
  #   "LARDERBAG" <<version::8, dedup::8>>
  #   chunk*      <<size::32, count::32, crc32::32, payload::binary-size(size)>>
  #   trailer     <<0::32, total::64>>
  #
  # `payload` is term_to_binary/1 (uncompressed) of a list of `count` ETS
  # objects `{key, value}`, in the order the table holds them (so the values
  # of a key keep their insertion order); `crc32` covers it. dedup = 1 marks
  # a deduplicating bag: load/2 counts the fingerprints of its pairs (and
  # skips a pair the file holds twice), dedup = 0 a plain :duplicate_bag.
  # Version 1 (a deduplicating bag as an ordered_set of `{[key | value]}`,
  # in term order) is refused: its order is not the insertion order.
  # The trailer holds the total number of objects, so a file cut at a chunk
  # boundary is caught too. Nothing may follow the trailer.
  #
  # A file is not trusted on load. Before anything is decoded, every chunk's
  # length, checksum and `count` (at most @max_chunk_count) are checked against
  # the bytes actually read, so header fields never size an allocation. A
  # payload is decoded with binary_to_term(payload, [:safe, :used]): it must be
  # one uncompressed term (a compressed one could declare gigabytes) that fills
  # the payload exactly and creates no atom (unless `create_atoms: true`), so
  # decoding allocates at most a small constant times the file's size. The
  # decoded term must be a proper list of `count` `{key, value}` tuples;
  # otherwise the load fails and the table is deleted.
  #
  # Writing (temporary file, fsync, rename, sweep of killed dumps' files) is
  # Larder.SnapshotFile's.

  require Logger

  @magic "LARDERBAG"
  @version 2

  # No chunk that dump/3 writes holds more objects than Larder.Bag's dump
  # chunk (4,096); the bound leaves room while rejecting absurd counts.
  @max_chunk_count 65_536

  @doc """
  Writes the chunks (lists of ETS objects) to `path` through
  `Larder.SnapshotFile.write/3` (a temporary file, fsync, rename).
  """
  @spec dump(Enumerable.t(), boolean(), Path.t()) :: :ok | {:error, Larder.Error.t()}
  def dump(chunks, dedup, path) do
    Larder.SnapshotFile.write(path, "Larder.Bag.dump/2", fn write ->
      with :ok <- write.([@magic, @version, if(dedup, do: 1, else: 0)]),
           {:ok, total} <- write_chunks(write, chunks) do
        write.(<<0::32, total::64>>)
      end
    end)
  end

  defp write_chunks(write, chunks) do
    Enum.reduce_while(chunks, {:ok, 0}, fn objects, {:ok, total} ->
      payload = :erlang.term_to_binary(objects)
      count = length(objects)
      header = <<byte_size(payload)::32, count::32, :erlang.crc32(payload)::32>>

      case write.([header, payload]) do
        :ok -> {:cont, {:ok, total + count}}
        error -> {:halt, error}
      end
    end)
  end

  @doc """
  Reads the snapshot at `path` into a new bag created with `opts` (validated
  `Larder.Bag.load/2` options). With `create_atoms: false` a payload that
  holds an atom this VM does not know is corrupt.
  """
  @spec load(Path.t(), keyword()) :: {:ok, Larder.Bag.t()} | {:error, Larder.Error.t()}
  def load(path, opts) do
    started = System.monotonic_time()
    {create_atoms, opts} = Keyword.pop(opts, :create_atoms, false)
    decode_opts = if create_atoms, do: [:used], else: [:safe, :used]

    with {:ok, data} <- Larder.SnapshotFile.read(path),
         {:ok, dedup, chunks} <- parse(data, path),
         bag = Larder.Bag.Store.create(Keyword.put(opts, :dedup, dedup)),
         {:ok, bag} <- fill(bag, chunks, decode_opts, path) do
      log_loaded(bag, path, byte_size(data), started)
      {:ok, bag}
    end
  end

  # The one info line of a load: the bag's name (or handle), the path, its
  # pairs, the file's bytes and the time since `started`.
  defp log_loaded(bag, path, bytes, started) do
    ms = System.convert_time_unit(System.monotonic_time() - started, :native, :microsecond) / 1000

    Logger.info(fn ->
      pairs = :ets.info(bag.tab, :size)

      "#{Larder.Instance.describe(Larder.Bag, bag.name, bag)} loaded from #{inspect(path)}: " <>
        "#{pairs} #{if pairs == 1, do: "pair", else: "pairs"}, #{bytes} bytes, " <>
        "in #{:erlang.float_to_binary(ms, decimals: 1)} ms"
    end)
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

  defp parse_chunks(<<size::32, count::32, _::binary>>, _acc, seen, path)
       when size > 0 and count > @max_chunk_count,
       do: corrupt("the chunk at pair #{seen} announces #{count} pairs", path)

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

  # Decodes, checks and inserts one chunk at a time (a decoded chunk is
  # garbage once inserted); on the first bad chunk the table is deleted.
  defp fill(bag, chunks, decode_opts, path) do
    Enum.reduce_while(chunks, 0, fn {count, payload}, seen ->
      case decode(payload, decode_opts) do
        {:ok, objects, ^count} ->
          Larder.Bag.Store.insert_loaded(bag, objects)
          {:cont, seen + count}

        {:ok, _objects, actual} ->
          {:halt, {:bad, seen, "holds #{actual} pairs, its header says #{count}"}}

        {:error, why} ->
          {:halt, {:bad, seen, why}}
      end
    end)
    |> case do
      {:bad, seen, why} ->
        Larder.Bag.drop(bag)
        corrupt("the chunk at pair #{seen} #{why}", path)

      _total ->
        {:ok, bag}
    end
  catch
    kind, reason ->
      Larder.Bag.drop(bag)
      :erlang.raise(kind, reason, __STACKTRACE__)
  end

  # A compressed term (tag 80) declares its uncompressed size: a few bytes
  # could ask for gigabytes. dump/3 never writes one.
  defp decode(<<131, 80, _::binary>>, _opts), do: {:error, "is compressed"}

  defp decode(payload, opts) do
    {term, used} = :erlang.binary_to_term(payload, opts)

    cond do
      used != byte_size(payload) ->
        {:error, "has #{byte_size(payload) - used} bytes after its term"}

      true ->
        count_pairs(term, 0)
    end
  rescue
    # binary_to_term/2 raises ArgumentError on a bad or unsafe term; nothing
    # a payload holds may escape as another exception either.
    _ ->
      {:error,
       "is not a valid external term, or holds an atom this VM does not know " <>
         "(see load/2's :create_atoms option)"}
  end

  # `{:ok, pairs, n}` if `pairs` is a proper list of n `{key, value}` tuples.
  defp count_pairs(pairs, n), do: count_pairs(pairs, pairs, n)
  defp count_pairs([{_, _} | rest], all, n), do: count_pairs(rest, all, n + 1)
  defp count_pairs([], all, n), do: {:ok, all, n}
  defp count_pairs(_bad, _all, n), do: {:error, "holds an object of the wrong shape at #{n}"}

  defp corrupt(message, path) do
    {:error, Larder.Error.new(:corrupt_snapshot, message, path: path)}
  end
end
