# The command connections of the Redis client to one node: a process that
# keeps :pool_size Larder.Redis.Connection processes to it, publishes their
# pids in its topology's table (where callers pick one), and replaces one
# that ended, with the one backoff (Larder.Backoff). A node that refuses
# connections, or closes them as they open, costs one attempt per backoff,
# not one per connection. It never exits because of the node.
defmodule Larder.Redis.Pool do
  @moduledoc false

  # Contract (internal).
  #
  # start_link/1 options:
  #
  #   :owner      the pid that gets the events (required; the pool stops
  #               when it goes)
  #   :ref        a term put in every event
  #   :table      the topology's table (Larder.Redis.Table)
  #   :node       {host, port}, or nil: no connection until move/2
  #   :keys       the table key of each connection (one per connection:
  #               the slots 0..n-1 on one server, {host, port, i} on a
  #               cluster)
  #   :connection Larder.Redis.Connection.start_link/3's options
  #   :backoff    {min, max} ms
  #
  # Rows: `{key, pid}` for a connection that is up, `{key, :none}` while
  # it is replaced (callers then fail at once). Every @watch_ms the pool
  # writes its rows again, so that a pool that was replaced and is still
  # stopping beside this one leaves its pids there for that long at most.
  # retire/1 deletes them and stops the writing.
  #
  # The connections are opened in start_link/1 and move/2 (each within the
  # connection's :timeout), so that the first calls find them up when the
  # node is; once one of them could not be opened, the rest wait for it.
  #
  # A connection that ends (Connection exits on any failure) is counted in
  # the table's :ended_connections, its row is :none and it is opened again
  # after the backoff's min: the first end is one warning naming the node
  # and the reason, and further ends at most one line per @end_log_ms
  # saying how many. The node is down when a connection cannot be opened,
  # or when one fails within @young_ms of its start (a node that accepts
  # and closes): then one connection is tried after each wait of the
  # backoff (doubling from its min, jittered), and the others are opened
  # once it connects; after a young end the backoff goes on from where the
  # last one left it, unless that was @young_forget_ms ago. The owner gets
  # `{:larder_redis, pool, ref, :node_down, %{node, reason}}` when the node
  # goes down and `:node_up` (%{node}) when a connection opens again.

  use GenServer

  require Logger

  alias Larder.Backoff
  alias Larder.Redis.{Connection, Socket, Table}

  @watch_ms 100
  @end_log_ms 30_000
  @young_ms 1_000
  @young_forget_ms 10_000

  @doc "Starts the pool, linked to the caller; its connections are opened before it returns."
  @spec start_link(keyword()) :: GenServer.on_start()
  def start_link(opts), do: GenServer.start_link(__MODULE__, opts, timeout: :infinity)

  @doc """
  Moves every connection to `node` (nil: none, every row `:none`): the
  connections to the old node are closed at once, the new ones opened
  before this returns.
  """
  @spec move(pid(), {String.t(), 1..65_535} | nil) :: :ok
  def move(pool, node), do: GenServer.call(pool, {:move, node}, :infinity)

  @doc "Deletes the pool's rows and opens nothing more; stop/1 follows."
  @spec retire(pid()) :: :ok
  def retire(pool), do: GenServer.call(pool, :retire, :infinity)

  @doc "Stops the pool and its connections."
  @spec stop(pid()) :: :ok
  def stop(pool), do: GenServer.stop(pool, :normal, :infinity)

  @doc """
  The connections of `keys` that are up, as the table has them: a map of
  pid to key. Reads the table; no call to the pool.
  """
  @spec clients(:ets.tid(), [term()]) :: %{pid() => term()}
  def clients(table, keys) do
    for key <- keys, pid = Table.get(table, key), is_pid(pid), into: %{}, do: {pid, key}
  end

  @impl true
  def init(opts) do
    Process.flag(:trap_exit, true)
    owner = Keyword.fetch!(opts, :owner)
    Process.monitor(owner)
    {min, max} = Keyword.fetch!(opts, :backoff)

    state = %{
      owner: owner,
      ref: Keyword.get(opts, :ref),
      table: Keyword.fetch!(opts, :table),
      node: Keyword.get(opts, :node),
      keys: Keyword.fetch!(opts, :keys),
      conn: Keyword.fetch!(opts, :connection),
      min: min,
      max: max,
      # pid => key, and when each was started (monotonic ms)
      clients: %{},
      born: %{},
      # keys waiting for their retry (each a timer)
      retries: %{},
      # nil, or the node is down: %{backoff, timer, pending: keys}
      down: nil,
      # after a young end: {the backoff the next down starts from, when}
      young: nil,
      end_log: %{at: nil, quiet: 0},
      retired: false
    }

    for key <- state.keys, do: Table.put(state.table, {key, :none})
    Process.send_after(self(), :watch, @watch_ms)
    {:ok, open_all(state)}
  end

  @impl true
  def handle_call({:move, node}, _from, state) do
    state = close_all(state)
    {:reply, :ok, open_all(%{state | node: node, young: nil})}
  end

  def handle_call(:retire, _from, state) do
    state = cancel_down(state)
    for key <- state.keys, do: Table.delete(state.table, key)
    {:reply, :ok, %{state | retired: true, retries: %{}}}
  end

  @impl true
  def handle_info({:EXIT, pid, reason}, %{clients: clients} = state)
      when is_map_key(clients, pid),
      do: {:noreply, ended(state, pid, reason)}

  def handle_info({:retry, key, ref}, %{retries: retries} = state) do
    case retries do
      %{^key => ^ref} -> {:noreply, open(%{state | retries: Map.delete(retries, key)}, key)}
      _ -> {:noreply, state}
    end
  end

  def handle_info({:node_retry, ref}, %{down: %{timer: {ref, _}}} = state),
    do: {:noreply, node_retry(state)}

  def handle_info(:watch, state) do
    Process.send_after(self(), :watch, @watch_ms)
    {:noreply, state |> write_rows() |> end_summary()}
  end

  def handle_info({:DOWN, _, :process, owner, _reason}, %{owner: owner} = state),
    do: {:stop, :normal, state}

  # (the owner's exit, as the pool's parent, is GenServer's; a connection
  # that failed to start has already answered connect/2)
  def handle_info(_other, state), do: {:noreply, state}

  @impl true
  def terminate(_reason, state) do
    for pid <- Map.keys(state.clients), do: stop_client(pid)
    :ok
  end

  ## Opening

  defp open_all(%{node: nil} = state), do: state
  defp open_all(state), do: Enum.reduce(state.keys, state, &open(&2, &1))

  # Opens `key`'s connection, unless the node is down (then it waits for
  # the node's retry) or nothing is to be opened.
  defp open(%{retired: true} = state, _key), do: state
  defp open(%{node: nil} = state, _key), do: state

  defp open(%{down: %{pending: pending} = down} = state, key),
    do: %{state | down: %{down | pending: MapSet.put(pending, key)}}

  defp open(state, key) do
    if Enum.any?(state.clients, fn {_pid, k} -> k == key end) do
      state
    else
      case connect(state, key) do
        {:ok, state} -> state
        {:error, reason} -> node_down(state, key, reason, nil)
      end
    end
  end

  defp connect(%{node: {host, port}} = state, key) do
    case Connection.start_link(String.to_charlist(host), port, state.conn) do
      {:ok, pid} ->
        Table.put(state.table, {key, pid})
        born = Map.put(state.born, pid, System.monotonic_time(:millisecond))
        {:ok, %{state | clients: Map.put(state.clients, pid, key), born: born}}

      {:error, {:shutdown, reason}} ->
        {:error, reason}

      {:error, reason} ->
        {:error, reason}
    end
  end

  defp close_all(state) do
    for pid <- Map.keys(state.clients), do: stop_client(pid)
    for key <- state.keys, do: Table.put(state.table, {key, :none})
    %{cancel_down(state) | clients: %{}, born: %{}, retries: %{}}
  end

  defp stop_client(pid) do
    Process.unlink(pid)
    Process.exit(pid, :kill)
  end

  ## A connection that ended

  defp ended(%{retired: true} = state, pid, _reason),
    do: %{state | clients: Map.delete(state.clients, pid), born: Map.delete(state.born, pid)}

  defp ended(state, pid, reason) do
    {key, clients} = Map.pop(state.clients, pid)
    {born, born_map} = Map.pop(state.born, pid)
    Table.put(state.table, {key, :none})
    Table.count(state.table, :ended_connections, 1)
    now = System.monotonic_time(:millisecond)
    state = log_end(%{state | clients: clients, born: born_map}, key, reason, now)

    # A connection the node closed soon after it opened: the node is down
    # as if it had refused it (a kill by someone else is not the node's).
    case reason do
      {:shutdown, why} when born != nil and now - born < @young_ms ->
        node_down(state, key, why, now)

      _ ->
        schedule_retry(state, key)
    end
  end

  defp schedule_retry(state, key) do
    ref = make_ref()
    Process.send_after(self(), {:retry, key, ref}, state.min)
    %{state | retries: Map.put(state.retries, key, ref)}
  end

  ## The node down: one attempt per backoff (see the contract)

  # `young_at`: when the connection that ended young ended (nil: one that
  # could not be opened).
  defp node_down(%{down: %{pending: pending} = down} = state, key, _reason, _young_at),
    do: %{state | down: %{down | pending: MapSet.put(pending, key)}}

  defp node_down(state, key, reason, young_at) do
    now = System.monotonic_time(:millisecond)

    backoff =
      case state.young do
        {backoff, at} when now - at < @young_forget_ms -> backoff
        _ -> Backoff.new(state.min, state.max)
      end

    state =
      if young_at do
        {_wait, next} = Backoff.wait(backoff)
        %{state | young: {next, now}}
      else
        state
      end

    event(state, :node_down, %{node: state.node, reason: reason})

    schedule_node_retry(%{
      state
      | down: %{backoff: backoff, timer: nil, pending: MapSet.new([key])}
    })
  end

  defp schedule_node_retry(%{down: down} = state) do
    {wait, backoff} = Backoff.wait(down.backoff)
    ref = make_ref()
    timer = Process.send_after(self(), {:node_retry, ref}, wait)
    %{state | down: %{down | backoff: backoff, timer: {ref, timer}}}
  end

  # One pending key is tried; once it connects, the others are opened;
  # else the next wait.
  defp node_retry(%{down: %{pending: pending}} = state) do
    [key | rest] = MapSet.to_list(pending)

    case connect(state, key) do
      {:ok, state} ->
        state = %{state | down: nil}
        event(state, :node_up, %{node: state.node})
        Enum.reduce(rest, state, &open(&2, &1))

      {:error, _reason} ->
        schedule_node_retry(state)
    end
  end

  defp cancel_down(%{down: %{timer: {_ref, timer}}} = state) do
    Process.cancel_timer(timer)
    %{state | down: nil}
  end

  defp cancel_down(state), do: %{state | down: nil}

  ## Rows and logs

  defp write_rows(%{retired: true} = state), do: state

  defp write_rows(state) do
    up = Map.new(state.clients, fn {pid, key} -> {key, pid} end)

    for key <- state.keys do
      row = {key, Map.get(up, key, :none)}
      if Table.get(state.table, key, :gone) != elem(row, 1), do: Table.put(state.table, row)
    end

    state
  end

  defp log_end(%{end_log: %{at: at, quiet: quiet}} = state, _key, _reason, now)
       when at != nil and now - at < @end_log_ms,
       do: %{state | end_log: %{at: at, quiet: quiet + 1}}

  defp log_end(state, key, reason, now) do
    Logger.warning(
      "Larder.Redis: command connection #{describe_key(key)} to #{address(state)} ended " <>
        "(#{describe(reason)}); opening it again in #{state.min} ms " <>
        "(further ends are counted and logged at most once per #{div(@end_log_ms, 1000)} s)"
    )

    %{state | end_log: %{at: now, quiet: 0}}
  end

  # Ends that were counted but not logged, once their window is over.
  defp end_summary(%{end_log: %{at: at, quiet: quiet}} = state) when quiet > 0 do
    now = System.monotonic_time(:millisecond)

    if now - at >= @end_log_ms do
      Logger.warning(
        "Larder.Redis: #{quiet} more command connections to #{address(state)} ended " <>
          "in the last #{div(now - at, 1000)} s"
      )

      %{state | end_log: %{at: now, quiet: 0}}
    else
      state
    end
  end

  defp end_summary(state), do: state

  defp describe({:shutdown, reason}), do: Socket.describe(reason)
  defp describe(:killed), do: "killed"
  defp describe(reason), do: inspect(reason, limit: 10, printable_limit: 200)

  defp describe_key({_host, _port, i}), do: "#{i}"
  defp describe_key(slot), do: "#{inspect(slot)}"

  defp address(%{node: {host, port}}), do: Socket.address(host, port)
  defp address(%{node: nil}), do: "(no node)"

  defp event(state, kind, props) do
    send(state.owner, {:larder_redis, self(), state.ref, kind, props})
    :ok
  end
end
