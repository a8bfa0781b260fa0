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
  # A dump is durable when it returns :ok: the temporary file is fsynced before
  # the rename, and the directory after it, so a power loss leaves the old file
  # or the complete new one.
  #
  # Temporary files. A dump writes `<path>.<os pid>.<vm token>-<n>.tmp` in
  # the directory of `path`: the OS process id of the VM, a random token
  # drawn when the :larder application starts (so a later VM with the same
  # OS pid is told apart), and a number unique in the VM, which the dump
  # registers with its Erlang pid (in the public ETS table
  # Larder.Bag.Snapshot) before it creates the file and deletes once the
  # file is renamed or removed. A dump killed mid-write leaves its file; the
  # next dump of the same `path` (from any VM) deletes every temporary file
  # of `path` whose writer is gone, and no other:
  #
  #   * this VM's token: the number is not registered, or its Erlang process
  #     is not alive (a dump killed inside a dirty write counts as gone at
  #     once; deleting the file then is safe, the write lands in an unlinked
  #     file and the dead process never renames it);
  #   * another token with this VM's OS pid: a previous run of a VM with the
  #     same pid (as a container's pid 1 is), so gone;
  #   * another OS pid: gone when /proc/<pid> does not exist. Without /proc
  #     such files are kept. This assumes the processes that dump into one
  #     directory share a pid namespace (not containers with their own
  #     namespaces over one shared volume).
  #
  # So a dump never deletes a live dump's file. A killed dump's file can
  # outlive the next dump only when its creation (a dirty I/O call that
  # runs to its end after the kill) finishes after that dump looked; the
  # dump after deletes it. Cost: one listing of the directory per dump.

  @magic "LARDERBAG"
  @version 2

  # No chunk that dump/3 writes holds more objects than Larder.Bag's dump
  # chunk (4,096); the bound leaves room while rejecting absurd counts.
  @max_chunk_count 65_536

  @registry __MODULE__

  @doc "Creates the table of live dumps; called once by Larder.Application.start/2."
  @spec create_table() :: :ok
  def create_table do
    _ = :ets.new(@registry, [:named_table, :public, :set])
    true = :ets.insert(@registry, {:token, Base.encode16(:rand.bytes(8), case: :lower)})
    :ok
  end

  @doc """
  Writes the chunks (lists of ETS objects) to a temporary file next to
  `path`, fsyncs it, renames it over `path` and fsyncs the directory.
  Deletes the temporary files of `path` that dumps killed mid-write left.
  """
  @spec dump(Enumerable.t(), boolean(), Path.t()) :: :ok | {:error, Larder.Error.t()}
  def dump(chunks, dedup, path) do
    token = token!()
    n = System.unique_integer([:positive])
    # Registered before the file exists, unregistered after it is gone.
    true = :ets.insert(@registry, {n, self()})

    try do
      sweep(path, token)
      write_file(chunks, dedup, path, "#{path}.#{System.pid()}.#{token}-#{n}.tmp")
    after
      :ets.delete(@registry, n)
    end
  end

  defp token! do
    [{:token, token}] = :ets.lookup(@registry, :token)
    token
  rescue
    ArgumentError ->
      raise RuntimeError, "Larder.Bag.dump/2 needs the :larder application to be started"
  end

  # Deletes the temporary files of `path` whose writer is gone (see the
  # layout comment above).
  defp sweep(path, token) do
    dir = Path.dirname(path)
    prefix = Path.basename(path) <> "."

    case File.ls(dir) do
      {:ok, names} ->
        for name <- names,
            String.starts_with?(name, prefix),
            suffix = binary_part(name, byte_size(prefix), byte_size(name) - byte_size(prefix)),
            [_, os_pid, file_token, n] <- [
              Regex.run(~r/^(\d+)\.([0-9a-f]{16})-(\d+)\.tmp$/, suffix)
            ],
            stale?(os_pid, file_token, String.to_integer(n), token) do
          _ = File.rm(Path.join(dir, name))
          if file_token == token, do: :ets.delete(@registry, String.to_integer(n))
        end

        :ok

      {:error, _} ->
        # The write that follows reports an unusable directory.
        :ok
    end
  end

  defp stale?(_os_pid, token, n, token) do
    case :ets.lookup(@registry, n) do
      [{^n, pid}] -> not Process.alive?(pid)
      [] -> true
    end
  end

  defp stale?(os_pid, _other_token, _n, _token) do
    cond do
      os_pid == System.pid() -> true
      File.dir?("/proc/self") -> not File.exists?("/proc/" <> os_pid)
      true -> false
    end
  end

  defp write_file(chunks, dedup, path, tmp) do
    with {:ok, io} <- open(tmp, path) do
      result =
        try do
          with :ok <- write(io, tmp, [@magic, @version, if(dedup, do: 1, else: 0)]),
               {:ok, total} <- write_chunks(io, tmp, chunks),
               :ok <- write(io, tmp, <<0::32, total::64>>),
               :ok <- sync(io, tmp),
               :ok <- close(io, tmp),
               :ok <- rename(tmp, path) do
            sync_dir(Path.dirname(path))
          end
        after
          # Closing twice is harmless; this also closes on a raise.
          File.close(io)
        end

      # After a failed directory sync the file is already renamed: rm is a no-op.
      if result != :ok, do: File.rm(tmp)
      result
    end
  end

  @doc """
  Flushes the directory `dir` to disk (its entries, such as a rename into
  it), like fsync(2) on the directory.
  """
  @spec sync_dir(Path.t()) :: :ok | {:error, Larder.Error.t()}
  def sync_dir(dir) do
    # The :directory mode (OTP 22+) lets file:open/2 open a directory; sync/1
    # is then fsync(2) on it.
    case :file.open(dir, [:read, :raw, :directory]) do
      {:ok, fd} ->
        result = :file.sync(fd)
        :file.close(fd)

        case result do
          :ok -> :ok
          {:error, posix} -> file_error("cannot sync the directory", dir, nil, posix)
        end

      {:error, posix} ->
        file_error("cannot open the directory to sync it", dir, nil, posix)
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

  defp sync(io, tmp) do
    case :file.sync(io) do
      :ok -> :ok
      {:error, posix} -> file_error("cannot sync", tmp, tmp, posix)
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
    details = if tmp, do: [path: path, tmp: tmp, posix: posix], else: [path: path, posix: posix]
    {:error, Larder.Error.new(:file_error, "#{message}: #{:file.format_error(posix)}", details)}
  end

  @doc """
  Reads the snapshot at `path` into a new bag created with `opts` (validated
  `Larder.Bag.load/2` options). With `create_atoms: false` a payload that
  holds an atom this VM does not know is corrupt.
  """
  @spec load(Path.t(), keyword()) :: {:ok, Larder.Bag.t()} | {:error, Larder.Error.t()}
  def load(path, opts) do
    {create_atoms, opts} = Keyword.pop(opts, :create_atoms, false)
    decode_opts = if create_atoms, do: [:used], else: [:safe, :used]

    with {:ok, data} <- read(path),
         {:ok, dedup, chunks} <- parse(data, path) do
      bag = Larder.Bag.create(Keyword.put(opts, :dedup, dedup))
      fill(bag, chunks, decode_opts, path)
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
          Larder.Bag.insert_objects(bag, objects)
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
