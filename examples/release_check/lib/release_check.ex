defmodule ReleaseCheck.Application do
  @moduledoc false
  use Application

  @impl true
  def start(_type, _args) do
    Supervisor.start_link([], strategy: :one_for_one, name: ReleaseCheck.Supervisor)
  end
end

defmodule ReleaseCheck do
  @moduledoc """
  What the release test evaluates in the booted release (`bin/release_check
  eval` or `rpc`): Larder's NIF loads and each capability answers.
  """

  @doc """
  Starts the application and everything it needs (what `bin/release_check
  start` does), then uses a Bag, a Register and a Table (the NIF); returns
  `:ok`.
  """
  @spec check() :: :ok
  def check do
    {:ok, _} = Application.ensure_all_started(:release_check)
    bag = Larder.Bag.new()
    Larder.Bag.insert(bag, :fruit, "apple")
    ["apple"] = Larder.Bag.lookup(bag, :fruit)

    register = Larder.Register.new()
    Larder.Register.put(register, :hits, 1)
    1 = Larder.Register.get(register, :hits)

    table = Larder.Table.new(key: :id, index: [:color])
    :ok = Larder.Table.insert_many(table, [%{id: 1, color: :red}, %{id: 2, color: :blue}])
    [%{id: 1}] = Larder.Table.search(table, color: :red)
    :ok
  end

  @doc """
  Starts a `Larder.Cache` over Redis at `port` and round-trips a value
  through it; returns `:ok` or the error `start_link/1` returned.
  """
  @spec check_redis(:inet.port_number()) :: :ok | {:error, term()}
  def check_redis(port) do
    {:ok, _} = Application.ensure_all_started(:release_check)
    # A cache that does not start exits its (linked) caller too.
    Process.flag(:trap_exit, true)

    case Larder.Cache.start_link(name: :release_check, l2: {Larder.Cache.Redis, port: port}) do
      {:ok, _pid} ->
        :ok = Larder.Cache.put(:release_check, :k, "v")
        {:ok, "v"} = Larder.Cache.fetch(:release_check, :k, fn -> :unused end)
        :ok

      {:error, _} = error ->
        error
    end
  end
end
