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
  # pid, node and replica name, is only for the error message.
  #
  # A killed replica's resource is freed as its process exits, which may
  # be just after its supervisor saw the exit and started the next one:
  # a start that finds the lock taken tries again for up to @wait_ms
  # before it refuses. A lock file that cannot be opened (a read-only
  # directory without one, where no dump can be written either) leaves the
  # replica with the claim in this VM only, and a warning.

  require Logger

  alias Larder.Instance

  @wait_ms 2_000
  @retry_ms 20

  @opaque t :: {Path.t(), reference() | nil}

  @doc """
  Claims `path` for the calling replica `name`: `{:ok, lock}`, or `{:error,
  %Larder.Error{reason: :snapshot_in_use}}` naming the path and the holder
  (its pid and name in this VM, or its OS pid).
  """
  @spec claim(Path.t(), atom()) :: {:ok, t()} | {:error, Larder.Error.t()}
  def claim(path, name) do
    path = Path.expand(path)

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
    if native, do: Larder.Native.file_lock_release(native)
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

      {:error, posix} ->
        Logger.warning(
          "Larder.Replica #{inspect(name)}: cannot open the lock file #{file} " <>
            "(#{:file.format_error(posix)}); the snapshot path is claimed in this VM only"
        )

        {:ok, nil}
    end
  end

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
