# How every Larder structure (Bag, Register, Table, Cache, Replica) lives
# and dies: its name, its owner, resolving a name or handle, and drop/1.
defmodule Larder.Instance do
  @moduledoc false

  # A newcomer's guide: the life of a structure, from birth to death.
  #
  # Birth and ownership. A structure is made one of two ways:
  #
  #   * new/1: it belongs to the calling process and dies when the caller
  #     exits, as an ETS table does. Register and Table start an owner
  #     process (start/3, not linked) that monitors the caller (watch/1) and
  #     stops when it goes; Bag.new/1 starts no process at all: its ETS table
  #     belongs to the caller itself.
  #   * start_link/1: an owner process under the caller's supervisor
  #     (start_link/3), so the structure outlives its users. child_spec/3
  #     builds every structure's child spec: id `{Kind, name}`, restart
  #     `:transient`, so a structure ended by drop/1 stays dropped (its owner
  #     exits `:normal`) and one whose owner crashed is restarted, empty.
  #
  # Names: one mechanism. A name is held by a claim, the object
  # `{{kind, name}, owner}` in this module's ETS table (created by
  # Larder.Application), inserted with :ets.insert_new/2: of any number of
  # racing creators exactly one gets it. A claim whose owner is dead (killed
  # before it could let go) is deleted by the next claimer and the claim is
  # tried again, so a dead owner never holds its name. Owner processes claim
  # through GenServer's name registration, `name: via(kind, name)` (this
  # module implements :global's register_name/whereis_name/send interface),
  # which turns a taken name into `{:error, {:already_started, pid}}`;
  # Bag.new/1 claims for its caller with claim/3. Names are per kind: a bag
  # and a table may share one. A Cache's owner and a Replica's process also
  # register their pid under the bare name once they hold the claim (their
  # documented address, for GenServer calls and Process.whereis/1).
  #
  # Resolving. The claim holder publishes the structure's handle under
  # `{kind, name}` in :persistent_term (publish/3). resolve/2 is a macro, so
  # a call by name costs exactly one :persistent_term.get/2 and a match, in
  # the caller's own function: no process, no ETS lookup. What goes wrong
  # has two messages, shared by every structure:
  #
  #   * unknown!/2: a name that holds nothing, or a handle whose structure is
  #     gone: "unknown Larder.X <what>: it was never created, it was dropped,
  #     or the process that owned it exited" (a handle was created: its
  #     message leaves that case out);
  #   * invalid!/2: a term that is not a handle nor a name, or a forged handle
  #     (its fields do not fit together): "expected a Larder.X (a handle or
  #     the name of one), got: <term>" ("got a forged Larder.X handle: ..."
  #     for the latter).
  #
  # A handle is shown by its Inspect implementation, which every structure
  # has (`#Larder.Table<name: :prices, key: :id>`), so these messages, and
  # describe/3's name for a structure in others, are one short line.
  #
  # The application. The claims table above, and what Larder.Application
  # creates beside it, exist only while the :larder application runs. Every
  # way to create a structure (new/1, start_link/1, load/2 of each kind, a
  # snapshot write) first calls started!/1, which raises the one error for
  # a :larder application that is not started, saying what to do.
  #
  # Death. drop/1 is idempotent by handle and by name. A structure with an
  # owner process is dropped by that process (drop/1 here sends it the one
  # `{Larder.Instance, :drop}` call; an owner that is gone counts as dropped),
  # which frees what it owns and exits `:normal`. The handle names its owner,
  # so no process has to be asked what it is. release/3, run by whoever frees
  # the structure, erases the published handle (only if it is still this
  # structure's: a newer structure of the same name is left alone) and then
  # the claim. An owner that is killed erases nothing: its handle stays
  # published until the name is claimed again, and every call through it
  # meets the freed ETS tables and raises unknown!/2.
  #
  # A Cache (a supervision tree) and a Replica stuck in an apply cannot be
  # asked to exit :normal: terminate/2 stops them, through their parent's
  # terminate_child when a supervisor started them, so the supervisor keeps
  # the child stopped and counts no crash.
  #
  # Telemetry. Whether a structure emits :telemetry events is decided once,
  # at creation (telemetry?/1), and kept in its handle.

  @table __MODULE__

  @type kind :: module()
  @type name :: atom()

  @not_started "the :larder application is not started: add :larder to your project's " <>
                 "deps (it starts with your application), or call " <>
                 "Application.ensure_all_started(:larder) in a script"

  @doc "Creates the claims table; called once by Larder.Application.start/2."
  @spec create_table() :: :ok
  def create_table do
    _ = :ets.new(@table, [:named_table, :public, :set, read_concurrency: true])
    :ok
  end

  ## Names

  @doc """
  Claims `name` for `owner`: `:ok`, or `{:error, {:already_started, holder}}`
  when a live process holds it (`owner` itself included: a process cannot
  hold one name twice).
  """
  @spec claim(kind(), name(), pid()) :: :ok | {:error, {:already_started, pid()}}
  def claim(kind, name, owner) do
    key = {kind, name}

    if :ets.insert_new(@table, {key, owner}) do
      :ok
    else
      case :ets.lookup(@table, key) do
        [{_, holder}] ->
          if holder != owner and not Process.alive?(holder) do
            # Only this exact claim: a live one put meanwhile stays.
            :ets.delete_object(@table, {key, holder})
            claim(kind, name, owner)
          else
            {:error, {:already_started, holder}}
          end

        [] ->
          claim(kind, name, owner)
      end
    end
  end

  @doc "Lets go of `owner`'s claim on `name` (one that publishes no handle)."
  @spec unclaim(kind(), term(), pid()) :: :ok
  def unclaim(kind, name, owner) do
    :ets.delete_object(@table, {{kind, name}, owner})
    :ok
  end

  @doc "Publishes the handle of the structure that holds `name`'s claim."
  @spec publish(kind(), name() | nil, term()) :: :ok
  def publish(_kind, nil, _handle), do: :ok
  def publish(kind, name, handle), do: :persistent_term.put({kind, name}, handle)

  @doc """
  Lets `name` go: erases the published handle if it is still `handle`,
  then `owner`'s claim. Whoever frees the structure calls it.
  """
  @spec release(kind(), name() | nil, term(), pid()) :: :ok
  def release(_kind, nil, _handle, _owner), do: :ok

  def release(kind, name, handle, owner) do
    key = {kind, name}
    # Erased while the claim still stands, so no other structure can have
    # published under the name yet; and only this structure's handle.
    if :persistent_term.get(key, nil) === handle, do: :persistent_term.erase(key)
    :ets.delete_object(@table, {key, owner})
    :ok
  end

  @doc "The `name:` option that makes a GenServer claim `name` as it starts."
  @spec via(kind(), name()) :: {:via, module(), {kind(), name()}}
  def via(kind, name), do: {:via, __MODULE__, {kind, name}}

  @doc "The live process that holds `name`, or nil."
  @spec whereis(kind(), name()) :: pid() | nil
  def whereis(kind, name) do
    case :ets.lookup(@table, {kind, name}) do
      [{_, pid}] -> if Process.alive?(pid), do: pid, else: nil
      [] -> nil
    end
  end

  @doc "The name of `kind` that the process `pid` holds, or nil."
  @spec name_of(kind(), pid()) :: name() | nil
  def name_of(kind, pid) do
    case :ets.match(@table, {{kind, :"$1"}, pid}, 1) do
      {[[name] | _], _} -> name
      _ -> nil
    end
  end

  @doc "Whether the process `pid` holds a name of `kind`."
  @spec holds?(kind(), pid()) :: boolean()
  def holds?(kind, pid), do: :ets.match(@table, {{kind, :_}, pid}, 1) != :"$end_of_table"

  @doc """
  Registers the calling owner, which holds `name`'s claim, under the bare
  name too (a Cache's and a Replica's documented address): `:ok`, or
  `{:error, {:already_started, pid}}` when another process has it.
  """
  @spec address(name()) :: :ok | {:error, {:already_started, pid()}}
  def address(name) do
    Process.register(self(), name)
    :ok
  rescue
    ArgumentError -> {:error, {:already_started, Process.whereis(name)}}
  end

  # The :via interface (GenServer.start*/3 and calls through via/2).

  @doc false
  def register_name({kind, name}, pid) do
    case claim(kind, name, pid) do
      :ok -> :yes
      {:error, _} -> :no
    end
  end

  @doc false
  def unregister_name({kind, name}) do
    :ets.delete_object(@table, {{kind, name}, self()})
    :ok
  end

  @doc false
  def whereis_name({kind, name}), do: whereis(kind, name) || :undefined

  @doc false
  def send({kind, name} = via, message) do
    case whereis(kind, name) do
      nil -> exit({:badarg, {via, message}})
      pid -> Kernel.send(pid, message)
    end
  end

  ## Resolving

  @doc """
  The handle published under `name`, or nil. A macro: one
  `:persistent_term.get/2` in the caller.
  """
  defmacro lookup(kind, name) do
    quote bind_quoted: [kind: kind, name: name] do
      :persistent_term.get({kind, name}, nil)
    end
  end

  @doc """
  The handle published under `name`, or `unknown!/2`. A macro: one
  `:persistent_term.get/2` and a match in the caller, nothing else.
  """
  defmacro resolve(kind, name) do
    quote bind_quoted: [kind: kind, name: name] do
      case :persistent_term.get({kind, name}, nil) do
        nil -> Larder.Instance.unknown!(kind, name)
        handle -> handle
      end
    end
  end

  @doc "Raises the one error for a structure that does not exist (any more)."
  @spec unknown!(kind(), term()) :: no_return()
  def unknown!(kind, what) do
    # A name may never have been created; a handle was.
    why =
      if is_atom(what),
        do: "it was never created, it was dropped, or the process that owned it exited",
        else: "it was dropped, or the process that owned it exited"

    raise ArgumentError, "unknown #{inspect(kind)} #{inspect(what, limit: 10)}: #{why}"
  end

  @doc "Raises the one error for a term that is not a handle or a name (or a forged handle)."
  @spec invalid!(kind(), term()) :: no_return()
  def invalid!(kind, term) do
    # A handle's Inspect shows it as a real one would show: say it is not.
    got =
      if is_struct(term, kind),
        do: "got a forged #{inspect(kind)} handle: ",
        else: "got: "

    raise ArgumentError,
          "expected a #{inspect(kind)} (a handle or the name of one), " <>
            got <> inspect(term, limit: 10)
  end

  @doc """
  `:ok` when the `:larder` application runs (its tables exist), else
  not_started!/1. One `:ets.whereis/1`: called by everything that creates
  a structure, before it creates anything.
  """
  @spec started!(String.t()) :: :ok
  def started!(what) do
    if :ets.whereis(@table) == :undefined, do: not_started!(what), else: :ok
  end

  @doc """
  Raises the one error for Larder used while the `:larder` application is
  not started: a `RuntimeError` that names `what` (a structure or a
  function) and says what to do.
  """
  @spec not_started!(String.t()) :: no_return()
  def not_started!(what), do: raise(RuntimeError, "#{what}: #{@not_started}")

  @doc """
  A structure in a message: `Larder.X :name` when it has a name, else its
  handle as its Inspect implementation shows it (`#Larder.X<...>`, which
  names the kind).
  """
  @spec describe(kind(), name() | nil, term()) :: String.t()
  def describe(_kind, nil, handle), do: inspect(handle, limit: 10)
  def describe(kind, name, _handle), do: "#{inspect(kind)} #{inspect(name)}"

  @doc "Raises the one error for a name in use."
  @spec taken!(kind(), name()) :: no_return()
  def taken!(kind, name) do
    raise ArgumentError, "a #{inspect(kind)} named #{inspect(name)} already exists"
  end

  @doc "Whether `term` can be a name (an atom other than nil and booleans)."
  defguard name?(term) when is_atom(term) and term not in [nil, true, false]

  ## Ownership

  @doc """
  Starts `module`'s owner process for new/1: not linked (it monitors
  `caller` through watch/1 instead), claiming `name` if there is one.
  """
  @spec start(module(), term(), kind(), name() | nil) :: GenServer.on_start()
  def start(module, arg, kind, name) do
    started!(inspect(kind))
    GenServer.start(module, arg, gen_opts(kind, name))
  end

  @doc "Starts `module`'s owner process under the caller's supervisor."
  @spec start_link(module(), term(), kind(), name()) :: GenServer.on_start()
  def start_link(module, arg, kind, name) do
    started!(inspect(kind))
    GenServer.start_link(module, arg, gen_opts(kind, name))
  end

  defp gen_opts(_kind, nil), do: []
  defp gen_opts(kind, name), do: [name: via(kind, name)]

  @doc """
  Called in an owner's init: ties the structure to `caller` (new/1; nil for
  start_link/1) and traps exits so that terminate/2 frees it on shutdown.
  The owner stops when it gets `{:DOWN, _, :process, caller, _}`.
  """
  @spec watch(pid() | nil) :: :ok
  def watch(caller) do
    Process.flag(:trap_exit, true)
    if caller, do: Process.monitor(caller)
    :ok
  end

  @doc """
  Every structure's child spec: id `{kind, name}`, `:transient` (a dropped
  structure stays dropped, a crashed one is restarted). Its start goes
  through start_child/3, which records the supervisor that started it
  (see terminate/2).
  """
  @spec child_spec(kind(), name(), {module(), atom(), list()}, keyword()) ::
          Supervisor.child_spec()
  def child_spec(kind, name, start, extra \\ []) do
    Map.merge(
      %{
        id: {kind, name},
        start: {__MODULE__, :start_child, [kind, name, start]},
        # (the code it runs is the start's module's, not this one's)
        modules: [elem(start, 0)],
        type: :worker,
        restart: :transient
      },
      Map.new(extra)
    )
  end

  @doc """
  The start of a child spec of child_spec/4: runs `start` (in the
  supervisor, which calls it) and records, in the claims table, that the
  process it started is the supervisor's child: `{{:supervised, kind,
  name}, pid, supervisor}` (one row per name, the last start's).
  """
  @spec start_child(kind(), name(), {module(), atom(), list()}) :: Supervisor.on_start_child()
  def start_child(kind, name, {module, fun, args}) do
    case apply(module, fun, args) do
      {:ok, pid} = started when is_pid(pid) ->
        :ets.insert(@table, {{:supervised, kind, name}, pid, self()})
        started

      {:ok, pid, _info} = started when is_pid(pid) ->
        :ets.insert(@table, {{:supervised, kind, name}, pid, self()})
        started

      other ->
        other
    end
  end

  # The supervisor that started `pid` through child_spec/4, if it is still
  # its parent.
  defp supervisor_of(pid) do
    with [[parent] | _] <- :ets.match(@table, {{:supervised, :_, :_}, pid, :"$1"}),
         {:parent, ^parent} <- Process.info(pid, :parent) do
      parent
    else
      _ -> nil
    end
  end

  @doc "The live processes that hold a name of `kind`."
  @spec holders(kind()) :: [pid()]
  def holders(kind) do
    for [pid] <- :ets.match(@table, {{kind, :_}, :"$1"}), Process.alive?(pid), do: pid
  end

  ## Death

  @doc """
  Drops the structure owned by the process `owner`: the owner frees it and
  exits `:normal`. An owner already gone counts as dropped: `:ok` either way.
  """
  @spec drop(pid()) :: :ok
  def drop(owner) when is_pid(owner) do
    GenServer.call(owner, {__MODULE__, :drop}, :infinity)
  catch
    :exit, _gone -> :ok
  end

  @doc """
  Drops the structure published under `name` with `drop`, the kind's own
  drop/1 on a handle. A name that holds nothing is taken as a structure
  already dropped: `:ok`.
  """
  @spec drop_name(kind(), name(), (term() -> :ok)) :: :ok
  def drop_name(kind, name, drop) do
    case lookup(kind, name) do
      nil -> :ok
      handle -> drop.(handle)
    end
  end

  @doc """
  Stops `pid`, the top process of a structure (a Cache's supervisor, a
  Replica's process), so that it stays stopped, and returns once it is gone.

  Under a `Supervisor` or a `DynamicSupervisor` that started it from its
  child spec (`child_spec/4`, which records it) and still has it as a
  child, it is terminated through that supervisor (`terminate_child`): the supervisor
  does not take the exit for a crash, so it neither restarts the child nor
  counts it against its restart intensity. `how` is `:shutdown` (the
  child's own shutdown, as the supervisor's shutdown of it would be) or
  `:kill` (at once: a process stuck in user code cannot take a shutdown).
  Otherwise `pid` is stopped directly: `:sys.terminate(pid, :normal)` (so a
  linked caller that does not trap exits lives on) or killed. A process
  already gone counts as stopped.
  """
  @spec terminate(pid(), :shutdown | :kill) :: :ok
  def terminate(pid, how) when how in [:shutdown, :kill] do
    monitor = Process.monitor(pid)

    # A supervisor that is gone, or does not know the child (any more),
    # leaves the stop to us.
    unless terminated_by_parent?(pid, how), do: stop(pid, how)

    receive do
      {:DOWN, ^monitor, :process, _pid, _reason} -> :ok
    end
  end

  defp stop(pid, :kill), do: Process.exit(pid, :kill)

  defp stop(pid, :shutdown) do
    :sys.terminate(pid, :normal, :infinity)
  catch
    # gone already, or stopped by a concurrent drop meanwhile
    :exit, _ -> :ok
  end

  # Asks `pid`'s parent to terminate it, if the parent is the supervisor
  # (a Supervisor or a DynamicSupervisor) that started it through a child
  # spec of child_spec/4 (start_child/3 recorded it) and still has it as a
  # child: by id for a Supervisor, by pid for a DynamicSupervisor (whose
  # children have no id). Whether the supervisor did. A parent that is not
  # known to be a supervisor is never asked: a call it does not expect
  # could crash it.
  defp terminated_by_parent?(pid, how) do
    with parent when is_pid(parent) and parent != self() <- supervisor_of(pid),
         {id, ^pid, _, _} <- List.keyfind(:supervisor.which_children(parent), pid, 1) do
      child = if id == :undefined, do: pid, else: id

      case how do
        :shutdown -> :supervisor.terminate_child(parent, child) == :ok
        :kill -> kill_through(parent, child, pid)
      end
    else
      _ -> false
    end
  catch
    :exit, _ -> false
  end

  # terminate_child/2 waits the child's whole shutdown time for a process
  # that cannot take the shutdown, and OTP has no terminate_child with
  # another one. So a helper asks for it, and `pid` is killed once the
  # supervisor is in its shutdown of it: the supervisor monitors the child
  # then, and only then, so a kill seen before it cannot be taken for a
  # crash (restarted and counted).
  defp kill_through(parent, child, pid) do
    {helper, ref} =
      spawn_monitor(fn -> exit({:done, :supervisor.terminate_child(parent, child)}) end)

    if shutting_down?(parent, pid, helper), do: Process.exit(pid, :kill)

    receive do
      {:DOWN, ^ref, :process, _, reason} -> reason == {:done, :ok}
    end
  end

  # Waits until `parent` monitors `pid`: true; false when `pid` is gone or
  # the helper is done first (the supervisor had no such child any more).
  defp shutting_down?(parent, pid, helper) do
    case Process.info(pid, :monitored_by) do
      {:monitored_by, by} ->
        cond do
          parent in by ->
            true

          not Process.alive?(helper) ->
            false

          true ->
            Process.sleep(1)
            shutting_down?(parent, pid, helper)
        end

      nil ->
        false
    end
  end

  ## Telemetry

  @doc "Whether a structure created now with `telemetry: flag` emits events."
  @spec telemetry?(boolean() | nil) :: boolean()
  def telemetry?(flag), do: Larder.Telemetry.enabled?(flag != false)
end
