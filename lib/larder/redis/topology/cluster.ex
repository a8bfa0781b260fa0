# The topology of a Redis Cluster: its manager reads the slot map (CLUSTER
# SLOTS, asked of the known masters and the seeds in turn), keeps one pool
# of command connections per master, and the sharded pub/sub connection
# (SSUBSCRIBE on the master of the channel's slot, followed when that slot
# moves); with tracking, one pub/sub connection per master for its reports.
defmodule Larder.Redis.Topology.Cluster do
  @moduledoc false

  # Contract (internal; the messages are Larder.Redis.Topology's).
  #
  # The manager is the one writer of the slot rows ClusterRouter reads
  # (`{slot, {host, port}}` per served slot) and of `{:manager, pid}`;
  # each master's Larder.Redis.Pool writes its own rows (`{{host, port, i},
  # pid | :none}`). A new map starts the pools of new masters first (their
  # connections open before start_link returns), then writes the slots, so
  # a slot never names a master without a pool; a master gone from the map
  # has its rows deleted at once and its pool stopped :timeout ms later, so
  # that callers already on it get their reply (a MOVED, most likely).
  # `{:bad_replies, n}` counts the CLUSTER SLOTS answers that were not
  # usable (not RESP, an error reply, not a list, naming more than
  # Cluster.max_masters/0 masters, skipped entries, larger than
  # @max_reply_bytes).
  #
  # A refresh blocks the manager (each node within :timeout) and runs at
  # most once per :reconnect_sleep, however many callers hint it (ClusterRouter:
  # one hint on its way at a time); events wait meanwhile. Nothing a node
  # says is trusted: see Larder.Redis.Cluster.
  #
  # A master down (its pool says :node_down: a connection refused, not
  # opened in time, or closed as it opened): the map is read again at once
  # (within that rate) from the other nodes, since a dead master answers no
  # MOVED, and again after a wait that doubles from :reconnect_sleep up to
  # @max_follow_ms while the map still names a master that is down. The
  # pool itself tries one connection per backoff (Larder.Redis.Pool). So a
  # map naming many dead masters costs one connection attempt per master
  # per backoff and one CLUSTER SLOTS per @max_follow_ms.
  #
  # The channel's pub/sub connection: a -sunsubscribe (the slot moved), a
  # new map that gives the slot to another master, an error reply (MOVED),
  # or a lost connection: the subscriber gets :disconnected if it was
  # subscribed, the map is read again, and the connection moves to the
  # slot's master. Tracking: each master's pub/sub connection subscribes to
  # __redis__:invalidate with CLIENT ID; its pool's connections are
  # redirected to it (Tracking), and the subscriber gets :subscribed only
  # while no master refuses tracking.

  use GenServer

  require Logger

  alias Larder.Backoff
  alias Larder.Redis.{Cluster, Pool, PubSub, Socket, Table, Topology, Tracking}

  # The largest CLUSTER SLOTS reply read (16,384 one-slot ranges with a
  # few replicas each fit).
  @max_reply_bytes 4_194_304
  # Of start_link's wait (see Larder.Redis.Topology), what the first map may take.
  @init_budget_ms 4_000
  # The longest wait between two readings of the map while it names a
  # master that is down.
  @max_follow_ms 500
  @sub_max_wait_ms 2_000
  @watch_ms 100
  # The longest a process of the manager takes to stop before it is killed.

  @doc """
  The master of `key`'s slot, from the `CLUSTER SLOTS` of the first of
  `seeds` that answers with a usable map (each within `timeout`):
  `{:ok, {host, port}}` or `{:error, reason}`.
  """
  @spec locate([{String.t(), 1..65_535}], binary(), [[binary()]], pos_integer()) ::
          {:ok, {String.t(), 1..65_535}} | {:error, term()}
  def locate(seeds, key, auth, timeout) do
    slot = Cluster.slot(key)

    Enum.reduce_while(seeds, {:error, :no_seed}, fn seed, acc ->
      case fetch_map(seed, auth, timeout) do
        {:ok, map} ->
          case Cluster.master(map, slot) do
            nil -> {:cont, acc}
            address -> {:halt, {:ok, address}}
          end

        {:error, reason} ->
          {:cont, {:error, reason}}
      end
    end)
  end

  @doc """
  `CLUSTER SLOTS` of `node`, on a connection of its own within `timeout`:
  `{:ok, slot_map}` or `{:error, reason}`, `{:bad, reason}` for an answer
  that is not a usable map (to be counted), `{:auth, text}` for a refused
  handshake, `{:connection_error, reason}`.
  """
  @spec fetch_map({String.t(), 1..65_535}, [[binary()]], pos_integer()) ::
          {:ok, Cluster.slot_map()} | {:error, term()}
  def fetch_map({host, port}, auth, timeout) do
    opts = [timeout: timeout, handshake: auth, max_reply_bytes: @max_reply_bytes]

    case Socket.request(host, port, [["CLUSTER", "SLOTS"]], opts) do
      {:ok, [{:ok, reply}]} ->
        case Cluster.slot_map(reply, host) do
          {:ok, map} -> {:ok, map}
          {:error, reason} -> {:error, {:bad, reason}}
        end

      {:ok, [{:error, error}]} ->
        {:error, {:bad, {:error_reply, error}}}

      {:error, {:handshake, error}} ->
        {:error, {:auth, error}}

      # (the parser bounds each reply to @max_reply_bytes)
      {:error, reason} when reason in [:bad_reply, :reply_too_large] ->
        {:error, {:bad, reason}}

      {:error, reason} ->
        {:error, {:connection_error, reason}}
    end
  end

  @impl true
  def init(%{handle: handle} = args) do
    Process.flag(:trap_exit, true)
    table = handle.table
    first? = Table.put_new(table, {:started, true})
    # A manager that starts again starts from nothing: the rows of the one
    # before (slots, pools of masters that may be gone) are dropped, and
    # callers wait for the new map meanwhile.
    Table.delete_all_but_counters(table)
    Table.put(table, {:manager, self()})
    opts = handle.opts
    sleep = opts[:reconnect_sleep]

    state = %{
      table: table,
      ref: handle.ref,
      opts: opts,
      subscriber: args.subscriber,
      channel: args.channel,
      timeout: handle.timeout,
      pool_size: handle.pool_size,
      seeds: opts[:cluster],
      auth: Socket.handshake(Keyword.take(opts, [:username, :password])),
      backoff: {sleep, max(@sub_max_wait_ms, sleep)},
      map: nil,
      # master => its pool, and back
      pools: %{},
      pool_nodes: %{},
      # masters whose pool says they are down
      down: MapSet.new(),
      last_refresh: nil,
      refresh_timer: nil,
      map_warned: false,
      # the map read again while it names a master that is down:
      # %{backoff, timer} or nil
      follow: nil,
      # the channel's pub/sub connection, the master it is on, and whether
      # it is subscribed
      chan: nil,
      chan_node: nil,
      chan_up: false,
      # tracking: the key prefix, and per master its pub/sub connection
      # (by master, and back) and tracking state
      tracking: args.tracking,
      tsubs: %{},
      tsub_nodes: %{},
      # masters that refuse tracking (no :subscribed while any does)
      untracked: MapSet.new(),
      # the subscriber was told the subscription is refused (no tracking)
      refused: false
    }

    budget = @init_budget_ms + state.pool_size * state.timeout - state.timeout
    state = refresh(state, System.monotonic_time(:millisecond) + max(budget, 1))

    case probe(state, first?) do
      :ok ->
        Process.send_after(self(), :watch, @watch_ms)
        {:ok, start_channel(state)}

      {:refused, props} ->
        stop_all(state)
        {:stop, {:refused, props}}
    end
  end

  # The first start of a topology with a subscription tries, on every
  # master (tracking) or on the channel's, what the subscription needs:
  # a refusal stops the start. A server that does not answer does not.
  defp probe(_state, false), do: :ok
  defp probe(%{channel: nil}, _first?), do: :ok
  defp probe(%{map: nil}, _first?), do: :ok

  defp probe(state, true) do
    chan_master = Cluster.master(state.map, Cluster.slot(state.channel))

    state.map
    |> Cluster.masters()
    |> Enum.filter(&(state.tracking != nil or &1 == chan_master))
    |> Task.async_stream(
      fn {host, port} = node ->
        tracking =
          if state.tracking,
            do: [["SUBSCRIBE", Tracking.channel()]],
            else: []

        subscribe = if node == chan_master, do: [["SSUBSCRIBE", state.channel]], else: []

        result =
          Tracking.probe(
            host,
            port,
            state.auth,
            state.tracking,
            tracking ++ subscribe,
            state.timeout
          )

        {node, result}
      end,
      timeout: state.timeout + 1_000,
      on_timeout: :kill_task,
      max_concurrency: 16
    )
    |> Enum.find_value(:ok, fn
      {:ok, {node, {:refused, command, reply}}} ->
        if refusal?(state, command, reply),
          do: {:refused, refusal(state, node, command, reply)}

      _ok_or_unknown ->
        nil
    end)
  end

  defp refusal?(%{tracking: nil}, command, reply),
    do: command == "SSUBSCRIBE" and String.starts_with?(reply, "NOPERM")

  defp refusal?(_state, _command, _reply), do: true

  defp refusal(state, {host, port}, command, reply) do
    %{
      server: Socket.address(host, port),
      user: state.opts[:username] || "default",
      command: command,
      reply: reply,
      channel: state.channel,
      tracking: state.tracking != nil
    }
  end

  @impl true
  def handle_info({:larder_redis, pid, _ref, kind, props}, state) do
    cond do
      pid == state.chan -> {:noreply, channel_event(kind, props, state)}
      is_map_key(state.pool_nodes, pid) -> {:noreply, pool_event(kind, props, state)}
      is_map_key(state.tsub_nodes, pid) -> {:noreply, tsub_event(kind, props, pid, state)}
      true -> {:noreply, state}
    end
  end

  def handle_info(:refresh, state) do
    # (taken before the refresh: a hint after this one sends again)
    Table.delete(state.table, :refresh_hinted)
    {:noreply, request_refresh(state)}
  end

  def handle_info(:refresh_now, state),
    do: {:noreply, refresh(%{state | refresh_timer: nil}, nil)}

  def handle_info({:follow_down, ref}, %{follow: %{timer: {ref, _}} = follow} = state),
    do: {:noreply, refresh(%{state | follow: %{follow | timer: nil}}, nil)}

  def handle_info({:stop_pool, pid}, state) do
    Process.unlink(pid)
    Pool.stop(pid)
    {:noreply, state}
  end

  def handle_info(:watch, state) do
    Process.send_after(self(), :watch, @watch_ms)
    if Table.get(state.table, :manager) != self(), do: Table.put(state.table, {:manager, self()})
    state = check_tracking(state)
    # no map yet (no node answered): ask again
    {:noreply, if(state.map == nil, do: request_refresh(state), else: state)}
  end

  def handle_info({:EXIT, pid, reason}, state) do
    cond do
      pid == state.chan -> {:stop, {:shutdown, {:pubsub, reason}}, state}
      is_map_key(state.pool_nodes, pid) -> {:stop, {:shutdown, {:pool, reason}}, state}
      is_map_key(state.tsub_nodes, pid) -> {:stop, {:shutdown, {:tracking_pubsub, reason}}, state}
      true -> {:noreply, state}
    end
  end

  def handle_info(_other, state), do: {:noreply, state}

  @impl true
  def terminate(_reason, state), do: stop_all(state)

  # Stops the manager's processes and returns once they are gone (a pool
  # once its connections are).
  defp stop_all(state) do
    pids = [state.chan | Map.keys(state.pool_nodes) ++ Map.keys(state.tsub_nodes)]
    Topology.stop_linked(for pid <- pids, is_pid(pid), do: pid)
  end

  ## The slot map

  defp request_refresh(%{refresh_timer: nil} = state) do
    now = System.monotonic_time(:millisecond)
    sleep = state.opts[:reconnect_sleep]

    case state.last_refresh do
      last when last == nil or now - last >= sleep ->
        refresh(state, nil)

      last ->
        %{state | refresh_timer: Process.send_after(self(), :refresh_now, last + sleep - now)}
    end
  end

  defp request_refresh(state), do: state

  # Asks the known masters, then the seeds, in turn (each within :timeout,
  # all before `deadline` when there is one) for CLUSTER SLOTS, and uses
  # the first usable answer; masters that are down are asked last.
  defp refresh(state, deadline) do
    known = if state.map, do: Cluster.masters(state.map), else: []
    {down, up} = Enum.split_with(Enum.uniq(known ++ state.seeds), &MapSet.member?(state.down, &1))

    result =
      Enum.reduce_while(up ++ down, {:error, :no_node}, fn node, acc ->
        if deadline && System.monotonic_time(:millisecond) >= deadline do
          {:halt, acc}
        else
          case fetch_map(node, state.auth, state.timeout) do
            {:ok, %{bad: bad} = map} ->
              if bad > 0, do: Table.count(state.table, :bad_replies, bad)

              if Cluster.masters(map) == [],
                do: {:cont, {:error, {node, :empty_map}}},
                else: {:halt, {:ok, map}}

            {:error, {:bad, reason}} ->
              Table.count(state.table, :bad_replies, 1)
              {:cont, {:error, {node, {:bad, reason}}}}

            {:error, reason} ->
              {:cont, {:error, {node, reason}}}
          end
        end
      end)

    state = %{state | last_refresh: System.monotonic_time(:millisecond)}

    state =
      case result do
        {:ok, map} ->
          state |> apply_map(map) |> Map.put(:map_warned, false) |> follow_channel()

        {:error, reason} ->
          unless state.map_warned do
            Logger.warning(
              "Larder.Redis: no usable CLUSTER SLOTS from any node of the cluster " <>
                "(seeds #{addresses(state.seeds)}#{known_masters(known)}): " <>
                "#{describe_map_error(reason)}; asking again every " <>
                "#{state.opts[:reconnect_sleep]} ms while it is needed"
            )
          end

          %{state | map_warned: true}
      end

    follow_down(state)
  end

  defp addresses(nodes), do: Enum.map_join(nodes, ", ", fn {h, p} -> Socket.address(h, p) end)

  defp known_masters([]), do: ""
  defp known_masters(known), do: "; known masters #{addresses(known)}"

  defp describe_map_error({{host, port}, reason}),
    do: "the last asked, #{Socket.address(host, port)}, #{describe_map_reason(reason)}"

  defp describe_map_error(reason), do: inspect(reason, limit: 10)

  defp describe_map_reason(:empty_map), do: "serves no slot"
  defp describe_map_reason({:auth, text}), do: "refused the handshake: #{text}"
  defp describe_map_reason({:connection_error, reason}), do: "failed: #{Socket.describe(reason)}"

  defp describe_map_reason({:bad, reason}),
    do: "answered with no usable map (#{inspect(reason, limit: 10, printable_limit: 100)})"

  # While the map names a master that is down, it is read again after a
  # wait doubling from :reconnect_sleep up to @max_follow_ms; once it names
  # none, the wait starts over.
  defp follow_down(%{follow: follow} = state) do
    down? =
      state.map != nil and Enum.any?(Cluster.masters(state.map), &MapSet.member?(state.down, &1))

    cond do
      not down? ->
        if follow && follow.timer, do: Process.cancel_timer(elem(follow.timer, 1))
        %{state | follow: nil}

      follow && follow.timer ->
        state

      true ->
        sleep = state.opts[:reconnect_sleep]

        backoff =
          if follow, do: follow.backoff, else: Backoff.new(sleep, max(@max_follow_ms, sleep))

        {wait, backoff} = Backoff.wait(backoff)
        ref = make_ref()
        timer = Process.send_after(self(), {:follow_down, ref}, wait)
        %{state | follow: %{backoff: backoff, timer: {ref, timer}}}
    end
  end

  # The same map again (read while a master is down): nothing to do.
  defp apply_map(%{map: %{slots: slots, masters: masters}} = state, %{
         slots: slots,
         masters: masters
       }),
       do: state

  # Pools first (started for new masters, retired for masters gone), then
  # the slots whose master changed.
  defp apply_map(state, map) do
    masters = MapSet.new(Cluster.masters(map))
    known = MapSet.new(Map.keys(state.pools))
    gone = MapSet.difference(known, masters)
    state = Enum.reduce(gone, state, &retire_pool(&2, &1))
    state = Enum.reduce(MapSet.difference(masters, known), state, &start_pool(&2, &1))

    {inserts, deletes} =
      Enum.reduce(0..(Cluster.slots() - 1), {[], []}, fn slot, {ins, del} ->
        old = state.map && Cluster.master(state.map, slot)

        case Cluster.master(map, slot) do
          ^old -> {ins, del}
          nil -> {ins, [slot | del]}
          node -> {[{slot, node} | ins], del}
        end
      end)

    Table.put(state.table, inserts)
    Enum.each(deletes, &Table.delete(state.table, &1))
    %{state | map: map}
  end

  defp start_pool(state, {host, port} = node) do
    {:ok, pool} =
      Pool.start_link(
        owner: self(),
        ref: state.ref,
        table: state.table,
        node: node,
        keys: for(i <- 0..(state.pool_size - 1), do: {host, port, i}),
        connection: [
          timeout: state.timeout,
          database: 0,
          auth: state.auth,
          max_reply_bytes: state.opts[:max_reply_bytes]
        ],
        backoff: state.backoff
      )

    state = %{
      state
      | pools: Map.put(state.pools, node, pool),
        pool_nodes: Map.put(state.pool_nodes, pool, node)
    }

    if state.tracking, do: start_tsub(state, node), else: state
  end

  # A master gone from the map (a replica now, or removed): callers no
  # longer find its pool, and those already on it finish (a MOVED, most
  # likely) before its connections are stopped, :timeout ms later.
  defp retire_pool(state, node) do
    {pool, pools} = Map.pop(state.pools, node)
    :ok = Pool.retire(pool)
    Process.send_after(self(), {:stop_pool, pool}, state.timeout)

    state = %{
      state
      | pools: pools,
        pool_nodes: Map.delete(state.pool_nodes, pool),
        down: MapSet.delete(state.down, node)
    }

    stop_tsub(state, node)
  end

  defp pool_event(:node_down, %{node: node}, state) do
    state = %{state | down: MapSet.put(state.down, node)}
    follow_down(request_refresh(state))
  end

  defp pool_event(:node_up, %{node: node}, state),
    do: follow_down(%{state | down: MapSet.delete(state.down, node)})

  defp pool_event(_kind, _props, state), do: state

  ## The channel's sharded pub/sub connection

  defp start_channel(%{channel: nil} = state), do: state

  defp start_channel(state) do
    node = channel_master(state)

    {:ok, chan} =
      PubSub.start_link(
        owner: self(),
        ref: state.ref,
        node: node,
        auth: state.auth,
        command: "SSUBSCRIBE",
        channels: [state.channel],
        timeout: state.timeout,
        max_message_bytes: state.opts[:max_message_bytes],
        backoff: state.backoff,
        label: "the pub/sub connection of channel #{inspect(state.channel)}"
      )

    %{state | chan: chan, chan_node: node}
  end

  defp channel_master(%{map: nil}), do: nil
  defp channel_master(state), do: Cluster.master(state.map, Cluster.slot(state.channel))

  defp channel_event(:subscribed, _props, state) do
    state = %{state | chan_up: true, refused: false}
    # (held back while a master refuses tracking: the subscriber keeps
    # nothing until all track)
    if MapSet.size(state.untracked) == 0, do: tell(state, :subscribed, %{})
    state
  end

  defp channel_event(:message, %{channel: channel, payload: payload}, state) do
    if channel == state.channel and is_binary(payload),
      do: tell(state, :message, %{channel: channel, payload: payload})

    state
  end

  # The slot may have moved (an error reply is likely MOVED: the map is
  # stale): the map first (at most once per :reconnect_sleep), then the
  # connection follows the slot's master.
  defp channel_event(:disconnected, %{reason: reason}, state) do
    tell(state, :disconnected, %{reason: reason})
    state = follow_channel(request_refresh(%{state | chan_up: false}))
    # the slot moved: connect again now (to its master as the map has it)
    if reason == :slot_moved, do: PubSub.move(state.chan, state.chan_node)
    state
  end

  defp channel_event(:failed, %{reason: reason}, state) do
    state =
      case reason do
        {:refused, command, reply} -> channel_refused(state, command, reply)
        _other -> state
      end

    follow_channel(request_refresh(state))
  end

  defp channel_refused(%{refused: true} = state, _command, _reply), do: state

  defp channel_refused(state, command, reply) do
    if state.tracking == nil and refusal?(state, command, reply) do
      tell(state, :refused, refusal(state, state.chan_node, command, reply))
      %{state | refused: true}
    else
      state
    end
  end

  # After a new map: a subscription on a master that no longer serves the
  # channel's slot hears nothing more; it moves.
  defp follow_channel(%{chan: nil} = state), do: state

  defp follow_channel(state) do
    case channel_master(state) do
      node when node == state.chan_node -> state
      node -> move_channel(state, node)
    end
  end

  defp move_channel(state, node) do
    if state.chan_up, do: tell(state, :disconnected, %{reason: :slot_moved})
    PubSub.move(state.chan, node)
    %{state | chan_node: node, chan_up: false}
  end

  ## Tracking, per master: a pub/sub connection that sends CLIENT ID and
  ## subscribes to __redis__:invalidate; once it is subscribed, every
  ## connection of that master's pool runs CLIENT TRACKING on REDIRECT <its
  ## id> BCAST PREFIX <prefix> (see Tracking), then the subscriber gets
  ## :subscribed. A lost connection is :disconnected; a connection that
  ## replaced one that ended gets its tracking back within @watch_ms
  ## (:subscribed when none of the master's kept it meanwhile).

  defp start_tsub(state, {host, port} = node) do
    {:ok, pid} =
      PubSub.start_link(
        owner: self(),
        ref: state.ref,
        node: node,
        auth: state.auth,
        client_id: true,
        channels: [Tracking.channel()],
        timeout: state.timeout,
        max_message_bytes: state.opts[:max_message_bytes],
        backoff: state.backoff,
        label: "the tracking connection of #{Socket.address(host, port)}"
      )

    tsub = %{pid: pid, tracking: Tracking.new(state.tracking), up: false}

    %{
      state
      | tsubs: Map.put(state.tsubs, node, tsub),
        tsub_nodes: Map.put(state.tsub_nodes, pid, node)
    }
  end

  defp stop_tsub(state, node) do
    # a master gone from the map no longer holds the subscriber back
    state = if MapSet.member?(state.untracked, node), do: node_tracks(state, node), else: state

    case Map.pop(state.tsubs, node) do
      {%{pid: pid}, tsubs} ->
        Process.unlink(pid)
        Process.exit(pid, :shutdown)
        %{state | tsubs: tsubs, tsub_nodes: Map.delete(state.tsub_nodes, pid)}

      {nil, _tsubs} ->
        state
    end
  end

  defp tsub_event(:subscribed, %{client_id: id}, pid, state) do
    node = Map.fetch!(state.tsub_nodes, pid)
    tsub = state.tsubs[node]

    {tracking, status} =
      Tracking.enable_all(tsub.tracking, id, node_clients(state, node), state.timeout)

    state = put_in(state.tsubs[node], %{tsub | tracking: tracking, up: true})

    case status do
      :on -> node_tracks(state, node)
      {:refused, reply} -> node_refused(state, node, "CLIENT TRACKING", reply)
      :off -> state
    end
  end

  defp tsub_event(:message, %{payload: payload}, _pid, state) do
    tell(state, :invalidated, %{keys: Tracking.keys(payload)})
    state
  end

  defp tsub_event(:disconnected, %{reason: reason}, pid, state) do
    node = Map.fetch!(state.tsub_nodes, pid)
    tell(state, :disconnected, %{reason: reason})
    put_in(state.tsubs[node].up, false)
  end

  defp tsub_event(:failed, %{reason: {:refused, command, reply}}, pid, state),
    do: node_refused(state, Map.fetch!(state.tsub_nodes, pid), command, reply)

  defp tsub_event(_kind, _props, _pid, state), do: state

  # A master's tracking is on (again): :subscribed, unless another master
  # still refuses it.
  defp node_tracks(state, node) do
    untracked = MapSet.delete(state.untracked, node)
    state = %{state | untracked: untracked}
    if MapSet.size(untracked) == 0, do: tell(state, :subscribed, %{})
    state
  end

  # A master refuses tracking: the subscriber is told (once per master,
  # until its tracking is on again).
  defp node_refused(state, node, command, reply) do
    if MapSet.member?(state.untracked, node) do
      state
    else
      tell(state, :refused, refusal(state, node, command, reply))
      %{state | untracked: MapSet.put(state.untracked, node)}
    end
  end

  defp node_clients(state, {host, port}),
    do: Pool.clients(state.table, for(i <- 0..(state.pool_size - 1), do: {host, port, i}))

  defp check_tracking(%{tracking: nil} = state), do: state

  defp check_tracking(state) do
    Enum.reduce(state.tsubs, state, fn
      {node, %{up: true, tracking: tracking} = tsub}, state ->
        {tracking, event} = Tracking.check(tracking, node_clients(state, node), state.timeout)
        state = put_in(state.tsubs[node], %{tsub | tracking: tracking})

        case event do
          :up -> node_tracks(state, node)
          {:refused, reply} -> node_refused(state, node, "CLIENT TRACKING", reply)
          nil -> state
        end

      _, state ->
        state
    end)
  end

  defp tell(state, kind, props) do
    send(state.subscriber, {:larder_redis, self(), state.ref, kind, props})
    :ok
  end
end
