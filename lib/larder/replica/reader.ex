# The reader of a replica: a process linked to the replica's server that
# connects to the source, reads batches from the position it handed over last,
# and hands each batch to the server, reading the next one (and running a
# pure apply function over it) while the server applies the previous one
# (at most one more batch waits in the server's mailbox). A source error closes
# the connection and waits (100 ms doubling to 2 s) before connecting again.
defmodule Larder.Replica.Reader do
  @moduledoc false

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
  waits for `{:replica_resume, position}`) and `{:replica_source_error,
  reader, error}`.
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
    server = self()

    spawn_link(fn ->
      state = %{
        server: server,
        source: source,
        opts: opts,
        position: position,
        count: batch_size,
        block: block_ms,
        prepare: prepare,
        conn: nil,
        wait: @min_wait_ms,
        unacked: 0,
        failing: false
      }

      loop(state)
    end)
  end

  defp loop(%{conn: nil} = state) do
    case state.source.connect(state.opts) do
      {:ok, conn} -> loop(%{state | conn: conn})
      {:error, error} -> failed(state, error)
    end
  end

  defp loop(state) do
    position = state.position

    case state.source.read(state.conn, position, state.count, state.block) do
      {:ok, [], ^position, conn} ->
        loop(recovered(%{state | conn: conn}))

      {:ok, entries, position_after, conn} ->
        entries = prepare(entries, state.prepare)
        state = state |> recovered() |> await_acks(1)
        send(state.server, {:replica_batch, self(), entries, position_after})
        loop(%{state | conn: conn, position: position_after, unacked: state.unacked + 1})

      {:trimmed, resume_position, conn} ->
        state = await_acks(%{state | conn: conn}, 0)
        send(state.server, {:replica_trimmed, self(), resume_position})

        receive do
          {:replica_resume, position} -> loop(%{state | position: position})
        end

      {:error, error, conn} ->
        state.source.close(conn)
        failed(%{state | conn: nil}, error)
    end
  end

  defp prepare(entries, nil), do: entries
  defp prepare(entries, fun), do: for({id, fields} <- entries, do: {id, fun.(fields)})

  # The server acknowledges each batch once applied; a batch is sent only
  # while at most `left` others are unacknowledged, so at most one batch
  # waits in the server's mailbox while it applies another (the server is
  # never left waiting for the reader's copy of the next batch).
  defp await_acks(%{unacked: unacked} = state, left) when unacked <= left, do: state

  defp await_acks(state, left) do
    receive do
      :replica_ack -> await_acks(%{state | unacked: state.unacked - 1}, left)
    end
  end

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

    Process.sleep(state.wait)
    loop(%{state | wait: min(state.wait * 2, @max_wait_ms), failing: true})
  end

  defp recovered(%{failing: true} = state) do
    Logger.info("Larder.Replica: the source answers again")
    %{state | failing: false, wait: @min_wait_ms}
  end

  defp recovered(state), do: state
end
