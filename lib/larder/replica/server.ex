# The process of a replica: it owns the structure (through its target,
# Larder.Replica.Target), starts the reader (Larder.Replica.Reader, which
# connects to the source and reads it, whatever the source; started
# before the structure is made or loaded from a snapshot, so that both go
# on at once), applies the
# batches the reader hands over, moves the offset after each and writes it
# in the row callers read (Larder.Replica.Handle), answers await calls,
# and has its snapshots written (Larder.Replica.SnapshotSchedule).
#
# The user's apply function never runs in this process, the one linked to
# whoever started the replica: an arity-1 function runs in the reader,
# over the batch it read, and this process writes the ops; an arity-2
# function, which writes the structure itself, runs in a step, a
# short-lived process linked to this one that applies one batch (one step
# at a time; the reader's batches and trims that come meanwhile queue
# here, and a snapshot, which begins between two batches, waits for it).
# An apply that does not return holds the reader or its step: drop/1 ends
# it by killing that process, while this one, free, stops with reason
# :normal (an exit :killed would kill a linked caller that does not trap
# exits).
defmodule Larder.Replica.Server do
  @moduledoc false

  use GenServer

  require Larder.Instance
  require Logger

  alias Larder.Replica.Apply
  alias Larder.Replica.Handle
  alias Larder.Replica.Reader
  alias Larder.Replica.Snapshot
  alias Larder.Replica.SnapshotLock
  alias Larder.Replica.SnapshotSchedule
  alias Larder.Replica.Target

  defstruct [
    :name,
    :source,
    :target,
    # the structure's handle
    :structure,
    :apply,
    :on_trimmed,
    :telemetry,
    :reader,
    :handle,
    :path_lock,
    :snapshots,
    :offset,
    # the step running: %{pid, started}, or nil; the timer of a drop/1
    # that waits for it
    :step,
    :dropping,
    epoch: 0,
    # the reader's messages that wait for the step ({:batch, entries,
    # position_after}, {:trimmed, resume})
    queue: :queue.new(),
    waiters: [],
    # whether the row holds a source error
    source_failing: false,
    # for the info line once caught up: when the replica started, the
    # entries applied since, and the log's end the reader first met
    # (nil once logged)
    started: nil,
    applied: 0,
    caught_up: :waiting
  ]

  # How long a drop (or a clean stop) waits for the step running to end
  # before it kills it.
  @drop_wait_ms 5_000

  @spec start_link(keyword()) :: GenServer.on_start()
  def start_link(opts) do
    ref = make_ref()

    args = [{:reply_to, {self(), ref}} | opts]

    case Larder.Instance.start_link(__MODULE__, args, Larder.Replica, opts[:name]) do
      :ignore ->
        # The process exits (normal) just after its :ignore reached us:
        # returned once it is gone, so that its name is free again.
        receive do
          {^ref, pid, error} ->
            monitor = Process.monitor(pid)

            receive do
              {:DOWN, ^monitor, :process, _, _} -> {:error, error}
            end
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
    name = opts[:name]
    target = Target.new!(opts[:into])

    identity = %{
      source: source,
      log: source.identity(source_opts),
      target: Target.identity(target, name)
    }

    telemetry = Larder.Instance.telemetry?(opts[:telemetry])

    apply = %Apply{
      fun: opts[:apply],
      target: target,
      source: source,
      on_error: opts[:on_error],
      name: name,
      telemetry: telemetry
    }

    with {:ok, lock} <- claim_path(opts[:snapshot], name),
         {:ok, found, offset} <- releasing_on_error(lock, fn -> find_snapshot(identity, opts) end) do
      # The reader connects, reads and runs a pure apply over its first
      # batch while the structure loads: a restart waits for the longer of
      # the two, not for both. Its batches wait in this process's mailbox.
      reader =
        Reader.start_link(
          source: source,
          source_opts: source_opts,
          position: offset,
          batch_size: opts[:batch_size],
          block_ms: opts[:block_ms],
          prepare: Apply.prepare(apply),
          name: name
        )

      case releasing_on_error(lock, fn -> start_target(target, found, name) end) do
        {:ok, structure} ->
          started(opts, %{apply | handle: structure}, identity, lock, reader, offset)

        {:error, error} ->
          stop_reader(reader)
          fail(opts, error)
      end
    else
      {:error, error} -> fail(opts, error)
    end
  end

  defp started(opts, apply, identity, lock, reader, offset) do
    {source, source_opts} = opts[:source]
    name = opts[:name]

    snapshots =
      [
        path: opts[:snapshot],
        every: opts[:snapshot_every],
        identity: identity,
        target: apply.target,
        arity: if(is_function(opts[:apply], 1), do: 1, else: 2),
        name: name,
        telemetry: apply.telemetry,
        committed: offset
      ]
      |> SnapshotSchedule.new()
      |> SnapshotSchedule.start(reader)

    state = %__MODULE__{
      name: name,
      source: source,
      target: apply.target,
      structure: apply.handle,
      apply: apply,
      on_trimmed: opts[:on_trimmed],
      telemetry: apply.telemetry,
      reader: reader,
      handle: Handle.new(name, source, source_opts),
      path_lock: lock,
      snapshots: snapshots,
      offset: offset,
      started: System.monotonic_time(:millisecond)
    }

    write_row(state)
    Larder.Instance.publish(Larder.Replica, name, state.handle)
    {:ok, state}
  end

  # A reader started for a structure that could not be made: gone, and its
  # connection with it, before start_link/1 returns.
  defp stop_reader(reader) do
    monitor = Process.monitor(reader)
    kill(reader)

    receive do
      {:DOWN, ^monitor, :process, _, _} -> :ok
    end
  end

  # One replica per snapshot path (its sweep deletes every other dump).
  defp claim_path(nil, _name), do: {:ok, nil}
  defp claim_path(path, name), do: SnapshotLock.claim(path, name)

  defp release_path(nil), do: :ok
  defp release_path(lock), do: SnapshotLock.release(lock)

  # start_link/1 gets the error as a value (a {:stop, reason} here would
  # also send the exit to a linked caller that does not trap).
  defp fail(opts, error) do
    {caller, ref} = opts[:reply_to]
    send(caller, {ref, self(), error})
    :ignore
  end

  # Runs a step of the start, `fun`: an ArgumentError there (bad options
  # of the source or the structure) becomes an error, which start_link/1
  # raises in its caller; on any error the snapshot path is released.
  defp releasing_on_error(lock, fun) do
    result =
      try do
        fun.()
      rescue
        error in ArgumentError -> {:error, error}
      end

    with {:error, _} <- result, do: release_path(lock)
    result
  end

  # The snapshot to start from (:none, or its path, dump and offset) and
  # the offset to read from.
  defp find_snapshot(identity, opts) do
    {source, source_opts} = opts[:source]
    path = opts[:snapshot]

    case if(path, do: Snapshot.read(path, identity), else: :none) do
      :none -> {:ok, :none, source.origin(source_opts)}
      {:ok, %{offset: offset, dump: dump}} -> {:ok, {path, dump, offset}, offset}
      {:error, error} -> {:error, error}
    end
  end

  # The structure, empty or from the snapshot's dump.
  defp start_target(target, :none, _name), do: {:ok, Target.create(target)}

  defp start_target(target, {path, dump, offset}, name) do
    started = System.monotonic_time(:millisecond)

    with {:ok, structure} <- Target.load(target, dump) do
      Logger.info(
        "Larder.Replica #{inspect(name)} loaded its snapshot #{path} " <>
          "in #{System.monotonic_time(:millisecond) - started} ms; reading the log from " <>
          inspect(offset, limit: 8)
      )

      {:ok, structure}
    end
  end

  ## Calls

  @impl true
  def handle_call({Larder.Instance, :drop}, {caller, _}, %{step: %{pid: caller}} = state),
    do: {:reply, :own_step, state}

  def handle_call({Larder.Instance, :drop}, _from, %{step: nil} = state) do
    Handle.put_stopping(state.handle)
    {:stop, :normal, :ok, state}
  end

  # A batch in a step: the replica stops once it is applied, or kills the
  # step after @drop_wait_ms (see between_batches/1 and :replica_drop).
  def handle_call({Larder.Instance, :drop}, _from, %{dropping: nil} = state) do
    Handle.put_stopping(state.handle)
    timer = Process.send_after(self(), :replica_drop, @drop_wait_ms)
    {:reply, :ok, %{state | dropping: timer}}
  end

  def handle_call({Larder.Instance, :drop}, _from, state), do: {:reply, :ok, state}

  def handle_call({:await, target, epoch, timeout}, from, state) do
    if Handle.reached?(state.source, {state.offset, state.epoch}, target, epoch) do
      {:reply, :ok, state}
    else
      ref = make_ref()

      timer =
        if timeout != :infinity, do: Process.send_after(self(), {:await_timeout, ref}, timeout)

      {:noreply, %{state | waiters: [{ref, {target, epoch}, from, timer} | state.waiters]}}
    end
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

  def handle_call(:snapshot, from, state),
    do:
      {:noreply,
       %{state | snapshots: SnapshotSchedule.request(state.snapshots, [from], now(state))}}

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

  ## The reader's messages

  @impl true
  # An arity-1 apply ran in the reader: its ops are written here. An
  # arity-2 apply's batch goes to a step, in turn.
  def handle_info({:replica_batch, reader, entries, position_after}, %{reader: reader} = state) do
    state = source_answers(state)

    if is_function(state.apply.fun, 1) do
      started = System.monotonic_time()
      outcome = Apply.batch(state.apply, entries, state.offset, position_after, true)
      batch_done(state, outcome, started)
    else
      next_queued(%{state | queue: :queue.in({:batch, entries, position_after}, state.queue)})
    end
  end

  def handle_info({:replica_trimmed, reader, resume}, %{reader: reader} = state),
    do: next_queued(%{state | queue: :queue.in({:trimmed, resume}, state.queue)})

  def handle_info({:replica_source_stop, reader, error}, %{reader: reader} = state) do
    # The log changed in a way no read or rebuild can follow (the source's
    # read/4 said so): reported, and a stop whatever :on_trimmed says.
    execute(state, [:source, :error], %{count: 1}, %{error: error})
    stop(state, error)
  end

  # The source's last error, kept in the row while it fails, for await/3's
  # timeout (a refusal such as an ACL's NOPERM is then the caller's to see,
  # not only the log's).
  def handle_info({:replica_source_error, reader, error}, %{reader: reader} = state) do
    execute(state, [:source, :error], %{count: 1}, %{error: error})
    Handle.put_source_error(state.handle, error)
    {:noreply, %{state | source_failing: true}}
  end

  def handle_info({:replica_source_ok, reader}, %{reader: reader} = state),
    do: {:noreply, source_answers(state)}

  def handle_info({:replica_caught_up, reader, position}, %{reader: reader} = state),
    do: {:noreply, log_caught_up(%{state | caught_up: position})}

  def handle_info({:replica_step, pid, outcome}, %{step: %{pid: pid, started: started}} = state) do
    case batch_done(%{state | step: nil}, outcome, started) do
      {:noreply, state} -> between_batches(state)
      stop -> stop
    end
  end

  # A drop that waited @drop_wait_ms for the step: it ends mid-batch, and
  # the replica stops with no snapshot (its structure may be mid-entry).
  def handle_info(:replica_drop, %{step: %{pid: pid}} = state) do
    kill(pid)
    {:stop, :normal, off(%{state | step: nil, dropping: nil})}
  end

  def handle_info({:await_timeout, ref}, state) do
    case List.keytake(state.waiters, ref, 0) do
      {{^ref, {target, _epoch}, from, _timer}, waiters} ->
        GenServer.reply(from, {:error, Handle.timed_out(state.handle, target)})
        {:noreply, %{state | waiters: waiters}}

      nil ->
        {:noreply, state}
    end
  end

  def handle_info(:snapshot_timer, state),
    do: {:noreply, %{state | snapshots: SnapshotSchedule.timer(state.snapshots, now(state))}}

  def handle_info({Snapshot, pid, result}, state) do
    if SnapshotSchedule.running?(state.snapshots, pid),
      do: {:noreply, snapshot_done(state, result)},
      else: {:noreply, state}
  end

  def handle_info({:EXIT, pid, reason}, state) do
    cond do
      SnapshotSchedule.running?(state.snapshots, pid) ->
        {:noreply, snapshot_done(state, SnapshotSchedule.exited(state.snapshots, reason))}

      pid == state.reader ->
        {:stop, reason, off(state)}

      reason == :normal ->
        {:noreply, state}

      true ->
        {:stop, reason, state}
    end
  end

  def handle_info(_other, state), do: {:noreply, state}

  @impl true
  def terminate(reason, state) do
    kill(state.reader)

    # A clean stop (the supervisor's shutdown, GenServer.stop/1, drop/1)
    # lets the step running end (up to @drop_wait_ms: after that, or on a
    # crash, it is killed mid-batch and no snapshot is written), lets the
    # snapshot being written commit and writes a last one; a crash does
    # not (the structure may be mid-entry).
    clean = clean?(reason)
    state = end_step(state, clean)
    SnapshotSchedule.stop(state.snapshots, now(state), clean)
    release_path(state.path_lock)
    Larder.Instance.release(Larder.Replica, state.name, state.handle, self())
    :ok
  end

  defp kill(pid) do
    Process.unlink(pid)
    Process.exit(pid, :kill)
  end

  defp end_step(%{step: nil} = state, _clean), do: state

  defp end_step(%{step: %{pid: pid}} = state, true) do
    receive do
      {:replica_step, ^pid, {:ok, offset, _applied, _rejected}} ->
        %{state | step: nil, offset: offset}

      {:replica_step, ^pid, {:stop, _error, offset}} ->
        %{state | step: nil, offset: offset}
    after
      @drop_wait_ms ->
        kill(pid)
        off(%{state | step: nil})
    end
  end

  defp end_step(%{step: %{pid: pid}} = state, false) do
    kill(pid)
    %{state | step: nil}
  end

  defp clean?(:normal), do: true
  defp clean?(:shutdown), do: true
  defp clean?({:shutdown, reason}), do: not is_exception(reason)
  defp clean?(_), do: false

  # No snapshot from now on: the structure may be mid-batch.
  defp off(state), do: %{state | snapshots: SnapshotSchedule.off(state.snapshots)}

  defp now(state), do: %{handle: state.structure, offset: state.offset, busy: state.step != nil}

  defp snapshot_done(state, result),
    do: %{state | snapshots: SnapshotSchedule.done(state.snapshots, result, now(state))}

  defp source_answers(%{source_failing: true} = state) do
    Handle.put_source_error(state.handle, nil)
    %{state | source_failing: false}
  end

  defp source_answers(state), do: state

  ## Batches

  # A batch applied (here or in a step): the reader gets its ack, the
  # offset moves; or the replica stops on a rejected entry.
  defp batch_done(state, outcome, started) do
    case outcome do
      {:ok, offset, applied, rejected} ->
        send(state.reader, :replica_ack)
        duration = System.monotonic_time() - started

        execute(state, [:batch], %{count: applied, rejected: rejected, duration: duration}, %{
          offset: offset
        })

        state = advance(%{state | applied: state.applied + applied}, offset)
        {:noreply, snapshot_due(state)}

      {:stop, error, offset} ->
        stop(advance(state, offset), error)
    end
  end

  # Runs an arity-2 apply over a batch in a step, which gets a copy of
  # what applying needs (the offset, the structure, the function) and
  # sends back {:replica_step, pid, outcome}.
  defp start_step(state, entries, position_after) do
    server = self()
    %{apply: apply, offset: offset} = state

    pid =
      :proc_lib.spawn_link(fn ->
        Process.put(:"$callers", [server])
        outcome = Apply.batch(apply, entries, offset, position_after, false)
        send(server, {:replica_step, self(), outcome})
      end)

    %{state | step: %{pid: pid, started: System.monotonic_time()}}
  end

  # Between two batches a drop that waited stops the replica, and a
  # snapshot that waited begins, before the next batch.
  defp between_batches(%{dropping: timer} = state) when timer != nil do
    Process.cancel_timer(timer)
    {:stop, :normal, %{state | dropping: nil}}
  end

  defp between_batches(state), do: next_queued(snapshot_due(state))

  # A snapshot that waited for a step, or for a position a restart can
  # read on from (see Larder.Replica.SnapshotSchedule), begins between two
  # batches.
  defp snapshot_due(state),
    do: %{state | snapshots: SnapshotSchedule.between_batches(state.snapshots, now(state))}

  # The reader's next message that waited for a step, if no step runs.
  defp next_queued(%{step: nil, dropping: nil} = state) do
    case :queue.out(state.queue) do
      {{:value, {:batch, entries, position_after}}, queue} ->
        {:noreply, start_step(%{state | queue: queue}, entries, position_after)}

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
            log: state.snapshots.identity.log
          )

        stop(state, error)

      :rebuild ->
        Logger.warning(
          "Larder.Replica #{inspect(state.name)}: the log lost entries after " <>
            "#{inspect(state.offset)}; rebuilding from what is left, from #{inspect(resume)}"
        )

        Target.drop(state.target, state.structure)
        structure = Target.create(state.target)
        send(state.reader, {:replica_resume, resume})
        apply = %{state.apply | handle: structure}
        state = %{state | structure: structure, apply: apply, epoch: state.epoch + 1}
        {:noreply, advance(state, resume)}
    end
  end

  # A stop on an error (a rejected entry, a trim with on_trimmed: :stop, a
  # log that cannot be followed): logged, and no snapshot.
  defp stop(state, error) do
    Logger.error("Larder.Replica #{inspect(state.name)} stops: #{Exception.message(error)}")
    {:stop, {:shutdown, error}, off(state)}
  end

  ## The offset and its waiters

  defp advance(state, offset) do
    {done, waiting} =
      Enum.split_with(state.waiters, fn {_ref, {target, epoch}, _from, _timer} ->
        Handle.reached?(state.source, {offset, state.epoch}, target, epoch)
      end)

    for {_ref, _id, from, timer} <- done do
      if timer, do: Process.cancel_timer(timer)
      GenServer.reply(from, :ok)
    end

    write_row(log_caught_up(%{state | offset: offset, waiters: waiting}))
  end

  # One info line, the first time the replica has applied everything up to
  # the log's end the reader first met (a boot that would be silent for
  # the length of the catch-up otherwise): what it applied and how long
  # it took since the replica started. Logger.put_application_level(:larder,
  # :warning) turns it off.
  defp log_caught_up(%{caught_up: position} = state) when position not in [:waiting, :done] do
    if state.source.reached?(state.offset, position) do
      ms = System.monotonic_time(:millisecond) - state.started

      Logger.info(
        "Larder.Replica #{inspect(state.name)} caught up with #{inspect(state.source)} " <>
          "#{inspect(state.source.identity(state.handle.source_opts))}: " <>
          "#{state.applied} #{if state.applied == 1, do: "entry", else: "entries"} applied " <>
          "in #{ms} ms since it started, at #{inspect(state.offset, limit: 8)}"
      )

      %{state | caught_up: :done}
    else
      state
    end
  end

  defp log_caught_up(state), do: state

  defp write_row(state) do
    Handle.put_position(state.handle, state.offset, state.epoch, state.structure)
    state
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
