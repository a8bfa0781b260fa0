# Larder.Cache.Redis on one server, given or named by Sentinel, the
# keeper's side: the pool of command connections to that master, its
# pub/sub handshake (AUTH, CLIENT ID with tracking, SUBSCRIBE), and with
# Sentinel, finding the master, watching every sentinel and moving when the
# master changes. The loop, the connections' life and the pub/sub failures
# are Keeper's.
defmodule Larder.Cache.Redis.ServerKeeper do
  @moduledoc false

  # Contract (internal).
  #
  # The table: `{slot, pid | :none}` per pool slot (0 to :pool_size - 1,
  # filled with :none by Larder.Cache.Redis.init/3), `{:keeper, pid}`, and
  # with Sentinel `{:sentinel, pid}` (the keeper, which callers hint with
  # :check_master when a command gets READONLY or loses its connection)
  # and `{:check_hinted, true}` while such a hint is on its way (callers
  # send one only when they insert that row; the keeper deletes it as it
  # takes the hint).
  #
  # Sentinel: the keeper finds the master at start, holds a subscription to
  # +switch-master and the failover events on every sentinel (connected
  # again every @sentinel_retry_ms while one is away), and asks the
  # sentinels again on a +switch-master for its master, a caller's hint, or
  # a failed subscription, at most once per :reconnect_sleep, and every
  # watch while it knows no master or is parked. A master other than the
  # one in use (checked with its own ROLE) moves every connection to it,
  # and tells the cache it was replaced (a promoted replica may hold older
  # values under the same keys: the cache renews its generation there).
  # From an event that says a replica of the master in use is being
  # promoted until the move (or an abort, or @park_ms), the keeper is
  # parked: no command connection, so nothing reaches the old master (see
  # park/1). On a +switch-master, the sentinel that announced it is asked
  # first. While it asks (each sentinel within :timeout), messages wait.

  @behaviour Larder.Cache.Redis.Keeper

  require Logger

  alias Larder.Cache.Redis.Keeper
  alias Larder.Redis.{Subscription, Tracking}
  alias Larder.Redis.Sentinel
  alias Larder.Redis.Socket

  # Wait before connecting again to a sentinel whose subscription was lost.
  @sentinel_retry_ms 1_000

  # The longest a keeper sends nothing to its master once a sentinel said a
  # replica is being promoted, if no +switch-master nor abort follows.
  @park_ms 5_000

  @doc false
  # The keeper process (a :proc_lib process started linked by
  # Larder.Cache.Redis.start_link/1; see Keeper for its system messages).
  def init(parent, %{opts: opts} = l2) do
    state = Keeper.init(parent, l2)
    Keeper.put(state.table, {:keeper, self()})
    # (a hint the keeper before this one did not take)
    Keeper.delete(state.table, :check_hinted)

    state =
      Map.merge(state, %{
        # the master's address; nil while Sentinel names none
        host: if(opts[:sentinel], do: nil, else: String.to_charlist(opts[:host])),
        port: opts[:port],
        master_warned: false,
        sentinel: opts[:sentinel],
        watchers: %{},
        check: nil,
        # {ref, timer} while parked: a replica is being promoted, the old
        # master gets nothing (see park/1)
        parked: nil,
        tracking: Tracking.new(opts[:tracking_prefix]),
        # true once the cache was told tracking is refused, until it is on
        untracked: false
      })

    # with Sentinel, the master first (the clients are started below)
    state = if state.sentinel, do: watch_sentinels(find_master(state)), else: state
    probe(state)

    # a client connects in start_link (bounded by :timeout each), so the
    # first calls find a connected client when Redis is up.
    state = Enum.reduce(0..(opts[:pool_size] - 1), state, &start_client(&2, &1))
    Keeper.run(__MODULE__, state)
  end

  @impl Keeper
  def handle_info(msg, %{watchers: watchers} = state) do
    case msg do
      {:tcp, w, data} when is_map_key(watchers, w) -> sentinel_data(state, w, data)
      {:tcp_closed, w} when is_map_key(watchers, w) -> sentinel_lost(state, w)
      {:tcp_error, w, _reason} when is_map_key(watchers, w) -> sentinel_lost(state, w)
      {:watch_sentinel, addr} -> watch_sentinel(state, addr)
      :check_master -> hinted(state, :check_hinted, &request_check/1)
      :find_master -> find_master(%{state | check: nil})
      {:unpark, ref} -> if match?({^ref, _}, state.parked), do: unpark(state), else: state
      _other -> state
    end
  end

  @impl Keeper
  def start_client(%{host: nil} = state, slot), do: Keeper.retry_client(state, slot)

  # (unpark/1 or move/3 starts every slot again)
  def start_client(%{parked: {_, _}} = state, slot) do
    Keeper.put(state.table, {slot, :none})
    state
  end

  def start_client(state, slot), do: Keeper.start_client(state, slot, state.host, state.port)

  @impl Keeper
  def watch(state) do
    state = check_tracking(state)
    # no master known (Sentinel named none, or it was down), or a failover
    # under way: ask again
    if state.sentinel && (state.host == nil or state.parked != nil),
      do: request_check(state),
      else: state
  end

  @impl Keeper
  def shutdown(state) do
    for socket <- Map.keys(state.watchers), do: :gen_tcp.close(socket)
    :ok
  end

  ## The pub/sub connection: AUTH (with a password), CLIENT ID (with
  ## tracking) and SUBSCRIBE, then every message on the channel is relayed,
  ## and with tracking every report on __redis__:invalidate.

  @impl Keeper
  def sub_connect(%{host: nil} = state), do: Keeper.sub_failed(state, :no_master, __MODULE__)

  def sub_connect(state) do
    opts = state.opts
    auth = Socket.handshake(Keyword.take(opts, [:username, :password]))
    {subscribe, expect} = Tracking.handshake(state.tracking, state.channel)
    expect = if auth != [], do: [:auth | expect], else: expect

    case Subscription.open(
           state.host,
           state.port,
           auth ++ subscribe,
           expect,
           opts[:max_message_bytes],
           opts[:timeout]
         ) do
      {:ok, sub} -> %{state | sub: sub}
      {:error, reason} -> Keeper.sub_failed(state, reason, __MODULE__)
    end
  end

  @impl Keeper
  def sub_reply(id, %{sub: %{expect: [:client_id | expect]}} = state) do
    case Tracking.parse_id(id) do
      {:ok, id} ->
        state = %{state | tracking: %{state.tracking | id: id}}
        {:cont, Keeper.handshake_step(state, expect, __MODULE__)}

      :error ->
        {:halt, Keeper.sub_failed(state, {:bad_reply, Keeper.text(id)}, __MODULE__)}
    end
  end

  def sub_reply(["subscribe", channel, _count], %{sub: %{expect: [:subscribe | expect]}} = state)
      when channel == state.channel,
      do: {:cont, Keeper.handshake_step(state, expect, __MODULE__)}

  def sub_reply(["subscribe", channel, _count], %{sub: %{expect: [:tracking | expect]}} = state) do
    if channel == Tracking.channel(),
      do: {:cont, Keeper.handshake_step(state, expect, __MODULE__)},
      else: {:halt, Keeper.sub_failed(state, {:bad_reply, Keeper.text(channel)}, __MODULE__)}
  end

  def sub_reply(["message", channel, payload], %{sub: %{expect: []}} = state)
      when channel == state.channel and is_binary(payload) do
    Keeper.tell(state, {:message, payload})
    {:cont, state}
  end

  def sub_reply(["message", channel, payload], %{sub: %{expect: []}} = state)
      when state.tracking != nil and channel == "__redis__:invalidate" do
    Keeper.tell(state, {:invalidate, Tracking.keys(payload)})
    {:cont, state}
  end

  def sub_reply(_reply, _state), do: :unexpected

  # Subscribed: with tracking, every data connection is redirected to this
  # connection's (new) id first, so that the cache, which clears L1 on
  # :connected, keeps nothing a write could have changed unreported; and
  # the cache gets :connected only once one of them tracks (with BCAST one
  # reports every write): if none does, because Redis refuses, it is told
  # so, and keeps no L1 until check_tracking/1 finds one that tracks.
  @impl Keeper
  def subscribed(%{tracking: nil} = state), do: {state, :up}

  def subscribed(%{tracking: tracking} = state) do
    {tracking, status} =
      Tracking.enable_all(tracking, tracking.id, state.clients, state.opts[:timeout])

    state = %{state | tracking: tracking}

    case status do
      :on -> {%{state | untracked: false}, :up}
      {:refused, reply} -> {refused(state, "CLIENT TRACKING", reply), :hold}
      :off -> {state, :hold}
    end
  end

  # An error reply to the pub/sub handshake: with tracking, Redis refuses
  # what it needs (CLIENT ID, the tracking channel, or AUTH itself).
  @impl Keeper
  def handshake_refused(%{tracking: nil} = state, _step, _reply), do: state

  def handshake_refused(state, step, reply) do
    command =
      case step do
        :auth -> "AUTH"
        :client_id -> "CLIENT ID"
        _subscribe -> "SUBSCRIBE"
      end

    refused(state, command, reply)
  end

  # The cache is told once (until tracking is on again) that Redis refuses
  # tracking: it keeps no L1 meanwhile.
  defp refused(%{untracked: true} = state, _command, _reply), do: state

  defp refused(state, command, reply) do
    Keeper.tell(state, {:tracking_refused, refusal(state, command, reply)})
    %{state | untracked: true}
  end

  defp refusal(state, command, reply),
    do:
      Keeper.tracking_refused(
        "#{state.host}:#{state.port}",
        state.opts[:username],
        command,
        reply
      )

  # The first keeper of a cache with tracking tries the commands tracking
  # needs before it starts anything: a server that refuses them (and
  # answers) makes the cache's start_link/1 return that error. Later
  # keepers report it to the running cache instead.
  defp probe(%{tracking: nil}), do: :ok
  defp probe(%{host: nil}), do: :ok

  defp probe(state) do
    if Keeper.first?(state) do
      auth = Socket.handshake(Keyword.take(state.opts, [:username, :password]))

      case Tracking.probe(
             state.host,
             state.port,
             auth,
             state.tracking.prefix,
             state.opts[:timeout]
           ) do
        {:refused, command, reply} ->
          Keeper.refuse_start(__MODULE__, state, refusal(state, command, reply))

        _ok_or_unknown ->
          :ok
      end
    end

    :ok
  end

  # (the master may have moved: Sentinel is asked)
  @impl Keeper
  def sub_failed(state, _reason, wait) do
    if state.sentinel, do: send(self(), :check_master)
    wait
  end

  # A data connection that replaced one that failed gets its tracking
  # back; if none kept it meanwhile (or Redis refused it), the cache
  # re-reads as on a resubscribe once one has it. If none has it because
  # Redis refuses it, the cache is told so.
  defp check_tracking(%{tracking: tracking, sub: %{expect: []}} = state) when tracking != nil do
    {tracking, event} = Tracking.check(tracking, state.clients, state.opts[:timeout])
    state = %{state | tracking: tracking}

    case event do
      :up ->
        Keeper.tell(state, :up)
        %{state | untracked: false}

      {:refused, reply} ->
        refused(state, "CLIENT TRACKING", reply)

      nil ->
        state
    end
  end

  defp check_tracking(state), do: state

  # A caller's hint (one on its way at a time: see Larder.Cache.Redis), taken
  # before it is acted on, so that a hint sent after this one is sent again.
  defp hinted(state, row, fun) do
    Keeper.delete(state.table, row)
    fun.(state)
  end

  ## Sentinel

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

    case Sentinel.master(
           sentinel,
           Socket.handshake(Keyword.take(state.opts, [:username, :password])),
           state.opts[:timeout]
         ) do
      {:ok, {host, port}} ->
        host = String.to_charlist(host)

        cond do
          {host, port} == {state.host, state.port} -> state
          # no master known yet (at start, or no sentinel named one): nothing
          # to move. (Not "no clients": they all end when the master dies.)
          state.host == nil -> %{state | host: host, port: port}
          true -> move(state, host, port)
        end

      {:error, reason} ->
        unless state.master_warned do
          Logger.warning(
            "Larder.Cache.Redis: no master from Sentinel yet (#{Keeper.text(reason)})"
          )
        end

        %{state | master_warned: true}
    end
  end

  defp move(state, host, port) do
    if state.host,
      do: Logger.warning("Larder.Cache.Redis: the master moved to #{host}:#{port}; moving")

    state = end_park(state)

    for {pid, slot} <- state.clients do
      Keeper.stop_client(pid)
      Keeper.put(state.table, {slot, :none})
    end

    state = %{state | host: host, port: port, clients: %{}, master_warned: false}
    state = Enum.reduce(0..(state.opts[:pool_size] - 1), state, &start_client(&2, &1))

    # The new master is a promoted replica: writes the old one acknowledged
    # but had not replicated are missing there, and the keys hold the older
    # values it had. The cache moves to a new generation on it (through
    # the connections just started), so that it reads none of them.
    Keeper.tell(state, :moved)

    # Whether or not it was subscribed, the cache must clear its L1 when the
    # subscription comes up on the new master: what it read from the old
    # one may be lost. :disconnected tells it so.
    Keeper.tell(state, :down)

    # The subscription moves at once, even when it is waiting out the
    # backoff of its failures on the old master (up to 2 s): until it is
    # up there, this node's commands reach the new master while its L1
    # still holds what it read from the old one, and it hears no other
    # node's writes.
    if state.sub, do: Subscription.close(state.sub)
    sub_connect(%{state | sub: nil, sub_wait: state.opts[:reconnect_sleep]})
  end

  # A sentinel said a replica of our master is being promoted (the leader
  # sends it REPLICAOF NO ONE a tick after the first such event): whatever
  # the old master acknowledges from then on is lost. So nothing more is
  # sent to it: its command connections are closed (callers get
  # :l2_unavailable, and writes are repaired once the L2 answers) until the
  # keeper moves to the new master, a sentinel says the failover was
  # aborted, or @park_ms passes (then back to the master in use). The
  # subscription stays, so that the other nodes' invalidations are heard.
  defp promoting?({:promoting, master, {host, port}}, master, state),
    do: {String.to_charlist(host), port} == {state.host, state.port}

  defp promoting?(_event, _master, _state), do: false

  defp park(%{parked: nil, host: host} = state) when host != nil do
    for {pid, slot} <- state.clients do
      Keeper.stop_client(pid)
      Keeper.put(state.table, {slot, :none})
    end

    ref = make_ref()
    timer = Process.send_after(self(), {:unpark, ref}, @park_ms)
    request_check(%{state | clients: %{}, parked: {ref, timer}})
  end

  defp park(state), do: state

  defp unpark(%{parked: nil} = state), do: state

  defp unpark(state) do
    state = end_park(state)
    Enum.reduce(0..(state.opts[:pool_size] - 1), state, &start_client(&2, &1))
  end

  defp end_park(%{parked: {_ref, timer}} = state) do
    Process.cancel_timer(timer)
    %{state | parked: nil}
  end

  defp end_park(state), do: state

  defp watch_sentinels(state) do
    Keeper.put(state.table, {:sentinel, self()})
    Enum.reduce(state.sentinel[:sentinels], state, &watch_sentinel(&2, &1))
  end

  defp watch_sentinel(state, addr) do
    case Sentinel.subscribe(addr, state.sentinel, state.opts[:timeout]) do
      {:ok, socket} ->
        watcher = %{addr: addr, parser: Sentinel.parser()}
        %{state | watchers: Map.put(state.watchers, socket, watcher)}

      {:error, _reason} ->
        Process.send_after(self(), {:watch_sentinel, addr}, @sentinel_retry_ms)
        state
    end
  end

  defp sentinel_data(state, socket, data) do
    watcher = Map.fetch!(state.watchers, socket)
    :inet.setopts(socket, active: :once)

    case Sentinel.read(watcher.parser, data) do
      {:ok, events, parser} ->
        watcher = %{watcher | parser: parser}
        state = %{state | watchers: Map.put(state.watchers, socket, watcher)}
        master = state.sentinel[:master]
        # A failover of our master is under way: drop L1 now, before the
        # promoted replica can take a write (see "Sentinel" in
        # Larder.Cache.Redis); counted as a bad message when the event
        # names no master.
        if {:failover, master} in events,
          do: Keeper.tell(state, {:invalidate, :all})

        for :bad <- events, do: Keeper.tell(state, {:invalidate, :bad})
        # (a promotion away from a master this keeper already left is over
        # for it: it moved while these messages waited)
        state = if Enum.any?(events, &promoting?(&1, master, state)), do: park(state), else: state

        state = if {:aborted, master} in events, do: unpark(state), else: state
        if {:switch, master} in events, do: find_master(state, watcher.addr), else: state

      :error ->
        :gen_tcp.close(socket)
        sentinel_lost(state, socket)
    end
  end

  defp sentinel_lost(state, socket) do
    {%{addr: addr}, watchers} = Map.pop(state.watchers, socket)
    Process.send_after(self(), {:watch_sentinel, addr}, @sentinel_retry_ms)
    %{state | watchers: watchers}
  end
end
