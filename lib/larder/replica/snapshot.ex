# A replica's snapshot: the dump of its Table or Bag and the source's
# position after the last entry in it (a Larder.Replica.Source position: a
# stream id, a map of partition to offset), tied together by a small
# manifest file that names the log, the structure and the dump; the
# manifest's rename is the snapshot's commit.
defmodule Larder.Replica.Snapshot do
  @moduledoc false

  alias Larder.Replica.Target

  # A snapshot at `path` is two files:
  #
  #   <path>.<stamp>.dump  the structure's own snapshot, written first by
  #                        its target (Larder.Replica.Target);
  #   <path>               the manifest, written after it through
  #                        Larder.SnapshotFile.write/3 (temporary file, fsync,
  #                        rename, directory fsync).
  #
  # `<stamp>` is `<ms>-<8 hex digits>` (the OS time and 4 random bytes).
  # Beside them the replica writes `<path>.lock` (Larder.Replica.SnapshotLock)
  # and temporary files `<path>.<os pid>.<token>-<n>.tmp` (the manifest's)
  # and `<path>.<stamp>.dump.<os pid>.<token>-<n>.tmp` (a dump's), see
  # Larder.SnapshotFile. These names are exact patterns: the sweep deletes
  # only files that match them, so a replica at `<path>.b` or
  # `<path>.x.dump` in the same directory is never touched. A :snapshot
  # path that is itself one of these names of another path (ending in
  # `.lock`, `.<stamp>.dump` or `.<os pid>.<token>-<n>.tmp`) is refused by
  # check_path/1, as one whose longest derived name could not be created
  # (over NAME_MAX or PATH_MAX).
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
  # (a consistent cut, taken between two batches), or, for a target dumped
  # while the replica writes it, every effect of the entries up to `offset`
  # and perhaps some of later ones, which are idempotent (see
  # Larder.Replica.SnapshotSchedule). A kill before the manifest's
  # rename leaves the previous manifest, which names the previous dump, still
  # there: dumps are deleted only once a newer manifest names another one.
  # So a reader of `path` always finds a whole manifest and the dump it names.
  #
  # A manifest is not trusted: magic, version, length and checksum are
  # checked, the payload is decoded with binary_to_term/2's :safe option and
  # must have the shape above, the dump name must be exactly
  # `<the manifest's name>.<stamp>.dump`, and its size must match. A manifest of
  # another source, log or structure is refused as :snapshot_mismatch.

  @magic "LARDERREP"
  @version 1

  # What follows `<basename of path>.` in a dump's name, and in a dump's
  # temporary file's (Larder.SnapshotFile's `<os pid>.<token>-<n>.tmp`).
  @dump ~S"\d+-[0-9a-f]{8}\.dump"
  @tmp ~S"\d+\.[0-9a-f]{16}-\d+\.tmp"
  @dump_re Regex.compile!("\\A" <> @dump <> "\\z")
  @dump_tmp_re Regex.compile!("\\A" <> @dump <> "\\." <> @tmp <> "\\z")
  # A path whose basename is a derived name of another path.
  @reserved_re Regex.compile!("\\.(lock|" <> @dump <> "|" <> @tmp <> ")\\z")

  # The longest name derived from a path (a dump's temporary file), after
  # the path's basename: a stamp of 13 digits of ms (until the year 2286),
  # an OS pid of at most 10 digits, a counter of at most 20.
  @longest_suffix byte_size(
                    ".1700000000000-0123abcd.dump.4294967295.0123456789abcdef-" <>
                      "18446744073709551615.tmp"
                  )
  @name_max 255
  @path_max 4_096

  @type manifest :: %{offset: term(), dump: Path.t()}

  @typedoc """
  What a manifest names: the source module, its log's identity
  (`c:Larder.Replica.Source.identity/1`) and the target's
  (`Larder.Replica.Target.identity/2`).
  """
  @type identity :: %{source: module(), log: binary(), target: term()}

  @doc """
  Dumps the structure `handle` of `target` and commits the manifest for
  `offset`, in the calling process (which must not write `handle`
  meanwhile). Deletes the dumps no manifest names any more.
  """
  @spec write(Path.t(), identity(), Target.t(), Target.handle(), term()) ::
          :ok | {:error, Larder.Error.t()}
  def write(path, identity, target, handle, offset) do
    dump = dump_path(path)

    with :ok <- Target.dump(target, handle, dump) do
      commit(path, identity, offset, dump)
    end
  end

  @doc """
  Starts a snapshot of the structure `handle` of `target` at `offset` that
  the caller, the replica's process, does not wait for: a process linked to
  it dumps the structure and commits the manifest, and then sends the
  caller `{Larder.Replica.Snapshot, pid, :ok | {:error, %Larder.Error{}}}`.
  The target begins the dump before this returns (`Target.start_dump/4`: a
  Table's writer takes its cut then, so the dump holds the table as it is
  now whatever the caller writes next) and the process finishes it
  (`Target.finish_dump/4`: a Bag's dump reads the bag while the caller
  writes it, see `c:Larder.Replica.Target.dump_mode/2` for when that is
  allowed).
  """
  @spec start(Path.t(), identity(), Target.t(), Target.handle(), term()) :: pid()
  def start(path, identity, target, handle, offset) do
    replica = self()
    dump = dump_path(path)

    pid =
      spawn_link(fn ->
        # Background work: the replica's process comes first.
        Process.flag(:priority, :low)

        written =
          receive do
            {:cut, {:ok, cut}} -> Target.finish_dump(target, handle, dump, cut)
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

    send(pid, {:cut, Target.start_dump(target, handle, dump, pid)})
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
  @spec commit(Path.t(), identity(), term(), Path.t()) :: :ok | {:error, Larder.Error.t()}
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

  # Deletes the dumps of `path` (`<path>.<stamp>.dump`) other than `keep`,
  # and the temporary files of dumps killed mid-write
  # (`<path>.<stamp>.dump.<os pid>.<token>-<n>.tmp`: each dump has a path of
  # its own, so the structure's own sweep, which deletes the temporary
  # files of the path it writes, never meets them): exactly these names,
  # so no file of a replica at another path is touched. Run after a commit,
  # when no dump of this replica is being written. One replica per snapshot
  # path: Larder.Replica.SnapshotLock, claimed at start, refuses a second
  # one, in this VM or another.
  defp sweep(path, keep) do
    prefix = Path.basename(path) <> "."

    Larder.SnapshotFile.delete_siblings(path, fn suffix ->
      (Regex.match?(@dump_re, suffix) and prefix <> suffix != keep) or
        Regex.match?(@dump_tmp_re, suffix)
    end)
  end

  @doc """
  Checks that `path` can be a replica's snapshot path: `:ok`, or `{:error,
  message}` when its basename is a name a replica derives from another
  path (`.lock`, `.<stamp>.dump`, a temporary file's), or when its longest
  derived name would be over NAME_MAX (#{@name_max} bytes) or its path over
  PATH_MAX (#{@path_max} bytes, with the terminating NUL), relative paths
  expanded.
  """
  @spec check_path(Path.t()) :: :ok | {:error, String.t()}
  def check_path(path) do
    base = Path.basename(path)
    expanded = Path.expand(path)

    cond do
      base in ["", ".", ".."] or String.ends_with?(path, "/") ->
        {:error, "a path to a file, got a directory: #{inspect(path)}"}

      Regex.match?(@reserved_re, base) ->
        {:error,
         "a path whose file name is not one a replica derives from another path " <>
           "(ending in .lock, .<ms>-<8 hex>.dump or .<os pid>.<16 hex>-<n>.tmp: " <>
           "the lock, dump and temporary files of the replica at the path before it), " <>
           "got: #{inspect(path)}"}

      byte_size(base) + @longest_suffix > @name_max ->
        {:error,
         "a file name of at most #{@name_max - @longest_suffix} bytes (the names " <>
           "derived from it, such as <path>.<stamp>.dump.<os pid>.<token>-<n>.tmp, " <>
           "add up to #{@longest_suffix} bytes and must fit NAME_MAX, #{@name_max}), " <>
           "got #{byte_size(base)} bytes: #{inspect(path, limit: 10, printable_limit: 80)}"}

      byte_size(expanded) + @longest_suffix + 1 > @path_max ->
        {:error,
         "a path of at most #{@path_max - @longest_suffix - 1} bytes once expanded " <>
           "(the names derived from it add up to #{@longest_suffix} bytes and must fit " <>
           "PATH_MAX, #{@path_max}), got #{byte_size(expanded)} bytes"}

      true ->
        :ok
    end
  end

  @doc """
  Reads and checks the manifest at `path` against `identity`: `{:ok,
  %{offset: position, dump: dump_path}}`, `:none` when there is no file, or an
  error (`:corrupt_snapshot`, `:snapshot_mismatch`, `:file_error`).
  """
  @spec read(Path.t(), identity()) :: {:ok, manifest()} | :none | {:error, Larder.Error.t()}
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

      not String.starts_with?(dump, prefix) or
          not Regex.match?(
            @dump_re,
            binary_part(dump, byte_size(prefix), byte_size(dump) - byte_size(prefix))
          ) ->
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
