# The process tree of one cache: its owner (the ETS tables, the generation,
# invalidations, repairs, the sweep), the L2's processes (through
# Larder.Cache.L2Runner) and the expiry clock. Larder.Cache's moduledoc
# ("Processes") states the contract.
defmodule Larder.Cache.Supervisor do
  @moduledoc false

  @behaviour :supervisor

  alias Larder.Cache.{Expiry, L2Runner, Owner}

  # The runner and the clock die only when killed (or by a bug): a few
  # restarts in a row are fine, a loop is a bug that stops the cache.
  @max_restarts 5
  @max_seconds 5

  @doc """
  Starts the tree: `{:ok, supervisor}`, or `{:error, reason}` with the
  reason of the child that did not start (the owner's or the L2 runner's
  `%Larder.Error{}`, or `{:already_started, pid}` for a taken name).
  """
  def start_link(opts) do
    case :supervisor.start_link(__MODULE__, opts) do
      {:error, {:shutdown, {:failed_to_start_child, _id, reason}}} -> {:error, reason}
      other -> other
    end
  end

  @impl true
  def init(opts) do
    name = opts[:name]

    flags = %{
      strategy: :rest_for_one,
      intensity: @max_restarts,
      period: @max_seconds,
      # the owner's exit, whatever its reason, ends the cache
      auto_shutdown: :any_significant
    }

    children = [
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

    {:ok, {flags, children}}
  end

  @doc "The pid of a cache's child (`:owner`, `:l2`, `:clock`), or nil."
  def child(cache, id) do
    with owner when is_pid(owner) <- Process.whereis(cache),
         {:dictionary, dict} <- Process.info(owner, :dictionary),
         [sup | _] when is_pid(sup) <- Keyword.get(dict, :"$ancestors"),
         {^id, pid, _, _} <- List.keyfind(:supervisor.which_children(sup), id, 0),
         true <- is_pid(pid) do
      pid
    else
      _ -> nil
    end
  end
end
