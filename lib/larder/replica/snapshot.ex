# A replica's snapshot: the dump of its Table or Bag and the source's
# position after the last entry in it (a Larder.Replica.Source position: a
# stream id, a map of partition to offset), tied together by a small
# manifest file that names the log, the structure and the dump; the
# manifest's rename is the snapshot's commit.
defmodule Larder.Replica.Snapshot do
  @moduledoc false

  # A snapshot at `path` is two files:
  #
  #   <path>.<stamp>.dump  the structure's own snapshot (Larder.Table.dump/2
  #                        or Larder.Bag.dump/2), written first;
  #   <path>               the manifest, written after it through
  #                        Larder.SnapshotFile.write/3 (temporary file, fsync,
  #                        rename, directory fsync).
  #
  # Manifest layout (integers big-endian):
  #
  #   "LARDERREP" <<version::8, size::32, crc32::32, payload::binary-size(size)>>
  #
  # `payload` is term_to_binary/1 of
  #
  #   {source_module, log_identity, target_identity, offset, dump_name, dump_size}
  #
  # where offset is the source's position (checked with its
  # cast_position/1) and dump_name is the dump's base name (in the
  # manifest's directory).
  # Nothing may follow the payload.
  #
  # The dump holds the structure as it was at `offset` and no later entry
  # (a consistent cut, taken between two batches), or, for a deduplicating
  # Bag fed by an arity-1 apply, every effect of the entries up to `offset`
  # and perhaps some of later ones, which are idempotent (see
  # Larder.Replica.Server's snapshot path). A kill before the manifest's
  # rename leaves the previous manifest, which names the previous dump, still
  # there: dumps are deleted only once a newer manifest names another one.
  # So a reader of `path` always finds a whole manifest and the dump it names.
  #
  # A manifest is not trusted: magic, version, length and checksum are
  # checked, the payload is decoded with binary_to_term/2's :safe option and
  # must have the shape above, the dump name must be a plain file name that
  # starts with the manifest's own, and its size must match. A manifest of
  # another source, log or structure is refused as :snapshot_mismatch.

  @magic "LARDERREP"
  @version 1

  @type manifest :: %{offset: term(), dump: Path.t()}

  @doc """
  Dumps `handle` and commits the manifest for `offset`, in the calling
  process (which must not write `handle` meanwhile). Deletes the dumps no
  manifest names any more.
  """
  @spec write(Path.t(), map(), term(), term()) :: :ok | {:error, Larder.Error.t()}
  def write(path, identity, target, offset) do
    dump = dump_path(path)

    with :ok <- Larder.Replica.Target.dump(identity.spec, target, dump) do
      commit(path, identity, offset, dump)
    end
  end

  @doc """
  Starts a snapshot of `target` at `offset` that the caller, the replica's
  process, does not wait for: a process linked to it dumps the structure
  and commits the manifest, and then sends the caller
  `{Larder.Replica.Snapshot, pid, :ok | {:error, %Larder.Error{}}}`. For a
  Table the cut is taken before this returns (Larder.Table.Dump), so the
  dump holds the table as it is now whatever the caller writes next; for a
  Bag the dump reads the bag while the caller writes it (see "Snapshots" in
  Larder.Replica.Server for when that is allowed).
  """
  @spec start(Path.t(), map(), term(), term()) :: pid()
  def start(path, identity, target, offset) do
    replica = self()
    dump = dump_path(path)

    pid =
      spawn_link(fn ->
        # Background work: the replica's process comes first.
        Process.flag(:priority, :low)

        written =
          receive do
            {:cut, {Larder.Table, writer, ref}} -> Larder.Table.Dump.await(writer, ref)
            {:cut, Larder.Bag} -> Larder.Bag.dump(target, dump)
            {:cut, :gone} -> :gone
          end

        result =
          case written do
            :ok -> commit(path, identity, offset, dump)
            {:error, %Larder.Error{}} = error -> error
            :gone -> exit(:structure_gone)
            {:raise, kind, reason, stack} -> :erlang.raise(kind, reason, stack)
          end

        send(replica, {__MODULE__, self(), result})
      end)

    cut =
      case identity.spec do
        {Larder.Table, _} ->
          case Larder.Table.Dump.request(target, dump, pid) do
            {:ok, ref} -> {Larder.Table, target.writer, ref}
            :gone -> :gone
          end

        {Larder.Bag, _} ->
          Larder.Bag
      end

    send(pid, {:cut, cut})
    pid
  end

  @doc "A new dump's path for the snapshot `path` (`<path>.<stamp>.dump`)."
  @spec dump_path(Path.t()) :: Path.t()
  def dump_path(path) do
    stamp = "#{System.os_time(:millisecond)}-#{Base.encode16(:rand.bytes(4), case: :lower)}"
    "#{path}.#{stamp}.dump"
  end

  @doc """
  Commits the manifest naming the written `dump` at `offset`, then deletes
  the dumps no manifest names any more. On an error the dump is deleted.
  """
  @spec commit(Path.t(), map(), term(), Path.t()) :: :ok | {:error, Larder.Error.t()}
  def commit(path, identity, offset, dump) do
    base = Path.basename(dump)

    with {:ok, %File.Stat{size: size}} <- stat(dump) do
      payload =
        :erlang.term_to_binary(
          {identity.source, identity.log, identity.target, offset, base, size}
        )

      result =
        Larder.SnapshotFile.write(path, "Larder.Replica", fn write ->
          write.([
            @magic,
            @version,
            <<byte_size(payload)::32, :erlang.crc32(payload)::32>>,
            payload
          ])
        end)

      case result do
        :ok ->
          sweep(path, base)
          :ok

        error ->
          File.rm(dump)
          error
      end
    end
  end

  defp stat(path) do
    case File.stat(path) do
      {:ok, stat} ->
        {:ok, stat}

      {:error, posix} ->
        {:error, Larder.Error.new(:file_error, "cannot stat the dump", path: path, posix: posix)}
    end
  end

  # Deletes `<path>.*.dump` files other than `keep`, and the temporary
  # files of dumps killed mid-write (`<path>.*.dump.*.tmp`: each dump has a
  # path of its own, so the structure's own sweep, which deletes the
  # temporary files of the path it writes, never meets them). Run after a
  # commit, when no dump of this replica is being written. One replica per
  # snapshot path: Larder.Replica.SnapshotLock, claimed at start, refuses a
  # second one, in this VM or another.
  defp sweep(path, keep) do
    prefix = Path.basename(path) <> "."

    Larder.SnapshotFile.delete_siblings(path, fn suffix ->
      prefix <> suffix != keep and
        (String.ends_with?(suffix, ".dump") or suffix =~ ~r/\.dump\..*\.tmp\z/)
    end)
  end

  @doc """
  Reads and checks the manifest at `path` against `identity`: `{:ok,
  %{offset: position, dump: dump_path}}`, `:none` when there is no file, or an
  error (`:corrupt_snapshot`, `:snapshot_mismatch`, `:file_error`).
  """
  @spec read(Path.t(), map()) :: {:ok, manifest()} | :none | {:error, Larder.Error.t()}
  def read(path, identity) do
    case Larder.SnapshotFile.read(path) do
      {:ok, data} -> parse(data, path, identity)
      {:error, %Larder.Error{details: %{posix: :enoent}}} -> :none
      {:error, error} -> {:error, error}
    end
  end

  defp parse(<<@magic, @version, size::32, crc::32, payload::binary-size(size)>>, path, identity) do
    with true <- :erlang.crc32(payload) == crc || corrupt("checksum mismatch", path),
         {:ok, term} <- decode(payload, path) do
      check(term, path, identity)
    end
  end

  defp parse(<<@magic, version, _::binary>>, path, _identity) when version != @version,
    do: corrupt("unsupported replica snapshot version #{version}", path)

  defp parse(_data, path, _identity), do: corrupt("not a Larder.Replica snapshot", path)

  defp decode(<<131, 80, _::binary>>, path), do: corrupt("a compressed manifest", path)

  defp decode(payload, path) do
    case :erlang.binary_to_term(payload, [:safe, :used]) do
      {term, used} when used == byte_size(payload) -> {:ok, term}
      _ -> corrupt("bytes after the manifest's term", path)
    end
  rescue
    ArgumentError -> corrupt("the manifest is not a valid term", path)
  end

  defp check({source, log, target, offset, dump, size}, path, identity)
       when is_atom(source) and is_binary(log) and is_binary(dump) and is_integer(size) do
    prefix = Path.basename(path) <> "."

    cond do
      {source, log, target} != {identity.source, identity.log, identity.target} ->
        {:error,
         Larder.Error.new(
           :snapshot_mismatch,
           "the snapshot was written by a replica of another log or structure",
           path: path,
           snapshot: [source: source, log: log, target: target],
           given: [source: identity.source, log: identity.log, target: identity.target]
         )}

      identity.source.cast_position(offset) != {:ok, offset} ->
        corrupt("a bad offset", path)

      Path.basename(dump) != dump or not String.starts_with?(dump, prefix) or
          not String.ends_with?(dump, ".dump") ->
        corrupt("a bad dump name", path)

      true ->
        dump_path = Path.join(Path.dirname(path), dump)

        case File.stat(dump_path) do
          {:ok, %File.Stat{size: ^size}} ->
            {:ok, %{offset: offset, dump: dump_path}}

          {:ok, _} ->
            corrupt("the dump #{dump} has another size than the manifest says", path)

          {:error, posix} ->
            {:error,
             Larder.Error.new(:file_error, "cannot read the dump the manifest names",
               path: dump_path,
               posix: posix
             )}
        end
    end
  end

  defp check(_term, path, _identity), do: corrupt("a manifest of the wrong shape", path)

  defp corrupt(message, path),
    do: {:error, Larder.Error.new(:corrupt_snapshot, message, path: path)}
end
