# When a replica writes its snapshots: every :snapshot_every ms, on
# dump/1, and last on a clean stop; one at a time; between two batches;
# in a process of its own or in the replica's, by the target's dump mode;
# and, once one is committed, the reader told (the source's committed/2).
# A data structure that the replica's process holds and calls; the
# snapshot files are Larder.Replica.Snapshot's.
defmodule Larder.Replica.SnapshotSchedule do
  @moduledoc false

  # A snapshot names `offset`, the position after the last batch applied
  # when it begins (between two batches: the replica, the only writer of
  # its structure, applies nothing while it starts one; a batch that a
  # step is applying defers it), and a dump that holds the effect of every
  # entry up to `offset`, by the target's dump mode
  # (Larder.Replica.Target.dump_mode/2):
  #
  #   * :concurrent, a process of its own dumps the structure while the
  #     replica goes on applying. For a Table, its writer took a
  #     consistent cut in constant time (Replica.Target.Table), none of the
  #     later entries in it. For a deduplicating Bag fed by an arity-1
  #     :apply, the dump reads the bag as the replica writes it, so it
  #     holds every pair as of `offset` that no later entry changes, and
  #     each pair a later entry inserts or deletes as before or after that
  #     entry; started from it, the replica applies those entries again:
  #     their ops are pure functions of the entries, and an insert of a
  #     pair present or a delete of one absent changes nothing, so each
  #     pair ends as the log leaves it;
  #   * :exclusive (any other Bag: dedup: false, where an insert applied
  #     twice leaves two copies, or an arity-2 :apply, which may read what
  #     it writes): the replica dumps it itself and applies nothing
  #     meanwhile.
  #
  # A snapshot names only a position a restart can read on from (the
  # source's resumable?/1, Larder.Replica.Source): one due at another (the
  # rows of a Postgres source's initial copy) waits for the first batch
  # that ends at a resumable one, and a clean stop there writes none.
  #
  # One snapshot at a time: a timer that fires meanwhile is skipped, and a
  # dump/1 call waits for the next one. The snapshot's process is linked
  # to the replica: a kill of the replica takes it down mid-dump, leaving
  # the last committed manifest and its dump (Larder.Replica.Snapshot).

  require Logger

  alias Larder.Replica.Snapshot
  alias Larder.Replica.Target

  @enforce_keys [:path, :every, :identity, :target, :mode, :name, :telemetry, :committed]
  defstruct @enforce_keys ++
              [
                :timer,
                # the reader, told of each commit
                :reader,
                # the snapshot being written by a process of its own:
                # %{pid, offset, started, callers}
                :running,
                # callers waiting for the snapshot after the running one
                next: [],
                # callers of a snapshot due once the step running is done
                # (nil: none due; [] for the timer's)
                deferred: nil
              ]

  @type t :: %__MODULE__{}

  @typedoc "The replica now: its structure's handle, its offset, and whether a step is applying a batch."
  @type now :: %{handle: Target.handle(), offset: term(), busy: boolean()}

  @doc """
  A schedule for the snapshots at `path` (nil: none). `committed` is the
  offset the replica started from (its snapshot's, or the origin): a
  snapshot is written only once the offset moved from it.
  """
  @spec new(keyword()) :: t()
  def new(opts) do
    target = opts[:target]

    %__MODULE__{
      path: opts[:path],
      every: opts[:every],
      identity: opts[:identity],
      target: target,
      mode: Target.dump_mode(target, opts[:arity]),
      name: opts[:name],
      telemetry: opts[:telemetry],
      committed: opts[:committed]
    }
  end

  @doc "Sets the reader to tell of each commit, and starts the timer."
  @spec start(t(), pid()) :: t()
  def start(%__MODULE__{path: nil} = s, reader), do: %{s | reader: reader}

  def start(s, reader),
    do: %{s | reader: reader, timer: Process.send_after(self(), :snapshot_timer, s.every)}

  @doc "No more snapshots: the structure may be mid-batch (a crash, a stop on an error)."
  @spec off(t()) :: t()
  def off(s), do: %{s | path: nil}

  @doc "Whether `pid` is the process writing the running snapshot."
  @spec running?(t(), pid()) :: boolean()
  def running?(%__MODULE__{running: %{pid: pid}}, pid), do: true
  def running?(_s, _pid), do: false

  @doc """
  A snapshot for `callers` (dump/1's, answered `{:ok, offset}` or
  `{:error, error}` once it is committed or failed; none for the timer's).
  """
  @spec request(t(), [GenServer.from()], now()) :: t()
  def request(%__MODULE__{path: nil} = s, callers, _now) do
    error = Larder.Error.new(:no_snapshot_path, "the replica has no :snapshot path")
    for from <- callers, do: GenServer.reply(from, {:error, error})
    s
  end

  def request(%__MODULE__{running: %{}} = s, callers, _now), do: %{s | next: callers ++ s.next}

  def request(%__MODULE__{committed: offset} = s, callers, %{offset: offset}) do
    for from <- callers, do: GenServer.reply(from, {:ok, offset})
    s
  end

  # A batch in a step: the snapshot begins once it is applied; at a
  # position a restart cannot read on from, once a batch ends at one that
  # it can.
  def request(s, callers, %{busy: true}), do: defer(s, callers)

  def request(s, callers, now) do
    cond do
      not resumable?(s, now.offset) ->
        defer(s, callers)

      s.mode == :concurrent ->
        pid = Snapshot.start(s.path, s.identity, s.target, now.handle, now.offset)
        started = System.monotonic_time()
        %{s | running: %{pid: pid, offset: now.offset, started: started, callers: callers}}

      true ->
        {reply, s} =
          case write(s, now) do
            {:ok, s} -> {{:ok, now.offset}, s}
            {:error, error, s} -> {{:error, error}, s}
          end

        for from <- callers, do: GenServer.reply(from, reply)
        s
    end
  end

  defp defer(s, callers), do: %{s | deferred: (s.deferred || []) ++ callers}

  # Whether a restart can read on from `offset` (the source's optional
  # resumable?/1, a pure function of its positions, as advance/2 is).
  defp resumable?(s, offset) do
    source = s.identity.source

    not (Code.ensure_loaded?(source) and function_exported?(source, :resumable?, 1)) or
      source.resumable?(offset) == true
  end

  @doc "The timer fired: a snapshot (unless one is running), and the next timer."
  @spec timer(t(), now()) :: t()
  def timer(s, now), do: s |> request([], now) |> start(s.reader)

  @doc """
  Between two batches: a snapshot that waited for the step, or for a
  resumable position, begins (or waits on).
  """
  @spec between_batches(t(), now()) :: t()
  def between_batches(%__MODULE__{deferred: nil} = s, _now), do: s
  def between_batches(s, now), do: request(%{s | deferred: nil}, s.deferred, now)

  @doc """
  The running snapshot's `result` (its message, or an error for its exit):
  its callers answered, and the next snapshot begun for those that waited.
  """
  @spec done(t(), :ok | {:error, Larder.Error.t()}, now()) :: t()
  def done(s, result, now) do
    %{offset: offset, started: started, callers: callers} = s.running
    s = result(%{s | running: nil}, offset, started, result)
    reply = if result == :ok, do: {:ok, offset}, else: result
    for from <- callers, do: GenServer.reply(from, reply)

    case s.next do
      [] -> s
      next -> request(%{s | next: []}, next, now)
    end
  end

  @doc "The error of a snapshot whose process exited with `reason` before it committed."
  @spec exited(t(), term()) :: {:error, Larder.Error.t()}
  def exited(s, reason) do
    {:error,
     Larder.Error.new(:file_error, "the snapshot's process exited before it committed",
       path: s.path,
       reason: reason
     )}
  end

  @doc """
  The replica stops. A clean stop lets the running snapshot commit and
  writes a last one (unless off/1); otherwise the running one is killed
  (it would commit after the replica let its path go).
  """
  @spec stop(t(), now(), boolean()) :: t()
  def stop(%__MODULE__{path: path} = s, now, true) when path != nil do
    s = await_running(s, now)

    case write(s, now) do
      {:ok, s} -> s
      {:error, _error, s} -> s
    end
  end

  def stop(%__MODULE__{running: %{pid: pid}} = s, _now, _clean) do
    Process.unlink(pid)
    Process.exit(pid, :kill)
    %{s | running: nil}
  end

  def stop(s, _now, _clean), do: s

  defp await_running(%__MODULE__{running: nil} = s, _now), do: s

  defp await_running(%__MODULE__{running: %{pid: pid}} = s, now) do
    result =
      receive do
        {Snapshot, ^pid, result} -> result
        {:EXIT, ^pid, reason} -> exited(s, reason)
      end

    done(%{s | next: []}, result, now)
  end

  # A snapshot in the replica's process: it applies nothing until it is
  # committed. None at a position a restart cannot read on from (a clean
  # stop inside a source's copy): the last one stays.
  defp write(%__MODULE__{committed: offset} = s, %{offset: offset}), do: {:ok, s}

  defp write(s, now) do
    if resumable?(s, now.offset) do
      write_now(s, now)
    else
      Logger.info(
        "Larder.Replica #{inspect(s.name)}: no snapshot at #{inspect(now.offset, limit: 8)}, " <>
          "which a restart cannot read on from (the source's copy is not complete); " <>
          "the last one stays"
      )

      {:ok, s}
    end
  end

  defp write_now(s, now) do
    started = System.monotonic_time()
    result = Snapshot.write(s.path, s.identity, s.target, now.handle, now.offset)

    case result(s, now.offset, started, result) do
      s when result == :ok -> {:ok, s}
      s -> {:error, elem(result, 1), s}
    end
  end

  defp result(s, offset, started, result) do
    Larder.Telemetry.execute(
      s.telemetry,
      [:larder, :replica, :snapshot],
      %{duration: System.monotonic_time() - started},
      %{replica: s.name, offset: offset, path: s.path, result: result}
    )

    case result do
      :ok ->
        if s.reader, do: send(s.reader, {:replica_committed, offset})
        %{s | committed: offset}

      {:error, error} ->
        Logger.warning(
          "Larder.Replica #{inspect(s.name)}: snapshot failed: #{Exception.message(error)}"
        )

        s
    end
  end
end
