# The process of a replica: it owns the Table or Bag, has the batches its
# reader hands over applied (the only writer of the structure, itself or
# through a step), moves the offset after each, answers await calls, and
# writes the snapshots. A source that can notify (a client that prefetches
# in threads of its own: Kafka) has no reader process: each batch is read
# with no wait by a step, which applies it too, so a batch is never copied
# between processes; the source tells this process when there is
# something to read once a read comes back empty. Its offset, epoch and
# structure are also kept in a row that callers read without a call.
#
# A step is a short-lived process, linked, that runs one batch's user
# code, so that the user's code never runs in this process, the one
# linked to whoever started the replica: an apply that does not return
# holds its step, and drop/1 ends it by killing the step, while this
# process, free, stops with reason :normal (an exit :killed would kill a
# linked caller that does not trap exits). Steps: an arity-2 apply's
# batches (the reader's, copied to the step), and every read of a
# notifying source (read, and applied with either arity, in the step).
# An arity-1 apply of a reader's batches runs in the reader. One step at
# a time; batches that come meanwhile queue, and a snapshot (which begins
# between two batches) waits for the step.
defmodule Larder.Replica.Server do
  @moduledoc false

  # What a caller needs without asking the process: published under the
  # replica's name (Larder.Instance.publish/3) once the structure exists.
  # `row` is this process's protected ETS table, holding
  #
  #   {:position, offset, epoch, target}  after each batch and rebuild;
  #   {:source_error, error}              while the source fails (its last
  #                                       error; gone once it answers);
  #   {:stopping}                         once it took a drop/1 request.
  #
  # `epoch` counts the rebuilds (on_trimmed: :rebuild): await/3 on a log
  # that went below the offset waits for the next epoch.
  defmodule Handle do
    @moduledoc false
    @enforce_keys [:pid, :name, :row, :source, :source_opts]
    defstruct @enforce_keys

    @type t :: %__MODULE__{
            pid: pid(),
            name: atom(),
            row: :ets.tid(),
            source: module(),
            source_opts: keyword()
          }
  end

  use GenServer

  require Larder.Instance

  require Logger

  alias Larder.Replica.Reader
  alias Larder.Replica.Snapshot
  alias Larder.Replica.SnapshotLock
  alias Larder.Replica.Target

  defstruct [
    :name,
    :source,
    :source_opts,
    :identity,
    :spec,
    :target,
    :apply,
    :snapshot,
    :snapshot_every,
    :batch_size,
    :block_ms,
    :on_trimmed,
    :on_error,
    :telemetry,
    :reader,
    # Reading through steps (a source with notify/2): the connection (nil
    # while a step holds it), the pending fallback read timer, the retry
    # timer, the retry wait.
    :conn,
    :read_timer,
    :retry,
    # the step running: %{pid, started}, or nil; the callers of a
    # snapshot that waits for it (nil: none due, [] for the timer's); the
    # timer of a drop/1 that waits for it
    :step,
    :deferred,
    :dropping,
    :offset,
    :snapshot_offset,
    :timer,
    :handle,
    :path_lock,
    # the snapshot being written (a process of Larder.Replica.Snapshot):
    # %{pid, offset, started, callers}; `next_callers` wait for the one after
    :snapshotting,
    epoch: 0,
    # the reader's messages that wait for the step ({:batch, entries,
    # position_after}, {:trimmed, resume})
    queue: :queue.new(),
    waiters: [],
    wait: 100,
    failing: false,
    # whether the row holds a source error (from the reader, or from the
    # steps' reads)
    source_failing: false,
    next_callers: []
  ]

  # How long a drop (or a clean stop) waits for the step running to end
  # before it kills it; how long drop/1 waits for the replica to take its
  # request (at once, but for a process busy in a write) before it kills
  # it, and how long it then lets a replica that took it write its last
  # snapshot.
  @drop_wait_ms 5_000
  @stop_wait_ms 30_000

  # Reading through steps: the waits between two connections after a
  # source error, as the reader's.
  @min_wait_ms 100
  @max_wait_ms 2_000

  @spec start_link(keyword()) :: GenServer.on_start()
  def start_link(opts) do
    ref = make_ref()

    args = [{:reply_to, {self(), ref}} | opts]

    case Larder.Instance.start_link(__MODULE__, args, Larder.Replica, opts[:name]) do
      :ignore ->
        receive do
          {^ref, error} -> {:error, error}
        end

      other ->
        other
    end
  end

  @impl true
  def init(opts) do
    Larder.Instance.watch(nil)

    case Larder.Instance.address(opts[:name]) do
      :ok -> start(opts)
      {:error, reason} -> fail(opts, reason)
    end
  end

  defp start(opts) do
    {source, source_opts} = opts[:source]
    spec = opts[:into]

    state = %__MODULE__{
      name: opts[:name],
      source: source,
      source_opts: source_opts,
      spec: spec,
      identity: %{
        source: source,
        log: source.identity(source_opts),
        target: Target.identity(spec, opts[:name]),
        spec: spec
      },
      apply: opts[:apply],
      snapshot: opts[:snapshot],
      snapshot_every: opts[:snapshot_every],
      batch_size: opts[:batch_size],
      block_ms: opts[:block_ms],
      on_trimmed: opts[:on_trimmed],
      on_error: opts[:on_error],
      telemetry: Larder.Instance.telemetry?(opts[:telemetry])
    }

    with {:ok, state} <- claim_path(state),
         {:ok, target, offset} <- safe_start_target(state) do
      state = publish(%{state | target: target, offset: offset, snapshot_offset: offset})
      {:ok, schedule(start_reading(state))}
    else
      {:error, error, state} ->
        release_path(state)
        fail(opts, error)

      {:error, error} ->
        fail(opts, error)
    end
  end

  # One replica per snapshot path (its sweep deletes every other dump).
  defp claim_path(%{snapshot: nil} = state), do: {:ok, state}

  defp claim_path(state) do
    case SnapshotLock.claim(state.snapshot, state.name) do
      {:ok, lock} -> {:ok, %{state | path_lock: lock}}
      {:error, error} -> {:error, error}
    end
  end

  defp release_path(%{path_lock: nil}), do: :ok
  defp release_path(state), do: SnapshotLock.release(state.path_lock)

  # start_link/1 gets the error as a value (a {:stop, reason} here would
  # also send the exit to a linked caller that does not trap).
  defp fail(opts, error) do
    {caller, ref} = opts[:reply_to]
    send(caller, {ref, error})
    :ignore
  end

  # Bad options of the structure raise in start_link/1's caller.
  defp safe_start_target(state) do
    case start_target(state) do
      {:error, error} -> {:error, error, state}
      ok -> ok
    end
  rescue
    error in ArgumentError -> {:error, error, state}
  end

  defp start_target(%{snapshot: nil} = state),
    do: {:ok, Target.new(state.spec), state.source.origin(state.source_opts)}

  defp start_target(state) do
    case Snapshot.read(state.snapshot, state.identity) do
      :none ->
        {:ok, Target.new(state.spec), state.source.origin(state.source_opts)}

      {:ok, %{offset: offset, dump: dump}} ->
        case Target.load(state.spec, dump) do
          {:ok, target} -> {:ok, target, offset}
          {:error, error} -> {:error, error}
        end

      {:error, error} ->
        {:error, error}
    end
  end

  ## Calls

  @impl true
  def handle_call({Larder.Instance, :drop}, {caller, _}, %{step: %{pid: caller}} = state),
    do: {:reply, :own_step, state}

  def handle_call({Larder.Instance, :drop}, _from, %{step: nil} = state) do
    :ets.insert(state.handle.row, {:stopping})
    {:stop, :normal, :ok, state}
  end

  # A batch in a step: the replica stops once it is applied, or kills the
  # step after @drop_wait_ms (see between_batches/1 and :replica_drop).
  def handle_call({Larder.Instance, :drop}, _from, %{dropping: nil} = state) do
    :ets.insert(state.handle.row, {:stopping})
    timer = Process.send_after(self(), :replica_drop, @drop_wait_ms)
    {:reply, :ok, %{state | dropping: timer}}
  end

  def handle_call({Larder.Instance, :drop}, _from, state), do: {:reply, :ok, state}

  def handle_call({:await, target, epoch, timeout}, from, state) do
    if reached?(state.source, {state.offset, state.epoch}, target, epoch) do
      {:reply, :ok, state}
    else
      ref = make_ref()

      timer =
        if timeout != :infinity, do: Process.send_after(self(), {:await_timeout, ref}, timeout)

      {:noreply, %{state | waiters: [{ref, {target, epoch}, from, timer} | state.waiters]}}
    end
  end

  def handle_call(:snapshot, _from, %{snapshot: nil} = state) do
    {:reply, {:error, Larder.Error.new(:no_snapshot_path, "the replica has no :snapshot path")},
     state}
  end

  # From the replica's own apply: the snapshot would wait for the batch
  # being applied, which waits for the call.
  def handle_call(:snapshot, {caller, _}, %{step: %{pid: caller}} = state) do
    error =
      Larder.Error.new(
        :in_apply,
        "dump/1 called by the replica's own apply function: a snapshot begins between " <>
          "two batches, after the one that is being applied"
      )

    {:reply, {:error, error}, state}
  end

  def handle_call(:snapshot, from, state), do: {:noreply, snapshot(state, [from])}

  # Not a call of Larder.Replica's: answered with an error, not a crash
  # (which would lose the structure and restart the catch-up).
  def handle_call(request, {caller, _}, state) do
    error =
      Larder.Error.new(:unknown_call, "Larder.Replica does not answer this call", request: request)

    Logger.warning(
      "Larder.Replica #{inspect(state.name)}: unknown call from #{inspect(caller)}: " <>
        inspect(request, limit: 10, printable_limit: 100)
    )

    {:reply, {:error, error}, state}
  end

  @impl true
  def handle_cast(request, state) do
    Logger.warning(
      "Larder.Replica #{inspect(state.name)}: unknown cast ignored: " <>
        inspect(request, limit: 10, printable_limit: 100)
    )

    {:noreply, state}
  end

  ## The reader's batches

  @impl true
  # An arity-1 apply ran in the reader: its ops are written here. An
  # arity-2 apply's batch goes to a step, in turn.
  def handle_info({:replica_batch, reader, entries, position_after}, %{reader: reader} = state) do
    state = source_answers(state)

    if is_function(state.apply, 1),
      do: applied(state, entries, position_after),
      else:
        next_queued(%{state | queue: :queue.in({:batch, entries, position_after}, state.queue)})
  end

  def handle_info({:replica_trimmed, reader, resume}, %{reader: reader} = state),
    do: next_queued(%{state | queue: :queue.in({:trimmed, resume}, state.queue)})

  def handle_info({:replica_source_stop, reader, error}, %{reader: reader} = state),
    do: source_stop(state, error)

  def handle_info({:replica_source_error, reader, error}, %{reader: reader} = state) do
    execute(state, [:source, :error], %{count: 1}, %{error: error})
    {:noreply, source_failed(state, error)}
  end

  def handle_info({:replica_source_ok, reader}, %{reader: reader} = state),
    do: {:noreply, source_answers(state)}

  # Reading through steps: the next batch (after one applied), the
  # source's notice that there is something to read, the fallback read
  # while waiting, the connection again after an error.
  def handle_info(:replica_read, %{reader: nil} = state), do: read(state)
  def handle_info(:larder_source_ready, %{reader: nil} = state), do: read(state)

  def handle_info(:replica_read_timer, %{reader: nil} = state),
    do: read(%{state | read_timer: nil})

  def handle_info(:replica_retry, %{reader: nil} = state), do: read(%{state | retry: nil})

  def handle_info({:replica_step, pid, result}, %{step: %{pid: pid}} = state),
    do: stepped(state, result)

  # A drop that waited @drop_wait_ms for the step: it ends mid-batch, and
  # the replica stops with no snapshot (its structure may be mid-entry).
  def handle_info(:replica_drop, %{step: %{pid: pid}} = state) do
    kill(pid)
    {:stop, :normal, %{state | step: nil, dropping: nil, snapshot: nil}}
  end

  def handle_info({:await_timeout, ref}, state) do
    case List.keytake(state.waiters, ref, 0) do
      {{^ref, {target, _epoch}, from, _timer}, waiters} ->
        GenServer.reply(from, {:error, timed_out(state.handle, target)})

        {:noreply, %{state | waiters: waiters}}

      nil ->
        {:noreply, state}
    end
  end

  def handle_info(:snapshot_timer, state), do: {:noreply, state |> snapshot([]) |> schedule()}

  def handle_info({Snapshot, pid, result}, %{snapshotting: %{pid: pid}} = state),
    do: {:noreply, snapshot_done(state, result)}

  def handle_info({:EXIT, pid, reason}, %{snapshotting: %{pid: pid}} = state) do
    error =
      Larder.Error.new(:file_error, "the snapshot's process exited before it committed",
        path: state.snapshot,
        reason: reason
      )

    {:noreply, snapshot_done(state, {:error, error})}
  end

  def handle_info({:EXIT, reader, reason}, %{reader: reader} = state) when is_pid(reader) do
    {:stop, reason, %{state | snapshot: nil}}
  end

  def handle_info({:EXIT, _pid, reason}, state) when reason not in [:normal] do
    {:stop, reason, state}
  end

  def handle_info(_other, state), do: {:noreply, state}

  @impl true
  def terminate(reason, state) do
    if state.reader, do: kill(state.reader)

    # A clean stop lets the step running end (up to @drop_wait_ms: after
    # that, or on a crash, it is killed mid-batch, with the connection it
    # holds, and no snapshot is written).
    state = end_step(state, clean?(reason))

    # A clean stop (the supervisor's shutdown, GenServer.stop/1, drop/1)
    # lets the snapshot being written commit and writes a last one; a
    # crash does not (the structure may be mid-entry), and its snapshot's
    # process is killed (it would commit after the replica let its path go).
    cond do
      state.snapshot && clean?(reason) -> state |> await_snapshot() |> write_snapshot()
      state.snapshotting -> kill(state.snapshotting.pid)
      true -> :ok
    end

    release_path(state)
    Larder.Instance.release(Larder.Replica, state.name, state.handle, self())
    # Last: the snapshot does not wait for the source's close.
    if state.conn, do: state.source.close(state.conn)
    :ok
  end

  defp kill(pid) do
    Process.unlink(pid)
    Process.exit(pid, :kill)
  end

  defp end_step(%{step: nil} = state, _clean), do: state

  defp end_step(%{step: %{pid: pid}} = state, true) do
    receive do
      {:replica_step, ^pid, result} -> last_step(%{state | step: nil}, result)
    after
      @drop_wait_ms ->
        kill(pid)
        %{state | step: nil, snapshot: nil}
    end
  end

  defp end_step(%{step: %{pid: pid}} = state, false) do
    kill(pid)
    %{state | step: nil}
  end

  # The position and connection a step ended with, for the last snapshot.
  defp last_step(state, {:applied, {:ok, offset, _applied, _rejected}}),
    do: %{state | offset: offset}

  defp last_step(state, {:applied, {:stop, _error, offset}}), do: %{state | offset: offset}

  defp last_step(state, {:read_applied, outcome, conn}),
    do: %{last_step(state, {:applied, outcome}) | conn: conn}

  defp last_step(state, {:read, {:ok, [], position_after, conn}}),
    do: %{state | offset: position_after, conn: conn}

  defp last_step(state, {:read, {_trimmed_or_error, _, conn}}), do: %{state | conn: conn}

  defp clean?(:normal), do: true
  defp clean?(:shutdown), do: true
  defp clean?({:shutdown, reason}), do: not is_exception(reason)
  defp clean?(_), do: false

  ## Reading

  # A source that notifies is read by steps; any other by a reader
  # process (which blocks in read/4 up to :block_ms).
  defp start_reading(state) do
    if Code.ensure_loaded?(state.source) and function_exported?(state.source, :notify, 2) do
      send(self(), :replica_read)
      state
    else
      reader =
        Reader.start_link(
          state.source,
          state.source_opts,
          state.offset,
          state.batch_size,
          state.block_ms,
          prepare(state)
        )

      %{state | reader: reader}
    end
  end

  # One read with no wait, in a step (which connects first when there is
  # no connection, and applies what it read), then: the next read queued
  # behind whatever calls came meanwhile; or, when nothing came, the
  # source asked for a notice (and a read after :block_ms at the latest,
  # which keeps a source's periodic checks going when idle). While a step
  # or a retry is pending, notices wait for it; a replica being dropped
  # reads no more.
  defp read(%{step: nil, retry: nil, dropping: nil} = state),
    do: {:noreply, start_step(%{state | conn: nil}, {:read, state.conn})}

  defp read(state), do: {:noreply, state}

  defp read_result(state, result) do
    offset = state.offset

    case result do
      {:ok, [], ^offset, conn} ->
        await_entries(recovered(%{state | conn: conn}))

      {:ok, [], position_after, conn} ->
        await_entries(advance(recovered(%{state | conn: conn}), position_after))

      {:trimmed, resume, conn} ->
        send(self(), :replica_read)
        trimmed(%{state | conn: conn}, resume)

      {:stop, error, conn} ->
        source_stop(%{state | conn: conn}, error)

      {:error, error, conn} ->
        if conn, do: state.source.close(conn)
        read_failed(%{state | conn: nil}, error)
    end
  end

  defp await_entries(state) do
    case state.source.notify(state.conn, self()) do
      {:armed, conn} ->
        timer =
          state.read_timer ||
            Process.send_after(self(), :replica_read_timer, state.block_ms)

        {:noreply, %{state | conn: conn, read_timer: timer}}

      {:ready, conn} ->
        send(self(), :replica_read)
        {:noreply, %{state | conn: conn}}

      {:error, error, conn} ->
        state.source.close(conn)
        read_failed(%{state | conn: nil}, error)
    end
  end

  # As the reader does: reported, one warning per outage, a retry after
  # 100 ms doubling to 2 s; a batch too large for the source's reply bound
  # is read in halves.
  defp read_failed(state, error) do
    execute(state, [:source, :error], %{count: 1}, %{error: error})
    state = source_failed(state, error)

    state =
      case error do
        %Larder.Error{reason: :source_bad_reply, details: %{max_reply_bytes: _}}
        when state.batch_size > 1 ->
          %{state | batch_size: div(state.batch_size, 2)}

        _ ->
          state
      end

    unless state.failing do
      Logger.warning(
        "Larder.Replica #{inspect(state.name)}: the source failed " <>
          "(#{Exception.message(error)}); retrying every #{state.wait}..#{@max_wait_ms} ms " <>
          "from #{inspect(state.offset)}"
      )
    end

    retry = Process.send_after(self(), :replica_retry, state.wait)

    {:noreply, %{state | retry: retry, wait: min(state.wait * 2, @max_wait_ms), failing: true}}
  end

  defp recovered(%{failing: true} = state) do
    Logger.info("Larder.Replica #{inspect(state.name)}: the source answers again")
    source_answers(%{state | failing: false, wait: @min_wait_ms})
  end

  defp recovered(state), do: state

  # The source's last error, kept in the row while it fails, for await/3's
  # timeout (a refusal such as an ACL's NOPERM is then the caller's to see,
  # not only the log's).
  defp source_failed(state, error) do
    :ets.insert(state.handle.row, {:source_error, error})
    %{state | source_failing: true}
  end

  defp source_answers(%{source_failing: true} = state) do
    :ets.delete(state.handle.row, :source_error)
    %{state | source_failing: false}
  end

  defp source_answers(state), do: state

  ## Batches

  # A reader's batch whose arity-1 apply already ran (in the reader): its
  # ops written here.
  defp applied(state, entries, position_after) do
    started = System.monotonic_time()
    batch_done(state, apply_batch(state, entries, position_after, true), started)
  end

  # A batch applied (here or in a step): the reader (if any) gets its ack,
  # the offset moves; or the replica stops on a rejected entry.
  defp batch_done(state, outcome, started) do
    case outcome do
      {:ok, offset, applied, rejected} ->
        if state.reader, do: send(state.reader, :replica_ack)

        execute(
          state,
          [:batch],
          %{
            count: applied,
            rejected: rejected,
            duration: System.monotonic_time() - started
          },
          %{offset: offset}
        )

        {:noreply, advance(state, offset)}

      {:stop, error, offset} ->
        state = advance(state, offset)
        Logger.error("Larder.Replica #{inspect(state.name)} stops: #{Exception.message(error)}")
        {:stop, {:shutdown, error}, %{state | snapshot: nil}}
    end
  end

  ## Steps

  # Runs `work` in a step (see the top of this file): {:read, conn} (a
  # notifying source's next batch, read and applied) or {:apply, entries,
  # position_after} (a reader's batch, for an arity-2 apply). The step
  # gets a copy of the state as it is now: the offset, the structure, the
  # function; it sends back {:replica_step, pid, result}.
  defp start_step(state, work) do
    server = self()
    copy = %{state | waiters: [], queue: :queue.new(), next_callers: [], deferred: nil}

    pid =
      :proc_lib.spawn_link(fn ->
        Process.put(:"$callers", [server])
        send(server, {:replica_step, self(), step(copy, work)})
      end)

    %{state | step: %{pid: pid, started: System.monotonic_time()}}
  end

  # In the step's process.
  defp step(state, {:apply, entries, position_after}),
    do: {:applied, apply_batch(state, entries, position_after, false)}

  defp step(state, {:read, conn}) do
    connected = if conn, do: {:ok, conn}, else: state.source.connect(state.source_opts)

    with {:ok, conn} <- connected,
         {:ok, [_ | _] = entries, position_after, conn} <-
           state.source.read(conn, state.offset, state.batch_size, 0) do
      {:read_applied, apply_batch(state, entries, position_after, false), conn}
    else
      {:error, %Larder.Error{} = error} -> {:read, {:error, error, nil}}
      other -> {:read, other}
    end
  end

  # A step's result, back here: what it read and applied is taken in,
  # and then, between two batches, a drop that waited stops the replica
  # and a snapshot that waited begins, before the next batch.
  defp stepped(state, result) do
    %{started: started} = state.step
    state = %{state | step: nil}

    reply =
      case result do
        {:applied, outcome} ->
          batch_done(state, outcome, started)

        {:read_applied, outcome, conn} ->
          send(self(), :replica_read)
          batch_done(recovered(%{state | conn: conn}), outcome, started)

        {:read, result} ->
          read_result(state, result)
      end

    case reply do
      {:noreply, state} -> between_batches(state)
      stop -> stop
    end
  end

  defp between_batches(%{dropping: timer} = state) when timer != nil do
    Process.cancel_timer(timer)
    {:stop, :normal, %{state | dropping: nil}}
  end

  defp between_batches(%{deferred: nil} = state), do: next_queued(state)

  defp between_batches(%{deferred: callers} = state),
    do: next_queued(snapshot(%{state | deferred: nil}, callers))

  # The reader's next message that waited for a step, if no step runs.
  defp next_queued(%{step: nil, dropping: nil} = state) do
    case :queue.out(state.queue) do
      {{:value, {:batch, entries, position_after}}, queue} ->
        {:noreply, start_step(%{state | queue: queue}, {:apply, entries, position_after})}

      {{:value, {:trimmed, resume}}, queue} ->
        case trimmed(%{state | queue: queue}, resume) do
          {:noreply, state} -> next_queued(state)
          stop -> stop
        end

      {:empty, _queue} ->
        {:noreply, state}
    end
  end

  defp next_queued(state), do: {:noreply, state}

  defp trimmed(state, resume) do
    execute(state, [:trimmed], %{count: 1}, %{
      offset: state.offset,
      resume_after: resume,
      action: state.on_trimmed
    })

    case state.on_trimmed do
      :stop ->
        error =
          Larder.Error.new(
            :offset_trimmed,
            "the log lost entries after the replica's offset (what is left starts at " <>
              "#{inspect(resume)}); on_trimmed: :rebuild rebuilds from what is left",
            offset: state.offset,
            trimmed_to: resume,
            log: state.identity.log
          )

        Logger.error("Larder.Replica #{inspect(state.name)} stops: #{Exception.message(error)}")
        {:stop, {:shutdown, error}, %{state | snapshot: nil}}

      :rebuild ->
        Logger.warning(
          "Larder.Replica #{inspect(state.name)}: the log lost entries after " <>
            "#{inspect(state.offset)}; rebuilding from what is left, from #{inspect(resume)}"
        )

        Target.drop(state.spec, state.target)
        target = Target.new(state.spec)
        if state.reader, do: send(state.reader, {:replica_resume, resume})
        {:noreply, advance(%{state | target: target, epoch: state.epoch + 1}, resume)}
    end
  end

  # The log changed in a way no read or rebuild can follow (the source's
  # read/4 said so): reported, and a stop whatever :on_trimmed says.
  defp source_stop(state, error) do
    execute(state, [:source, :error], %{count: 1}, %{error: error})
    Logger.error("Larder.Replica #{inspect(state.name)} stops: #{Exception.message(error)}")
    {:stop, {:shutdown, error}, %{state | snapshot: nil}}
  end

  ## Applying

  # Applies `entries` in order: {:ok, position_after, applied, rejected}
  # once every entry is applied or skipped, or {:stop, error, position after
  # the last entry done} (with on_error: :stop). The position moves by the
  # source's advance/2 over each entry done; a whole batch moves it to the
  # reader's `position_after`, which may be past the last entry (past a gap
  # of the log: a compacted offset, a transaction marker). An arity-1
  # function is pure: its ops are queued and written in runs (the inserts
  # between two deletes as one insert_many/2). An arity-2 function may
  # write `into` itself, so what is queued is written before each call.
  #
  # An arity-1 function is called by the reader, on the batch it has just
  # read (in parallel with the batch this process applies): the entries
  # come `prepared`, as {id, result of run_apply/2}, and are written in
  # the replica's process. Otherwise (an arity-2 function, or a source
  # read by steps) it is called here, in a step.
  defp apply_batch(state, entries, position_after, prepared) do
    ctx = %{
      state: state,
      prepared: prepared,
      pending: [],
      done: state.offset,
      applied: 0,
      rejected: 0
    }

    pure = is_function(state.apply, 1)

    result =
      Enum.reduce_while(entries, {:ok, ctx}, fn {id, fields}, {:ok, ctx} ->
        case if(pure, do: {:ok, ctx}, else: flush(ctx)) do
          {:ok, ctx} ->
            case apply_entry(ctx, id, fields) do
              {:stop, error, ctx} -> {:halt, stop_after_flush(ctx, error)}
              ctx -> {:cont, {:ok, ctx}}
            end

          stop ->
            {:halt, stop}
        end
      end)

    with {:ok, ctx} <- result,
         {:ok, ctx} <- flush(ctx) do
      {:ok, position_after, ctx.applied, ctx.rejected}
    end
  end

  defp apply_entry(ctx, id, fields) do
    result = if ctx.prepared, do: fields, else: run_apply(ctx.state, fields)

    case result do
      :ok ->
        %{ctx | done: done(ctx, id), applied: ctx.applied + 1}

      {:ops, ops} ->
        %{ctx | pending: [{id, ops} | ctx.pending]}

      {:rejected, why} ->
        case reject(ctx, id, why) do
          {:skip, ctx} -> %{ctx | pending: [{id, :skipped} | ctx.pending]}
          {:stop, error} -> {:stop, error, ctx}
        end
    end
  end

  # The position after entry `id`, done after the entries before it.
  defp done(ctx, id), do: ctx.state.source.advance(ctx.done, id)

  defp stop_after_flush(ctx, error) do
    case flush(ctx) do
      {:ok, ctx} -> {:stop, error, ctx.done}
      {:stop, _error, _done} = stop -> stop
    end
  end

  # The reader's work for an arity-1 function: each entry's checked ops.
  defp prepare(%{apply: fun} = state) when is_function(fun, 1) do
    check = %{apply: fun, spec: state.spec}
    fn fields -> run_apply(check, fields) end
  end

  defp prepare(_state), do: nil

  defp run_apply(%{apply: fun} = state, fields) when is_function(fun, 1) do
    case fun.(fields) do
      :ok -> {:ops, []}
      ops -> check_ops(state.spec, List.wrap(ops), ops)
    end
  catch
    kind, reason -> {:rejected, {kind, reason}}
  end

  defp run_apply(state, fields) do
    case state.apply.(fields, state.target) do
      :ok -> :ok
      nil -> {:rejected, {:returned, nil}}
      ops -> check_ops(state.spec, List.wrap(ops), ops)
    end
  catch
    kind, reason -> {:rejected, {kind, reason}}
  end

  defp check_ops({Larder.Table, opts} = spec, [{:insert, record} | rest], all)
       when is_map(record) do
    if Map.has_key?(record, opts[:key]),
      do: check_ops(spec, rest, all),
      else: {:rejected, {:returned, all}}
  end

  defp check_ops({Larder.Table, _} = spec, [{:delete, _key} | rest], all),
    do: check_ops(spec, rest, all)

  defp check_ops({Larder.Bag, _} = spec, [{:insert, _k, _v} | rest], all),
    do: check_ops(spec, rest, all)

  defp check_ops({Larder.Bag, _} = spec, [{:delete, _k} | rest], all),
    do: check_ops(spec, rest, all)

  defp check_ops({Larder.Bag, _} = spec, [{:delete, _k, _v} | rest], all),
    do: check_ops(spec, rest, all)

  defp check_ops(_spec, [], all), do: {:ops, List.wrap(all)}
  defp check_ops(_spec, _bad, all), do: {:rejected, {:returned, all}}

  defp reject(ctx, id, why) do
    state = ctx.state

    execute(state, [:rejected], %{count: 1}, %{id: id, reason: why, action: state.on_error})

    case state.on_error do
      :skip ->
        {:skip, %{ctx | rejected: ctx.rejected + 1}}

      :stop ->
        {:stop,
         Larder.Error.new(:apply_failed, "the apply function rejected an entry",
           id: id,
           reason: why
         )}
    end
  end

  # Writes the queued ops. If a write raises (an index function), the
  # entries are written again one by one and the one that raises is
  # rejected (an entry whose write raised wrote nothing: a Table write is
  # whole or not done).
  defp flush(%{pending: []} = ctx), do: {:ok, ctx}

  defp flush(ctx) do
    queued = Enum.reverse(ctx.pending)
    ctx = %{ctx | pending: []}
    ops = for {_id, ops} <- queued, ops != :skipped, op <- ops, do: op

    try do
      write_ops(ctx.state.spec, ctx.state.target, ops)

      done =
        Enum.reduce(queued, ctx.done, fn {id, _}, done -> ctx.state.source.advance(done, id) end)

      {:ok,
       %{ctx | done: done, applied: ctx.applied + Enum.count(queued, &(elem(&1, 1) != :skipped))}}
    rescue
      _ -> flush_one_by_one(ctx, queued)
    end
  end

  defp flush_one_by_one(ctx, []), do: {:ok, ctx}

  defp flush_one_by_one(ctx, [{id, :skipped} | rest]),
    do: flush_one_by_one(%{ctx | done: done(ctx, id)}, rest)

  defp flush_one_by_one(ctx, [{id, ops} | rest]) do
    result =
      try do
        write_ops(ctx.state.spec, ctx.state.target, ops)
      rescue
        error -> {:raised, error}
      end

    case result do
      {:raised, error} ->
        case reject(ctx, id, {:error, error}) do
          {:skip, ctx} -> flush_one_by_one(%{ctx | done: done(ctx, id)}, rest)
          {:stop, error} -> {:stop, error, ctx.done}
        end

      _ ->
        flush_one_by_one(%{ctx | done: done(ctx, id), applied: ctx.applied + 1}, rest)
    end
  end

  # Writes `ops` in runs of one kind (the inserts between two deletes as
  # one insert_many/2), in order.
  defp write_ops(_spec, _target, []), do: :ok
  defp write_ops(spec, target, [op | ops]), do: write_ops(spec, target, ops, elem(op, 0), [op])

  defp write_ops(spec, target, [op | ops], kind, run) when elem(op, 0) == kind,
    do: write_ops(spec, target, ops, kind, [op | run])

  defp write_ops(spec, target, ops, _kind, run) do
    write_run(spec, target, :lists.reverse(run))
    write_ops(spec, target, ops)
  end

  defp write_run({Larder.Table, _}, table, [{:insert, _} | _] = run),
    do: Larder.Table.insert_many(table, Enum.map(run, &elem(&1, 1)))

  defp write_run({Larder.Table, _}, table, run),
    do: Enum.each(run, fn {:delete, key} -> Larder.Table.delete(table, key) end)

  defp write_run({Larder.Bag, _}, bag, [{:insert, _, _} | _] = run),
    do: Larder.Bag.insert_many(bag, Enum.map(run, fn {:insert, k, v} -> {k, v} end))

  defp write_run({Larder.Bag, _}, bag, run) do
    Enum.each(run, fn
      {:delete, k} -> Larder.Bag.delete(bag, k)
      {:delete, k, v} -> Larder.Bag.delete(bag, k, v)
    end)
  end

  ## Offset, waiters, snapshots

  defp advance(state, offset) do
    {done, waiting} =
      Enum.split_with(state.waiters, fn {_ref, {target, epoch}, _from, _timer} ->
        reached?(state.source, {offset, state.epoch}, target, epoch)
      end)

    for {_ref, _id, from, timer} <- done do
      if timer, do: Process.cancel_timer(timer)
      GenServer.reply(from, :ok)
    end

    write_row(%{state | offset: offset, waiters: waiting})
  end

  # Whether a replica at `offset` in `epoch` has reached the position
  # `target` of `min_epoch`.
  defp reached?(source, {offset, epoch}, target, min_epoch),
    do: epoch >= min_epoch and source.reached?(offset, target)

  ## What callers read without a call

  defp publish(state) do
    row = :ets.new(__MODULE__, [:protected, :set, read_concurrency: true])

    handle = %Handle{
      pid: self(),
      name: state.name,
      row: row,
      source: state.source,
      source_opts: state.source_opts
    }

    state = write_row(%{state | handle: handle})
    Larder.Instance.publish(Larder.Replica, state.name, handle)
    state
  end

  defp write_row(state) do
    :ets.insert(state.handle.row, {:position, state.offset, state.epoch, state.target})
    state
  end

  @doc """
  The handle of the live replica `replica` (its name or pid), or nil.
  """
  @spec handle(atom() | pid()) :: Handle.t() | nil
  def handle(replica) when is_pid(replica) do
    case Larder.Instance.name_of(Larder.Replica, replica) do
      nil -> nil
      name -> with %Handle{pid: ^replica} = handle <- handle(name), do: handle, else: (_ -> nil)
    end
  end

  def handle(name) do
    case Larder.Instance.lookup(Larder.Replica, name) do
      %Handle{pid: pid} = handle -> if Process.alive?(pid), do: handle
      _ -> nil
    end
  end

  @doc """
  `{offset, epoch, target}` as the replica last wrote them (after its last
  batch), or nil when it is gone. Asks nothing of the replica's process.
  """
  @spec position(Handle.t()) :: {term(), non_neg_integer(), term()} | nil
  def position(%Handle{row: row}) do
    case :ets.lookup(row, :position) do
      [{:position, offset, epoch, target}] -> {offset, epoch, target}
      [] -> nil
    end
  rescue
    # the replica's table went with it
    ArgumentError -> nil
  end

  @doc """
  Waits until the replica has reached the position `target` (the
  source's `reached?/2`) in epoch `min_epoch` or later,
  for `timeout` ms whatever the replica's process is doing: `:ok`, or
  `{:error, %Larder.Error{}}` (`:timeout`, the replica's own stop error, or
  `:replica_stopped`).
  """
  @spec await(Handle.t(), term(), non_neg_integer(), timeout()) ::
          :ok | {:error, Larder.Error.t()}
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

  # The call is bounded by `timeout` on this side: a replica busy in an
  # arity-2 apply answers late, and a late answer is dropped (the call's
  # alias is gone by then).
  defp call_await(handle, target, min_epoch, timeout) do
    GenServer.call(handle.pid, {:await, target, min_epoch, timeout}, timeout)
  catch
    :exit, {:timeout, _} -> {:error, timed_out(handle, target)}
    :exit, {{:shutdown, %Larder.Error{} = error}, _} -> {:error, error}
    :exit, {reason, _} -> {:error, stopped(reason)}
  end

  # The error of an await that timed out: the replica's offset, and the
  # source's last error while it fails (in the details and the message).
  defp timed_out(handle, target) do
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
  applied is; a step that has not ended within #{@drop_wait_ms} ms (an apply
  that does not return) is killed, and the replica stops with no snapshot
  (its structure and reader go with it). A replica that has not taken the
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
    handle = handle(pid)

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

  defp stopping?(%Handle{row: row}) do
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

  defp schedule(%{snapshot: nil} = state), do: state

  defp schedule(state) do
    %{state | timer: Process.send_after(self(), :snapshot_timer, state.snapshot_every)}
  end

  ## Snapshots
  #
  # A snapshot names `offset`, the position after the last batch applied
  # when it begins (between two batches: the replica, the only writer of its
  # structure, applies nothing while it starts one), and a dump that holds
  # the effect of every entry up to `offset`:
  #
  #   * a Table: its writer takes a consistent cut in constant time
  #     (Larder.Table.Dump), none of the later entries in it, and a process
  #     of its own writes the file while the replica goes on applying,
  #     whatever the :apply;
  #   * a deduplicating Bag (dedup: true, the default) fed by an arity-1
  #     :apply: the dump reads the bag while the replica goes on applying
  #     (Larder.Bag.dump/2 is no snapshot), so it holds every pair as of
  #     `offset` that no later entry changes, and each pair a later entry
  #     inserts or deletes as before or after that entry. Started from it,
  #     the replica applies those entries again: their ops are pure
  #     functions of the entries, and an insert of a pair present or a
  #     delete of one absent changes nothing, so each pair ends as the log
  #     leaves it;
  #   * any other Bag (dedup: false, where an insert applied twice leaves
  #     two copies; or an arity-2 :apply, which may read what it writes):
  #     the replica dumps it itself and applies nothing meanwhile.
  #
  # One snapshot at a time: a timer that fires meanwhile is skipped, and a
  # dump/1 call waits for the next one. The snapshot's process is linked to
  # the replica: a kill of the replica takes it down mid-dump, leaving the
  # last committed manifest and its dump (Larder.Replica.Snapshot).

  defp snapshot(%{snapshotting: %{}} = state, callers),
    do: %{state | next_callers: callers ++ state.next_callers}

  defp snapshot(%{offset: offset, snapshot_offset: offset} = state, callers) do
    for from <- callers, do: GenServer.reply(from, {:ok, offset})
    state
  end

  # A batch in a step: the snapshot begins once it is applied.
  defp snapshot(%{step: %{}} = state, callers),
    do: %{state | deferred: (state.deferred || []) ++ callers}

  defp snapshot(state, callers) do
    if concurrent?(state) do
      pid = Snapshot.start(state.snapshot, state.identity, state.target, state.offset)

      snapshotting = %{
        pid: pid,
        offset: state.offset,
        started: System.monotonic_time(),
        callers: callers
      }

      %{state | snapshotting: snapshotting}
    else
      {reply, state} =
        case write_snapshot(state) do
          {:ok, state} -> {{:ok, state.offset}, state}
          {:error, error, state} -> {{:error, error}, state}
        end

      for from <- callers, do: GenServer.reply(from, reply)
      state
    end
  end

  defp concurrent?(%{spec: {Larder.Table, _}}), do: true

  defp concurrent?(%{spec: {Larder.Bag, opts}, apply: fun}),
    do: is_function(fun, 1) and Keyword.get(opts, :dedup, true)

  defp snapshot_done(state, result) do
    %{offset: offset, started: started, callers: callers} = state.snapshotting
    state = %{state | snapshotting: nil}
    state = snapshot_result(state, offset, started, result)
    reply = if result == :ok, do: {:ok, offset}, else: result
    for from <- callers, do: GenServer.reply(from, reply)

    case state.next_callers do
      [] -> state
      next -> snapshot(%{state | next_callers: []}, next)
    end
  end

  # The snapshot being written, committed or failed, before a last one.
  defp await_snapshot(%{snapshotting: nil} = state), do: state

  defp await_snapshot(%{snapshotting: %{pid: pid}} = state) do
    result =
      receive do
        {Snapshot, ^pid, result} -> result
        {:EXIT, ^pid, reason} -> {:error, Larder.Error.new(:file_error, nil, reason: reason)}
      end

    snapshot_done(%{state | next_callers: []}, result)
  end

  defp write_snapshot(%{offset: offset, snapshot_offset: offset} = state), do: {:ok, state}

  # A snapshot in this process: it applies nothing until it is committed.
  defp write_snapshot(state) do
    started = System.monotonic_time()
    result = Snapshot.write(state.snapshot, state.identity, state.target, state.offset)

    case snapshot_result(state, state.offset, started, result) do
      state when result == :ok -> {:ok, state}
      state -> {:error, elem(result, 1), state}
    end
  end

  defp snapshot_result(state, offset, started, result) do
    execute(state, [:snapshot], %{duration: System.monotonic_time() - started}, %{
      offset: offset,
      path: state.snapshot,
      result: if(result == :ok, do: :ok, else: result)
    })

    case result do
      :ok ->
        %{state | snapshot_offset: offset}

      {:error, error} ->
        Logger.warning(
          "Larder.Replica #{inspect(state.name)}: snapshot failed: #{Exception.message(error)}"
        )

        state
    end
  end

  defp execute(state, event, measurements, meta) do
    Larder.Telemetry.execute(
      state.telemetry,
      [:larder, :replica | event],
      measurements,
      Map.put(meta, :replica, state.name)
    )
  end
end
