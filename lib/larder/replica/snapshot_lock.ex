# One replica per snapshot path: a replica claims its path at start, in
# this VM (a claim in Larder.Instance's table, which names the holder) and
# on the host (a kernel lock on `<path>.lock`), so that a second replica on
# the same path is refused instead of sweeping the first one's dumps.
defmodule Larder.Replica.SnapshotLock do
  @moduledoc false

  # The host-wide lock is flock(2) on `<path>.lock`, taken by the NIF
  # (Larder.Native.file_lock/1) and held by a resource kept in the replica's
  # state. The kernel releases it when the file is closed: by release/1 on
  # a clean stop, when the replica's process dies and its heap (the
  # resource) is freed, and when the whole VM dies, SIGKILL included. So a
  # lock is never stale: a restarted service is never locked out by its
  # dead predecessor, and of two racing starters the kernel gives the lock
  # to one. A clean release deletes the file while it still holds the
  # lock, and a taker counts its lock only if the file it locked is still
  # the one at the path (the NIF checks the inode), so a taker that opened
  # the file just before its deletion tries again. A killed holder leaves
  # the file, which the next taker reuses. Its content, the holder's OS
  # pid, node and replica name, is for the error message, and marks it as
  # a lock file (the NIF writes only a file that is one).
  #
  # A killed replica's resource is freed as its process exits, which may
  # be just after its supervisor saw the exit and started the next one:
  # a start that finds the lock taken tries again for up to @wait_ms
  # before it refuses.
  #
  # The claim is also where a path that cannot hold snapshots is refused,
  # before anything is read or written: a directory that does not exist or
  # is not writable (a typo would otherwise give a replica that never
  # snapshots), a lock file that cannot be opened, a symbolic link at the
  # lock file's path (the NIF opens it with O_NOFOLLOW: a replica writes
  # through no link), and a file there that is not a lock file (the NIF
  # proves it is one before it writes it; see lockfile.rs). Each is
  # `{:error, %Larder.Error{reason: :file_error}}` naming the option.

  alias Larder.Instance

  @wait_ms 2_000
  @retry_ms 20

  @opaque t :: {Path.t(), reference()}

  @doc """
  Claims `path` for the calling replica `name`: `{:ok, lock}`, or `{:error,
  %Larder.Error{reason: :snapshot_in_use}}` naming the path and the holder
  (its pid and name in this VM, or its OS pid), or `{:error,
  %Larder.Error{reason: :file_error}}` when the path cannot hold snapshots
  (its directory is missing or not writable, its lock file cannot be
  opened, is a symbolic link or is not a lock file).
  """
  @spec claim(Path.t(), atom()) :: {:ok, t()} | {:error, Larder.Error.t()}
  def claim(path, name) do
    path = Path.expand(path)

    with :ok <- check_dir(path) do
      claim_expanded(path, name)
    end
  end

  defp claim_expanded(path, name) do
    case Instance.claim(__MODULE__, path, self()) do
      :ok ->
        case lock(path, name, deadline()) do
          {:ok, native} ->
            {:ok, {path, native}}

          {:error, error} ->
            Instance.unclaim(__MODULE__, path, self())
            {:error, error}
        end

      {:error, {:already_started, holder}} ->
        {:error,
         in_use(path,
           holder: holder,
           holder_name: Instance.name_of(Larder.Replica, holder)
         )}
    end
  end

  @doc "Lets go of the path (a clean stop; a dead holder's lock goes by itself)."
  @spec release(t()) :: :ok
  def release({path, native}) do
    Larder.Native.file_lock_release(native)
    Instance.unclaim(__MODULE__, path, self())
  end

  defp deadline, do: System.monotonic_time(:millisecond) + @wait_ms

  defp lock(path, name, deadline) do
    file = path <> ".lock"

    case Larder.Native.file_lock(file, "#{System.pid()} #{node()} #{inspect(name)}\n") do
      {:ok, native} ->
        {:ok, native}

      {:error, :locked} ->
        if System.monotonic_time(:millisecond) < deadline do
          Process.sleep(@retry_ms)
          lock(path, name, deadline)
        else
          {:error, in_use(path, holder_os_pid: holder_os_pid(file))}
        end

      {:error, :not_a_lock_file} ->
        {:error,
         file_error(
           "the lock file #{file} of the :snapshot path is not a lock file (another " <>
             "program's file, or another replica's snapshot?); it was left as it is: " <>
             "move it away, or choose another :snapshot path",
           path,
           lock_file: file
         )}

      {:error, :eloop} ->
        {:error,
         file_error(
           "the lock file #{file} of the :snapshot path is a symbolic link; a replica " <>
             "opens its lock file without following links: remove the link",
           path,
           lock_file: file,
           posix: :eloop
         )}

      {:error, posix} ->
        {:error,
         file_error(
           "cannot open the lock file #{file} of the :snapshot path: " <>
             "#{:file.format_error(posix)}",
           path,
           lock_file: file,
           posix: posix
         )}
    end
  end

  # The directory snapshots are written in: there, a directory, writable
  # (as access(2) says: root may write a directory of mode 0555).
  defp check_dir(path) do
    dir = Path.dirname(path)

    case File.stat(dir) do
      {:ok, %File.Stat{type: :directory, access: access}} when access in [:write, :read_write] ->
        :ok

      {:ok, %File.Stat{type: :directory}} ->
        {:error,
         file_error("the directory #{dir} of the :snapshot path is not writable", path,
           dir: dir,
           posix: :eacces
         )}

      {:ok, %File.Stat{}} ->
        {:error,
         file_error("#{dir}, the directory of the :snapshot path, is not a directory", path,
           dir: dir,
           posix: :enotdir
         )}

      {:error, :enoent} ->
        {:error,
         file_error("the directory #{dir} of the :snapshot path does not exist", path,
           dir: dir,
           posix: :enoent
         )}

      {:error, posix} ->
        {:error,
         file_error(
           "cannot reach the directory #{dir} of the :snapshot path: " <>
             :file.format_error(posix),
           path,
           dir: dir,
           posix: posix
         )}
    end
  end

  defp file_error(message, path, details),
    do: Larder.Error.new(:file_error, message, [option: :snapshot, path: path] ++ details)

  defp holder_os_pid(file) do
    with {:ok, data} <- File.read(file),
         [pid | _] <- String.split(data),
         {n, ""} <- Integer.parse(pid) do
      Integer.to_string(n)
    else
      _ -> nil
    end
  end

  defp in_use(path, holder) do
    who =
      case holder do
        [holder: pid, holder_name: nil] -> "#{inspect(pid)} in this VM"
        [holder: pid, holder_name: name] -> "#{inspect(name)} (#{inspect(pid)}) in this VM"
        [holder_os_pid: nil] -> "in another OS process"
        [holder_os_pid: os_pid] -> "in OS process #{os_pid}"
      end

    Larder.Error.new(
      :snapshot_in_use,
      "the snapshot path #{path} is in use by another replica, #{who} " <>
        "(one replica per snapshot path)",
      [path: path] ++ Enum.reject(holder, &match?({_, nil}, &1))
    )
  end
end
