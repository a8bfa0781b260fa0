defmodule Larder.Cache.Redis do
  @moduledoc """
  The Redis second level of `Larder.Cache` (a `Larder.Cache.L2`).

  Use it as `l2: {Larder.Cache.Redis, redis_opts}` in `Larder.Cache.start_link/1`.

  ## Options

    * `:host` - the server's host name or address, 1 to 255 bytes (default
      `"127.0.0.1"`).
    * `:port` - its TCP port, 1 to 65535 (default `6379`).
    * `:database` - the database index selected on connect, 0 to 1,000,000
      (default `0`).
    * `:password` - sent with `AUTH` on connect (default none).
    * `:username` - a Redis 6 ACL user, 1 to 255 bytes, sent with
      `:password` as `AUTH <username> <password>` by every data and
      pub/sub connection, on every reconnect too (default none: `AUTH
      <password>`).
    * `:timeout` - the L2 timeout in milliseconds, 1 to 600,000 (default
      `1000`): no caller waits longer than this for Redis, whatever state
      Redis is in.
    * `:reconnect_sleep` - milliseconds between reconnection attempts and
      before a dead client is replaced, 1 to 60,000 (default `100`).
    * `:pool_size` - connections for commands, 1 to 64 (default `2`);
      callers are spread over them by scheduler. Pub/sub uses one more
      connection.
    * `:max_reply_bytes` - the largest reply a command connection may be
      reading, 1024 to 2^32 (default `134217728`, 128 MB); keep it above
      the cache's `:max_value_bytes`.
    * `:max_message_bytes` - the same for the pub/sub connection, whose
      messages are small, 1024 to 2^32 (default `1048576`). A tracking
      report larger than this (one write of very many keys) closes the
      connection like any oversized message: the cache clears its L1 when
      it subscribes again.
    * `:sentinel` - run against the master a Sentinel set names, instead of
      `:host` and `:port` (default `nil`): `[sentinels: [{"127.0.0.1",
      26379}, ...], master: "mymaster"]`, with 1 to 16 sentinels, and
      optional `:username` and `:password` sent to the sentinels with
      `AUTH`. The data nodes get `:password`. See "Sentinel".
    * `:cluster` - run on a Redis Cluster, given 1 to 16 of its nodes as
      seeds, `[{"127.0.0.1", 7000}, ...]`, instead of `:host` and `:port`
      (default `nil`); excludes `:host`, `:port` and `:sentinel`, and
      `:database` must be 0. See "Cluster".
    * `:tracking_prefix` - set by `Larder.Cache` from its `invalidation:
      :tracking` option (not by hand): the key prefix, 0 to 4096 bytes,
      whose changes Redis reports (see "Tracking"; default `nil`, none).

  ## Concurrency

  Callers send their commands straight to a connection process, never
  through the cache's process. A connection pipelines the commands of all
  the callers that use it and answers them in order, so a slow reply (a
  large value) delays the others on that connection only.

  ## Client

  Larder speaks RESP2 to Redis itself, over `:gen_tcp`: no Redis client
  library is needed, in development or in a release.

  Command connections (`:pool_size` of them, per master on a cluster) are
  each one process that owns its socket:

    * Connecting: within `:timeout`, it sends `AUTH` (`:username` and
      `:password`, as a RESP array, so any bytes are sent as they are) and
      `SELECT` (a `:database` other than 0), and checks that each answers
      `OK`. A connection that cannot be opened, or whose `AUTH` or
      `SELECT` fails, is tried again every `:reconnect_sleep` ms; meanwhile
      calls on its pool slot return `:l2_unavailable` at once.
    * Replies: read incrementally, whatever the TCP segments: an error
      reply is an error (`:l2_failed`) however its bytes arrive, and a
      value is never taken for an error. Nothing is buffered beyond
      `:max_reply_bytes` per reply: a bulk string's declared length is
      checked against it (with the rest of its reply) before any of its
      bytes is kept. A reply may nest at most 16 arrays of at most 2^24
      elements each, and a line (a header, a status, an error) is at
      most 64 KB.
    * Failures: a lost connection, bytes that are not RESP, a reply over
      those bounds, or a reply no caller asked for closes the connection:
      every caller waiting on it gets `:l2_unavailable` at once (the
      details say why: `:closed`, `:bad_reply`, `:reply_too_large`...),
      and a new connection is opened after `:reconnect_sleep` ms. A caller
      whose reply does not come within `:timeout` gets `:l2_unavailable`
      (`:timeout`); a reply that comes later is dropped.
    * Cost: one `GenServer.call` per command. The caller encodes it; the
      connection process sends it (one `:gen_tcp.send`), queues the caller,
      parses what arrives (the socket delivers up to 100 reads before it
      is re-armed) and replies; a bulk string read in one TCP read is a
      sub-binary of it, one spread over several reads is joined once.

  One keeper process, the child spec `init/3` returns (run by the cache's
  supervision tree, see "Processes" in `Larder.Cache`), owns the
  connections: it keeps their pids in the table of the state, which the
  cache's process owns and callers read, replaces a connection that ended
  after `:reconnect_sleep` ms, and runs the pub/sub connection itself. A
  connection that ends is replaced by the keeper, on a timer, rather than
  by a supervisor: a hostile server ends a connection on every reply, a
  loop that no restart intensity should count as a bug. No process
  crashes in a loop: reconnection is a timer, not a restart. If the
  keeper itself dies (a bug, or killed), the cache starts another, which
  fills the same table: the state callers hold stays valid.

  The pub/sub connection sends `AUTH` (with `:password`) and `SUBSCRIBE`,
  and checks every reply. An error reply (`NOAUTH`, `WRONGPASS`, `NOPERM`),
  a handshake reply that is not the one Redis sends, bytes that are not
  RESP, a reply larger than `:max_message_bytes`, a handshake not done
  within `:timeout` ms, or a lost connection closes it: the cache gets
  `{:larder_cache_l2, :disconnected}` if it was subscribed (the
  `[:larder, :cache, :l2, :disconnected]` event), the first failure of a
  run of failures is logged as one warning, and the keeper connects again
  after `:reconnect_sleep` ms, doubling the wait after each failure up to
  2 s (or `:reconnect_sleep`, if longer). Once subscribed again (the
  server's password matches, or Redis is back) the cache gets
  `{:larder_cache_l2, :connected}`, and the wait is back to
  `:reconnect_sleep`. Replies that are not messages on the channel are
  ignored once subscribed.

  ## Sentinel

  With `:sentinel`, the keeper asks the sentinels in turn for the master
  (`SENTINEL get-master-addr-by-name`), each within `:timeout`, and uses
  the first address whose node answers `ROLE` with `master`. On every
  sentinel it can reach (one it cannot reach is tried again every second)
  it subscribes to `+switch-master` and to the events that say a failover
  is under way (`+try-failover`, `+elected-leader`,
  `+failover-state-select-slave`, `+selected-slave`,
  `+failover-state-send-slaveof-noone`, `+failover-state-wait-promotion`,
  `+promoted-slave`, `+failover-state-reconf-slaves`). Each of those that
  names its master clears its L1 at once (the cache gets
  `{:larder_cache_l2, :invalidated, :all}`); one naming another master is
  ignored, one naming none is counted in the cache's `:bad_messages`.
  `+sdown` and `+odown` clear nothing: a master that some or all
  sentinels find down may come back without a failover, and until one
  begins L1 keeps serving, as in any outage. The keeper asks the sentinels again
  on a `+switch-master` for its master, when a command gets `READONLY` or
  finds its connection lost, when the pub/sub connection fails, and every
  100 ms while it knows no master; at most once per `:reconnect_sleep`
  however many callers hint it. What a sentinel or a node says is checked
  (a reply that is not RESP, is larger than 64 KB, or has the wrong shape
  counts as no answer). A master other than the one in use moves every
  connection: the command clients are replaced, and the pub/sub connection
  connects to the new master at once (whatever backoff its failures on the
  old one ran up), and the cache gets `{:larder_cache_l2, :disconnected}`
  then `:connected`, so it clears its L1 and reads the generation there
  (writes the old master acknowledged may be lost, since replication is
  asynchronous). With tracking, the new subscription has a new client id
  on the new master, and every command connection is redirected to it
  before the cache gets `:connected` (see "Tracking").

  What a failover costs a caller: from the old master's death until the
  sentinels elect a new one (their `down-after-milliseconds` plus the
  election) and the keeper hears of it, L2 calls fail with
  `:l2_unavailable` (L1 hits are served, misses call the loader, and
  writes are repaired once the L2 answers, as in any outage); every
  node's L1 is cleared when the failover begins and again when the node
  moves, and values written to the old master that it
  had not yet replicated are gone (a miss, never an old value, since the
  nodes agree on the new master's generation key, or renew it if it was
  lost). The check runs in the keeper, which relays pub/sub messages too:
  while it asks the sentinels (each within `:timeout`), messages wait.

  What a node serves across a failover (the contract):

    * Each node moves on its own: when its keeper hears `+switch-master`
      from any sentinel, or, if it heard none, at its next check (one
      follows every failed attempt to subscribe again, so within
      `max(2 s, :reconnect_sleep) + :reconnect_sleep` of the sentinels
      naming the new master). Its move is done when its subscription is
      up on the new master and its L1 cleared: from then on it serves
      nothing it held before the failover, and hears every other node's
      writes.
    * A node drops its L1 when it hears a failover of its master begin,
      and again when its move is done. The sentinel that leads the
      failover publishes `+try-failover` at least three of its timer
      ticks, and `+elected-leader` at least two, before it sends the
      replica `REPLICAOF NO ONE` (a tick is 50 to 100 ms in Redis 7's
      Sentinel), and no sentinel names the promoted replica as the master
      (so no node can move there and write) before the leader has seen
      the promotion in the replica's `INFO`, which it polls every second
      during a failover. So a node subscribed to the leading sentinel
      whose keeper reads those messages within that margin (at least
      ~150 ms) holds nothing from before the failover once the first put
      on the new master has returned, whether or not it has moved. That
      is as far as Redis lets a client go: nothing orders messages across
      connections, and a node that cannot reach the leading sentinel, or
      reads its messages later than that, serves its L1 until its move
      (milliseconds after the `+switch-master` it hears), as in any
      outage. A failover that is attempted and aborted (no replica fit to
      promote, no leader elected) costs each node an L1 clear per event.
    * Between that clear and its move, a node's L1 misses go to the old
      master: a dead one gives `:l2_unavailable`; one that is still up
      (a partition the sentinels are on the other side of) serves what it
      holds, which the node's move clears again. Tested: a node that
      makes no L2 calls has dropped the old value by the time any
      sentinel names the new master, and a failover event for another
      master, or naming none, leaves L1 alone.
    * A node never goes back on its own writes: once a put made on the
      new master has returned, that node reads that value or a newer one,
      or a miss (a repair of an earlier put of the key that failed
      deletes it; a renewed generation). Tested with the master SIGKILLed
      under 8 readers and writers on 2 nodes
      (`test/larder/cache/redis_sentinel_failover_test.exs`).
    * A caller sees only `:l2_unavailable` from a failover in which the
      old master stays down. An old master that comes back before the
      sentinels make it a replica still says `master` and holds its
      unreplicated writes: a node that has not moved can read from it
      (and, once it is a replica, gets `READONLY`, an `:l2_failed`, which
      makes the node check again).

  `mix run bench/cache_topology_bench.exs` measures the first successful
  put after the master is killed against the sentinels' own failover time
  (down-after 1 s), when a node that makes no L2 calls drops the old value
  from its L1 against that put, how long any node serves the old value
  after it, and an L1 hit on a Sentinel cache against one on a single
  server.

  ## Tracking

  With `:tracking_prefix`, the pub/sub connection also sends `CLIENT ID`
  before subscribing, and subscribes to `__redis__:invalidate` along with
  the cache's channel (each reply checked, as above). Once subscribed, the
  keeper runs `CLIENT TRACKING off` and `CLIENT TRACKING on REDIRECT <id>
  BCAST PREFIX <prefix>` on every command connection (in parallel, within
  `:timeout`), so that Redis sends the pub/sub connection, as a message on
  that channel, every key under the prefix that any client changes, or a
  null after `FLUSHDB`/`FLUSHALL`; only then does the cache get
  `{:larder_cache_l2, :connected}`. Each such message goes to the cache as
  `{:larder_cache_l2, :invalidated, keys | :all}`, or with `:bad` in
  place of the keys when it is not what Redis sends (anyone may `PUBLISH`
  on that channel). A resubscription has a new id, so tracking is set
  again on every connection before the cache hears of it. A command
  connection that replaces one that ended starts with tracking off: every
  100 ms the keeper compares each connection's socket with the one it
  turned tracking on for, and turns it on for a new one; when no connection kept
  its tracking meanwhile, the cache gets `{:larder_cache_l2, :connected}`
  again (and clears L1). A connection whose `CLIENT TRACKING` fails (a
  Redis before 6.0, an ACL without it) is tried again every 100 ms, and
  the first failure of a run is logged. With BCAST every tracking
  connection reports every write, so each node receives `:pool_size`
  reports of each write.

  ## Cluster

  With `:cluster`, the keeper asks the masters it knows, then the seeds,
  in turn (each within `:timeout`) for `CLUSTER SLOTS`, and keeps one pool
  of `:pool_size` connections per master. A command goes to the pool of
  the master that serves its key's slot: CRC16 of the key, or of its hash
  tag (the bytes between the first `{` and the next `}`), modulo 16,384.
  `publish/3` sends `SPUBLISH` to the master of the channel's slot.

  Keys and slots: every key the cache writes is one key in one slot, so
  no command spans slots. The generation key (`<namespace>:<version>:gen`,
  see `Larder.Cache`) is one key, in one slot, on one master, which every
  node reads and increments; its slot moves only when a reshard moves it,
  with its value. A namespace holding a hash tag (`"{shop}"`) puts the
  generation key and all that namespace's data on one master, in one
  slot: one master's memory and load, but nothing to move between them.

  Routing costs a caller one CRC16 of the key and two ETS lookups (the
  slot's master, then the pool's connection) more than on one server.
  What the cluster's changes cost a caller:

    * `MOVED` (a slot moved: a finished reshard, a failover): the command
      is sent again to the named master, one more round trip, and the
      keeper reads `CLUSTER SLOTS` again, at most once per
      `:reconnect_sleep` however many callers hint it. A master the keeper
      has no pool for yet (a promoted replica) is waited for, polling the
      map every 5 ms doubling to 100 ms.
    * `ASK` (a slot halfway through a migration): `ASKING` and the command,
      pipelined on one connection of the named master; one more round
      trip.
    * `TRYAGAIN`, `CLUSTERDOWN`, or a slot no master serves: the command
      is tried again after 5 ms, doubling to 100 ms.
    * At most 5 `MOVED` or `ASK` are followed per command; the 6th is
      `:l2_unavailable`.
    * A lost connection (a master killed): `:l2_unavailable` at once, and
      the keeper reads the map again. Until the cluster promotes a replica
      (its `cluster-node-timeout` plus the election) the keys of that
      master's slots fail as in any outage (L1 serves, misses call the
      loader, writes are repaired once the L2 answers). Replication is
      asynchronous: a write the dead master acknowledged but had not sent
      its replica is lost, and the key then reads as the replica had it.
      A coordinated `CLUSTER FAILOVER` loses nothing: writes wait while
      the replica catches up, then get `MOVED`.
    * A master that leaves the map (it is a replica now) keeps its pool for
      `:timeout` ms, so that callers already on it get their reply (a
      `MOVED`, most likely).

  Every wait and every call is bounded by what is left of the caller's
  `:timeout`: whatever the cluster does, a call returns within
  `:timeout` ms, with `:l2_unavailable` when it could not be served by
  then (a timeout, a lost connection, a redirect loop, a cluster still
  down). Other error replies are `:l2_failed`.

  The pub/sub connection `SSUBSCRIBE`s on the master of the channel's slot
  (sharded pub/sub: a message crosses no other master). When that slot
  moves (Redis sends `-sunsubscribe`, or a new map names another master)
  or the connection is lost, the cache gets `{:larder_cache_l2,
  :disconnected}`, then `:connected` once it is subscribed on the slot's
  master, and clears its L1 as on any resubscribe. Invalidations work as
  on one server.

  With tracking (`invalidation: :tracking`), each master has its own
  pub/sub connection subscribed to `__redis__:invalidate`, and the
  connections of its pool are redirected to it (see "Tracking"): each
  master reports the writes to its own keys. Such a connection lost sends
  `:disconnected`, and `:connected` once it and its master's tracking
  are back.

  What a node says is untrusted: a `CLUSTER SLOTS` reply that is not RESP,
  an error, not a list, or larger than 4 MB is ignored (the next node is
  asked), its entries of the wrong shape or overlapping are skipped, and
  each is counted. A redirect that is not well formed is an error reply
  (`:l2_failed`). Redirects are error replies only: a value whose text
  reads like one is a value.

  ## Failures

  Every call returns within `:timeout` ms; an unreachable, slow or failing
  server gives `{:error, %Larder.Error{reason: :l2_unavailable}}`, an error
  reply gives `:l2_failed`, and a reply that is not what Redis sends for
  that command gives `:l2_bad_reply`: `GET` must return a binary or nil,
  `SET` `"OK"` (or nil with `NX`), `DEL`, `INCR` and `PUBLISH` an integer
  from 0 to 2^63 - 1. Nothing raises or exits, except `ArgumentError` for
  arguments of the wrong type (a key, value, channel or payload that is not
  a binary, a state that `init/3` did not return).

  ## Performance

  A call is one Redis round trip through one of the pool's connection
  processes (a message to it, and the checked reply back). On a cluster,
  the key's slot is computed first (a CRC16, O(key bytes)), and a
  redirect costs one more round trip. `mix run bench/cache_topology_bench.exs` measures, in
  the same run, an L1 hit and an L2 hit on a Sentinel or cluster cache
  against a single-server one (the L1 path is the same code; an L2 hit on
  a cluster is about 1.1x one on a single server), the failover times
  above, and a reshard under load; the README has the table of a full run.
  """

  @behaviour Larder.Cache.L2

  require Logger

  alias Larder.Cache.Redis.{
    Auth,
    ClusterKeeper,
    ClusterRouter,
    Connection,
    Sentinel,
    Subscription
  }

  alias Larder.Cache.Redis.Tracking
  alias Larder.Options

  # Upper bounds of the numeric options (documented in the moduledoc).
  @max_database 1_000_000
  @max_timeout 600_000
  @max_reconnect_sleep 60_000
  @max_pool_size 64
  @max_max_reply_bytes 4_294_967_296
  # How often the keeper checks its table and its clients' tracking.
  @watch_ms 100
  # Longest wait between two pub/sub connection attempts (unless
  # :reconnect_sleep is longer).
  @sub_max_wait_ms 2_000
  # Wait before connecting again to a sentinel whose subscription was lost.
  @sentinel_retry_ms 1_000
  # Longest wait for the keeper to start the clients, beyond their connect
  # timeouts.
  @init_timeout 5_000

  @doc """
  Checks `opts` and builds the state: the table of client pids (owned by
  the caller, public, filled by the keeper) and the options, with the child
  spec of the keeper process (see "Client"), which the cache runs under its
  supervision tree. A keeper that restarts fills the same table, so the
  state never changes. Starts no process. Raises `ArgumentError` for a bad
  option.
  """
  @impl true
  @spec init(keyword(), pid(), binary()) :: {:ok, map(), Supervisor.child_spec()}
  def init(opts, subscriber, channel) do
    opts = validate_opts!(opts)
    table = :ets.new(:larder_cache_redis, [:set, :public, read_concurrency: true])

    unless opts[:cluster],
      do: for(slot <- 0..(opts[:pool_size] - 1), do: :ets.insert(table, {slot, :none}))

    state = %{
      table: table,
      pool_size: opts[:pool_size],
      timeout: opts[:timeout],
      opts: opts,
      # only then can a failed command mean the master moved
      sentinel?: opts[:sentinel] != nil,
      cluster?: opts[:cluster] != nil,
      subscriber: subscriber,
      channel: channel
    }

    {:ok, state, %{id: __MODULE__, start: {__MODULE__, :start_link, [state]}}}
  end

  # The start of init/3's child spec: the keeper, linked to the caller (a
  # supervisor). It starts the command connections (each connecting within
  # :timeout) and the pub/sub connection; it succeeds while Redis is down
  # or not Redis.
  @doc false
  @spec start_link(map()) :: {:ok, pid()} | {:error, :timeout}
  def start_link(state) do
    check_args!(state, [])
    parent = self()
    ref = make_ref()

    keeper =
      if state.cluster?,
        do: spawn_link(fn -> ClusterKeeper.init(parent, ref, state) end),
        else: spawn_link(fn -> keeper_init(parent, ref, state) end)

    receive do
      {^ref, :ready} -> {:ok, keeper}
    after
      @init_timeout + state.pool_size * state.timeout ->
        Process.unlink(keeper)
        Process.exit(keeper, :kill)
        {:error, :timeout}
    end
  end

  @doc "`GET key`: `{:ok, binary}`, `:miss` or an error, within the timeout."
  @impl true
  @spec get(map(), binary()) :: {:ok, binary()} | :miss | {:error, Larder.Error.t()}
  def get(state, key) do
    check_args!(state, key: key)

    case query(state, ["GET", key]) do
      {:ok, :undefined} -> :miss
      {:ok, bin} when is_binary(bin) -> {:ok, bin}
      {:ok, other} -> bad_reply("GET", other)
      {:error, _} = error -> error
    end
  end

  @doc "`SET key value [PX ttl] [NX]`, within the timeout."
  @impl true
  @spec put(map(), binary(), binary(), pos_integer() | :infinity, :always | :new) ::
          :ok | {:error, Larder.Error.t()}
  def put(state, key, value, ttl, mode) do
    check_args!(state, key: key, value: value)

    unless ttl == :infinity or (is_integer(ttl) and ttl > 0 and ttl < 2 ** 63) do
      raise ArgumentError,
            "expected ttl to be a positive integer (ms) or :infinity, got: #{inspect(ttl)}"
    end

    unless mode in [:always, :new] do
      raise ArgumentError, "expected mode to be :always or :new, got: #{inspect(mode)}"
    end

    expiry = if ttl == :infinity, do: [], else: ["PX", Integer.to_string(ttl)]
    cond_ = if mode == :new, do: ["NX"], else: []

    # "OK", or nil when NX found the key: both are :ok
    case query(state, ["SET", key, value | expiry ++ cond_]) do
      {:ok, "OK"} -> :ok
      {:ok, :undefined} when mode == :new -> :ok
      {:ok, other} -> bad_reply("SET", other)
      {:error, _} = error -> error
    end
  end

  @doc "`DEL key`, within the timeout."
  @impl true
  @spec delete(map(), binary()) :: :ok | {:error, Larder.Error.t()}
  def delete(state, key) do
    check_args!(state, key: key)
    state |> query(["DEL", key]) |> integer_reply("DEL", 1) |> ok()
  end

  @doc """
  `INCR key`, within the timeout. A reply that is not an integer from 0 to
  2^63 - 1 is `{:error, %Larder.Error{reason: :l2_bad_reply}}`.
  """
  @impl true
  @spec incr(map(), binary()) :: {:ok, non_neg_integer()} | {:error, Larder.Error.t()}
  def incr(state, key) do
    check_args!(state, key: key)
    state |> query(["INCR", key]) |> integer_reply("INCR", 2 ** 63 - 1)
  end

  @doc "`PUBLISH channel payload`, within the timeout."
  @impl true
  @spec publish(map(), binary(), binary()) :: :ok | {:error, Larder.Error.t()}
  def publish(state, channel, payload) do
    check_args!(state, channel: channel, payload: payload)
    state |> query(["PUBLISH", channel, payload]) |> integer_reply("PUBLISH", 2 ** 63 - 1) |> ok()
  end

  @doc """
  Nothing to release: the keeper is stopped by its supervisor, and the
  table goes with the process that called `init/3`.
  """
  @impl true
  @spec stop(map()) :: :ok
  def stop(state) do
    check_args!(state, [])
    :ok
  end

  # Commands on one connection are answered in order, so a large value
  # holds up whatever was sent after it: spread callers over the pool by
  # scheduler. A caller waits for each reply, so its own commands stay in
  # order whichever connection they take. The keeper replaces a client that
  # died, and its pid is looked up in the keeper's table. On a cluster, the
  # router sends it to the pool of the master of the key's slot.
  defp query(%{cluster?: true} = state, command), do: ClusterRouter.query(state, command)

  defp query(%{table: table, pool_size: size, timeout: timeout} = state, command) do
    slot = rem(:erlang.system_info(:scheduler_id), size)
    [{_, client}] = :ets.lookup(table, slot)

    case Connection.q(client, command, timeout) do
      {:ok, value} ->
        {:ok, value}

      {:error, reason} when is_binary(reason) ->
        if match?("READONLY" <> _, reason), do: master_moved?(state)
        {:error, Larder.Error.new(:l2_failed, "Redis replied with an error", error: reason)}

      {:error, reason} ->
        master_moved?(state)
        {:error, unavailable(reason)}
    end
  catch
    # the keeper (and its table) is gone
    :error, _ -> {:error, unavailable(:no_client)}
  end

  # A READONLY reply or a lost connection: with Sentinel, the master may
  # have moved; the keeper asks the sentinels (at most once per
  # :reconnect_sleep, whatever the number of callers that hint it).
  defp master_moved?(%{sentinel?: false}), do: :ok

  defp master_moved?(%{table: table}) do
    case :ets.lookup(table, :sentinel) do
      [{:sentinel, keeper}] -> send(keeper, :check_master)
      [] -> :ok
    end
  end

  defp check_args!(state, binaries) do
    unless match?(
             %{table: table, pool_size: size, timeout: _, opts: _, subscriber: sub, channel: _}
             when is_reference(table) and is_integer(size) and size > 0 and is_pid(sub),
             state
           ) do
      raise ArgumentError,
            "expected state to be what Larder.Cache.Redis.init/3 returned, got: #{inspect(state, limit: 10)}"
    end

    for {name, value} <- binaries, not is_binary(value) do
      raise ArgumentError, "expected #{name} to be a binary, got: #{inspect(value, limit: 10)}"
    end

    :ok
  end

  # An integer reply: decimal digits of a value in 0..max.
  defp integer_reply({:ok, bin}, command, max) when is_binary(bin) and byte_size(bin) in 1..20 do
    case Integer.parse(bin) do
      {n, ""} when n >= 0 and n <= max -> {:ok, n}
      _ -> bad_reply(command, bin)
    end
  end

  defp integer_reply({:ok, other}, command, _max), do: bad_reply(command, other)
  defp integer_reply({:error, _} = error, _command, _max), do: error

  defp bad_reply(command, reply) do
    {:error,
     Larder.Error.new(:l2_bad_reply, "the server's reply is not what Redis sends",
       command: command,
       reply: truncate(reply)
     )}
  end

  defp truncate(bin) when is_binary(bin) and byte_size(bin) > 64,
    do: binary_part(bin, 0, 64) <> "..."

  defp truncate(other), do: inspect(other, limit: 10, printable_limit: 64)

  defp ok({:ok, _reply}), do: :ok
  defp ok({:error, _} = error), do: error

  defp unavailable(reason),
    do: Larder.Error.new(:l2_unavailable, "Redis is unreachable", error: reason)

  @doc "Checks the options above; raises `ArgumentError` naming a bad one."
  @impl true
  @spec validate_opts!(keyword()) :: keyword()
  def validate_opts!(opts) do
    schema = [
      host: {{:string, 1, 255}, "127.0.0.1"},
      port: {{:integer, 1, 65_535}, 6379},
      database: {{:integer, 0, @max_database}, 0},
      password: {{:or_nil, {:custom, "a string", &is_binary/1}}, nil},
      timeout: {{:integer, 1, @max_timeout}, 1000},
      reconnect_sleep: {{:integer, 1, @max_reconnect_sleep}, 100},
      pool_size: {{:integer, 1, @max_pool_size}, 2},
      max_reply_bytes: {{:integer, 1024, @max_max_reply_bytes}, 134_217_728},
      max_message_bytes: {{:integer, 1024, @max_max_reply_bytes}, 1_048_576},
      sentinel: {{:custom, "a keyword list", &(is_nil(&1) or is_list(&1))}, nil},
      cluster: {{:custom, "a list of {host, port} seeds", &(is_nil(&1) or is_list(&1))}, nil},
      username: {{:or_nil, {:string, 1, 255}}, nil},
      tracking_prefix: {{:or_nil, {:string, 0, 4096}}, nil}
    ]

    opts
    |> Options.validate!(schema, "Larder.Cache.Redis")
    |> Keyword.update!(:sentinel, &Sentinel.validate!/1)
    |> ClusterKeeper.validate!(opts)
  end

  ## The keeper: owns the command connections (their pids are in its table,
  ## by pool slot), replaces one that ends,
  ## and runs the pub/sub connection (below), relaying its messages to the
  ## subscriber.

  defp keeper_init(parent, ref, %{opts: opts, table: table} = l2) do
    Process.flag(:trap_exit, true)
    %{subscriber: subscriber, channel: channel} = l2
    put_slot(table, :keeper, self())

    state = %{
      parent: parent,
      subscriber: subscriber,
      channel: channel,
      opts: opts,
      table: table,
      # the master's address; nil while Sentinel names none
      host: if(opts[:sentinel], do: nil, else: String.to_charlist(opts[:host])),
      port: opts[:port],
      master_warned: false,
      sentinel: opts[:sentinel],
      watchers: %{},
      check: nil,
      clients: %{},
      sub: nil,
      sub_wait: opts[:reconnect_sleep],
      sub_failing: false,
      tracking: Tracking.new(opts[:tracking_prefix])
    }

    # with Sentinel, the master first (the clients are started below)
    state = if state.sentinel, do: watch_sentinels(find_master(state)), else: state

    # a client connects in start_link (bounded by :timeout each), so the
    # first calls find a connected client when Redis is up.
    state = Enum.reduce(0..(opts[:pool_size] - 1), state, &start_client(&2, &1))
    send(parent, {ref, :ready})
    Process.send_after(self(), :watch, @watch_ms)
    keeper_loop(sub_connect(state))
  end

  defp start_client(%{host: nil} = state, slot) do
    put_slot(state.table, slot, :none)
    Process.send_after(self(), {:start_client, slot}, state.opts[:reconnect_sleep])
    state
  end

  defp start_client(state, slot) do
    opts = state.opts

    conn_opts = [
      timeout: opts[:timeout],
      database: opts[:database],
      auth: Auth.commands(opts),
      max_reply_bytes: opts[:max_reply_bytes]
    ]

    case Connection.start_link(state.host, state.port, conn_opts) do
      {:ok, client} ->
        put_slot(state.table, slot, client)
        %{state | clients: Map.put(state.clients, client, slot)}

      {:error, _reason} ->
        # callers see :l2_unavailable until the retry succeeds
        put_slot(state.table, slot, :none)
        Process.send_after(self(), {:start_client, slot}, opts[:reconnect_sleep])
        state
    end
  end

  ## The pub/sub connection, run by the keeper itself on its own socket:
  ## AUTH (with a password) and SUBSCRIBE, then every message is relayed.
  ## Each reply is checked. An error reply (NOAUTH, WRONGPASS, NOPERM...),
  ## a handshake reply that is not the one Redis sends, bytes that are not
  ## RESP, a reply above :max_message_bytes, a handshake not done within
  ## :timeout, or a lost connection closes the socket: the subscriber gets
  ## :disconnected if it was subscribed, the first failure of a streak is
  ## logged (one line), and the keeper connects again after a wait that
  ## doubles from :reconnect_sleep up to @sub_max_wait_ms, back to
  ## :reconnect_sleep once subscribed. Nothing crashes; nothing is retried
  ## faster than that.

  defp sub_connect(%{host: nil} = state), do: sub_failed(state, :no_master)

  defp sub_connect(state) do
    opts = state.opts
    auth = Auth.commands(opts)
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
      {:error, reason} -> sub_failed(state, reason)
    end
  end

  defp sub_data(%{sub: sub} = state, data) do
    case Subscription.read(sub, data) do
      {:ok, replies, sub} -> Enum.reduce_while(replies, %{state | sub: sub}, &sub_reply/2)
      {:error, reason} -> sub_failed(state, reason)
    end
  end

  defp sub_reply({:error, message}, state),
    do: {:halt, sub_failed(state, {:error_reply, error_text(message)})}

  defp sub_reply({:ok, "OK"}, %{sub: %{expect: [:auth | expect]}} = state),
    do: {:cont, handshake_step(state, expect)}

  defp sub_reply({:ok, id}, %{sub: %{expect: [:client_id | expect]}} = state) do
    case Tracking.parse_id(id) do
      {:ok, id} ->
        {:cont, handshake_step(%{state | tracking: %{state.tracking | id: id}}, expect)}

      :error ->
        {:halt, sub_failed(state, {:bad_reply, truncate(id)})}
    end
  end

  defp sub_reply(
         {:ok, ["subscribe", channel, _count]},
         %{sub: %{expect: [:subscribe | expect]}} = state
       )
       when channel == state.channel,
       do: {:cont, handshake_step(state, expect)}

  defp sub_reply(
         {:ok, ["subscribe", channel, _count]},
         %{sub: %{expect: [:tracking | expect]}} = state
       ) do
    if channel == Tracking.channel(),
      do: {:cont, handshake_step(state, expect)},
      else: {:halt, sub_failed(state, {:bad_reply, truncate(channel)})}
  end

  defp sub_reply({:ok, ["message", channel, payload]}, %{sub: %{expect: []}} = state)
       when channel == state.channel and is_binary(payload) do
    send(state.subscriber, {:larder_cache_l2, :message, payload})
    {:cont, state}
  end

  defp sub_reply({:ok, ["message", channel, payload]}, %{sub: %{expect: []}} = state)
       when state.tracking != nil and channel == "__redis__:invalidate" do
    send(state.subscriber, Tracking.relay(payload))
    {:cont, state}
  end

  defp sub_reply({:ok, reply}, %{sub: %{expect: [_ | _]}} = state),
    do: {:halt, sub_failed(state, {:bad_reply, truncate(reply)})}

  # anything else once subscribed is not ours: ignored
  defp sub_reply({:ok, _reply}, state), do: {:cont, state}

  defp handshake_step(%{sub: sub} = state, [_ | _] = expect),
    do: %{state | sub: %{sub | expect: expect}}

  # Subscribed: with tracking, every data connection is redirected to this
  # connection's (new) id first, so that the cache, which clears L1 on
  # :connected, keeps nothing a write could have changed unreported.
  defp handshake_step(%{sub: sub} = state, []) do
    Process.cancel_timer(sub.timer)

    state =
      if state.tracking,
        do: %{
          state
          | tracking:
              Tracking.enable_all(
                state.tracking,
                state.tracking.id,
                state.clients,
                state.opts[:timeout]
              )
        },
        else: state

    send(state.subscriber, {:larder_cache_l2, :connected})
    if state.sub_failing, do: Logger.info("Larder.Cache.Redis: pub/sub subscribed again")
    sub = %{sub | expect: [], timer: nil}
    %{state | sub: sub, sub_wait: state.opts[:reconnect_sleep], sub_failing: false}
  end

  # A data connection that replaced one that failed gets its tracking
  # back; if none kept it meanwhile, the cache re-reads as on a resubscribe.
  defp check_tracking(%{tracking: tracking, sub: %{expect: []}} = state) when tracking != nil do
    {tracking, gap?} = Tracking.check(tracking, state.clients, state.opts[:timeout])
    if gap?, do: send(state.subscriber, {:larder_cache_l2, :connected})
    %{state | tracking: tracking}
  end

  defp check_tracking(state), do: state

  defp error_text(message) when is_binary(message),
    do: binary_part(message, 0, min(byte_size(message), 200))

  defp error_text(other), do: truncate(other)

  # A subscription that is lost is reported to the subscriber; a connection
  # attempt that fails is logged, the first of a run of failures only.
  defp sub_failed(state, reason) do
    lost? = state.sub != nil and state.sub.expect == []

    if state.sub, do: Subscription.close(state.sub)

    cond do
      lost? ->
        send(state.subscriber, {:larder_cache_l2, :disconnected})

      not state.sub_failing ->
        Logger.warning(
          "Larder.Cache.Redis: the pub/sub connection of channel #{inspect(state.channel)} " <>
            "failed (#{inspect(reason)}); " <>
            "connecting again every #{state.sub_wait} ms, backing off to " <>
            "#{sub_max_wait(state)} ms, until it subscribes"
        )

      true ->
        :ok
    end

    Process.send_after(self(), :reconnect, state.sub_wait)
    # the master may have moved (Sentinel)
    if state.sentinel, do: send(self(), :check_master)
    wait = min(state.sub_wait * 2, sub_max_wait(state))
    %{state | sub: nil, sub_failing: not lost?, sub_wait: wait}
  end

  defp sub_max_wait(state), do: max(@sub_max_wait_ms, state.opts[:reconnect_sleep])

  defp keeper_loop(%{sub: sub, parent: parent, watchers: watchers} = state) do
    socket = sub && sub.socket

    receive do
      {:tcp, w, data} when is_map_key(watchers, w) ->
        keeper_loop(sentinel_data(state, w, data))

      {:tcp_closed, w} when is_map_key(watchers, w) ->
        keeper_loop(sentinel_lost(state, w))

      {:tcp_error, w, _reason} when is_map_key(watchers, w) ->
        keeper_loop(sentinel_lost(state, w))

      {:watch_sentinel, addr} ->
        keeper_loop(watch_sentinel(state, addr))

      :check_master ->
        keeper_loop(request_check(state))

      :find_master ->
        keeper_loop(find_master(%{state | check: nil}))

      {:tcp, ^socket, data} when socket != nil ->
        keeper_loop(sub_data(state, data))

      {:tcp_closed, ^socket} when socket != nil ->
        keeper_loop(sub_failed(state, :closed))

      {:tcp_error, ^socket, reason} when socket != nil ->
        keeper_loop(sub_failed(state, {:tcp_error, reason}))

      {:sub_timeout, ^socket} when socket != nil ->
        # (a timer that fired as the subscription came up is ignored)
        keeper_loop(if sub.expect == [], do: state, else: sub_failed(state, :timeout))

      :reconnect ->
        keeper_loop(if sub == nil, do: sub_connect(state), else: state)

      {:start_client, slot} ->
        # (a move may have started that slot's client meanwhile)
        taken? = Enum.any?(state.clients, fn {_pid, s} -> s == slot end)
        keeper_loop(if taken?, do: state, else: start_client(state, slot))

      :watch ->
        watch(state)
        Process.send_after(self(), :watch, @watch_ms)
        state = check_tracking(state)
        # no master known (Sentinel named none, or it was down): ask again
        keeper_loop(if state.sentinel && state.host == nil, do: request_check(state), else: state)

      :stop ->
        shutdown(state)

      {:EXIT, ^parent, reason} ->
        shutdown(state)
        exit(reason)

      {:EXIT, pid, reason} ->
        keeper_loop(handle_exit(state, pid, reason))

      _other ->
        keeper_loop(state)
    end
  end

  # A client that ended (its connection failed: see Connection) is
  # replaced after reconnect_sleep; until then its slot answers
  # :l2_unavailable.
  defp handle_exit(state, pid, reason) do
    case Map.pop(state.clients, pid) do
      {nil, _clients} ->
        state

      {slot, clients} ->
        Logger.warning("Larder.Cache.Redis: client exited: #{inspect(truncate(reason))}")
        put_slot(state.table, slot, :none)
        Process.send_after(self(), {:start_client, slot}, state.opts[:reconnect_sleep])
        %{state | clients: clients}
    end
  end

  defp watch(state) do
    # A keeper that was replaced (its runner killed) may still be shutting
    # down beside us and write its last slot updates over ours: the table
    # says what this keeper holds again within one watch.
    for {pid, slot} <- state.clients,
        :ets.lookup(state.table, slot) != [{slot, pid}],
        do: put_slot(state.table, slot, pid)

    if :ets.lookup(state.table, :keeper) != [{:keeper, self()}],
      do: put_slot(state.table, :keeper, self())

    :ok
  catch
    # the table's owner is gone: the cache is stopping
    :error, :badarg -> :ok
  end

  ## Sentinel: the keeper finds the master at start, holds a +switch-master
  ## subscription on every sentinel (reconnected every second while one is
  ## away), and asks the sentinels again on a +switch-master, a caller's
  ## READONLY or lost connection, or a lost subscription, at most once per
  ## :reconnect_sleep. A master other than the one in use (checked with its
  ## own ROLE) moves every connection to it: the clients are replaced and
  ## the pub/sub connection reconnects, so the cache resubscribes and
  ## clears its L1 (writes acknowledged by the old master may be lost).

  defp request_check(%{check: nil} = state) do
    %{state | check: Process.send_after(self(), :find_master, state.opts[:reconnect_sleep])}
  end

  defp request_check(state), do: state

  defp find_master(state) do
    case Sentinel.master(state.sentinel, Auth.commands(state.opts), state.opts[:timeout]) do
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
            "Larder.Cache.Redis: no master from Sentinel yet (#{inspect(truncate(reason))})"
          )
        end

        %{state | master_warned: true}
    end
  end

  defp move(state, host, port) do
    if state.host,
      do: Logger.warning("Larder.Cache.Redis: the master moved to #{host}:#{port}; moving")

    for {pid, slot} <- state.clients do
      stop_client(pid)
      put_slot(state.table, slot, :none)
    end

    state = %{state | host: host, port: port, clients: %{}, master_warned: false}
    state = Enum.reduce(0..(state.opts[:pool_size] - 1), state, &start_client(&2, &1))

    # Whether or not it was subscribed, the cache must clear its L1 when the
    # subscription comes up on the new master: what it read from the old
    # one may be lost. :disconnected tells it so.
    send(state.subscriber, {:larder_cache_l2, :disconnected})

    # The subscription moves at once, even when it is waiting out the
    # backoff of its failures on the old master (up to 2 s): until it is
    # up there, this node's commands reach the new master while its L1
    # still holds what it read from the old one, and it hears no other
    # node's writes.
    state =
      case state.sub do
        nil ->
          state

        sub ->
          Subscription.close(sub)
          %{state | sub: nil}
      end

    sub_connect(%{state | sub_wait: state.opts[:reconnect_sleep]})
  end

  defp watch_sentinels(state) do
    put_slot(state.table, :sentinel, self())
    Enum.reduce(state.sentinel[:sentinels], state, &watch_sentinel(&2, &1))
  end

  defp watch_sentinel(state, addr) do
    case Sentinel.subscribe(addr, state.sentinel, state.opts[:timeout]) do
      {:ok, socket} ->
        watcher = %{addr: addr, parser: Sentinel.parser(), partial: 0}
        %{state | watchers: Map.put(state.watchers, socket, watcher)}

      {:error, _reason} ->
        Process.send_after(self(), {:watch_sentinel, addr}, @sentinel_retry_ms)
        state
    end
  end

  defp sentinel_data(state, socket, data) do
    watcher = Map.fetch!(state.watchers, socket)
    :inet.setopts(socket, active: :once)

    case Sentinel.read(watcher.parser, watcher.partial, data) do
      {:ok, events, parser, partial} ->
        watcher = %{watcher | parser: parser, partial: partial}
        state = %{state | watchers: Map.put(state.watchers, socket, watcher)}
        master = state.sentinel[:master]
        # A failover of our master is under way: drop L1 now, before the
        # promoted replica can take a write (see "Sentinel"); counted as
        # a bad message when the event names no master.
        if {:failover, master} in events,
          do: send(state.subscriber, {:larder_cache_l2, :invalidated, :all})

        for :bad <- events, do: send(state.subscriber, {:larder_cache_l2, :invalidated, :bad})
        if {:switch, master} in events, do: find_master(state), else: state

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

  defp shutdown(state) do
    for socket <- Map.keys(state.watchers), do: :gen_tcp.close(socket)
    for pid <- Map.keys(state.clients), do: stop_client(pid)
    if state.sub, do: :gen_tcp.close(state.sub.socket)
    :ok
  end

  # The table belongs to the process that called init/3; once it is gone
  # nobody reads it.
  defp put_slot(table, slot, value) do
    :ets.insert(table, {slot, value})
  catch
    :error, :badarg -> true
  end

  defp stop_client(client) do
    Process.unlink(client)
    Process.exit(client, :kill)
  end
end
