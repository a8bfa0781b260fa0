# The log's end for await(replica, :latest, timeout): the source's latest/2
# asked within the caller's deadline, again after a backoff while the
# source fails (a server that is down, restarting, or refusing), the same
# for every source.
defmodule Larder.Replica.Latest do
  @moduledoc false

  # Each ask runs in a process of its own, monitored, whose answer comes
  # through an alias: the caller waits for it no longer than its deadline
  # (a source whose latest/2 overruns its timeout, or hangs in a connect,
  # cannot hold the caller), and a late answer is dropped with the alias
  # rather than left in the caller's mailbox. An ask that overruns is
  # killed. Between two failed asks the caller sleeps @min_wait_ms,
  # doubling up to @max_wait_ms, never past its deadline.

  alias Larder.Replica.Handle

  @min_wait_ms 50
  @max_wait_ms 1_000
  # One ask's timeout when the caller's is :infinity; and how long past
  # it the caller waits for the ask's own answer before it asks again.
  @ask_ms 60_000
  @grace_ms 1_000

  @doc """
  The log's end: `{:ok, position}`, or `{:error, %Larder.Error{reason:
  :timeout}}` once `deadline` (monotonic ms, or `:infinity`) has passed
  without an answer, whose `details.source_error` is the source's last
  error (and the message says it), or `:replica_stopped` when the
  replica is gone by the time an ask fails.
  """
  @spec fetch(Handle.t(), integer() | :infinity) ::
          {:ok, term()} | {:error, Larder.Error.t()}
  def fetch(handle, deadline), do: fetch(handle, deadline, @min_wait_ms, nil)

  defp fetch(handle, deadline, wait, last_error) do
    case left(deadline) do
      0 ->
        {:error, timed_out(handle, last_error)}

      left ->
        case ask(handle, left) do
          {:ok, latest} ->
            {:ok, latest}

          {:error, error} ->
            case Handle.position(handle) do
              nil ->
                {:error, Handle.stopped(:noproc)}

              _ ->
                Process.sleep(min(wait, left(deadline)))
                fetch(handle, deadline, min(wait * 2, @max_wait_ms), error)
            end

          :no_answer ->
            error =
              Larder.Error.new(:source_unavailable, "the source did not say where its log ends",
                source: handle.source
              )

            fetch(handle, deadline, wait, error)
        end
    end
  end

  # One ask of latest/2 with `left` ms (a source's own timeout), waited
  # for `left` ms (plus @grace_ms for an :infinity caller's ask).
  defp ask(handle, left) do
    {timeout, wait} = if left == :infinity, do: {@ask_ms, @ask_ms + @grace_ms}, else: {left, left}

    %{source: source, source_opts: opts} = handle
    reply_to = :erlang.alias([:reply])

    {pid, monitor} =
      spawn_monitor(fn ->
        result =
          try do
            source.latest(opts, timeout)
          catch
            kind, reason ->
              {:error,
               Larder.Error.new(:source_failed, "#{inspect(source)}.latest/2 failed",
                 reason: {kind, reason}
               )}
          end

        send(reply_to, {reply_to, result})
      end)

    receive do
      {^reply_to, {:ok, latest}} ->
        Process.demonitor(monitor, [:flush])
        {:ok, latest}

      {^reply_to, {:error, %Larder.Error{} = error}} ->
        Process.demonitor(monitor, [:flush])
        {:error, error}

      {^reply_to, other} ->
        Process.demonitor(monitor, [:flush])

        {:error,
         Larder.Error.new(:source_bad_reply, "#{inspect(source)}.latest/2 returned a bad value",
           returned: other
         )}

      {:DOWN, ^monitor, :process, ^pid, reason} ->
        :erlang.unalias(reply_to)

        {:error,
         Larder.Error.new(:source_failed, "#{inspect(source)}.latest/2 exited", reason: reason)}
    after
      wait ->
        :erlang.unalias(reply_to)
        Process.demonitor(monitor, [:flush])
        Process.exit(pid, :kill)

        # An answer sent before the alias went.
        receive do
          {^reply_to, {:ok, latest}} -> {:ok, latest}
          {^reply_to, {:error, %Larder.Error{} = error}} -> {:error, error}
          {^reply_to, _other} -> :no_answer
        after
          0 -> :no_answer
        end
    end
  end

  defp timed_out(handle, source_error) do
    offset =
      case Handle.position(handle) do
        {offset, _epoch, _target} -> offset
        nil -> nil
      end

    message =
      if source_error,
        do:
          "the log's end was not read in time; the source's last error: " <>
            Exception.message(source_error),
        else: "the log's end was not read in time"

    Larder.Error.new(:timeout, message, id: :latest, offset: offset, source_error: source_error)
  end

  defp left(:infinity), do: :infinity
  defp left(deadline), do: max(0, deadline - System.monotonic_time(:millisecond))
end
