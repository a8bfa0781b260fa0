# Larder.Cache.Redis on a Redis Cluster, the keeper's side: the :cluster
# option's check, the slot map (CLUSTER SLOTS, asked of the known masters
# and the seeds in turn), one pool of command connections per master, and the
# sharded pub/sub connection (SSUBSCRIBE on the master of the channel's
# slot, followed when that slot moves).
defmodule Larder.Cache.Redis.ClusterKeeper do
  @moduledoc false

  # Contract (internal).
  #
  # The keeper is the one writer of the table ClusterRouter reads:
  # `{slot, {host, port}}` per served slot, `{{host, port, i}, pid | :none}`
  # per pool client, `{:keeper, pid}`, and `{:bad_replies, n}`, the count of
  # CLUSTER SLOTS answers that were not usable (not RESP, an error reply,
  # not a list, naming more than Cluster.max_masters/0 masters, skipped
  # entries, larger than @max_reply_bytes). A new map is written pools
  # first, then slots, so a slot never names a master without a pool.
  #
  # A refresh blocks the keeper (each node within :timeout) and runs at most
  # once per :reconnect_sleep, however many callers hint it; while it runs,
  # pub/sub messages wait. Nothing a node says is trusted: see Cluster.
  #
  # A master down (a connection to it refused or failed to open): the map
  # is read again at once (within that rate) from the other nodes, since a
  # dead master answers no MOVED, and again after a wait that doubles from
  # :reconnect_sleep up to @max_follow_ms while the map still names a
  # master that is down. Meanwhile its pool is not reconnected key by key:
  # one connection is tried after a wait that doubles from
  # :reconnect_sleep up to Keeper.max_wait/1 (each wait jittered by +-25%
  # so that masters down together are not tried together), and the rest
  # of its pool is started once one connects. So a map naming many dead
  # masters costs at most one connection attempt per master per backoff
  # and one CLUSTER SLOTS per @max_follow_ms. A master that accepts
  # connections and closes them (a pool connection ending within a second
  # of its start, see ended_young/2) is down the same way, its backoff
  # going on from one such end to the next.

  @behaviour Larder.Cache.Redis.Keeper

  require Logger

  alias Larder.Cache.Redis.Keeper
  alias Larder.Redis.{Subscription, Tracking}
  alias Larder.Redis.Cluster
  alias Larder.Redis.Socket

  # The largest CLUSTER SLOTS reply read (16,384 one-slot ranges with a
  # few replicas each fit).
  @max_reply_bytes 4_194_304
  # Of start_link's wait (see Larder.Cache.Redis), what the first map may take.
  @init_budget_ms 4_000
  # The longest wait between two readings of the map while it names a
  # master that is down.
  @max_follow_ms 500
  # How long a master's young ends are remembered for its backoff.
  @young_forget_ms 10_000

  @doc "How many CLUSTER SLOTS answers (or their entries) were not usable."
  @spec bad_replies(map()) :: non_neg_integer()
  def bad_replies(%{table: table}), do: Keeper.counter(table, :bad_replies)

  @doc false
  # The keeper process (a :proc_lib process started linked by
  # Larder.Cache.Redis.start_link/1; see Keeper for its system messages).
  def init(parent, %{opts: opts, table: table} = l2) do
    state = Keeper.init(parent, l2)
    # A keeper that restarts starts from nothing: the rows of the one before
    # (slots, pools of masters that may be gone) are dropped, and callers
    # wait for the new map meanwhile.
    Keeper.delete_all_but_counters(table)
    Keeper.put(table, {:keeper, self()})

    state =
      Map.merge(state, %{
        timeout: opts[:timeout],
        pool_size: opts[:pool_size],
        seeds: opts[:cluster],
        auth: Socket.handshake(Keyword.take(opts, [:username, :password])),
        map: nil,
        pools: MapSet.new(),
        last_refresh: nil,
        refresh_timer: nil,
        map_warned: false,
        # masters whose connections cannot be opened: node => %{wait,
        # timer, pending (the pool keys that wait for it)}
        down: %{},
        # the map read again while it names a master that is down:
        # %{wait, timer} or nil
        follow: nil,
        # invalidation: :tracking, per master: its pub/sub connection for
        # __redis__:invalidate (by node, and its socket's node)
        tracking: opts[:tracking_prefix],
        tsubs: %{},
        tsockets: %{},
        # masters whose tracking Redis refuses (the cache keeps no L1 and
        # gets no :connected while any does)
        untracked: MapSet.new(),
        # masters whose connections ended young: node => {the wait the
        # next young end starts from, when the last one was}
        young: %{}
      })

    budget = @init_budget_ms + state.pool_size * state.timeout - state.timeout
    state = refresh(state, System.monotonic_time(:millisecond) + max(budget, 1))
    probe(state)
    Keeper.run(__MODULE__, state)
  end

  # The first keeper of a cache with tracking tries, on every master of
  # the map, the commands tracking needs: one that refuses them (and
  # answers) makes the cache's start_link/1 return that error. Later
  # keepers report it to the running cache instead.
  defp probe(%{tracking: nil}), do: :ok
  defp probe(%{map: nil}), do: :ok

  defp probe(state) do
    if Keeper.first?(state) do
      state.map
      |> Cluster.masters()
      |> Task.async_stream(
        fn {host, port} = node ->
          {node, Tracking.probe(host, port, state.auth, state.tracking, state.timeout)}
        end,
        timeout: state.timeout + 1_000,
        on_timeout: :kill_task,
        max_concurrency: 16
      )
      |> Enum.find_value(fn
        {:ok, {node, {:refused, command, reply}}} -> refusal(state, node, command, reply)
        _ok_or_unknown -> nil
      end)
      |> case do
        nil -> :ok
        error -> Keeper.refuse_start(__MODULE__, state, error)
      end
    end

    :ok
  end

  defp refusal(state, {host, port}, command, reply),
    do: Keeper.tracking_refused("#{host}:#{port}", state.opts[:username], command, reply)

  @impl Keeper
  def handle_info(msg, %{tsockets: tsockets} = state) do
    case msg do
      {:tcp, t, data} when is_map_key(tsockets, t) ->
        tsub_data(state, Map.fetch!(tsockets, t), data)

      {:tcp_closed, t} when is_map_key(tsockets, t) ->
        tsub_failed(state, Map.fetch!(tsockets, t), :closed)

      {:tcp_error, t, reason} when is_map_key(tsockets, t) ->
        tsub_failed(state, Map.fetch!(tsockets, t), {:tcp_error, reason})

      {:tsub_timeout, t} when is_map_key(tsockets, t) ->
        node = Map.fetch!(tsockets, t)
        if state.tsubs[node].expect == [], do: state, else: tsub_failed(state, node, :timeout)

      {:tsub_connect, node} ->
        tsub_connect(state, node)

      :refresh ->
        # (taken before the refresh: a hint after this one sends again)
        Keeper.delete(state.table, :refresh_hinted)
        request_refresh(state)

      :refresh_now ->
        refresh(%{state | refresh_timer: nil}, nil)

      :follow_down ->
        # (a timer cancelled as it fired finds no follow-up)
        if state.follow,
          do: refresh(%{state | follow: %{state.follow | timer: nil}}, nil),
          else: state

      {:node_retry, node} ->
        node_retry(state, node)

      {:stop_clients, pids} ->
        Enum.each(pids, &Keeper.stop_client/1)
        state

      _other ->
        state
    end
  end

  @impl Keeper
  def watch(state) do
    state = check_tracking(state)
    # no map yet (no node answered): ask again
    if state.map == nil, do: request_refresh(state), else: state
  end

  @impl Keeper
  def shutdown(state) do
    for socket <- Map.keys(state.tsockets), do: :gen_tcp.close(socket)
    :ok
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
    {down, up} = Enum.split_with(Enum.uniq(known ++ state.seeds), &is_map_key(state.down, &1))
    nodes = up ++ down

    result =
      Enum.reduce_while(nodes, {:error, :no_node}, fn node, acc ->
        if deadline && System.monotonic_time(:millisecond) >= deadline do
          {:halt, acc}
        else
          case fetch_map(state, node) do
            {:ok, %{bad: bad} = map} ->
              if bad > 0, do: count_bad(state, bad)

              if Cluster.masters(map) == [],
                do: {:cont, {:error, :empty_map}},
                else: {:halt, {:ok, map}}

            {:error, {:bad, reason}} ->
              count_bad(state, 1)
              {:cont, {:error, reason}}

            {:error, reason} ->
              {:cont, {:error, reason}}
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
              "Larder.Cache.Redis: no usable CLUSTER SLOTS from any node " <>
                "(#{inspect(reason, limit: 10, printable_limit: 100)}); asking again"
            )
          end

          %{state | map_warned: true}
      end

    follow_down(state)
  end

  # While the map names a master that is down, it is read again after a
  # wait doubling from :reconnect_sleep up to @max_follow_ms; once it names
  # none, the wait starts over.
  defp follow_down(%{down: down, follow: follow} = state) when down == %{} do
    if follow && follow.timer, do: Process.cancel_timer(follow.timer)
    %{state | follow: nil}
  end

  defp follow_down(%{follow: %{timer: timer}} = state) when timer != nil, do: state

  defp follow_down(state) do
    sleep = state.opts[:reconnect_sleep]

    wait =
      if state.follow, do: min(state.follow.wait * 2, max(@max_follow_ms, sleep)), else: sleep

    %{
      state
      | follow: %{wait: wait, timer: Process.send_after(self(), :follow_down, jitter(wait))}
    }
  end

  # `wait` +-25%.
  defp jitter(wait) when wait < 4, do: wait
  defp jitter(wait), do: wait - div(wait, 4) + :rand.uniform(div(wait, 2) + 1) - 1

  defp count_bad(state, n), do: Keeper.count(state.table, :bad_replies, n)

  defp fetch_map(state, {host, port}) do
    opts = [timeout: state.timeout, handshake: state.auth, max_reply_bytes: @max_reply_bytes]

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

  # The same map again (read while a master is down): nothing to do.
  defp apply_map(%{map: %{slots: slots, masters: masters}} = state, %{
         slots: slots,
         masters: masters
       }),
       do: state

  # Pools first (started for new masters, stopped for masters gone), then
  # the slots whose master changed.
  defp apply_map(state, map) do
    masters = MapSet.new(Cluster.masters(map))
    new = MapSet.difference(masters, state.pools)
    gone = MapSet.difference(state.pools, masters)
    state = Enum.reduce(gone, state, &node_gone(&2, &1))

    state =
      Enum.reduce(new, %{state | pools: masters}, fn node, state ->
        {host, port} = node
        state = Enum.reduce(0..(state.pool_size - 1), state, &start_client(&2, {host, port, &1}))
        if state.tracking, do: tsub_connect(state, node), else: state
      end)

    state = Enum.reduce(gone, state, &tsub_close(&2, &1))

    {inserts, deletes} =
      Enum.reduce(0..(Cluster.slots() - 1), {[], []}, fn slot, {ins, del} ->
        old = state.map && Cluster.master(state.map, slot)

        case Cluster.master(map, slot) do
          ^old -> {ins, del}
          nil -> {ins, [slot | del]}
          node -> {[{slot, node} | ins], del}
        end
      end)

    Keeper.put(state.table, inserts)
    Enum.each(deletes, &Keeper.delete(state.table, &1))

    # A master gone from the map (a replica now, or removed): callers no
    # longer find its pool, and those already on it finish (a MOVED, most
    # likely) before its clients are stopped, :timeout ms later.
    {leaving, clients} = Enum.split_with(state.clients, fn {_, {h, p, _}} -> {h, p} in gone end)

    for {host, port} <- gone,
        i <- 0..(state.pool_size - 1),
        do: Keeper.delete(state.table, {host, port, i})

    if leaving != [],
      do:
        Process.send_after(
          self(),
          {:stop_clients, Enum.map(leaving, &elem(&1, 0))},
          state.timeout
        )

    %{state | map: map, clients: Map.new(clients)}
  end

  # A pool's connection {host, port, i}, while its master is in the map;
  # while that master is down, the key waits for its node's retry.
  @impl Keeper
  def start_client(state, {host, port, _i} = key) do
    node = {host, port}

    cond do
      not MapSet.member?(state.pools, node) -> state
      is_map_key(state.down, node) -> park(state, node, key)
      true -> connect(state, node, key)
    end
  end

  ## Masters down: one connection attempt per node and backoff (see the
  ## contract above)

  defp connect(state, {host, port} = node, key) do
    started = Keeper.start_client(state, key, String.to_charlist(host), port)

    if started?(started, state) do
      started
    else
      sleep = state.opts[:reconnect_sleep]
      down = %{wait: sleep, timer: nil, pending: MapSet.new([key])}
      state = %{started | down: Map.put(started.down, node, down)}
      # (as a message: this may run inside a refresh, applying its map)
      send(self(), :refresh)
      state |> schedule_retry(node) |> follow_down()
    end
  end

  # A pool connection that ended young (a master that accepts and then
  # closes): its master is down as if the connection had been refused, and
  # the backoff goes on from where the last young end left it (unless that
  # was more than @young_forget_ms ago), since each retry connects.
  @impl Keeper
  def ended_young(state, {host, port, _i} = key) do
    node = {host, port}
    Keeper.put(state.table, {key, :none})

    cond do
      not MapSet.member?(state.pools, node) ->
        state

      is_map_key(state.down, node) ->
        park(state, node, key)

      true ->
        now = System.monotonic_time(:millisecond)
        sleep = state.opts[:reconnect_sleep]

        wait =
          case state.young do
            %{^node => {wait, at}} when now - at < @young_forget_ms -> wait
            _ -> sleep
          end

        down = %{wait: wait, timer: nil, pending: MapSet.new([key])}
        young = {min(wait * 2, Keeper.max_wait(state)), now}

        state = %{
          state
          | down: Map.put(state.down, node, down),
            young: Map.put(state.young, node, young)
        }

        send(self(), :refresh)
        state |> schedule_retry(node) |> follow_down()
    end
  end

  # Whether Keeper.start_client/4 connected (it adds the client's pid).
  defp started?(after_start, before), do: map_size(after_start.clients) > map_size(before.clients)

  # (Keeper.start_client/4 has marked a failed key :none and will send its
  # {:start_client, key} again: it lands here, among the pending)
  defp park(state, node, key) do
    Keeper.put(state.table, {key, :none})
    update_in(state.down[node].pending, &MapSet.put(&1, key))
  end

  defp schedule_retry(state, node) do
    %{wait: wait} = state.down[node]
    timer = Process.send_after(self(), {:node_retry, node}, jitter(wait))
    put_in(state.down[node].timer, timer)
  end

  # One pending key of the node is tried; once it connects, the others are
  # started; else the wait doubles.
  defp node_retry(state, node) do
    case state.down do
      %{^node => %{pending: pending, wait: wait} = down} ->
        [key | rest] = MapSet.to_list(pending)
        {host, port} = node
        started = Keeper.start_client(state, key, String.to_charlist(host), port)

        if started?(started, state) do
          state = %{started | down: Map.delete(started.down, node)}
          state = Enum.reduce(rest, state, &start_client(&2, &1))
          follow_down(state)
        else
          next = min(wait * 2, Keeper.max_wait(started))
          state = %{started | down: Map.put(started.down, node, %{down | wait: next, timer: nil})}
          schedule_retry(state, node)
        end

      _ ->
        state
    end
  end

  defp node_gone(state, node) do
    state = %{state | young: Map.delete(state.young, node)}

    case Map.pop(state.down, node) do
      {nil, _} ->
        state

      {down, rest} ->
        if down.timer, do: Process.cancel_timer(down.timer)
        %{state | down: rest}
    end
  end

  ## The sharded pub/sub connection: AUTH and SSUBSCRIBE on the master of
  ## the channel's slot; SMESSAGEs are relayed. A -sunsubscribe push (the
  ## slot moved away), a new map that gives the slot to another master, an
  ## error reply (MOVED), bytes that are not RESP, a reply above
  ## :max_message_bytes, a handshake not done within :timeout, or a lost
  ## connection closes it: :disconnected if it was subscribed, a map
  ## refresh, and a new connection after a wait that doubles from
  ## :reconnect_sleep up to 2 s, as on one server.

  @impl Keeper
  def sub_connect(%{map: nil} = state), do: Keeper.sub_failed(state, :no_slot_map, __MODULE__)

  def sub_connect(state) do
    case Cluster.master(state.map, Cluster.slot(state.channel)) do
      nil -> Keeper.sub_failed(state, :slot_not_served, __MODULE__)
      node -> sub_connect(state, node)
    end
  end

  defp sub_connect(state, {host, port} = node) do
    commands = state.auth ++ [["SSUBSCRIBE", state.channel]]
    expect = if state.auth != [], do: [:auth, :ssubscribe], else: [:ssubscribe]
    max_bytes = state.opts[:max_message_bytes]

    case Subscription.open(to_charlist(host), port, commands, expect, max_bytes, state.timeout) do
      {:ok, sub} -> %{state | sub: Map.put(sub, :node, node)}
      {:error, reason} -> Keeper.sub_failed(state, reason, __MODULE__)
    end
  end

  @impl Keeper
  def sub_reply(["ssubscribe", channel, _], %{sub: %{expect: [:ssubscribe]}} = state)
      when channel == state.channel,
      do: {:cont, Keeper.handshake_step(state, [], __MODULE__)}

  def sub_reply(["smessage", channel, payload], %{sub: %{expect: []}} = state)
      when channel == state.channel and is_binary(payload) do
    Keeper.tell(state, {:message, payload})
    {:cont, state}
  end

  # the channel's slot moved to another master
  def sub_reply(["sunsubscribe", channel | _], %{sub: %{expect: []}} = state)
      when channel == state.channel,
      do: {:halt, Keeper.sub_failed(state, :slot_moved, __MODULE__)}

  def sub_reply(_reply, _state), do: :unexpected

  # (:connected waits while a master refuses tracking: the cache keeps no
  # L1 until all track)
  @impl Keeper
  def subscribed(state),
    do: {state, if(MapSet.size(state.untracked) == 0, do: :up, else: :hold)}

  # The channel's subscription carries no tracking here (each master's
  # tracking connection does: tsub_reply/3).
  @impl Keeper
  def handshake_refused(state, _step, _reply), do: state

  # The slot may have moved (an error reply is likely MOVED: the map is
  # stale): the map first (at most once per :reconnect_sleep), then a new
  # connection, at once when the slot is known to have moved.
  @impl Keeper
  def sub_failed(_state, reason, wait) do
    send(self(), :refresh)
    if reason == :slot_moved, do: 0, else: wait
  end

  # After a new map: a subscription on a master that no longer serves the
  # channel's slot hears nothing more; it moves.
  defp follow_channel(%{sub: %{node: node}, map: map} = state) do
    if Cluster.master(map, Cluster.slot(state.channel)) == node,
      do: state,
      else: Keeper.sub_failed(state, :slot_moved, __MODULE__)
  end

  defp follow_channel(state), do: state

  ## Tracking (invalidation: :tracking), per master: a pub/sub connection
  ## that sends CLIENT ID and subscribes to __redis__:invalidate; once it
  ## is subscribed, every client of that master's pool runs CLIENT TRACKING
  ## on REDIRECT <its id> BCAST PREFIX <prefix> (see Tracking), then the
  ## cache is told :up (and clears L1). Its reports go to the cache as
  ## {:invalidate, keys | :all | :bad} (Keeper.tell/2). A lost
  ## connection tells :down and connects again (the wait doubling
  ## from :reconnect_sleep up to 2 s); a client that replaced one that
  ## failed gets its tracking back within 100 ms (:up when none of the master's
  ## clients kept it meanwhile).

  defp tsub_connect(state, node) do
    cond do
      not MapSet.member?(state.pools, node) -> state
      match?(%{socket: _}, state.tsubs[node]) -> state
      true -> tsub_open(state, node)
    end
  end

  defp tsub_open(state, {host, port} = node) do
    wait = Map.get(state.tsubs, node, %{wait: state.opts[:reconnect_sleep]}).wait
    commands = state.auth ++ [["CLIENT", "ID"], ["SUBSCRIBE", Tracking.channel()]]
    expect = if(state.auth != [], do: [:auth], else: []) ++ [:client_id, :subscribe]
    max_bytes = state.opts[:max_message_bytes]

    case Subscription.open(
           to_charlist(host),
           port,
           commands,
           expect,
           max_bytes,
           state.timeout,
           :tsub_timeout
         ) do
      {:ok, sub} ->
        tsub = Map.merge(sub, %{tracking: Tracking.new(state.tracking), wait: wait})

        %{
          state
          | tsubs: Map.put(state.tsubs, node, tsub),
            tsockets: Map.put(state.tsockets, tsub.socket, node)
        }

      {:error, _reason} ->
        Process.send_after(self(), {:tsub_connect, node}, wait)
        next = min(wait * 2, Keeper.max_wait(state))
        %{state | tsubs: Map.put(state.tsubs, node, %{wait: next})}
    end
  end

  defp tsub_data(state, node, data) do
    case Subscription.read(state.tsubs[node], data) do
      {:ok, replies, tsub} ->
        state = put_in(state.tsubs[node], tsub)
        Enum.reduce_while(replies, state, &tsub_reply(&1, &2, node))

      {:error, reason} ->
        tsub_failed(state, node, reason)
    end
  end

  defp tsub_reply(reply, state, node) do
    case {reply, state.tsubs[node]} do
      {{:ok, "OK"}, %{expect: [:auth | expect]} = tsub} ->
        {:cont, put_in(state.tsubs[node], %{tsub | expect: expect})}

      {{:ok, id}, %{expect: [:client_id | expect]} = tsub} ->
        case Tracking.parse_id(id) do
          {:ok, id} ->
            tracking = %{tsub.tracking | id: id}
            {:cont, put_in(state.tsubs[node], %{tsub | expect: expect, tracking: tracking})}

          :error ->
            {:halt, tsub_failed(state, node, {:bad_reply, Keeper.text(id)})}
        end

      {{:error, reply}, %{expect: [step | _]}} when is_binary(reply) ->
        command =
          case step do
            :auth -> "AUTH"
            :client_id -> "CLIENT ID"
            _subscribe -> "SUBSCRIBE"
          end

        state = node_refused(state, node, command, Keeper.text(reply))
        {:halt, tsub_failed(state, node, {:error_reply, Keeper.text(reply)})}

      {{:ok, ["subscribe", channel, _]}, %{expect: [:subscribe]} = tsub} ->
        if channel == Tracking.channel(),
          do: {:cont, tsub_subscribed(state, node, tsub)},
          else: {:halt, tsub_failed(state, node, {:bad_reply, Keeper.text(channel)})}

      {{:ok, ["message", channel, payload]}, %{expect: []}} ->
        if channel == Tracking.channel(),
          do: Keeper.tell(state, {:invalidate, Tracking.keys(payload)})

        {:cont, state}

      {{:ok, _other}, %{expect: []}} ->
        {:cont, state}

      {other, _tsub} ->
        {:halt, tsub_failed(state, node, {:bad_reply, Keeper.text(other)})}
    end
  end

  # Subscribed: the master's clients are redirected to it, and the cache
  # gets :connected once one of them tracks (and no master refuses).
  defp tsub_subscribed(state, node, tsub) do
    Process.cancel_timer(tsub.timer)
    clients = node_clients(state, node)

    {tracking, status} =
      Tracking.enable_all(tsub.tracking, tsub.tracking.id, clients, state.timeout)

    tsub = %{
      tsub
      | expect: [],
        timer: nil,
        tracking: tracking,
        wait: state.opts[:reconnect_sleep]
    }

    state = put_in(state.tsubs[node], tsub)

    case status do
      :on -> node_tracks(state, node)
      {:refused, reply} -> node_refused(state, node, "CLIENT TRACKING", reply)
      :off -> state
    end
  end

  # A master's tracking is on (again): :connected, unless another master
  # still refuses it.
  defp node_tracks(state, node) do
    untracked = MapSet.delete(state.untracked, node)
    state = %{state | untracked: untracked}
    if MapSet.size(untracked) == 0, do: Keeper.tell(state, :up)
    state
  end

  # A master refuses tracking: the cache is told (once per master, until
  # its tracking is on again) and keeps no L1 meanwhile.
  defp node_refused(state, node, command, reply) do
    if MapSet.member?(state.untracked, node) do
      state
    else
      Keeper.tell(state, {:tracking_refused, refusal(state, node, command, reply)})
      %{state | untracked: MapSet.put(state.untracked, node)}
    end
  end

  defp tsub_failed(state, node, reason) do
    tsub = state.tsubs[node]
    Subscription.close(tsub)

    if tsub.expect == [] do
      Keeper.tell(state, :down)
    else
      Logger.warning(
        "Larder.Cache.Redis: the tracking connection of #{inspect(node)} failed " <>
          "(#{inspect(reason, limit: 10)}); connecting again"
      )
    end

    Process.send_after(self(), {:tsub_connect, node}, tsub.wait)
    next = if tsub.expect == [], do: tsub.wait, else: min(tsub.wait * 2, Keeper.max_wait(state))

    %{
      state
      | tsubs: Map.put(state.tsubs, node, %{wait: next}),
        tsockets: Map.delete(state.tsockets, tsub.socket)
    }
  end

  defp tsub_close(state, node) do
    # a master gone from the map no longer holds the cache's L1 back
    state = if MapSet.member?(state.untracked, node), do: node_tracks(state, node), else: state

    case Map.pop(state.tsubs, node) do
      {%{socket: socket} = tsub, tsubs} ->
        Subscription.close(tsub)
        %{state | tsubs: tsubs, tsockets: Map.delete(state.tsockets, socket)}

      {_, tsubs} ->
        %{state | tsubs: tsubs}
    end
  end

  defp node_clients(state, {host, port}),
    do: for({pid, {^host, ^port, _}} <- state.clients, into: %{}, do: {pid, true})

  defp check_tracking(%{tracking: nil} = state), do: state

  defp check_tracking(state) do
    Enum.reduce(state.tsubs, state, fn
      {node, %{expect: [], tracking: tracking} = tsub}, state ->
        clients = node_clients(state, node)
        {tracking, event} = Tracking.check(tracking, clients, state.timeout)
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
end
