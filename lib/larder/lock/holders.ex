# The holder registry of Larder.Lock: hands each process a small integer id
# once, in a public ETS table {id, pid}, and deletes the entry when the
# process exits, so that waiters can tell a live holder from a dead one
# (and deletes its row of Larder.Lock.Waits, if any).
defmodule Larder.Lock.Holders do
  @moduledoc false

  use GenServer

  # The table belongs to the process that runs Larder.Application.start/2
  # (the application master's), so entries outlive a restart of this
  # process; a restarted registry monitors every entry again. Ids come from
  # :erlang.unique_integer([:positive, :monotonic]): never reused in a VM.
  @table __MODULE__
  @id {__MODULE__, :id}

  @doc "Creates the table; called once by Larder.Application.start/2."
  @spec create_table() :: :ok
  def create_table do
    _ = :ets.new(@table, [:named_table, :public, :set, read_concurrency: true])
    :ok
  end

  @doc false
  @spec start_link(keyword()) :: GenServer.on_start()
  def start_link(_opts), do: GenServer.start_link(__MODULE__, [], name: __MODULE__)

  @doc """
  The calling process's holder id. The first call in a process registers it
  (one call to the registry); later calls read the process dictionary.
  """
  @spec id() :: pos_integer()
  def id do
    case Process.get(@id) do
      nil -> register()
      id -> id
    end
  end

  defp register do
    id = GenServer.call(__MODULE__, :register, :infinity)
    Process.put(@id, id)
    id
  catch
    :exit, {reason, _} when reason in [:noproc, :normal, :shutdown, :killed] ->
      raise RuntimeError, "Larder.Lock needs the :larder application to be started"
  end

  @doc """
  Whether the process holding `id` may still act: true until the registry
  has deleted its entry, on the process's `:DOWN`.

  `Process.alive?/1` is not enough: a process killed while it runs a dirty
  NIF counts as not alive at once (it is exiting), yet the NIF runs on to
  its end and may still change what the holder was writing. The runtime
  sends the `:DOWN` only once the process has finished exiting, so a holder
  is taken over only after everything it started has stopped.
  """
  @spec alive?(pos_integer()) :: boolean()
  def alive?(id), do: :ets.member(@table, id)

  @doc "The number of registered holders (live, or dead and not yet deleted)."
  @spec size() :: non_neg_integer()
  def size, do: :ets.info(@table, :size)

  @impl true
  def init([]) do
    # Entries registered under a previous run of this process lost their
    # monitors: monitor them again (a dead one is reported at once).
    :ets.foldl(fn {id, pid}, :ok -> watch(id, pid) end, :ok, @table)
    {:ok, nil}
  end

  @impl true
  def handle_call(:register, {pid, _tag}, state) do
    id = :erlang.unique_integer([:positive, :monotonic])
    :ok = watch(id, pid)
    true = :ets.insert(@table, {id, pid})
    {:reply, id, state}
  end

  @impl true
  def handle_info({{__MODULE__, id}, _ref, :process, pid, _reason}, state) do
    :ets.delete(@table, id)
    Larder.Lock.Waits.forget(pid)
    {:noreply, state}
  end

  def handle_info(_msg, state), do: {:noreply, state}

  defp watch(id, pid) do
    _ = :erlang.monitor(:process, pid, tag: {__MODULE__, id})
    :ok
  end
end
