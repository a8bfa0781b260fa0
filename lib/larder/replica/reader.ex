# The reader of a replica: a process linked to the replica's server that
# connects to the source, reads batches from the position it handed over last,
# and hands each batch to the server, reading the next one (and running a
# pure apply function over it) while the server applies the previous one
# (at most one more batch waits in the server's mailbox). A source error closes
# the connection and waits (100 ms doubling to 2 s) before connecting again.
# A GenServer (see init/1) for a source that does not notify; a notifying
# source (Larder.Replica.Source.notify/2) is read by the server itself.
defmodule Larder.Replica.Reader do
  @moduledoc false

  use GenServer

  require Logger

  @min_wait_ms 100
  @max_wait_ms 2_000

  @doc """
  Starts the reader, linked to the caller (the server), reading from
  `position`. It sends the server `{:replica_batch, reader, entries,
  position_after}` (`{id, fields}`, or `{id, prepare.(fields)}` given a
  `prepare` function, called here while the server applies the previous
  batch; a batch may have no entries when only the position moved, past a
  gap of the log), `{:replica_trimmed, reader, resume_position}` (and then
  waits for `{:replica_resume, position}`), `{:replica_source_error,
  reader, error}` on each failed connect or read, `{:replica_source_ok,
  reader}` once the source answers again after one, and
  `{:replica_source_stop, reader, error}` when the source says the log
  cannot be followed (then it reads no more).
  """
  @spec start_link(
          module(),
          keyword(),
          term(),
          pos_integer(),
          non_neg_integer(),
          (map() -> term()) | nil
        ) :: pid()
  def start_link(source, opts, position, batch_size, block_ms, prepare \\ nil) do
    state = %{
      server: self(),
      source: source,
      opts: opts,
      position: position,
      count: batch_size,
      block: block_ms,
      prepare: prepare,
      conn: nil,
      wait: @min_wait_ms,
      unacked: 0,
      # what waits for acknowledgements before it is sent: nil,
      # {:batch, entries, position_after}, {:trimmed, resume_position} or
      # {:stop, error}
      held: nil,
      failing: false
    }

    {:ok, pid} = GenServer.start_link(__MODULE__, state)
    pid
  end

  # A GenServer, so that :sys.get_state/1 and crash reports work on it: each
  # step (a connect, or one read of up to :block_ms) is one :read message
  # it sends itself, so calls and system messages are answered between two
  # reads. Exactly one :read is pending (a message or a timer) unless a
  # batch is held for acknowledgements, or a trim waits for :replica_resume.
  @impl true
  def init(state) do
    send(self(), :read)
    {:ok, state}
  end

  @impl true
  def handle_info(:read, %{conn: nil} = state) do
    case state.source.connect(state.opts) do
      {:ok, conn} -> {:noreply, next(%{state | conn: conn})}
      {:error, error} -> {:noreply, failed(state, error)}
    end
  end

  def handle_info(:read, state) do
    position = state.position

    case state.source.read(state.conn, position, state.count, state.block) do
      {:ok, [], ^position, conn} ->
        {:noreply, next(recovered(%{state | conn: conn}))}

      {:ok, entries, position_after, conn} ->
        entries = prepare(entries, state.prepare)
        state = recovered(%{state | conn: conn, held: {:batch, entries, position_after}})
        {:noreply, release(state)}

      {:trimmed, resume_position, conn} ->
        {:noreply, release(%{state | conn: conn, held: {:trimmed, resume_position}})}

      {:stop, error, conn} ->
        {:noreply, release(%{state | conn: conn, held: {:stop, error}})}

      {:error, error, conn} ->
        state.source.close(conn)
        {:noreply, failed(%{state | conn: nil}, error)}
    end
  end

  def handle_info(:replica_ack, state),
    do: {:noreply, release(%{state | unacked: state.unacked - 1})}

  def handle_info({:replica_resume, position}, state),
    do: {:noreply, next(%{state | position: position})}

  def handle_info(_other, state), do: {:noreply, state}

  defp next(state) do
    send(self(), :read)
    state
  end

  # The server acknowledges each batch once applied; a batch is sent only
  # while at most one other is unacknowledged, so at most one batch waits
  # in the server's mailbox while it applies another (the server is never
  # left waiting for the reader's copy of the next batch). A trim is sent
  # once every batch before it is applied, and reading stops until the
  # server answers it with :replica_resume; a stop likewise, and reading
  # stops for good (the server stops, and this process with it).
  defp release(%{held: {:batch, entries, position_after}, unacked: unacked} = state)
       when unacked <= 1 do
    send(state.server, {:replica_batch, self(), entries, position_after})
    next(%{state | held: nil, position: position_after, unacked: unacked + 1})
  end

  defp release(%{held: {:trimmed, resume_position}, unacked: 0} = state) do
    send(state.server, {:replica_trimmed, self(), resume_position})
    %{state | held: nil}
  end

  defp release(%{held: {:stop, error}, unacked: 0} = state) do
    send(state.server, {:replica_source_stop, self(), error})
    %{state | held: nil}
  end

  defp release(state), do: state

  defp prepare(entries, nil), do: entries
  defp prepare(entries, fun), do: for({id, fields} <- entries, do: {id, fun.(fields)})

  defp failed(state, error) do
    send(state.server, {:replica_source_error, self(), error})

    # A batch too large for the source's reply bound is read in halves
    # (entries of a legitimate log can be larger than the batch size assumed).
    state =
      case error do
        %Larder.Error{reason: :source_bad_reply, details: %{max_reply_bytes: _}}
        when state.count > 1 ->
          %{state | count: div(state.count, 2)}

        _ ->
          state
      end

    unless state.failing do
      Logger.warning(
        "Larder.Replica: the source failed (#{Exception.message(error)}); " <>
          "retrying every #{state.wait}..#{@max_wait_ms} ms from #{inspect(state.position)}"
      )
    end

    Process.send_after(self(), :read, state.wait)
    %{state | wait: min(state.wait * 2, @max_wait_ms), failing: true}
  end

  defp recovered(%{failing: true} = state) do
    Logger.info("Larder.Replica: the source answers again")
    send(state.server, {:replica_source_ok, self()})
    %{state | failing: false, wait: @min_wait_ms}
  end

  defp recovered(state), do: state
end
