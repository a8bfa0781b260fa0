# The holder registry of Larder.Lock: each process takes a small integer id
# once and records it in a public ETS table {id, pid}; a janitor process
# deletes the entries of processes that exited (and their rows of
# Larder.Lock.Waits, if any).
defmodule Larder.Lock.Holders do
  @moduledoc false

  use GenServer

  # The table belongs to the process that runs Larder.Application.start/2
  # (the application master's), so it lives as long as the application.
  # Ids come from :erlang.unique_integer([:positive, :monotonic]): never
  # reused in a VM.
  #
  # Nothing a lock does waits on a process. A process registers itself:
  # it inserts its own entry, then tells the janitor (this GenServer) to
  # monitor it. Whether a holder is alive is read from the table and the
  # runtime (`alive?/1`), not from the janitor, whose only job is to delete
  # the entries of processes that exited, so that the table does not grow.
  #
  # So the janitor may be killed at any time, any number of times, without
  # a lock or a caller noticing. It is a :temporary child of
  # Larder.Supervisor: its exits never count towards the supervisor's
  # restart intensity (which a permanent child killed four times in five
  # seconds would exceed, stopping the application). The next process that
  # registers while no janitor runs starts one; a new janitor monitors every
  # entry in the table, so an entry that lost its monitor with a killed
  # janitor is deleted once the next one runs (or at once if its process is
  # already gone).
  @table __MODULE__
  @id {__MODULE__, :id}

  @doc "Creates the table; called once by Larder.Application.start/2."
  @spec create_table() :: :ok
  def create_table do
    _ = :ets.new(@table, [:named_table, :public, :set, read_concurrency: true])
    :ok
  end

  @doc "The janitor's child spec: `:temporary`, see the comment above."
  @spec child_spec(term()) :: Supervisor.child_spec()
  def child_spec(_arg) do
    %{id: __MODULE__, start: {__MODULE__, :start_link, [[]]}, restart: :temporary}
  end

  @doc false
  @spec start_link(keyword()) :: GenServer.on_start()
  def start_link(_opts), do: GenServer.start_link(__MODULE__, [], name: __MODULE__)

  @doc """
  The calling process's holder id. The first call in a process registers it
  (one ETS insert and a message to the janitor, or, when no janitor runs,
  starting one); later calls read the process dictionary. Never waits on
  the janitor. Raises only when the :larder application is not started.
  """
  @spec id() :: pos_integer()
  def id do
    # :erlang.get/1, not Process.get/1 (two more calls): this is on every
    # lock's path.
    case :erlang.get(@id) do
      :undefined -> register()
      id -> id
    end
  end

  defp register do
    id = :erlang.unique_integer([:positive, :monotonic])

    try do
      :ets.insert(@table, {id, self()})
    rescue
      ArgumentError ->
        raise RuntimeError, "Larder.Lock needs the :larder application to be started"
    end

    Process.put(@id, id)

    case Process.whereis(__MODULE__) do
      nil -> start_janitor()
      janitor -> send(janitor, {:watch, id, self()})
    end

    id
  end

  # A janitor started now monitors every entry, this one included. Another
  # process may start one first ({:already_started, _}), or the application
  # may be stopping (the supervisor is gone): either way there is nothing
  # more to do here.
  defp start_janitor do
    _ = Supervisor.start_child(Larder.Supervisor, __MODULE__)
    :ok
  catch
    :exit, _ -> :ok
  end

  @doc """
  Whether the process holding `id` may still act: it registered and is
  alive. A snapshot: a process may exit just after.

  A process killed while it runs a dirty NIF counts as not alive at once,
  while the NIF runs on to its end (OTP 25 sends the `:DOWN` of a monitor
  at the same moment, so waiting for it would not help). A lock's holder
  must therefore not rely on a dirty NIF it started having stopped when its
  slot is taken over.
  """
  @spec alive?(pos_integer()) :: boolean()
  def alive?(id) do
    case :ets.lookup(@table, id) do
      [{_, pid}] -> Process.alive?(pid)
      [] -> false
    end
  end

  @doc "The number of registered holders (live, or dead and not yet deleted)."
  @spec size() :: non_neg_integer()
  def size, do: :ets.info(@table, :size)

  @impl true
  def init([]) do
    # Entries registered while no janitor ran, or under a killed one, have
    # no monitor: monitor every entry (a dead one is reported at once).
    :ets.foldl(fn {id, pid}, :ok -> watch(id, pid) end, :ok, @table)
    {:ok, nil}
  end

  @impl true
  def handle_info({:watch, id, pid}, state) do
    :ok = watch(id, pid)
    {:noreply, state}
  end

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
