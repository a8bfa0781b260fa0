# The loop both keepers of Larder.Cache.Redis run, the single-server and
# Sentinel keeper (Larder.Cache.Redis) and the cluster keeper: the command
# connections (started, replaced after one ends, stopped), the table rows
# callers read, and the pub/sub connection's life (handshake, failure,
# backoff). Each topology supplies only its own part, as callbacks.
defmodule Larder.Cache.Redis.Keeper do
  @moduledoc false

  # Contract (internal).
  #
  # State: the map init/2 returns, plus the topology's own keys. `clients`
  # maps each command connection's pid to its key in the table (a pool slot
  # on one server, `{host, port, i}` on a cluster). The table holds `{key,
  # pid | :none}` per connection, `{:keeper, pid}`, `{:first_keeper, pid}`
  # (the first keeper of the state: see first?/1), and the counters
  # `{:ended_connections, n}` and (cluster) `{:bad_replies, n}`; every
  # watch (each @watch_ms) writes those rows again, so a keeper that was
  # replaced and is still shutting down beside this one cannot leave its
  # pids there for longer than that.
  #
  # A command connection that ends (see Connection) is counted, its row is
  # :none (callers get :l2_unavailable at once) and it is started again
  # after :reconnect_sleep: by a timer, not a restart, since a hostile
  # server may end one on every reply. Ends are logged as one warning for
  # the first, then at most one per @end_log_ms saying how many more ended:
  # a reconnect storm does not flood the log. A connection that ends within
  # @young_ms of its start goes to the topology's c:ended_young/2 when it
  # has one (the cluster keeper backs its master off as one that refused).
  #
  # The pub/sub connection: the topology opens it (c:sub_connect/1, with
  # Subscription.open/7) and handles the replies of its own handshake and
  # its messages (c:sub_reply/2); this module handles error replies (an
  # error reply to the handshake goes to c:handshake_refused/3 first: with
  # tracking, Redis refused what it needs), AUTH's OK, anything unexpected
  # during the handshake (a failure) or after it (ignored), the
  # handshake's end (c:subscribed/1, then :connected unless it holds it
  # back: tracking is not on), and
  # every failure: the subscriber gets :disconnected if it was subscribed,
  # the first failure of a run is logged (one line), and a new connection
  # is made after a wait that doubles from :reconnect_sleep up to
  # max_wait/1, back to :reconnect_sleep once subscribed (the topology may
  # shorten the wait: c:sub_failed/3).

  require Logger

  alias Larder.Redis.{Connection, Subscription, Tracking}
  alias Larder.Redis.Socket

  @watch_ms 100
  @sub_max_wait_ms 2_000
  @end_log_ms 30_000
  # A command connection that ends sooner than this after it started
  # ended young (see c:ended_young/2).
  @young_ms 1_000

  @type state :: map()

  @doc "Handles a message that is the topology's own (anything else: ignore it)."
  @callback handle_info(msg :: term(), state()) :: state()

  @doc "Opens the pub/sub connection (or fails it, with `sub_failed/3`)."
  @callback sub_connect(state()) :: state()

  @doc """
  Handles a reply on the pub/sub connection that is not an error nor AUTH's
  OK: a step of its own handshake (`handshake_step/3`), a message, or
  `:unexpected`.
  """
  @callback sub_reply(reply :: term(), state()) ::
              {:cont, state()} | {:halt, state()} | :unexpected

  @doc """
  The topology's part of a handshake that is done: `:up` to send
  `:connected`, `:hold` to hold it back (with tracking, until tracking is on:
  the topology sends it then).
  """
  @callback subscribed(state()) :: {state(), :up | :hold}

  @doc """
  Redis answered a step of the pub/sub handshake (`step`, the first of the
  replies still expected) with the error reply `reply`; the failure follows.
  """
  @callback handshake_refused(state(), step :: atom(), reply :: binary()) :: state()

  @doc """
  The topology's follow-up of a pub/sub failure (the state has no
  subscription); returns the wait before connecting again, `wait` or less.
  """
  @callback sub_failed(state(), reason :: term(), wait :: pos_integer()) :: non_neg_integer()

  @doc "Starts the command connection of `key` again, when its timer fires."
  @callback start_client(state(), key :: term()) :: state()

  @doc "The topology's part of the periodic watch."
  @callback watch(state()) :: state()

  @doc """
  A command connection of `key` ended less than @young_ms after it was
  started: the topology backs it off as a connection that could not be
  opened (optional; without it, the key is started again after
  `:reconnect_sleep`, as after any end).
  """
  @callback ended_young(state(), key :: term()) :: state()
  @optional_callbacks ended_young: 2

  @doc "Closes the topology's own sockets, when the keeper stops."
  @callback shutdown(state()) :: :ok

  @doc """
  The keeper's state before the topology's own keys, in the keeper process
  (which it sets to trap exits).
  """
  @spec init(pid(), map()) :: state()
  def init(parent, %{opts: opts} = l2) do
    Process.flag(:trap_exit, true)
    # the first keeper of this state says so (see first?/1)
    unless_gone(fn -> :ets.insert_new(l2.table, {:first_keeper, self()}) end, false)

    %{
      parent: parent,
      subscriber: l2.subscriber,
      channel: l2.channel,
      opts: opts,
      table: l2.table,
      clients: %{},
      # when each command connection was started (monotonic ms)
      born: %{},
      sub: nil,
      sub_wait: opts[:reconnect_sleep],
      sub_failing: false,
      end_log: %{at: nil, quiet: 0}
    }
  end

  @doc """
  Refuses to start: closes what the keeper opened (`mod`'s sockets, the
  command connections, the subscription), answers the parent `{:error,
  error}` and ends the keeper (`:normal`). Does not return.
  """
  @spec refuse_start(module(), state(), Larder.Error.t()) :: no_return()
  def refuse_start(mod, state, error) do
    mod.shutdown(state)
    for pid <- Map.keys(state.clients), do: stop_client(pid)
    if state.sub, do: Subscription.close(state.sub)
    :proc_lib.init_ack({:error, error})
    exit(:normal)
  end

  @doc """
  Whether this keeper is the first of its L2 state (not one the cache
  restarted): only the first refuses to start (`refuse_start/3`); the
  others report what they find to the running cache.
  """
  @spec first?(state()) :: boolean()
  def first?(%{table: table}), do: :ets.lookup(table, :first_keeper) == [{:first_keeper, self()}]

  @doc """
  Tells the parent the keeper is ready (`:proc_lib.init_ack/1`), opens the
  pub/sub connection and runs the loop of `mod`'s keeper. Does not return.
  """
  @spec run(module(), state()) :: no_return()
  def run(mod, state) do
    :proc_lib.init_ack({:ok, self()})
    Process.send_after(self(), :watch, @watch_ms)
    loop(mod, mod.sub_connect(state))
  end

  ## System messages: the keeper is a :proc_lib special process, so
  ## :sys.get_state/1, :sys.trace/2 and crash reports work on it.

  @doc false
  def system_continue(_parent, _debug, {mod, state}), do: loop(mod, state)

  @doc false
  def system_terminate(reason, _parent, _debug, {mod, state}), do: stop(mod, state, reason)

  @doc false
  def system_get_state({_mod, state}), do: {:ok, state}

  @doc false
  def system_replace_state(fun, {mod, state}) do
    state = fun.(state)
    {:ok, state, {mod, state}}
  end

  @doc false
  def system_code_change(misc, _module, _old, _extra), do: {:ok, misc}

  defp stop(mod, %{sub: sub, clients: clients} = state, reason) do
    mod.shutdown(state)
    for pid <- Map.keys(clients), do: stop_client(pid)
    if sub, do: Subscription.close(sub)
    exit(reason)
  end

  defp loop(mod, %{sub: sub, parent: parent, clients: clients} = state) do
    socket = sub && sub.socket

    receive do
      {:tcp, ^socket, data} when socket != nil ->
        loop(mod, sub_data(mod, state, data))

      {:tcp_closed, ^socket} when socket != nil ->
        loop(mod, sub_failed(state, :closed, mod))

      {:tcp_error, ^socket, reason} when socket != nil ->
        loop(mod, sub_failed(state, {:tcp_error, reason}, mod))

      {:sub_timeout, ^socket} when socket != nil ->
        # (a timer that fired as the subscription came up is ignored)
        loop(mod, if(sub.expect == [], do: state, else: sub_failed(state, :timeout, mod)))

      :reconnect ->
        loop(mod, if(sub == nil, do: mod.sub_connect(state), else: state))

      {:start_client, key} ->
        # (a move or a new map may have started it meanwhile)
        taken? = Enum.any?(clients, fn {_pid, k} -> k == key end)
        loop(mod, if(taken?, do: state, else: mod.start_client(state, key)))

      :watch ->
        Process.send_after(self(), :watch, @watch_ms)
        state = state |> write_rows() |> end_summary()
        loop(mod, mod.watch(state))

      {:system, from, request} ->
        :sys.handle_system_msg(request, from, parent, __MODULE__, [], {mod, state})

      {:EXIT, ^parent, reason} ->
        stop(mod, state, reason)

      {:EXIT, pid, reason} when is_map_key(clients, pid) ->
        loop(mod, client_ended(mod, state, pid, reason))

      other ->
        loop(mod, mod.handle_info(other, state))
    end
  end

  ## Command connections

  @doc """
  Starts the command connection of `key` to `host` (a charlist) and
  `port`; if it cannot connect, its row is `:none` and it is tried again
  after `:reconnect_sleep`.
  """
  @spec start_client(state(), term(), charlist(), 1..65_535) :: state()
  def start_client(state, key, host, port) do
    opts = state.opts

    conn_opts = [
      timeout: opts[:timeout],
      database: opts[:database],
      auth: Socket.handshake(Keyword.take(opts, [:username, :password])),
      max_reply_bytes: opts[:max_reply_bytes]
    ]

    case Connection.start_link(host, port, conn_opts) do
      {:ok, client} ->
        put(state.table, {key, client})
        born = Map.put(state.born, client, System.monotonic_time(:millisecond))
        %{state | clients: Map.put(state.clients, client, key), born: born}

      {:error, _reason} ->
        retry_client(state, key)
    end
  end

  @doc "Marks `key`'s row `:none` (callers get `:l2_unavailable`) and tries again later."
  @spec retry_client(state(), term()) :: state()
  def retry_client(state, key) do
    put(state.table, {key, :none})
    Process.send_after(self(), {:start_client, key}, state.opts[:reconnect_sleep])
    state
  end

  @doc "Stops a command connection without its exit reaching the keeper."
  @spec stop_client(pid()) :: true
  def stop_client(pid) do
    Process.unlink(pid)
    Process.exit(pid, :kill)
  end

  @doc "How many command connections of the keeper of `l2` (its state) have ended."
  @spec ended_connections(map()) :: non_neg_integer()
  def ended_connections(%{table: table}), do: counter(table, :ended_connections)

  defp client_ended(mod, state, pid, reason) do
    {key, clients} = Map.pop(state.clients, pid)
    {born, born_map} = Map.pop(state.born, pid)
    count(state.table, :ended_connections, 1)
    now = System.monotonic_time(:millisecond)
    state = %{state | clients: clients, born: born_map}

    # A connection that ended young (a server that accepts and closes)
    # is, for a topology that backs off failed opens, one of those.
    state =
      if born != nil and now - born < @young_ms and function_exported?(mod, :ended_young, 2),
        do: mod.ended_young(state, key),
        else: retry_client(state, key)

    case state.end_log do
      %{at: at, quiet: quiet} when at != nil and now - at < @end_log_ms ->
        %{state | end_log: %{at: at, quiet: quiet + 1}}

      _ ->
        Logger.warning(
          "Larder.Cache.Redis: command connection #{describe(key)} of channel " <>
            "#{inspect(state.channel)} ended " <>
            "(#{text(reason)}); replacing it every #{state.opts[:reconnect_sleep]} ms " <>
            "(further ends are counted and logged at most once per #{div(@end_log_ms, 1000)} s)"
        )

        %{state | end_log: %{at: now, quiet: 0}}
    end
  end

  # Ends that were counted but not logged, once their window is over.
  defp end_summary(%{end_log: %{at: at, quiet: quiet}} = state) when quiet > 0 do
    now = System.monotonic_time(:millisecond)

    if now - at >= @end_log_ms do
      Logger.warning(
        "Larder.Cache.Redis: #{quiet} more command connections of channel " <>
          "#{inspect(state.channel)} ended in the last #{div(now - at, 1000)} s"
      )

      %{state | end_log: %{at: now, quiet: 0}}
    else
      state
    end
  end

  defp end_summary(state), do: state

  defp describe({host, port, i}), do: "#{i} of #{host}:#{port}"
  defp describe(slot), do: "#{inspect(slot)}"

  ## The table (owned by the process that called init/3 of
  ## Larder.Cache.Redis: once it is gone, nobody reads it)

  defp write_rows(state) do
    for {pid, key} <- state.clients,
        :ets.lookup(state.table, key) != [{key, pid}],
        do: put(state.table, {key, pid})

    if :ets.lookup(state.table, :keeper) != [{:keeper, self()}],
      do: put(state.table, {:keeper, self()})

    state
  catch
    :error, :badarg -> state
  end

  @doc "Inserts `rows` into the table, if it still exists."
  @spec put(:ets.tid(), tuple() | [tuple()]) :: true
  def put(table, rows), do: unless_gone(fn -> :ets.insert(table, rows) end, true)

  @doc "Deletes `key` from the table, if it still exists."
  @spec delete(:ets.tid(), term()) :: true
  def delete(table, key), do: unless_gone(fn -> :ets.delete(table, key) end, true)

  @doc "Deletes every row of the table but the counters (and which keeper was the first)."
  @spec delete_all_but_counters(:ets.tid()) :: non_neg_integer()
  def delete_all_but_counters(table) do
    counter? =
      {:orelse, {:orelse, {:==, :"$1", :bad_replies}, {:==, :"$1", :ended_connections}},
       {:==, :"$1", :first_keeper}}

    unless_gone(
      fn -> :ets.select_delete(table, [{{:"$1", :_}, [{:not, counter?}], [true]}]) end,
      0
    )
  end

  @doc "Adds `n` to the counter `name` in the table."
  @spec count(:ets.tid(), atom(), pos_integer()) :: integer()
  def count(table, name, n),
    do: unless_gone(fn -> :ets.update_counter(table, name, n, {name, 0}) end, 0)

  defp unless_gone(fun, gone) do
    fun.()
  catch
    :error, :badarg -> gone
  end

  @doc "The counter `name` in the table (0 before its first count)."
  @spec counter(:ets.tid(), atom()) :: non_neg_integer()
  def counter(table, name) do
    case :ets.lookup(table, name) do
      [{_, n}] -> n
      [] -> 0
    end
  end

  ## The pub/sub connection

  defp sub_data(mod, %{sub: sub} = state, data) do
    case Subscription.read(sub, data) do
      {:ok, replies, sub} ->
        Enum.reduce_while(replies, %{state | sub: sub}, &sub_reply(&1, &2, mod))

      {:error, reason} ->
        sub_failed(state, reason, mod)
    end
  end

  defp sub_reply({:error, message}, %{sub: %{expect: [step | _]}} = state, mod) do
    state = mod.handshake_refused(state, step, text(message))
    {:halt, sub_failed(state, {:error_reply, text(message)}, mod)}
  end

  defp sub_reply({:error, message}, state, mod),
    do: {:halt, sub_failed(state, {:error_reply, text(message)}, mod)}

  defp sub_reply({:ok, "OK"}, %{sub: %{expect: [:auth | expect]}} = state, mod),
    do: {:cont, handshake_step(state, expect, mod)}

  defp sub_reply({:ok, reply}, state, mod) do
    case mod.sub_reply(reply, state) do
      # anything else once subscribed is not ours: ignored
      :unexpected when state.sub.expect == [] -> {:cont, state}
      :unexpected -> {:halt, sub_failed(state, {:bad_reply, text(reply)}, mod)}
      result -> result
    end
  end

  @doc """
  Tells the subscriber (the cache's process) `event`, in the client's
  terms: `{:message, payload}`, `:up`, `:down`, `{:invalidate, keys | :all
  | :bad}` or `:moved`; `Larder.Cache.Redis.message/1` says what each is to
  the cache.
  """
  @spec tell(map(), term()) :: :ok
  def tell(%{subscriber: subscriber}, event) do
    send(subscriber, Larder.Cache.Redis.message(event))
    :ok
  end

  @doc """
  A handshake reply was the one expected: `expect` is what is left. When
  nothing is, the subscription is up: the topology's part, then the
  subscriber gets `:connected`, and the wait is back to `:reconnect_sleep`.
  """
  @spec handshake_step(state(), [atom()], module()) :: state()
  def handshake_step(%{sub: sub} = state, [_ | _] = expect, _mod),
    do: %{state | sub: %{sub | expect: expect}}

  def handshake_step(%{sub: sub} = state, [], mod) do
    Process.cancel_timer(sub.timer)
    {state, up} = mod.subscribed(state)
    if up == :up, do: tell(state, :up)
    if state.sub_failing, do: Logger.info("Larder.Cache.Redis: pub/sub subscribed again")
    sub = %{state.sub | expect: [], timer: nil}
    %{state | sub: sub, sub_wait: state.opts[:reconnect_sleep], sub_failing: false}
  end

  @doc """
  The pub/sub connection failed (or could not be opened): see the contract
  above.
  """
  @spec sub_failed(state(), term(), module()) :: state()
  def sub_failed(state, reason, mod) do
    lost? = state.sub != nil and state.sub.expect == []
    if state.sub, do: Subscription.close(state.sub)
    wait = state.sub_wait

    cond do
      lost? ->
        tell(state, :down)

      not state.sub_failing ->
        Logger.warning(
          "Larder.Cache.Redis: the pub/sub connection of channel #{inspect(state.channel)} " <>
            "failed (#{inspect(reason, limit: 10, printable_limit: 256)}); " <>
            "connecting again every #{wait} ms, backing off to " <>
            "#{max_wait(state)} ms, until it subscribes"
        )

      true ->
        :ok
    end

    state = %{state | sub: nil, sub_failing: not lost?, sub_wait: min(wait * 2, max_wait(state))}
    Process.send_after(self(), :reconnect, mod.sub_failed(state, reason, wait))
    state
  end

  @doc "The longest wait between two pub/sub connection attempts."
  @spec max_wait(state()) :: pos_integer()
  def max_wait(state), do: max(@sub_max_wait_ms, state.opts[:reconnect_sleep])

  @doc """
  The error of a server that refused tracking (`invalidation: :tracking`):
  it names the server, the user (`"default"` without `:username`), the
  command and Redis's reply, what to grant, and the other way out.
  """
  @spec tracking_refused(binary(), binary() | nil, binary(), binary()) :: Larder.Error.t()
  def tracking_refused(server, username, command, reply) do
    user = username || "default"
    reply = text(reply)
    channel = Tracking.channel()
    details = [server: server, user: user, command: command, reply: reply]

    if command == "AUTH" do
      Larder.Error.new(
        :l2_failed,
        "Redis at #{server} refused AUTH to user #{inspect(user)} (#{reply}): " <>
          "invalidation: :tracking cannot learn of other programs' writes; " <>
          "check :username and :password",
        details
      )
    else
      needs = "+client|id +client|tracking &#{channel}"

      Larder.Error.new(
        :l2_failed,
        "Redis at #{server} refused #{command} to user #{inspect(user)} (#{reply}). " <>
          "invalidation: :tracking needs the commands CLIENT ID and CLIENT TRACKING and " <>
          "the channel #{channel}: grant them with `ACL SETUSER #{user} #{needs}`, " <>
          "or use invalidation: :pubsub",
        details ++ [needs: needs]
      )
    end
  end

  @doc "A reply or reason, bounded for a log line or an error's details."
  @spec text(term()) :: binary()
  def text(message) when is_binary(message),
    do: binary_part(message, 0, min(byte_size(message), 200))

  def text(other), do: inspect(other, limit: 10, printable_limit: 64)
end
