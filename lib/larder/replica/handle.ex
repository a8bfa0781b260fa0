# A replica as its callers see it: the handle its process publishes under
# its name (Larder.Instance.publish/3) once the structure exists, the row
# it writes after each batch, which offset/1, target/1 and await/3 read
# without a call, and the caller's side of await/3 and drop/1.
defmodule Larder.Replica.Handle do
  @moduledoc false

  # `row` is the replica's protected ETS table, holding
  #
  #   {:position, offset, epoch, target}  after each batch and rebuild;
  #   {:source_error, error}              while the source fails (its last
  #                                       error; gone once it answers);
  #   {:stopping}                         once it took a drop/1 request.
  #
  # `epoch` counts the rebuilds (on_trimmed: :rebuild): await/3 on a log
  # that went below the offset waits for the next epoch.

  require Larder.Instance

  @enforce_keys [:pid, :name, :row, :source, :source_opts]
  defstruct @enforce_keys

  @type t :: %__MODULE__{
          pid: pid(),
          name: atom(),
          row: :ets.tid(),
          source: module(),
          source_opts: keyword()
        }

  # How long drop/1 waits for the replica to take its request (at once,
  # but for a process busy in a write) before it kills it, and how long it
  # then lets a replica that took it write its last snapshot.
  @drop_wait_ms 5_000
  @stop_wait_ms 30_000

  ## The replica's side (its own process)

  @doc "A new handle of the calling process, the replica `name`, with its row."
  @spec new(atom(), module(), keyword()) :: t()
  def new(name, source, source_opts) do
    row = :ets.new(__MODULE__, [:protected, :set, read_concurrency: true])
    %__MODULE__{pid: self(), name: name, row: row, source: source, source_opts: source_opts}
  end

  @doc "Writes the position after a batch or a rebuild."
  @spec put_position(t(), term(), non_neg_integer(), term()) :: :ok
  def put_position(handle, offset, epoch, target) do
    :ets.insert(handle.row, {:position, offset, epoch, target})
    :ok
  end

  @doc "Keeps the source's last error while it fails (nil: it answers again)."
  @spec put_source_error(t(), Larder.Error.t() | nil) :: :ok
  def put_source_error(handle, nil) do
    :ets.delete(handle.row, :source_error)
    :ok
  end

  def put_source_error(handle, error) do
    :ets.insert(handle.row, {:source_error, error})
    :ok
  end

  @doc "Marks the replica as stopping (it took a drop/1 request)."
  @spec put_stopping(t()) :: :ok
  def put_stopping(handle) do
    :ets.insert(handle.row, {:stopping})
    :ok
  end

  ## The callers' side

  @doc "The handle of the live replica `replica` (its name or pid), or nil."
  @spec lookup(atom() | pid()) :: t() | nil
  def lookup(replica) when is_pid(replica) do
    case Larder.Instance.name_of(Larder.Replica, replica) do
      nil ->
        nil

      name ->
        with %__MODULE__{pid: ^replica} = handle <- lookup(name), do: handle, else: (_ -> nil)
    end
  end

  def lookup(name) do
    case Larder.Instance.lookup(Larder.Replica, name) do
      %__MODULE__{pid: pid} = handle -> if Process.alive?(pid), do: handle
      _ -> nil
    end
  end

  @doc """
  `{offset, epoch, target}` as the replica last wrote them (after its last
  batch), or nil when it is gone. Asks nothing of the replica's process.
  """
  @spec position(t()) :: {term(), non_neg_integer(), term()} | nil
  def position(%__MODULE__{row: row}) do
    case :ets.lookup(row, :position) do
      [{:position, offset, epoch, target}] -> {offset, epoch, target}
      [] -> nil
    end
  rescue
    # the replica's table went with it
    ArgumentError -> nil
  end

  @doc """
  Whether a replica at `offset` in `epoch` has reached the position
  `target` of `min_epoch` (the source's `reached?/2`).
  """
  @spec reached?(module(), {term(), non_neg_integer()}, term(), non_neg_integer()) :: boolean()
  def reached?(source, {offset, epoch}, target, min_epoch),
    do: epoch >= min_epoch and source.reached?(offset, target)

  @doc """
  Waits until the replica has reached the position `target` in epoch
  `min_epoch` or later, for `timeout` ms whatever the replica's process is
  doing: `:ok`, or `{:error, %Larder.Error{}}` (`:timeout`, the replica's
  own stop error, or `:replica_stopped`).
  """
  @spec await(t(), term(), non_neg_integer(), timeout()) :: :ok | {:error, Larder.Error.t()}
  def await(handle, target, min_epoch, timeout) do
    case position(handle) do
      nil ->
        {:error, stopped(:noproc)}

      {offset, epoch, _structure} ->
        cond do
          reached?(handle.source, {offset, epoch}, target, min_epoch) -> :ok
          timeout == 0 -> {:error, timed_out(handle, target)}
          true -> call_await(handle, target, min_epoch, timeout)
        end
    end
  end

  # The call is bounded by `timeout` on this side: a replica busy in a
  # write answers late, and a late answer is dropped (the call's alias is
  # gone by then).
  defp call_await(handle, target, min_epoch, timeout) do
    GenServer.call(handle.pid, {:await, target, min_epoch, timeout}, timeout)
  catch
    :exit, {:timeout, _} -> {:error, timed_out(handle, target)}
    :exit, {{:shutdown, %Larder.Error{} = error}, _} -> {:error, error}
    :exit, {reason, _} -> {:error, stopped(reason)}
  end

  @doc """
  The error of an await that timed out: the replica's offset, and the
  source's last error while it fails (in the details and the message).
  """
  @spec timed_out(t(), term()) :: Larder.Error.t()
  def timed_out(handle, target) do
    {offset, source_error} =
      try do
        offset =
          case :ets.lookup(handle.row, :position) do
            [{:position, offset, _epoch, _structure}] -> offset
            [] -> nil
          end

        case :ets.lookup(handle.row, :source_error) do
          [{:source_error, error}] -> {offset, error}
          [] -> {offset, nil}
        end
      rescue
        ArgumentError -> {nil, nil}
      end

    if source_error do
      Larder.Error.new(
        :timeout,
        "the replica did not reach the position in time; the source's last error: " <>
          Exception.message(source_error),
        id: target,
        offset: offset,
        source_error: source_error
      )
    else
      Larder.Error.new(:timeout, "the replica did not reach the position in time",
        id: target,
        offset: offset
      )
    end
  end

  @doc "The error of an await whose replica stopped (`reason`, its exit reason)."
  @spec stopped(term()) :: Larder.Error.t()
  def stopped(reason),
    do: Larder.Error.new(:replica_stopped, "the replica stopped", reason: reason)

  @doc """
  Drops the replica whose process is `pid`: it takes the request at once
  and stops as a clean stop does (its last snapshot written, given up to
  #{@stop_wait_ms} ms), with reason `:normal`, once the batch being
  applied is (see Larder.Replica.Server). A replica that has not taken the
  request within #{@drop_wait_ms} ms (busy in a write of its own) is
  killed (through its supervisor, if one started it:
  `Larder.Instance.terminate/2`). Returns once the process is gone.
  """
  @spec drop(pid()) :: :ok
  # A call of the replica to itself cannot be answered; nothing is done,
  # as for any call of a process to itself.
  def drop(pid) when pid == self(), do: :ok

  def drop(pid) do
    monitor = Process.monitor(pid)
    handle = lookup(pid)

    case request_drop(pid, handle, monitor) do
      # An apply that drops its own replica: the replica would wait for
      # the apply, and the apply for the replica; nothing is done.
      :own_step ->
        Process.demonitor(monitor, [:flush])
        :ok

      :ok ->
        gone?(monitor, :infinity)
        :ok

      :gone ->
        :ok
    end
  end

  # :ok once the replica took the request (or was killed), :gone once its
  # exit is seen, or :own_step.
  defp request_drop(pid, handle, monitor) do
    GenServer.call(pid, {Larder.Instance, :drop}, @drop_wait_ms)
  catch
    :exit, {:timeout, _} ->
      if stopping?(handle) and gone?(monitor, @stop_wait_ms) do
        :gone
      else
        Larder.Instance.terminate(pid, :kill)
        :ok
      end

    :exit, _gone ->
      :ok
  end

  # No handle: the replica is still starting or already stopping (it lets
  # its name go in terminate/2); either way it is not stuck in an apply.
  defp stopping?(nil), do: true

  defp stopping?(%__MODULE__{row: row}) do
    :ets.member(row, :stopping)
  rescue
    ArgumentError -> true
  end

  defp gone?(monitor, timeout) do
    receive do
      {:DOWN, ^monitor, :process, _pid, _reason} -> true
    after
      timeout -> false
    end
  end
end
