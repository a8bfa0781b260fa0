# The topology of one Redis server: the one at :host and :port, or the
# master a Sentinel set names. Its manager holds the pool of command
# connections to that master and the pub/sub connection there (with
# tracking, it redirects the pool's connections to it), and with Sentinel
# finds the master, hears every sentinel, stops writing to a master being
# replaced and moves to the new one.
defmodule Larder.Redis.Topology.Server do
  @moduledoc false

  # Contract (internal; the messages are Larder.Redis.Topology's).
  #
  # Processes, linked to the manager (a GenServer that traps exits): one
  # Larder.Redis.Pool (rows 0..:pool_size-1 of the table), one
  # Larder.Redis.PubSub on the channel (with tracking: CLIENT ID, and
  # __redis__:invalidate too), and with Sentinel one PubSub per sentinel on
  # Sentinel.channels/0. Each reconnects on its own; the manager only tells
  # them where (Pool.move/2, PubSub.move/2). One that exits stops the
  # manager ({:shutdown, {role, reason}}).
  #
  # Tracking: once the subscription is up, every command connection is
  # redirected to its client id (Tracking.enable_all/4) before the
  # subscriber gets :subscribed, which is held back while none tracks;
  # every @watch_ms a connection that replaced one that ended is redirected
  # too (Tracking.check/3), and :subscribed is sent again when none had
  # kept it meanwhile.
  #
  # Sentinel: the manager finds the master at start (each sentinel asked
  # within :timeout, in turn), and asks again on a +switch-master for its
  # master (the announcing sentinel first), on a caller's hint (READONLY or
  # a lost connection: Topology.query/2), when the pub/sub connection or
  # the pool's node fails, at most once per :reconnect_sleep, and every
  # @watch_ms while it knows no master or is parked. A master other than
  # the one in use moves the pool there (its connections open before the
  # subscriber gets :moved), then the subscriber gets :moved and
  # :disconnected (reason :moved) and the pub/sub connection moves at once.
  # From an event that says a replica of the master in use is being
  # promoted until the move, an abort, or @park_ms, the manager is parked:
  # the pool has no connection (Pool.move(pool, nil)), so nothing reaches
  # the old master. While it asks the sentinels, events wait.

  use GenServer

  require Logger

  alias Larder.Redis.{Pool, PubSub, Sentinel, Socket, Table, Topology, Tracking}

  @watch_ms 100
  # The longest a process of the manager takes to stop before it is killed.
  @park_ms 5_000
  @sub_max_wait_ms 2_000

  @impl true
  def init(%{handle: handle} = args) do
    Process.flag(:trap_exit, true)
    table = handle.table
    first? = Table.put_new(table, {:started, true})
    Table.put(table, {:manager, self()})
    # (a hint the manager before this one did not take)
    Table.delete(table, :check_hinted)
    opts = handle.opts

    state = %{
      table: table,
      ref: handle.ref,
      opts: opts,
      pool_size: handle.pool_size,
      timeout: handle.timeout,
      subscriber: args.subscriber,
      channel: args.channel,
      tracking: Tracking.new(args.tracking),
      auth: Socket.handshake(Keyword.take(opts, [:username, :password])),
      # the master in use: {host, port}, nil while Sentinel names none
      node: if(opts[:sentinel], do: nil, else: {opts[:host], opts[:port]}),
      sentinel: opts[:sentinel],
      master_warned: false,
      # the processes: the pool, the pub/sub connection, the sentinels'
      pool: nil,
      pubsub: nil,
      watchers: %{},
      check: nil,
      # {ref, timer} while parked (see the contract)
      parked: nil,
      # the subscriber was told Redis refuses the subscription (:refused),
      # until the next :subscribed
      refused: false
    }

    state = if state.sentinel, do: find_master(state), else: state

    case probe(state, first?) do
      :ok ->
        Process.send_after(self(), :watch, @watch_ms)
        {:ok, state |> start_pool() |> start_pubsub() |> start_watchers()}

      {:refused, props} ->
        {:stop, {:refused, props}}
    end
  end

  defp backoff(state) do
    sleep = state.opts[:reconnect_sleep]
    {sleep, max(@sub_max_wait_ms, sleep)}
  end

  defp start_pool(state) do
    {:ok, pool} =
      Pool.start_link(
        owner: self(),
        ref: state.ref,
        table: state.table,
        node: state.node,
        keys: Enum.to_list(0..(state.pool_size - 1)),
        connection: [
          timeout: state.timeout,
          database: state.opts[:database],
          auth: state.auth,
          max_reply_bytes: state.opts[:max_reply_bytes]
        ],
        backoff: backoff(state)
      )

    %{state | pool: pool}
  end

  defp start_pubsub(%{channel: nil} = state), do: state

  defp start_pubsub(state) do
    channels = [state.channel | if(state.tracking, do: [Tracking.channel()], else: [])]

    {:ok, pubsub} =
      PubSub.start_link(
        owner: self(),
        ref: state.ref,
        node: state.node,
        auth: state.auth,
        client_id: state.tracking != nil,
        channels: channels,
        timeout: state.timeout,
        max_message_bytes: state.opts[:max_message_bytes],
        backoff: backoff(state),
        label: "the pub/sub connection of channel #{inspect(state.channel)}"
      )

    %{state | pubsub: pubsub}
  end

  defp start_watchers(%{sentinel: nil} = state), do: state

  defp start_watchers(state) do
    watchers =
      Map.new(state.sentinel[:sentinels], fn address ->
        {:ok, pid} =
          PubSub.start_link(
            owner: self(),
            ref: state.ref,
            node: address,
            auth: Sentinel.auth(state.sentinel),
            channels: Sentinel.channels(),
            timeout: state.timeout,
            max_message_bytes: Sentinel.max_reply_bytes(),
            backoff: backoff(state),
            label: "the pub/sub connection of Sentinel events (master #{master_name(state)})"
          )

        {pid, address}
      end)

    %{state | watchers: watchers}
  end

  ## Events

  @impl true
  def handle_info({:larder_redis, pid, _ref, kind, props}, state) do
    cond do
      pid == state.pubsub -> {:noreply, subscription(kind, props, state)}
      pid == state.pool -> {:noreply, pool(kind, state)}
      is_map_key(state.watchers, pid) -> {:noreply, sentinel(kind, props, pid, state)}
      true -> {:noreply, state}
    end
  end

  def handle_info(:check_master, state) do
    # (taken before it is acted on: a hint after this one is sent again)
    Table.delete(state.table, :check_hinted)
    {:noreply, request_check(state)}
  end

  def handle_info(:find_master, state), do: {:noreply, find_master(%{state | check: nil})}

  def handle_info({:unpark, ref}, %{parked: {ref, _}} = state), do: {:noreply, unpark(state)}

  def handle_info(:watch, state) do
    Process.send_after(self(), :watch, @watch_ms)
    if Table.get(state.table, :manager) != self(), do: Table.put(state.table, {:manager, self()})
    state = check_tracking(state)
    # no master known (Sentinel named none), or a failover under way: ask again
    state =
      if state.sentinel && (state.node == nil or state.parked != nil),
        do: request_check(state),
        else: state

    {:noreply, state}
  end

  def handle_info({:EXIT, pid, reason}, state) do
    case role(pid, state) do
      nil -> {:noreply, state}
      role -> {:stop, {:shutdown, {role, reason}}, state}
    end
  end

  def handle_info(_other, state), do: {:noreply, state}

  @impl true
  def terminate(_reason, state) do
    pids = [state.pubsub, state.pool | Map.keys(state.watchers)]
    Topology.stop_linked(for pid <- pids, is_pid(pid), do: pid)
  end

  defp role(pid, state) do
    cond do
      pid == state.pool -> :pool
      pid == state.pubsub -> :pubsub
      is_map_key(state.watchers, pid) -> :sentinel_pubsub
      true -> nil
    end
  end

  ## The subscription

  defp subscription(:subscribed, props, state), do: subscribed(state, props.client_id)

  defp subscription(:message, %{channel: channel, payload: payload}, state) do
    cond do
      channel == state.channel and is_binary(payload) ->
        tell(state, :message, %{channel: channel, payload: payload})

      state.tracking != nil and channel == Tracking.channel() ->
        tell(state, :invalidated, %{keys: Tracking.keys(payload)})

      true ->
        :ok
    end

    state
  end

  defp subscription(:disconnected, %{reason: reason}, state) do
    tell(state, :disconnected, %{reason: reason})
    # (the master may have moved: Sentinel is asked)
    if state.sentinel, do: request_check(state), else: state
  end

  defp subscription(:failed, %{reason: reason}, state) do
    state =
      case reason do
        {:refused, command, reply} -> refused(state, command, reply)
        _other -> state
      end

    if state.sentinel, do: request_check(state), else: state
  end

  # Subscribed: with tracking, every command connection is redirected to
  # this connection's (new) id first, so that the subscriber, told
  # :subscribed, keeps nothing a write could have changed unreported; and
  # it is told only once one of them tracks (with BCAST one reports every
  # write): if none does, because Redis refuses, it is told that instead.
  defp subscribed(%{tracking: nil} = state, _id) do
    tell(state, :subscribed, %{})
    %{state | refused: false}
  end

  defp subscribed(%{tracking: tracking} = state, id) do
    {tracking, status} = Tracking.enable_all(tracking, id, clients(state), state.timeout)
    state = %{state | tracking: tracking}

    case status do
      :on ->
        tell(state, :subscribed, %{})
        %{state | refused: false}

      {:refused, reply} ->
        refused(state, "CLIENT TRACKING", reply)

      :off ->
        state
    end
  end

  # A connection that replaced one that ended gets its tracking back; if
  # none kept it meanwhile the subscriber is told :subscribed again (what
  # was written then went unreported), or :refused.
  defp check_tracking(%{tracking: %{id: id} = tracking} = state) when id != nil do
    {tracking, event} = Tracking.check(tracking, clients(state), state.timeout)
    state = %{state | tracking: tracking}

    case event do
      :up ->
        tell(state, :subscribed, %{})
        %{state | refused: false}

      {:refused, reply} ->
        refused(state, "CLIENT TRACKING", reply)

      nil ->
        state
    end
  end

  defp check_tracking(state), do: state

  defp clients(state), do: Pool.clients(state.table, Enum.to_list(0..(state.pool_size - 1)))

  # Redis answered, and refused what the subscription needs (see
  # refusal?/3): the subscriber is told once, until the next :subscribed.
  defp refused(%{refused: true} = state, _command, _reply), do: state

  defp refused(state, command, reply) do
    if refusal?(state, command, reply) do
      tell(state, :refused, refusal(state, command, reply))
      %{state | refused: true}
    else
      state
    end
  end

  # With tracking, any error reply to the handshake or to CLIENT TRACKING;
  # without, a NOPERM to SUBSCRIBE (an ACL without the command or the
  # channel: the data connections may still work). A refused AUTH without
  # tracking is an outage like any other: the data connections fail too.
  defp refusal?(%{tracking: nil}, command, reply),
    do: command == "SUBSCRIBE" and String.starts_with?(reply, "NOPERM")

  defp refusal?(_state, _command, _reply), do: true

  defp refusal(%{node: {host, port}} = state, command, reply) do
    %{
      server: Socket.address(host, port),
      user: state.opts[:username] || "default",
      command: command,
      reply: reply,
      channel: state.channel,
      tracking: state.tracking != nil
    }
  end

  # The first start of a topology with a subscription tries, on a
  # connection of its own, what the subscription needs: a refusal stops
  # the start. A server that does not answer does not.
  defp probe(_state, false), do: :ok
  defp probe(%{channel: nil}, _first?), do: :ok
  defp probe(%{node: nil}, _first?), do: :ok

  defp probe(%{node: {host, port}} = state, true) do
    prefix = if state.tracking, do: state.tracking.prefix, else: nil
    channels = [state.channel | if(state.tracking, do: [Tracking.channel()], else: [])]
    subscribe = for channel <- channels, do: ["SUBSCRIBE", channel]

    case Tracking.probe(host, port, state.auth, prefix, subscribe, state.timeout) do
      {:refused, command, reply} ->
        if refusal?(state, command, reply),
          do: {:refused, refusal(state, command, reply)},
          else: :ok

      _ok_or_unknown ->
        :ok
    end
  end

  ## The pool

  # The node of the pool is down: with Sentinel, the master may have moved.
  defp pool(:node_down, %{sentinel: sentinel} = state) when sentinel != nil,
    do: request_check(state)

  defp pool(_kind, state), do: state

  ## Sentinel

  defp sentinel(:message, %{channel: channel, payload: payload}, pid, state) do
    events = Sentinel.event(channel, payload)
    master = state.sentinel[:master]

    # A failover of our master is under way: what was read from it may be
    # lost (the promoted replica may lack it), so the subscriber is told
    # now, before the promoted replica can take a write.
    if {:failover, master} in events, do: tell(state, :failover, %{master: master})

    for :bad <- events do
      {host, port} = Map.fetch!(state.watchers, pid)
      tell(state, :bad_event, %{from: "sentinel " <> Socket.address(host, port)})
    end

    # (a promotion away from a master this manager already left is over
    # for it: it moved while these messages waited)
    state = if Enum.any?(events, &promoting?(&1, master, state)), do: park(state), else: state
    state = if {:aborted, master} in events, do: unpark(state), else: state

    if {:switch, master} in events,
      do: find_master(state, Map.fetch!(state.watchers, pid)),
      else: state
  end

  defp sentinel(_kind, _props, _pid, state), do: state

  # (the master's name, quoted, in a log line)
  defp master_name(state), do: inspect(state.sentinel[:master])

  defp request_check(%{check: nil} = state) do
    %{state | check: Process.send_after(self(), :find_master, state.opts[:reconnect_sleep])}
  end

  defp request_check(state), do: state

  # `first`: the sentinel to ask first (the one that announced a switch:
  # the others may name the old master, still running, for a while).
  defp find_master(state, first \\ nil) do
    sentinel =
      if first,
        do: Keyword.update!(state.sentinel, :sentinels, &[first | List.delete(&1, first)]),
        else: state.sentinel

    case Sentinel.master(sentinel, state.auth, state.timeout) do
      {:ok, node} ->
        cond do
          node == state.node -> %{state | master_warned: false}
          # no master known yet (at start, or no sentinel named one):
          # nothing to move from
          state.node == nil -> adopt(%{state | master_warned: false}, node)
          true -> move(state, node)
        end

      {:error, error} ->
        unless state.master_warned do
          Logger.warning(
            "Larder.Redis: no master #{master_name(state)} from the Sentinel set " <>
              "(#{sentinels(state)}) yet: #{Sentinel.describe(error)}; asking again every " <>
              "#{state.opts[:reconnect_sleep]} ms and on each failover event"
          )
        end

        %{state | master_warned: true}
    end
  end

  defp sentinels(state),
    do: Enum.map_join(state.sentinel[:sentinels], ", ", fn {h, p} -> Socket.address(h, p) end)

  # The first master found after the start: the pool and the subscription
  # go there (in init, they are started there).
  defp adopt(%{pool: nil} = state, node), do: %{state | node: node}

  defp adopt(state, node) do
    state = %{state | node: node}
    if state.parked == nil, do: Pool.move(state.pool, node)
    if state.pubsub, do: PubSub.move(state.pubsub, node)
    state
  end

  defp move(%{node: {old_host, old_port} = old} = state, {host, port} = node) do
    Logger.warning(
      "Larder.Redis: the master #{master_name(state)} moved from " <>
        "#{Socket.address(old_host, old_port)} to #{Socket.address(host, port)}; moving there"
    )

    state = end_park(state)
    :ok = Pool.move(state.pool, node)
    state = %{state | node: node, master_warned: false}

    # The new master is a promoted replica: writes the old one acknowledged
    # but had not replicated are missing there, and the keys hold the older
    # values it had. Told once the pool's connections reach it.
    tell(state, :moved, %{from: old, to: node})

    # Whether or not it was subscribed, the subscriber must drop what it
    # read when the subscription comes up on the new master: told so.
    tell(state, :disconnected, %{reason: :moved})

    # The subscription moves at once, whatever backoff its failures on the
    # old master ran up: until it is up there, commands reach the new
    # master while nothing of the other clients' writes is heard.
    if state.pubsub, do: PubSub.move(state.pubsub, node)
    state
  end

  # A sentinel said a replica of our master is being promoted (the leader
  # sends it REPLICAOF NO ONE a tick after the first such event): whatever
  # the old master acknowledges from then on is lost. So nothing more is
  # sent to it: the pool closes its connections (callers fail at once)
  # until the manager moves, a sentinel says the failover was aborted, or
  # @park_ms passes (then back to the master in use). The subscription
  # stays, so that the other clients' invalidations are heard.
  defp promoting?({:promoting, master, address}, master, state), do: address == state.node
  defp promoting?(_event, _master, _state), do: false

  defp park(%{parked: nil, node: node} = state) when node != nil do
    :ok = Pool.move(state.pool, nil)
    ref = make_ref()
    timer = Process.send_after(self(), {:unpark, ref}, @park_ms)
    request_check(%{state | parked: {ref, timer}})
  end

  defp park(state), do: state

  defp unpark(%{parked: nil} = state), do: state

  defp unpark(state) do
    state = end_park(state)
    :ok = Pool.move(state.pool, state.node)
    state
  end

  defp end_park(%{parked: {_ref, timer}} = state) do
    Process.cancel_timer(timer)
    %{state | parked: nil}
  end

  defp end_park(state), do: state

  defp tell(state, kind, props) do
    send(state.subscriber, {:larder_redis, self(), state.ref, kind, props})
    :ok
  end
end
