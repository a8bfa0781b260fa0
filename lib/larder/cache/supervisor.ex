# The process tree of one cache: its owner (the ETS tables, the generation,
# invalidations, repairs, the sweep), the L2's processes (through
# Larder.Cache.L2Runner) and the expiry clock. Larder.Cache's moduledoc
# ("Processes") states the contract.
defmodule Larder.Cache.Supervisor do
  @moduledoc false

  @behaviour :supervisor

  alias Larder.Cache.{Expiry, L2Runner, Owner}
  alias Larder.Instance

  # The runner and the clock die only when killed (or by a bug): a few
  # restarts in a row are fine, a loop is a bug that stops the cache.
  @max_restarts 5
  @max_seconds 5

  @doc """
  Starts the tree: `{:ok, supervisor}`, or `{:error, reason}` with the
  reason of the child that did not start (the owner's or the L2 runner's
  `%Larder.Error{}`, or `{:already_started, pid}` for a taken name).

  A child that fails never takes its caller down. A supervisor whose
  children fail in its `init/1` exits with `{:shutdown,
  {:failed_to_start_child, ...}}`, an exit signal that kills a linked
  caller that does not trap exits; so the supervisor starts empty and its
  children are added here, in order, with `:supervisor.start_child/2`,
  which answers an error instead. On an error the half-built tree is
  unlinked and stopped before this returns, so nothing of it is left and
  no exit signal or message reaches the caller.
  """
  def start_link(opts) do
    with {:ok, sup} <- :supervisor.start_link(__MODULE__, opts) do
      start_children(sup, children(opts[:name], opts))
    end
  end

  defp start_children(sup, []), do: {:ok, sup}

  defp start_children(sup, [child | rest]) do
    case :supervisor.start_child(sup, child) do
      {:ok, _pid_or_undefined} ->
        start_children(sup, rest)

      # start_child/2 gives the child's own error with the child's record
      {:error, {reason, _child}} ->
        Process.unlink(sup)
        stop_tree(sup)
        {:error, reason}
    end
  end

  # Stops the half-built tree and returns once each of its processes is
  # gone. A child whose init failed has answered the supervisor before it
  # exits (OTP 25's gen_server and gen acknowledge, then exit): it may
  # still run, linked to the supervisor, which does not count it as a
  # child. So every process linked to the supervisor is watched, and its
  # end awaited (and its :DOWN taken) after the supervisor's stop.
  defp stop_tree(sup) do
    links =
      case Process.info(sup, :links) do
        {:links, links} -> links
        # already gone (it took its children with it)
        nil -> []
      end

    refs = for pid <- links, is_pid(pid), pid != self(), do: Process.monitor(pid)
    :ok = :proc_lib.stop(sup, :shutdown, :infinity)
    for ref <- refs, do: receive(do: ({:DOWN, ^ref, :process, _, _} -> :ok))
    :ok
  end

  @impl true
  def init(_opts) do
    flags = %{
      strategy: :rest_for_one,
      intensity: @max_restarts,
      period: @max_seconds,
      # the owner's exit, whatever its reason, ends the cache
      auto_shutdown: :any_significant
    }

    # the children come from start_link/1, one at a time
    {:ok, {flags, []}}
  end

  defp children(name, opts) do
    [
      %{
        id: :owner,
        start: {Owner, :start_link, [opts]},
        restart: :temporary,
        significant: true,
        shutdown: 5_000
      },
      %{id: :l2, start: {L2Runner, :start_link, [name]}, shutdown: :infinity},
      %{id: :clock, start: {Expiry, :start_clock, [name]}, shutdown: :brutal_kill}
    ]
  end

  @doc """
  Drops the cache whose supervisor, or owner (the process registered under
  its name), is `pid`, and returns once the supervisor is gone
  (`Larder.Instance.terminate/2`). Under a
  supervisor (a `Supervisor` or a `DynamicSupervisor`) the cache's child is
  terminated through it (`terminate_child`), so it is not restarted and
  stays dropped; otherwise the supervisor is stopped with reason `:normal`,
  so a linked caller that does not trap exits lives on. Either way the
  clock, the L2's processes and then the owner stop, and the owner's tables
  go with it. A pid that is neither (any more) is taken as a cache already
  dropped.
  """
  @spec drop(pid()) :: :ok
  def drop(pid) do
    case tree(pid) do
      sup when is_pid(sup) and sup != self() -> Instance.terminate(sup, :shutdown)
      _none -> :ok
    end
  end

  # The supervisor of the cache that `pid` is the owner or the supervisor
  # of, or nil: told by what the owners registered (their claim of the
  # cache's name), and the owner's parent, its supervisor.
  defp tree(pid) do
    cond do
      node(pid) != node() -> nil
      Instance.holds?(Larder.Cache, pid) -> parent(pid)
      Enum.any?(Instance.holders(Larder.Cache), &(parent(&1) == pid)) -> pid
      true -> nil
    end
  end

  defp parent(pid) do
    case Process.info(pid, :parent) do
      {:parent, parent} when is_pid(parent) -> parent
      _ -> nil
    end
  end

  @doc """
  The pid of a cache's child (`:owner`, `:l2`, `:clock`), or nil: by its
  child id in the cache's supervisor, the parent of the owner registered
  under the cache's name.
  """
  def child(cache, id) do
    with owner when is_pid(owner) <- Process.whereis(cache),
         true <- Instance.holds?(Larder.Cache, owner),
         sup when is_pid(sup) <- parent(owner),
         {^id, pid, _, _} <- List.keyfind(:supervisor.which_children(sup), id, 0),
         true <- is_pid(pid) do
      pid
    else
      _ -> nil
    end
  end
end
