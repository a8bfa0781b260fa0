# Atomic, durable snapshot files shared by Larder.Bag and Larder.Table: a
# dump writes a temporary file beside the target, fsyncs it, renames it over
# the target and fsyncs the directory; temporary files of killed dumps are
# swept by the next dump of the same path.
defmodule Larder.SnapshotFile do
  @moduledoc false

  # A write is durable when it returns :ok: the temporary file is fsynced
  # before the rename, and the directory after it, so a power loss leaves
  # the old file or the complete new one.
  #
  # Temporary files. A dump writes `<path>.<os pid>.<vm token>-<n>.tmp` in
  # the directory of `path`: the OS process id of the VM, a random token
  # drawn when the :larder application starts (so a later VM with the same
  # OS pid is told apart), and a number unique in the VM, which the dump
  # registers with its Erlang pid (in the public ETS table
  # Larder.SnapshotFile) before it creates the file and deletes once the
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

  @registry __MODULE__

  @doc "Creates the table of live dumps; called once by Larder.Application.start/2."
  @spec create_table() :: :ok
  def create_table do
    _ = :ets.new(@registry, [:named_table, :public, :set])
    true = :ets.insert(@registry, {:token, Base.encode16(:rand.bytes(8), case: :lower)})
    :ok
  end

  @doc """
  Reads a whole snapshot file: `{:ok, binary}`, or `{:error,
  %Larder.Error{reason: :file_error}}` naming the path and the POSIX error.

  The file is read in the caller (a raw file), not through `File.read/1`,
  whose file server process keeps a reference to the file's bytes (tens of
  MB for a large table) until it next collects its garbage, which an idle
  file server may never do.
  """
  @spec read(Path.t()) :: {:ok, binary()} | {:error, Larder.Error.t()}
  def read(path) do
    case read_raw(path) do
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

  defp read_raw(path) do
    with {:ok, io} <- :file.open(path, [:read, :raw, :binary]) do
      try do
        with {:ok, size} <- :file.position(io, :eof),
             {:ok, 0} <- :file.position(io, :bof) do
          read_all(io, max(size, 1), [])
        end
      after
        :file.close(io)
      end
    end
  end

  # Until end of file: a file that grew since its size was taken is read whole.
  defp read_all(io, size, acc) do
    case :file.read(io, size) do
      {:ok, data} -> read_all(io, size, [data | acc])
      :eof when acc == [] -> {:ok, ""}
      # One read, as usual: its binary, not a copy.
      :eof when tl(acc) == [] -> {:ok, hd(acc)}
      :eof -> {:ok, acc |> :lists.reverse() |> IO.iodata_to_binary()}
      {:error, _} = error -> error
    end
  end

  @doc """
  Writes a file at `path` atomically and durably: `fun` gets a function that
  appends iodata to a temporary file next to `path` (returning `:ok` or
  `{:error, %Larder.Error{}}`) and returns `:ok` or an error; on `:ok` the
  file is fsynced, renamed over `path` and the directory fsynced. On an
  error or a raise the temporary file is removed. Deletes first the
  temporary files of `path` that dumps killed mid-write left. `caller`
  names the function in the error raised when :larder is not started.
  """
  @spec write(
          Path.t(),
          String.t(),
          ((iodata() -> :ok | {:error, Larder.Error.t()}) ->
             :ok | {:error, Larder.Error.t()})
        ) ::
          :ok | {:error, Larder.Error.t()}
  def write(path, caller, fun) do
    token = token!(caller)
    n = System.unique_integer([:positive])
    # Registered before the file exists, unregistered after it is gone.
    true = :ets.insert(@registry, {n, self()})

    try do
      sweep(path, token)
      write_file(fun, path, "#{path}.#{System.pid()}.#{token}-#{n}.tmp")
    after
      :ets.delete(@registry, n)
    end
  end

  defp token!(caller) do
    [{:token, token}] = :ets.lookup(@registry, :token)
    token
  rescue
    ArgumentError -> Larder.Instance.not_started!(caller)
  end

  # Deletes the temporary files of `path` whose writer is gone (see the
  # layout comment above). (A directory it cannot list: the write that
  # follows reports it.)
  defp sweep(path, token) do
    delete_siblings(path, fn suffix ->
      case Regex.run(~r/^(\d+)\.([0-9a-f]{16})-(\d+)\.tmp$/, suffix) do
        [_, os_pid, file_token, n] ->
          n = String.to_integer(n)
          stale? = stale?(os_pid, file_token, n, token)
          if stale? and file_token == token, do: :ets.delete(@registry, n)
          stale?

        nil ->
          false
      end
    end)
  end

  @doc """
  Deletes the files beside `path` named `<basename of path>.<suffix>` for
  which `delete?.(suffix)` is true. A directory that cannot be listed is
  left as it is. Returns `:ok`.
  """
  @spec delete_siblings(Path.t(), (String.t() -> boolean())) :: :ok
  def delete_siblings(path, delete?) do
    dir = Path.dirname(path)
    prefix = Path.basename(path) <> "."

    case File.ls(dir) do
      {:ok, names} ->
        for name <- names,
            String.starts_with?(name, prefix),
            delete?.(binary_part(name, byte_size(prefix), byte_size(name) - byte_size(prefix))),
            do: File.rm(Path.join(dir, name))

        :ok

      {:error, _} ->
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

  defp write_file(fun, path, tmp) do
    with {:ok, io} <- open(tmp, path) do
      result =
        try do
          with :ok <- fun.(&append(io, tmp, &1)),
               :ok <- sync(io, tmp),
               :ok <- close(io, tmp),
               :ok <- rename(tmp, path) do
            sync_dir(Path.dirname(path))
          end
        catch
          # The structure went away during the dump: leave no temporary file.
          kind, reason ->
            File.close(io)
            File.rm(tmp)
            :erlang.raise(kind, reason, __STACKTRACE__)
        after
          # Closing twice is harmless.
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

  defp open(tmp, path) do
    case File.open(tmp, [:write, :raw, :binary, :delayed_write]) do
      {:ok, io} -> {:ok, io}
      {:error, posix} -> file_error("cannot create the temporary file", path, tmp, posix)
    end
  end

  defp append(io, tmp, data) do
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
end
