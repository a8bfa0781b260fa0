# The process behind each Larder.Table: it owns the table's ETS tables and
# index, hands out (and reuses) row ids, and applies every write whole, so a
# caller killed mid-write cannot leave half of one behind. Its name, owner
# and drop follow Larder.Instance.
defmodule Larder.Table.Writer do
  @moduledoc false

  use GenServer

  alias Larder.Index
  alias Larder.Instance
  alias Larder.Table
  alias Larder.Table.Claim
  alias Larder.Table.Dump
  alias Larder.Table.Snapshot
  alias Larder.Table.Writes

  @direct_limit 0x80000000

  # `next`, `free` and `top` are the row ids' state (see Larder.Table.Writes).
  # While a `claim` is held, the other requests wait in `held`, in order.
  # `dumps` are the dumps running (Larder.Table.Dump), whose cut each write
  # saves what it changes for.
  defstruct [
    :table,
    :owner,
    next: @direct_limit,
    free: [],
    top: 0,
    claim: nil,
    held: :queue.new(),
    dumps: []
  ]

  # Started by Larder.Table through Larder.Instance.start/4 (new/1, load/2:
  # `owner` is the caller) or start_link/4 (owner nil), with `path` the
  # snapshot load/2 fills the table from (read here, so the file's bytes are
  # this process's garbage, not the caller's); a bad file stops the writer
  # with `{:shutdown, %Larder.Error{}}`.

  @doc """
  Whether the calling process is a table's writer, that is, whether a write
  now would come from a function a writer runs (an `update/4` function or an
  index function). Such a write is refused: it could wait for ever on a
  writer that waits on this one.
  """
  @spec writer?() :: boolean()
  def writer?, do: Process.get(__MODULE__, false)

  @doc "The handle of the table `writer` owns."
  @spec handle(pid()) :: Table.t()
  def handle(writer), do: GenServer.call(writer, :handle, :infinity)

  @impl true
  def init({config, owner, path}) do
    started = System.monotonic_time()

    # A snapshot is checked whole before any table is created.
    case path && Snapshot.read(path, config) do
      {:error, error} -> {:stop, {:shutdown, error}}
      {:ok, read} -> init(config, owner, {read, path, started})
      nil -> init(config, owner, nil)
    end
  end

  defp init(config, owner, snapshot) do
    Instance.watch(owner)
    Process.put(__MODULE__, true)

    table = %Table{
      # Public so that a caller can insert a claimed chunk (Larder.Table.Claim).
      rows: :ets.new(Table, [:set, :public, read_concurrency: true]),
      keys: :ets.new(Table.Keys, [:set, :protected, read_concurrency: true]),
      index: Index.new(reverse: config.store != nil),
      key: config.key,
      entries: config.entries,
      names: Map.new(config.entries, fn {name, _} -> {name, true} end),
      store: config.store,
      writer: self(),
      top: :atomics.new(1, signed: false),
      name: config.name,
      telemetry: Instance.telemetry?(config.telemetry)
    }

    case fill(%__MODULE__{table: table, owner: owner}, snapshot) do
      {:ok, state} ->
        Instance.publish(Table, table.name, table)
        {:ok, state}

      {:error, error} ->
        {:stop, error}
    end
  end

  defp fill(state, nil), do: {:ok, state}

  defp fill(state, {read, path, started}) do
    case Snapshot.fill(state.table, read, path) do
      {:ok, {next, free, top}} ->
        # The file's bytes and the decoded chunks are garbage now.
        :erlang.garbage_collect()
        Snapshot.log_loaded(state.table, path, read.bytes, started)
        {:ok, Writes.top(%{state | next: next, free: free}, top)}

      # A shutdown: a bad file is not a crash to report.
      {:error, error} ->
        {:error, {:shutdown, error}}
    end
  end

  @impl true
  def handle_call(:handle, _from, state), do: {:reply, state.table, state}

  # A build claim (see Larder.Table.Claim). While it is held no other
  # write runs: requests wait in `held` and run, in order, once it ends.
  def handle_call({:release, ref}, from, %{claim: %Claim{ref: ref}} = state) do
    {reply, state} = settle(state)
    GenServer.reply(from, reply)
    drain(state)
  end

  def handle_call(request, from, %{claim: %Claim{}} = state),
    do: {:noreply, %{state | held: :queue.in({request, from}, state.held)}}

  def handle_call({:claim, span, ops, ids}, {caller, _}, state) do
    case Claim.grant(span, ops, ids, caller, state.top) do
      {:ok, claim} -> {:reply, {:claimed, claim.ref}, %{state | claim: claim}}
      :stale -> {:reply, :stale, state}
    end
  end

  # A dump: the writer takes the cut (between two writes, so the file is
  # one state of the table) and a process of its own writes the file while
  # the writer goes on; `notify` gets the result (Larder.Table.Dump).
  def handle_call({:dump, path, notify}, _from, state) do
    dump = Dump.start(state, path, notify)
    {:reply, {:ok, dump.ref}, %{state | dumps: [dump | state.dumps]}}
  catch
    kind, reason -> {:reply, {:raise, kind, reason, __STACKTRACE__}, state}
  end

  def handle_call({Instance, :drop}, _from, state) do
    release(state)
    {:stop, :normal, :ok, state}
  end

  def handle_call(request, _from, state) do
    {reply, state} = Writes.run(request, state)
    {:reply, reply, state}
  catch
    # Nothing has changed yet when a step raises (see Writes.run/2): the
    # caller re-raises, the table is as it was.
    kind, reason -> {:reply, {:raise, kind, reason, __STACKTRACE__}, state}
  end

  @impl true
  def handle_info({Dump, ref, result}, state),
    do: {:noreply, %{state | dumps: Dump.finish(state.dumps, ref, result)}}

  def handle_info({:DOWN, monitor, :process, _, reason} = down, state) do
    case Dump.down(state.dumps, monitor) do
      nil ->
        down(down, state)

      # Killed from outside: the caller of dump/2 exits as its process did.
      dump ->
        result = {:raise, :exit, reason, []}
        {:noreply, %{state | dumps: Dump.finish(state.dumps, dump.ref, result)}}
    end
  end

  def handle_info(_other, state), do: {:noreply, state}

  defp down({:DOWN, ref, :process, _, _}, %{claim: %Claim{ref: ref}} = state) do
    {_reply, state} = settle(state)
    drain(state)
  end

  defp down({:DOWN, _ref, :process, owner, _reason}, %{owner: owner} = state),
    do: {:stop, :normal, state}

  defp down(_other, state), do: {:noreply, state}

  @impl true
  def terminate(_reason, state), do: release(state)

  defp release(%{table: table}) do
    for tab <- [table.rows, table.keys], :ets.info(tab, :id) != :undefined, do: :ets.delete(tab)
    Index.drop(table.index)
    Instance.release(Table, table.name, table, self())
  end

  defp settle(state) do
    {reply, top} = Claim.settle(state.claim, state.table, state.top)
    {reply, Writes.top(%{state | claim: nil}, top)}
  end

  # Runs the requests held back during a claim, in order, until one of them
  # takes a new claim (the rest then wait for that one).
  defp drain(%{claim: nil} = state) do
    case :queue.out(state.held) do
      {:empty, _} ->
        {:noreply, state}

      {{:value, {request, from}}, held} ->
        case handle_call(request, from, %{state | held: held}) do
          {:reply, reply, state} ->
            GenServer.reply(from, reply)
            drain(state)

          {:stop, reason, reply, state} ->
            GenServer.reply(from, reply)
            {:stop, reason, state}
        end
    end
  end

  defp drain(state), do: {:noreply, state}
end
