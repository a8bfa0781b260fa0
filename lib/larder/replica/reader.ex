# The reader of a replica: a process linked to the replica's server that
# runs the read loop (Larder.Replica.ReadLoop) for every kind of source, so
# the process that connects is the one that reads, asks for notices,
# tells the source what is committed and closes. It hands each batch to
# the server and reads the next one (running a pure apply function over
# it) while the server writes the previous one: at most one more batch
# waits in the server's mailbox. A source that blocks in read/4 is read
# again as soon as a read comes back empty; a source that notifies
# (Larder.Replica.Source.notify/2) is read with no wait, and once a read
# finds nothing the reader waits for its notice (and reads again after
# :block_ms at the latest, which keeps a source's periodic checks going).
defmodule Larder.Replica.Reader do
  @moduledoc false

  use GenServer

  alias Larder.Replica.ReadLoop

  # How long the log's end is asked for the caught-up line (caught_up/1).
  @latest_timeout_ms 5_000

  @doc """
  Starts the reader, linked to the caller (the server), reading from
  `position` (which counts as committed). It sends the server
  `{:replica_batch, reader, entries, position_after}` (`[{id, fields}]`,
  or `prepare.(entries)` given a `prepare` function, called here while the
  server applies the previous batch; a batch may have no entries when
  only the position moved, past a gap of the log), `{:replica_trimmed,
  reader, resume_position}` (and then waits for `{:replica_resume,
  position}`), `{:replica_source_error, reader, error}` on each failed
  connect, read or notice, `{:replica_source_ok, reader}` once the source
  answers again after one, and `{:replica_source_stop, reader, error}` when
  the source says the log cannot be followed (then it reads no more). The
  server acknowledges each batch applied with `:replica_ack`, and tells of
  a snapshot committed with `{:replica_committed, position}`.
  """
  @spec start_link(keyword()) :: pid()
  def start_link(opts) do
    loop =
      ReadLoop.new(
        opts[:source],
        opts[:source_opts],
        opts[:position],
        opts[:batch_size],
        if(ReadLoop.notifies?(opts[:source]), do: 0, else: opts[:block_ms]),
        opts[:name]
      )

    state = %{
      server: self(),
      source: opts[:source],
      source_opts: opts[:source_opts],
      loop: loop,
      prepare: opts[:prepare],
      notifies: ReadLoop.notifies?(opts[:source]),
      block_ms: opts[:block_ms],
      unacked: 0,
      # what waits for acknowledgements before it is sent: nil,
      # {:batch, entries, position_after}, {:trimmed, resume_position} or
      # {:stop, error}
      held: nil,
      # :read (a :read message is on its way), :notice (waiting for the
      # source's notice, with `timer`, {ref, timer} of the read after
      # :block_ms), :retry (a :read after a wait),
      # :held, :resume (a trim sent, waiting for :replica_resume), :stopped
      phase: :read,
      timer: nil,
      caught_up: false
    }

    {:ok, pid} = GenServer.start_link(__MODULE__, state)
    pid
  end

  # A GenServer, so that :sys.get_state/1 and crash reports work on it: each
  # step of the loop (a connect, or one read of up to :block_ms) is one
  # :read message it sends itself, so calls and system messages are
  # answered between two steps. Exactly one :read is on its way (a message
  # or a timer) in phases :read and :retry, none in the others.
  @impl true
  def init(state) do
    send(self(), :read)
    {:ok, state}
  end

  @impl true
  def handle_info(:read, state), do: {:noreply, step(state)}

  # The source's notice, or the read after :block_ms while waiting for it
  # (a late one, from an earlier wait, is ignored).
  def handle_info(:larder_source_ready, %{phase: :notice} = state),
    do: {:noreply, read_now(state)}

  def handle_info({:replica_read_timer, ref}, %{phase: :notice, timer: {ref, _}} = state),
    do: {:noreply, read_next(%{state | timer: nil})}

  def handle_info(:replica_ack, state),
    do: {:noreply, release(%{state | unacked: state.unacked - 1})}

  def handle_info({:replica_resume, position}, %{phase: :resume} = state),
    do: {:noreply, read_next(%{state | loop: ReadLoop.resume(state.loop, position)})}

  # Told at the next step; a reader waiting for a notice steps now.
  def handle_info({:replica_committed, position}, state) do
    state = %{state | loop: ReadLoop.committed(state.loop, position)}
    {:noreply, if(state.phase == :notice, do: read_now(state), else: state)}
  end

  def handle_info(_other, state), do: {:noreply, state}

  defp step(state) do
    failing = ReadLoop.failing?(state.loop)
    {event, loop} = ReadLoop.step(state.loop)
    state = %{state | loop: loop}

    if failing and not ReadLoop.failing?(loop),
      do: send(state.server, {:replica_source_ok, self()})

    case event do
      :connected ->
        read_next(state)

      {:batch, entries, position_after} ->
        release(%{state | held: {:batch, prepare(entries, state.prepare), position_after}})

      :empty ->
        state = caught_up(state)
        if state.notifies, do: notice(state), else: read_next(state)

      {:trimmed, resume} ->
        release(%{state | held: {:trimmed, resume}})

      {:stop, error} ->
        release(%{state | held: {:stop, error}})

      {:error, error, wait} ->
        retry(state, error, wait)
    end
  end

  defp notice(state) do
    case ReadLoop.await_notice(state.loop, self()) do
      {:armed, loop} ->
        ref = make_ref()
        timer = Process.send_after(self(), {:replica_read_timer, ref}, state.block_ms)
        %{state | loop: loop, phase: :notice, timer: {ref, timer}}

      {:ready, loop} ->
        read_next(%{state | loop: loop})

      {{:error, error, wait}, loop} ->
        retry(%{state | loop: loop}, error, wait)
    end
  end

  defp retry(state, error, wait) do
    send(state.server, {:replica_source_error, self(), error})
    Process.send_after(self(), :read, wait)
    %{state | phase: :retry}
  end

  # Woken before the read after :block_ms: its timer goes.
  defp read_now(%{timer: {_ref, timer}} = state) do
    Process.cancel_timer(timer)
    read_next(%{state | timer: nil})
  end

  defp read_next(state) do
    send(self(), :read)
    %{state | phase: :read}
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
    read_next(%{state | held: nil, unacked: unacked + 1})
  end

  defp release(%{held: {:trimmed, resume_position}, unacked: 0} = state) do
    send(state.server, {:replica_trimmed, self(), resume_position})
    %{state | held: nil, phase: :resume}
  end

  defp release(%{held: {:stop, error}, unacked: 0} = state) do
    send(state.server, {:replica_source_stop, self(), error})
    %{state | held: nil, phase: :stopped}
  end

  defp release(%{held: nil} = state), do: state
  defp release(state), do: %{state | phase: :held}

  # The first read that finds nothing tells the server where the log's
  # end is (once: the replica's info line, see Larder.Replica.Server). A
  # read can find nothing before the log's end (a Kafka poll before the
  # first fetch came back): the end is the source's latest/2, asked by a
  # process of its own so that reading goes on meanwhile (this position,
  # if the source does not answer).
  defp caught_up(%{caught_up: false} = state) do
    %{server: server, source: source, source_opts: opts} = state
    reader = self()
    position = ReadLoop.position(state.loop)

    spawn(fn ->
      end_position =
        try do
          case source.latest(opts, @latest_timeout_ms) do
            {:ok, latest} -> latest
            _ -> position
          end
        catch
          _kind, _reason -> position
        end

      send(server, {:replica_caught_up, reader, end_position})
    end)

    %{state | caught_up: true}
  end

  defp caught_up(state), do: state

  defp prepare(entries, nil), do: entries
  defp prepare(entries, fun), do: fun.(entries)
end
