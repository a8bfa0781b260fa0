defmodule Larder.Cache.Redis do
  @moduledoc """
  The Redis second level of `Larder.Cache` (a `Larder.Cache.L2`).

  Use it as `l2: {Larder.Cache.Redis, redis_opts}` in `Larder.Cache.start_link/1`.

  ## Contract

  The adapter is five commands over Larder's internal Redis client (which
  speaks RESP2 over `:gen_tcp` itself: no Redis client library is needed,
  in development or in a release):

    * `get/2` is `GET key`: `{:ok, binary}`, or `:miss` for nil.
    * `put/5` is `SET key value [PX ttl] [NX]`: `:ok` for `OK` (and for
      nil with `NX`, a key that was there).
    * `delete/2` is `DEL key`, `incr/2` is `INCR key` (the cache's
      generation), `publish/3` is `PUBLISH channel payload` (`SPUBLISH` on
      a cluster): each reply an integer from 0 to 2^63 - 1.

  Each call goes from the caller straight to one command connection of a
  pool of `:pool_size` (per master on a cluster), chosen by scheduler;
  never through the cache's process. What the client reports is turned
  into the cache's terms: an error reply is `:l2_failed`, a reply that is
  not what Redis sends for the command is `:l2_bad_reply`, and anything
  else that keeps a reply from coming within `:timeout` (no connection,
  a lost one, a timeout, a reply over `:max_reply_bytes`, bytes that are
  not RESP, a redirect loop, a cluster still down) is `:l2_unavailable`,
  with the client's reason as the error's `:error` detail (`:closed`,
  `:timeout`, `:bad_reply`, `:reply_too_large`, `:no_connection`...).

  ## Processes

  The adapter is a thin layer over the client's topology (a single
  server, the master a Sentinel set names, or a Redis Cluster), whose
  processes are the child spec `init/3` returns, run by the cache's
  supervision tree (see "Processes" in `Larder.Cache`):

    * the L2's process, which starts the topology linked to it and turns
      its messages into the cache's (below);
    * the topology's manager (it finds the master, reads the cluster's
      slot map, hears the sentinels, redirects tracking);
    * a pool of `:pool_size` command connections per master, whose pids
      are in the table of the state (which the cache's process owns and
      callers read);
    * a pub/sub connection on the cache's channel (and, with Sentinel, one
      per sentinel; on a cluster with tracking, one per master).

  Every connection reconnects on its own, with one backoff: a connection
  that could not be opened, or that failed, is tried again after
  `:reconnect_sleep` ms, the wait doubling after each failure up to 2 s
  (or `:reconnect_sleep`, if longer), each wait +-25% at random, back to
  `:reconnect_sleep` once it is up. A pool whose server refuses (or
  closes connections as they open) tries one connection per wait, and
  opens the others once it connects; meanwhile calls on its connections
  return `:l2_unavailable` at once. A server that is down, refuses or
  answers garbage never makes a process exit: they exit only when killed
  or on a bug, and any of them that exits takes the others with it, so
  that the cache starts them again (after its own backoff, see
  `Larder.Cache.L2`) and the new ones fill the same table: the state
  callers hold stays valid.

  Every warning names the server (`host:port`, the Sentinel master and
  its sentinels, or the cluster's nodes), says what failed in words
  ("connection refused", "the host name does not resolve", "Redis refused
  SUBSCRIBE: NOPERM ...") and what comes next; a failing pub/sub
  connection logs the first failure of a run, a pool the first ended
  connection and then at most one line per 30 s.

  ## Messages

  The L2's process turns what the topology reports into the messages of
  `Larder.Cache.L2`, sent to the cache's process:

    * a payload published on the channel: `{:larder_cache_l2, :message,
      payload}`;
    * the subscription up (again): `{:larder_cache_l2, :connected}`, after
      which the cache re-reads its generation; with tracking, only once
      every command connection is redirected to the new subscription;
    * the subscription lost (an error reply such as `NOAUTH`, a
      handshake reply that is not Redis's, bytes that are not RESP, a
      message over `:max_message_bytes`, a handshake not done within
      `:timeout`, a closed connection): `{:larder_cache_l2,
      :disconnected}` if it was subscribed (the cache reports the
      `[:larder, :cache, :l2, :disconnected]` event, and clears its L1 at
      the next `:connected`); the first failure of a run is logged as one
      warning, and the connection subscribes again with the backoff above;
    * keys Redis reports changed (tracking): `{:larder_cache_l2,
      :invalidated, keys | :all | :bad}` (see "Tracking");
    * a failover that begins, or a move to another master (Sentinel):
      `{:larder_cache_l2, :invalidated, :all}`, and `{:larder_cache_l2,
      :replaced}` (see "Sentinel");
    * Redis refusing what the invalidation needs (tracking, or the
      subscription): `{:larder_cache_l2, :refused, error}` (see "Tracking"
      and "Redis refusing the subscription").

  Replies that are not messages on the channel are ignored once
  subscribed.

  ## Options

  The connection options (`:url`, `:host` to `:max_reply_bytes`,
  `:sentinel` and `:cluster`) are the ones `Larder.Replica.RedisStream`
  takes under `:redis`, checked by one schema.

    * `:url` - the server as `"redis://[[username]:password@]host[:port][/database]"`
      (user and password percent-encoded), instead of `:host`, `:port`,
      `:username`, `:password` and `:database`, which it excludes, as it
      excludes `:sentinel` and `:cluster` (default `nil`). `rediss://` (TLS)
      is refused: this client speaks plain TCP.
    * `:host` - the server's host name or address, 1 to 255 bytes (default
      `"127.0.0.1"`).
    * `:port` - its TCP port, 1 to 65535 (default `6379`).
    * `:database` - the database index selected on connect, 0 to 1,000,000
      (default `0`).
    * `:password` - sent with `AUTH` on connect, 0 to 4,096 bytes (default
      none).
    * `:username` - a Redis 6 ACL user, 1 to 255 bytes, sent with
      `:password` as `AUTH <username> <password>` by every data and
      pub/sub connection, on every reconnect too (default none: `AUTH
      <password>`).
    * `:timeout` - the L2 timeout in milliseconds, 1 to 600,000 (default
      `1000`): one call of the cache (a `fetch/3`, `put/4`, `delete/2`,
      `invalidate_all/1`) waits at most this for Redis in all, across every
      command, redirect and retry it makes (`deadline/2`), whatever state
      Redis is in. The topology's own steps (a connection's connect and
      handshake, a question to a sentinel, a `CLUSTER SLOTS`) are each
      bounded by it too; callers never wait for them.
    * `:reconnect_sleep` - the first wait before a connection that failed
      or ended is opened again, 1 to 60,000 ms (default `100`): the wait
      doubles while it keeps failing, up to 2 s or `:reconnect_sleep`, if
      longer (see "Processes").
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

  ## Sentinel

  With `:sentinel`, the topology's manager asks the sentinels in turn for
  the master (`SENTINEL get-master-addr-by-name`), each within `:timeout`,
  and uses the first address whose node answers `ROLE` with `master`. On
  every sentinel it can reach (one it cannot reach is tried again with the
  backoff of "Processes") it subscribes to `+switch-master` and to the
  events that say a failover is under way (`+try-failover`, `+elected-leader`,
  `+failover-state-select-slave`, `+selected-slave`,
  `+failover-state-send-slaveof-noone`, `+failover-state-wait-promotion`,
  `+promoted-slave`, `+failover-state-reconf-slaves`). Each of those that
  names its master clears its L1 at once (the cache gets
  `{:larder_cache_l2, :invalidated, :all}`); one naming another master is
  ignored, one naming none is counted in the cache's `:bad_messages`.
  `+sdown` and `+odown` clear nothing: a master that some or all
  sentinels find down may come back without a failover, and until one
  begins L1 keeps serving, as in any outage. From the first of
  `+failover-state-send-slaveof-noone` (the leading sentinel sends the
  replica `REPLICAOF NO ONE` one of its ticks later),
  `+failover-state-wait-promotion`, `+promoted-slave` and
  `+failover-state-reconf-slaves` that names its master, the manager
  sends the old master nothing more, since whatever it acknowledges from
  then on is lost: its command connections are closed, and L2 calls fail
  with `:l2_unavailable` at once (L1 hits are served, misses call the
  loader, writes are repaired on the new master), until the manager moves,
  a sentinel publishes `-failover-abort-not-elected`,
  `-failover-abort-no-good-slave` or `-failover-abort-slave-timeout` for
  its master (it subscribes to those too), or 5 s have passed (a
  failover that takes longer: the connections to the master in use are
  opened again). Its subscription stays, so the other nodes' writes are
  still heard. The manager asks the sentinels again on a `+switch-master`
  for its master, when a command gets `READONLY` or finds its connection
  lost, when the pub/sub connection fails or the master refuses the
  pool's connections, and every 100 ms while it knows no master or a
  promotion is under way; at most once per `:reconnect_sleep` however
  many callers hint it. What a sentinel or a node says is checked (a
  reply that is not RESP, is larger than 64 KB, or has the wrong shape
  counts as no answer). A master other than the one in use moves every
  connection: the command clients are replaced, the cache gets
  `{:larder_cache_l2, :replaced}`, and the pub/sub connection connects to
  the new master at once (whatever backoff its failures on the old one
  ran up), and the cache gets `{:larder_cache_l2, :disconnected}` then
  `:connected`, so it clears its L1 and reads the generation there. On
  `:replaced` the cache moves to a new generation on the new master
  (`INCR` of its generation key, checked and published as
  `invalidate_all/1` does; retried as a pending invalidate-all while the
  new master does not answer): the new master is a promoted replica,
  which lacks the writes the old master acknowledged but had not
  replicated, and holds the older values they had replaced under the same
  keys. No node reads those keys again. (A node that hears the leading
  sentinel sends the old master no write after the promotion, but one
  that does not, or reads the event late, can have writes acknowledged
  there and lost.) Tested: under `SENTINEL FAILOVER`, the old master
  runs no write from 200 ms after the replica says it is a master. With tracking, the new subscription has a new client id
  on the new master, and every command connection is redirected to it
  before the cache gets `:connected` (see "Tracking").

  What a failover costs a caller: from the old master's death until the
  sentinels elect a new one (their `down-after-milliseconds` plus the
  election) and the manager hears of it, L2 calls fail with
  `:l2_unavailable` (L1 hits are served, misses call the loader, and
  writes are repaired once the L2 answers, as in any outage); every
  node's L1 is cleared when the failover begins and again when the node
  moves; every value the cache stored in Redis before the failover is
  gone (each node that moves renews the generation on the new master),
  and with it every write the old master acknowledged but had not
  replicated: a miss, never an older value. The check runs in the
  manager, which relays the subscription's messages too: while it asks
  the sentinels (each within `:timeout`), messages wait.

  What a node serves across a failover (the contract):

    * Each node moves on its own: when its manager hears `+switch-master`
      from any sentinel, or, if it heard none, at its next check (one
      follows every failed attempt to subscribe again, so within
      `max(2 s, :reconnect_sleep) + :reconnect_sleep` of the sentinels
      naming the new master). Its move is done when it has renewed the
      generation on the new master (one `INCR` and one `GET`, each within
      `:timeout`) and its subscription is up there: from then on it
      serves nothing it held or that Redis held before the failover, and
      hears every other node's writes.
    * The repair window: once `max(2 s, :reconnect_sleep) +
      :reconnect_sleep + :timeout` has passed after a sentinel named the
      new master, no node that heard `+switch-master` from a sentinel, or
      whose old master is dead, serves a value older than the newest put
      of its key that had returned `:ok` before the read began (on any
      node), while the new master answers; a write the old master
      acknowledged but did not replicate is a miss. Inside the window, a
      node that has switched its connections but not yet renewed the
      generation (the `INCR` and `GET` round trips) can read the promoted
      replica's older values. A node that hears no sentinel while its old
      master still runs moves only when that master stops answering as
      one (`READONLY`, or its connections closed when the sentinels make
      it a replica), and can serve the older values until then. With
      `codec: :raw` the keys hold no generation, so a failover can serve
      the older values a promoted replica holds for as long as they are
      not written again. Tested with `SENTINEL FAILOVER`
      (the old master still running) under 8 writers and 4 readers on 2
      nodes, every operation recorded and checked
      (`test/larder/cache/redis/sentinel_history_test.exs`).
    * A node drops its L1 when it hears a failover of its master begin,
      and again when its move is done. The sentinel that leads the
      failover publishes `+try-failover` at least three of its timer
      ticks, and `+elected-leader` at least two, before it sends the
      replica `REPLICAOF NO ONE` (a tick is 50 to 100 ms in Redis 7's
      Sentinel), and no sentinel names the promoted replica as the master
      (so no node can move there and write) before the leader has seen
      the promotion in the replica's `INFO`, which it polls every second
      during a failover. So a node subscribed to the leading sentinel
      whose manager reads those messages within that margin (at least
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
      (`test/larder/cache/redis/sentinel_failover_test.exs`).
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

  With `:tracking_prefix` (the cache's `invalidation: :tracking`), every
  command connection has `CLIENT TRACKING` on in BCAST mode for the
  prefix, redirected to the manager's pub/sub connection, so that Redis
  reports there every key under the prefix that any client changes, or a
  flush (`FLUSHDB`/`FLUSHALL`). The cache gets `{:larder_cache_l2,
  :invalidated, keys | :all}`, or `:bad` in place of the keys when the
  message is not what Redis sends (anyone may `PUBLISH` on that channel).
  The cache gets `{:larder_cache_l2, :connected}` only once tracking was
  set, redirected to the current subscription, on every command
  connection, and at least one has it (a resubscription has a new client
  id, so tracking is set again on every connection first): with BCAST
  every tracking connection reports every write, so one is enough, and
  each node receives up to `:pool_size` reports of each write. A command
  connection that replaces one that ended is redirected within 100 ms;
  when no connection kept its tracking meanwhile, the cache gets
  `:connected` again (and clears L1). A connection whose `CLIENT TRACKING`
  fails is tried again every 100 ms.

  Redis may refuse tracking: a user whose ACL lacks `CLIENT ID`, `CLIENT
  TRACKING`, `SUBSCRIBE` or the channels `__redis__:invalidate` and the
  cache's (`-client`, `-client|tracking`, `resetchannels`), a Redis before
  6.0, or `AUTH` itself refused. Nothing would then invalidate what the
  cache's L1 holds, so:

    * At the cache's start, the manager first tries those commands on a
      connection of its own (on every master of a cluster): if Redis
      answers with a refusal, `Larder.Cache.start_link/1` returns `{:error,
      %Larder.Error{reason: :l2_failed}}` whose message names the server,
      the user (`"default"` without `:username`), the command refused and
      Redis's reply, the grant that fixes it (`ACL SETUSER <user>
      +client|id +client|tracking +subscribe &__redis__:invalidate
      &<channel>`) and the other way out (`invalidation: :pubsub`); its
      `:details` hold `:server`, `:user`, `:command`, `:reply` and
      `:needs`. A server that does not answer does not stop the start.
    * Later (the ACL changed and the connections were renewed, a Sentinel
      failover to a server with another ACL, a cluster master with its own
      ACL), when the pub/sub handshake gets an error reply, or no command
      connection of a server (of any master) tracks and Redis refused
      `CLIENT TRACKING`, the cache gets `{:larder_cache_l2, :refused,
      error}`, the same error: it logs it (once),
      counts it in `:l2_errors`, clears its L1 and keeps nothing in it,
      every read going to Redis or the loader, and reads the generation
      every second (its subscription may be refused too). The manager
      keeps trying (the subscription with its backoff, `CLIENT TRACKING`
      every 100 ms); once tracking is on on every master, the cache gets
      `:connected` and uses its L1 again, from empty. Tested with an ACL
      user that loses `client|tracking`, or all of `client`, mid-run, and
      with one cluster master whose default user loses it.

  ## Redis refusing the subscription

  With the cache's default `invalidation: :pubsub`, a node hears the
  other nodes' writes only through its subscription to the cache's
  channel (`SUBSCRIBE`; `SSUBSCRIBE` on a cluster). Redis may refuse it
  while the command connections work: a user whose ACL lacks the command
  (`-subscribe`) or the channel (`resetchannels`, or a pattern such as
  `&other:*`), which Redis answers with `NOPERM`. Such a node's L1 would
  keep what other nodes replaced, for ever, so:

    * At the cache's start, the manager tries the subscription on a
      connection of its own (on the master of the channel's slot on a
      cluster): a `NOPERM` makes `Larder.Cache.start_link/1` return
      `{:error, %Larder.Error{reason: :l2_failed}}` whose message names the
      server, the user, the command and Redis's reply and the grant that
      fixes it (`ACL SETUSER <user> +subscribe &<channel>`), with the same
      `:details` as above. A server that does not answer, or refuses
      `AUTH` (the command connections fail too: an outage, L1 serves),
      does not stop the start.
    * Later (the ACL changed and the connections were renewed, a failover
      to a server with another ACL), a `NOPERM` to the subscription makes
      the cache get `{:larder_cache_l2, :refused, error}`, the same error:
      as with tracking, it logs it, counts it in `:l2_errors`, clears its
      L1 and keeps nothing in it until the subscription is up again
      (`:connected`), every read going to Redis or the loader. The
      connection keeps trying with its backoff. Tested with an ACL user
      that loses `SUBSCRIBE` mid-run and gets it back, and users without
      the command or the channel at start.

  ## Cluster

  With `:cluster`, the manager asks the masters it knows, then the seeds,
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
      manager reads `CLUSTER SLOTS` again, at most once per
      `:reconnect_sleep` however many callers hint it. A master the manager
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
      the manager reads the map again. Until the cluster promotes a replica
      (its `cluster-node-timeout` plus the election) the keys of that
      master's slots fail as in any outage (L1 serves, misses call the
      loader, writes are repaired once the L2 answers). A dead master
      answers no `MOVED`, so the manager follows the promotion itself: a
      master it cannot connect to again (refused, or not within
      `:timeout`) makes it read `CLUSTER SLOTS` from the other nodes (the
      other masters of its map and the seeds, the masters it finds down
      last) at once, then again after a wait that doubles from
      `:reconnect_sleep` up to 500 ms (or `:reconnect_sleep`, if longer),
      for as long as the map still names that master: the keys come back
      within about half a second of the promotion (the first successful
      put on its slots came 1.11x the cluster's own promotion time after
      the kill, median of 5, at most 0.54 s after the promotion; `mix run
      bench/cache_topology_bench.exs --only cluster_kill`). Meanwhile the dead
      master's pool is tried one connection at a time, after a wait that
      doubles from `:reconnect_sleep` up to 2 s (or `:reconnect_sleep`, if
      longer), each wait +-25% at random, and the rest of the pool is
      started once one connects: a map naming many dead masters costs the
      topology one connection attempt per master per wait, and two `CLUSTER
      SLOTS` a second. Replication is asynchronous: a write the dead
      master acknowledged but had not sent its replica is lost, and the
      key then reads as the replica had it.
      A coordinated `CLUSTER FAILOVER` loses nothing: writes wait while
      the replica catches up, then get `MOVED`.
    * A master that leaves the map (it is a replica now) keeps its pool for
      `:timeout` ms, so that callers already on it get their reply (a
      `MOVED`, most likely).

  Every wait and every command is bounded by what is left of the call's
  deadline (`deadline/2`): whatever the cluster does, a call of the cache
  returns within `:timeout` ms, all its commands (a write and its
  `SPUBLISH`, on two masters), redirects and retries together, with
  `:l2_unavailable` when it could not be served by then (a timeout, a lost
  connection, a redirect loop, a cluster still down). Other error replies
  are `:l2_failed`. Tested with the master of the invalidation channel
  SIGSTOPped and the key's master stopped for 300 ms as each call starts.

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
  an error, not a list, larger than 4 MB, or whose ranges name more than
  1,000 masters (Redis Cluster is designed for up to 1,000 nodes) is
  ignored (the next node is asked), its entries of the wrong shape or
  overlapping are skipped, and each is counted. A redirect that is not well formed is an error reply
  (`:l2_failed`). Redirects are error replies only: a value whose text
  reads like one is a value.

  ## Failures

  Every call of the cache returns within `:timeout` ms of Redis time in
  all (see `deadline/2`: tested with a server that answers every command
  960 ms late, under `timeout: 1000`); an unreachable, slow or failing
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
  a cluster is about 1.05x one on a single server), the failover times
  above (Sentinel, and a cluster master SIGKILLed), and a reshard under
  load; the README has the table of a full run.
  """

  @behaviour Larder.Cache.L2

  alias Larder.Cache.Redis.Subscriber
  alias Larder.Redis.Options, as: RedisOptions
  alias Larder.Redis.Topology

  # Upper bounds of the numeric options (documented in the moduledoc).
  @max_reconnect_sleep 60_000
  @max_pool_size 64
  @max_max_reply_bytes 4_294_967_296

  @doc """
  Checks `opts` and builds the state: the topology's handle (its table of
  connection pids, owned by the caller, which the topology's processes
  fill; see Larder.Redis.Topology) and the options, with the child spec of
  the L2's process (see "Contract"), which the cache runs under its
  supervision tree. Processes that restart fill the same table, so the
  state never changes. Starts no process. Raises `ArgumentError` for a bad
  option.
  """
  @impl true
  @spec init(keyword(), pid(), binary()) :: {:ok, map(), Supervisor.child_spec()}
  def init(opts, subscriber, channel) do
    opts = validate_opts!(opts)

    state =
      opts
      |> Topology.new()
      |> Map.merge(%{subscriber: subscriber, channel: channel})

    {:ok, state, %{id: __MODULE__, start: {Subscriber, :start_link, [state]}}}
  end

  @doc "`GET key`: `{:ok, binary}`, `:miss` or an error, within the timeout."
  @impl true
  @spec get(map(), binary()) :: {:ok, binary()} | :miss | {:error, Larder.Error.t()}
  def get(state, key) do
    check_args!(state, key: key)

    state
    |> query(["GET", key])
    |> reply("GET", fn
      :undefined -> :miss
      bin when is_binary(bin) -> {:ok, bin}
      _other -> :bad
    end)
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

    state
    |> query(["SET", key, value | expiry ++ cond_])
    |> reply("SET", fn
      "OK" -> :ok
      # nil when NX found the key
      :undefined when mode == :new -> :ok
      _other -> :bad
    end)
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
  The state for one call of the cache: every command made with it returns
  by `deadline` (a `System.monotonic_time(:millisecond)`; `nil`: `:timeout`
  ms from now), however many round trips, redirects and retries the call
  takes, and a command made once it has passed returns `:l2_unavailable`
  (error `:timeout`) without being sent. See "Deadlines" in
  `Larder.Cache.L2`.
  """
  @impl true
  @spec deadline(map(), integer() | nil) :: {map(), integer()}
  def deadline(state, deadline) do
    check_args!(state, [])

    deadline =
      case deadline do
        nil ->
          System.monotonic_time(:millisecond) + state.timeout

        d when is_integer(d) ->
          d

        other ->
          raise ArgumentError, "expected deadline to be an integer or nil, got: #{inspect(other)}"
      end

    {Map.put(state, :deadline, deadline), deadline}
  end

  @doc """
  Nothing to release: the L2's process is stopped by the cache's
  supervision tree, and the table goes with the process that called
  `init/3`.
  """
  @impl true
  @spec stop(map()) :: :ok
  def stop(state) do
    check_args!(state, [])
    :ok
  end

  # Commands on one connection are answered in order, so a large value
  # holds up whatever was sent after it: the topology spreads callers over
  # the pool by scheduler. A caller waits for each reply, so its own
  # commands stay in order whichever connection they take.
  defp query(state, [name | _] = command) do
    case Topology.query(state, command) do
      {:ok, value} ->
        {:ok, value}

      {:error, {:error_reply, text}} ->
        {:error, Larder.Error.new(:l2_failed, "Redis replied with an error", error: text)}

      {:error, {:unavailable, reason}} ->
        {:error, Larder.Error.new(:l2_unavailable, "Redis is unreachable", error: reason)}

      {:error, {:bad_reply, reply}} ->
        bad_reply(name, reply)
    end
  end

  defp check_args!(state, binaries) do
    unless match?(
             %{table: table, pool_size: size, timeout: _, kind: _, subscriber: sub, channel: _}
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

  # A reply checked by `check`, which maps it to the result or to :bad (a
  # reply that is not what Redis sends for `command`); errors as they are.
  defp reply({:ok, reply}, command, check) do
    case check.(reply) do
      :bad -> bad_reply(command, reply)
      result -> result
    end
  end

  defp reply({:error, _} = error, _command, _check), do: error

  # An integer reply: decimal digits of a value in 0..max.
  defp integer_reply(result, command, max) do
    reply(result, command, fn
      bin when is_binary(bin) and byte_size(bin) in 1..20 ->
        case Integer.parse(bin) do
          {n, ""} when n >= 0 and n <= max -> {:ok, n}
          _ -> :bad
        end

      _other ->
        :bad
    end)
  end

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

  @doc "Checks the options above; raises `ArgumentError` naming a bad one."
  @impl true
  @spec validate_opts!(keyword()) :: keyword()
  def validate_opts!(opts) do
    extra = [
      reconnect_sleep: {{:integer, 1, @max_reconnect_sleep}, 100},
      pool_size: {{:integer, 1, @max_pool_size}, 2},
      max_message_bytes: {{:integer, 1024, @max_max_reply_bytes}, 1_048_576},
      tracking_prefix: {{:or_nil, {:string, 0, 4096}}, nil}
    ]

    RedisOptions.validate!(opts, "Larder.Cache.Redis", extra,
      timeout: 1000,
      max_reply_bytes: 134_217_728
    )
  end
end
