defmodule Larder.Cache do
  @moduledoc """
  A read-through cache: an ETS L1 in every node, in front of an optional
  shared L2 (Redis), with versioned keys, miss collapsing and cross-node
  invalidation.

      iex> {:ok, _pid} = Larder.Cache.start_link(name: :doc_cache)
      iex> Larder.Cache.fetch(:doc_cache, :answer, fn -> {:ok, 42} end)
      {:ok, 42}
      iex> Larder.Cache.fetch(:doc_cache, :answer, fn -> {:ok, :not_called} end)
      {:ok, 42}
      iex> Larder.Cache.get(:doc_cache, :missing, :default)
      :default

  `fetch/3` reads through the levels: L1; then L2, and an L2 hit is written
  back into L1 (the "backfill" without which an L1 gains nothing); then the
  loader, whose `{:ok, value}` is written to L1 and L2.

  A cache is a small tree of processes started with `start_link/1` (or
  under a supervisor with `child_spec/1`) and named by its `:name`; every
  function takes that name. Reads and writes do not go through those
  processes: they use the cache's ETS tables and the L2's state directly
  from the caller.

  ## Processes

  `start_link/1` starts a supervisor (`:rest_for_one`) whose pid it
  returns, with three children, in this order:

    1. **the cache's process** (the owner), registered under `:name`: it
       owns the ETS tables and the state of the L2 (what its `init/3`
       built), is the only writer of the generation, applies invalidations,
       repairs L2 writes and sweeps. It is `:temporary` and *significant*:
       it is never restarted, and when it exits, for any reason, the
       supervisor stops the other children and exits (`:shutdown`). A
       restart would bring back an empty cache under the same name, which
       its callers could not tell from the one they used; so, as before
       the tree, the cache ends and its own supervisor (the application's)
       decides. The tables live and die with this process.
    2. **the L2's processes** (connections, subscribers), from the child
       spec the L2's `init/3` returned (see "Lifecycle" in
       `Larder.Cache.L2`), run by a small process of the cache that never
       exits of its own: when any of them exits it stops the rest, counts
       an `:l2_errors`, emits `[:larder, :cache, :l2, :disconnected]` with
       reason `:process_died`, logs one line, and starts them again after
       100 ms, doubling up to 5 s while they keep exiting within 5 s of a
       start. A restart costs no L1 entry and no generation: L1 keeps
       serving, L2 calls fail with `:l2_unavailable` for the gap, and once
       the new processes are up the cache's process has the generation read
       and, when the subscription is back, clears L1 (invalidations may
       have been missed meanwhile), as after any resubscription. The L2's
       state does not change across a restart (it holds stable names only),
       so callers never see a stale one. An L2 in a crash loop therefore
       costs a log line per restart and never stops the cache. Restarting
       is not how the L2 reconnects: `Larder.Cache.Redis`'s connections
       stay up and reconnect on their own.
    3. **the expiry clock** (see "Eviction and expiry"), restarted at once
       if it dies.

  The supervisor allows 5 restarts of the L2's runner or the clock in 5 s
  (each exits only when killed or by a bug); more stop the cache.

  `start_link/1` returns once the tree is up and the generation read (when
  the L2 answers). A bad option raises `ArgumentError` in the caller; an L2
  whose `init/3` raises or whose processes cannot start gives `{:error,
  %Larder.Error{reason: :l2_failed}}` (the L2's own error when it gives one:
  Redis refusing `invalidation: :tracking`, or the cache's channel, say); a
  name in use gives `{:error, {:already_started, pid}}` with the owner's pid
  (or that of the process that holds the name). None of these errors harms
  the caller, trapping exits or not: what was started of the tree is
  stopped before `start_link/1` returns, and no exit signal or message
  reaches the caller.
  Of any number of processes starting one name at once, exactly one gets
  `{:ok, pid}`. Stopping the supervisor (`Supervisor.stop/1`, or the
  application's supervisor) stops the clock, then the L2's processes, then
  the owner, which erases the cache's handle. Killing the supervisor makes
  the owner stop the same way a moment later (a linked exit): calls made in
  between still work. Killing the owner ends the cache at once (its tables
  go with it), and its supervisor exits.

  ## Complexity

  An L1 hit is one ETS lookup, O(1), plus a copy of the value into the
  caller's heap, O(size of the value). Values whose external size is at
  least `:local_copy_min_bytes` are stored apart, and the reading process
  keeps the copy it made in its dictionary, tagged with the value's version:
  a repeat hit by that process reads only the key's small row (O(1)) and
  copies nothing. The copies one process keeps of one cache add up to at
  most `:local_copy_max_bytes` (external size): a new copy that would go
  over drops others first, and a value larger than the bound is copied on
  every hit. A copy is replaced when its process reads a newer large
  version, dropped when its process reads the key and finds no value (a copy
  of a key that now holds a small value stays until the bound pushes it
  out), and goes with the process. Until then a process keeps its copy of
  a value that was since replaced or deleted: an idle process holds on to
  what it last read.

  The copies of a cache that stopped are dropped by each process at its
  next miss (on any cache or `Larder.Register`) or its next new copy of a
  large value; those of a cache that was killed, at its first
  copy from a cache or register it held no copies of (the restarted cache,
  say) or after any later stop. Restarting a cache therefore does not pile
  copies up: `:local_copy_max_bytes` bounds the copies of each running
  cache. One mechanism, shared with `Larder.Register`, does this: a
  process that makes a new copy or misses reads one VM-wide counter of
  deaths, and only when it moved does it look at the structures it holds
  copies of (O(number held)).

  A write computes the value's size, O(size), and copies it into ETS;
  eviction is O(log n) per evicted entry.

  Sizes are `:erlang.external_size/1`, which counts a binary's own bytes.
  A value that is a binary cut from a larger one (a sub-binary, such as a
  `binary_part/3` of a request body) is stored as a copy of just its bytes,
  so it neither keeps the larger binary alive nor is counted for less than
  it holds. A sub-binary *inside* another term (a map or tuple holding a
  slice of a large binary) is stored as it is: it keeps the whole larger
  binary alive for as long as the entry lives, while `stats/1` and
  `:max_bytes` count only the slice. Apply `:binary.copy/1` to such slices
  before caching them.

  ## Concurrency

    * **Hits take no lock.** A hit is one `:ets.lookup/2` and an expiry
      check (plus, for a large value, a look in the process dictionary).
    * **Writers of a key are serialised.** Every change to a key's L1 rows
      (`put/4`, a load's write, `delete/2`, a remote invalidation, expiry,
      eviction) runs holding the key's slot of an internal striped lock
      (64 slots per cache, by `:erlang.phash2/2` of the key), so one key
      always has at most one live version, and its index, byte count and
      large-value rows match it. Keys are only ever used in key-exact ETS
      calls, never in a match pattern: `:_` or `:"$1"` is a key like any
      other.
    * **Writes are repairable.** Each change writes a small journal row
      first and deletes it last. A process killed in the middle leaves its
      slot and its journal row; the next process to take the slot (or the
      cache's periodic sweep, within 5 s) repairs the change before
      anything else: whichever version the key's row holds is kept, the
      other version's rows are dropped, and the byte count is set from the
      journal. `stats/1` matches the tables again once that has run.
    * **Miss collapsing.** Concurrent misses on one key run the loader once:
      the first puts a loading marker in the key's row (an ETS
      `insert_new`, which needs no lock) and runs the L2 read and the
      loader *in its own process*; the others monitor it and get its
      result, or its error. Misses on different keys never wait for each
      other, except when their keys share a lock slot for the few ETS
      operations of the write. If the loading process dies, its waiters
      notice at once (monitor) and one of them loads.
    * The first write (or load) by a process registers it once with the
      lock's holder registry, a process of the `:larder` application (one
      call); hits never do.
    * **Backfill guard.** Every write gets a new version. A backfill or load
      writes L1 only while its loading marker is still in place (checked
      and replaced under the slot); a `put/4`, `delete/2`,
      `invalidate_all/1` or remote invalidation that happens during the
      load removes the marker, so the older value never overwrites the
      newer one.
    * **Clearing** (`invalidate_all/1`, a generation change, a resubscribe)
      runs in the cache's process, which holds every slot meanwhile: no
      write is half done when the L1 empties, and killing the caller cannot
      stop a clear half way. `invalidate_all/1` returns only once that
      clear is done, however many calls race.
    * **One writer of the generation.** The generation in every L2 key is
      this node's copy of the L2's generation key, and only the cache's
      process changes it, to what the key held when it was read (by the
      caller of `invalidate_all/1`, or by a small process of the cache's
      own), and only ever forward (see "Generations" under Failures):
      concurrent `invalidate_all/1` calls, messages from other nodes and
      reads answered out of order cannot leave a node on an older
      generation than the L2's. The cache's process itself never waits
      for the L2, so a slow or stopped Redis does not hold up the clears
      and invalidations it runs.
    * **Cross-node invalidation.** `put/4` and `delete/2` publish the key on
      an L2 channel; every other instance sharing the L2, namespace and
      version deletes it from its L1 when the message arrives.
      `invalidate_all/1` publishes the new generation, and every instance
      reads the generation key, moves to it and clears its L1. An instance
      ignores its own messages. Messages published while an instance is
      disconnected are lost to it, so when its subscription comes back (or
      first comes up after Redis was unreachable at start) it clears its L1
      and re-reads the generation.
    * **Invalidation on any program's write** (`invalidation: :tracking`).
      Redis reports every change to a key under the cache's prefix (a
      write, a delete, an expiry, an eviction, by any client) to each
      node's subscription, and the node deletes the key from its L1 when
      the report arrives; `FLUSHDB` and `FLUSHALL` clear its L1. A report
      for a key of another generation, or for the generation key, changes
      nothing. Larder's own invalidations are still published as with
      `:pubsub`: they also cover what Redis does not report (a `delete/2`
      of a key the L2 no longer holds, a value too large for the L2) and
      `invalidate_all/1`. Redis reports this node's own writes too, so a
      node's `put/4` drops its own L1 copy shortly after (the next read is
      an L2 hit): with `:tracking` a written key stays in L1 only until
      its report comes back. A read that races a foreign write cannot
      keep the old value: the report removes the read's loading marker.
      While the subscription is down, or once no data connection kept its
      tracking through a reconnection, reports are lost, so the node
      clears its L1 when both are back, as on a resubscribe.
    * **Redis refusing tracking** (`invalidation: :tracking`). A Redis
      that answers but will not report changes (an ACL user without
      `CLIENT TRACKING`, `CLIENT ID` or the channel `__redis__:invalidate`)
      makes `start_link/1` return `{:error, %Larder.Error{reason:
      :l2_failed}}` naming the server, the user and what to grant (see
      "Tracking" in `Larder.Cache.Redis`). Refused later (the ACL
      changed, a failover to a server with another ACL, a cluster master),
      the node logs that error, counts it in `:l2_errors`, clears its L1
      and writes nothing to it until tracking is on again: every read goes
      to the L2 (or the loader) meanwhile, so no old value is kept, and a
      `put/4` leaves no copy in L1. Once tracking is back the L1 is used
      again, from empty.
    * **Redis refusing the subscription** (`invalidation: :pubsub`). A
      Redis whose ACL lets a node read and write but not subscribe to the
      cache's channel (no `SUBSCRIBE`, or not that channel: `NOPERM`)
      would let it keep what other nodes replaced for ever: the same
      holds, at start (`start_link/1` returns the error, naming the
      server, the user and the grant) and later (the L1 is off until the
      subscription is back). See "Redis refusing the subscription" in
      `Larder.Cache.Redis`.
    * **`invalidate_all/1` with `codec: :raw`** clears every node's L1 and
      leaves the data in Redis alone: the keys under `:key_prefix` belong
      to whichever program writes them. It still increments the cache's
      generation key (`<namespace>:<version>:gen`, outside the data), which
      is how every node, including one that missed the message, learns to
      clear its L1.
    * Concurrent `put/4`s of one key have no defined order between them.
    * The L2 has no compare-and-set: a load that wrote L1 and is about to
      write L2 (`SET NX`) when a `delete/2` runs can leave its value in L2
      until its ttl. Puts are not affected (`SET NX` never overwrites).
    * A loader must not call `fetch/3` for its own key (that raises).
    * **Load cycles.** Loaders may read other keys, of this cache or of
      others. Loaders that end up waiting for each other's loads (the
      loader of `:a` fetches `:b` while the loader of `:b` fetches `:a`,
      in two processes; or any longer ring, across any caches) would wait
      for ever: instead, the wait that closes the ring is refused, and that
      `fetch/3` (or `get/3`, which then returns its default) answers
      `{:error, %Larder.Error{reason: :load_cycle}}` at once. Its loader
      decides what to do with it; the other loads of the ring then get its
      outcome the usual way (usually a `:loader_failed` error), so every
      call returns, and later calls load those keys again. A waiting
      process that runs a loader records whom it waits for in one VM-wide
      ETS table and follows that chain of waits (at most 1,000 steps, an
      ETS lookup and a look at one load's waiters each); other waits cost
      nothing more. Not detected: a ring longer than 1,000 loads, and a
      ring that goes through a wait Larder cannot see (a loader that waits
      for a task or a message from a process that fetches). A loader that
      never returns blocks its callers and the waiters of its key, like
      any function call without a timeout.

  ## Eviction and expiry

  `:ttl` (and `put/4`'s `ttl:`) expire entries in L1 and L2. A hit checks
  expiry against a clock (one atomic read: reading the system clock on every
  hit is slower than the rest of the hit) that a small process of the
  cache's own, apart from the cache's process, moves forward every 10 ms.
  It runs at high priority and does nothing else, so neither a busy cache
  process nor a machine busy with normal-priority work holds it up: an L1
  entry may be served up to 10 ms past its ttl plus that process's
  scheduling delay, never before.

  Expired L1 rows that nobody reads (a read deletes the expired row it
  finds) are swept every 5 s by the cache's process, in slices of 1,000
  rows: between two slices it handles its other messages (invalidations
  from other nodes, clears), so a sweep of n rows costs O(n) in all but
  holds the process for one slice at a time. A row written during a sweep
  may wait for the next one. The table is fixed (`:ets.safe_fixtable/2`)
  while a sweep runs, so rows deleted meanwhile release their memory when
  it ends. An L2 hit backfills L1 with a full `:ttl`, so a value can outlive
  its L2 copy by up to one ttl.

  When `:max_entries` or `:max_bytes` (the sum of `:erlang.external_size/1`
  of the values) is exceeded, the oldest writes are evicted first (FIFO, not
  LRU: a hit writes nothing, which keeps hits as cheap as an ETS lookup).
  The writer evicts after releasing its own slot, taking each victim's slot
  in turn (never two at once). A single value larger than `:max_bytes` is
  evicted as soon as it is written. A writer killed before it evicted
  leaves the L1 over its limits until the next write or sweep.

  ## Failures

    * The loader returns `{:ok, value}` or `{:error, reason}`; an error, a
      raise or anything else is `{:error, %Larder.Error{reason:
      :loader_failed}}`, is not cached, and is given to every waiter.
    * A `fetch/3` made by a loader that would close a ring of loads waiting
      for each other returns `{:error, %Larder.Error{reason: :load_cycle}}`
      instead of waiting (see Concurrency).
    * A cache that stops or is killed while a `fetch/3` or `get/3` is
      loading gives that caller and its waiters `{:error, %Larder.Error{reason:
      :cache_stopped}}`. A call that starts after the cache stopped raises
      `ArgumentError` (an unknown cache).
    * A process killed in the middle of a write loses that write or
      completes it, never half of it (see Concurrency); a loader killed
      mid-load leaves no marker behind once a waiter or the sweep sees it
      dead.
    * An L2 that is down at start or goes down mid-run is not fatal: `fetch/3`
      serves L1, calls the loader on a miss, counts `:l2_errors`, and the L2
      reconnects when the server comes back. No call waits for the L2 longer
      than its `:timeout` in all (see "Timeouts" below). `put/4`, `delete/2`
      and `invalidate_all/1` still update L1 and return `{:error,
      %Larder.Error{reason: :l2_unavailable}}` (or `:l2_failed`,
      `:l2_bad_reply`), which means "the L2 outcome is unknown and is being
      repaired" (see below). The same holds for a Redis that refuses the cache
      (a password it now requires, `NOAUTH`): its commands fail with
      `:l2_failed`, and the Redis L2 retries its subscription with a backoff
      (up to 2 s) and one log line, no process crashing, until the password
      matches again.
    * **Timeouts.** The L2's `:timeout` (`Larder.Cache.Redis`'s option)
      bounds a whole call, not each of its round trips: the L2 calls of
      one `fetch/3` or `get/3` (the read, and a load's write), `put/4`
      (the write, then the publish), `delete/2` (the same) or
      `invalidate_all/1` (the `INCR`, the reads and writes of a lost
      generation key's renewal, the publish) share one deadline,
      `:timeout` from the call's start, however many round trips,
      redirects and retries they take. The loader's own time is not
      counted: a `fetch/3` takes at most the loader's time plus `:timeout`
      (plus the L1 work and scheduling). A step the deadline leaves no time
      for is not sent and fails as `:l2_unavailable`: a load's write is
      then skipped (the value is in L1, the next node loads it), and a
      write's publish is repaired like any failed write. (With an L2 that
      does not export `c:Larder.Cache.L2.deadline/2`, each L2 call is
      bounded on its own.)
    * Everything that comes from the L2 is untrusted. A reply that is not
      what Redis sends is `{:error, %Larder.Error{reason: :l2_bad_reply}}`.
      An invalidation message that is not a 16-byte node id with a
      well-formed `{:key, key}` or `{:all, generation}` (an integer from 0
      to 2^62 - 1), or is larger than `:max_value_bytes`, is ignored and
      counted in `:bad_messages`. With `invalidation: :tracking`, a report
      that is not an array of keys or a null (anyone may `PUBLISH` to
      `__redis__:invalidate`, and then sends a string), or that names a key
      under the cache's prefix that is not one of its keys (a "t:" key
      that is not a safe term within `:max_value_bytes`), is counted in
      `:bad_messages` once and its well-formed keys are still dropped;
      anyone who can publish there can at most make nodes drop keys.
      Reports are bounded by the L2's message size (see
      `Larder.Cache.Redis`'s `:max_message_bytes`).
      If one of the L2's processes dies, the cache logs it, counts an
      `:l2_errors` and starts the L2's processes again (after 100 ms,
      doubling up to 5 s while they keep dying; see "Processes"); L1
      keeps serving throughout and the cache's process does not restart.
    * Writes whose L2 outcome is unknown: when the L2 write of a `put/4`,
      `delete/2` or `invalidate_all/1` fails (a timeout, a dropped
      connection, a reply that is not Redis), it may still land, or the old
      value may still be there, and the other nodes have not been told. The
      caller records the key (or "all") as pending, and the cache's process
      repairs it from a separate process: at once, then, while the L2 stays
      away, after 100 ms, backing off to every 400 ms, and at once when the
      subscription comes back. For a key it deletes the L2 key and then
      publishes the key; for "all" it increments the generation and
      publishes it. Once Redis answers again, every node drops the old value
      within one retry (0.4 s plus a round trip at most). The repair deletes
      the key from the L2 even when a later write of it succeeded, since the
      earlier one may land after it: the price is a miss, never an old
      value.
    * Failed writes cost bounded work, at any rate: a record is an insert
      into a table of the cache (one row per key, however often the key
      fails) and, only when none is on its way, one message to the cache's
      process, which takes every row at once. More than 1,000 pending keys
      become one pending invalidate-all. So any number of writers failing
      in a loop (Redis down, refusing connections) leave the cache's
      mailbox with at most a message or two for them, and the cache's
      memory flat. The same holds for the hints callers give the Redis
      L2's topology manager (`Larder.Cache.Redis`): one on its way at a time. Pending
      work lives in the cache's process and is lost if that process stops.
    * L2 values are checked before they are decoded: the bytes, a
      compressed value's declared uncompressed size and the memory the
      decoded term would take (walked from its encoding, without
      recursion) must each be at most `:max_value_bytes`, and the value
      must hold no fun. It is then decoded with `:erlang.binary_to_term(bin,
      [:safe])`. A value that fails (corrupt, foreign, too large, a zip
      bomb, a fun, or atoms this node does not know) is a miss plus a
      `:decode_errors` and `:l2_errors` count, never a crash, and the load
      replaces it. A generation key that does not hold an integer from 0 to
      2^62 - 1 counts a `:decode_errors` and is replaced (see below).
    * **Generations.** The L2's generation key is the truth. A node reads it
      (GET) at start, on every (re)subscription and on every other node's
      `{:all, generation}` that differs from its own, takes what its own
      `invalidate_all/1`'s `INCR` answers, and moves to what the key holds
      when that is above its own generation. A key that is missing, that holds
      no generation, or that holds a lower one than the node's means Redis
      lost it (`FLUSHALL`, a restart without its data, another program writing
      it): the node writes a fresh generation above every one it used, the
      larger of its own plus 1 and the system time in milliseconds (`SET NX`
      when the key is missing, so that nodes finding it missing together
      agree), reads the key back, moves to what it holds and publishes it, so
      that every other node reads it too. A node never goes back to a lower
      generation, whose L2 keys may hold values written before the loss. Every
      move clears L1. So after a `FLUSHALL` the next `invalidate_all/1` (or a
      node's start) moves every node to one fresh generation, and after Redis
      restarts empty the old nodes (on resubscribing) and any new node agree
      on one. An L2 error while reading leaves the node's generation as it is
      (counted in `:l2_errors`) and the node reads again after 100 ms,
      doubling up to 5 s while the L2 keeps failing, or at the next hint; an
      `invalidate_all/1` whose read failed returns the error and is repaired
      like a failed INCR. Until a hint comes, nodes that missed a loss keep
      using their generation: they still agree with each other, since they
      never changed it.
    * On a cache with an L2, a key whose invalidation the other nodes
      would refuse (one that holds a fun, or whose external encoding is
      larger than `:max_value_bytes`) raises `ArgumentError` from `put/4`,
      `delete/2`, and from `fetch/3`, `fetch!/3` and `get/3` on an L1 miss;
      such a key never gets into L1, so those calls always refuse it, and
      an L1 hit checks nothing. Binaries, atoms, numbers, pids, references
      and ports are accepted without a check. A local-only cache takes any
      key.
    * A name that is not a running cache raises `ArgumentError`.

  ## Telemetry

  Reads, writes, evictions, invalidations and L2 errors and connection
  changes are `:telemetry` events, listed in `Larder.Telemetry`. Without
  `:telemetry` (or with `telemetry: false`) they cost one boolean check.

  The Redis L2 runs its own connections (no Redis client library);
  `Larder.Cache.Redis` says how they meet these requirements ("Client").

  ## Performance

  `mix run bench/cache_bench.exs` measures each figure as a ratio of
  medians to an anchor in the same run, the columns taking turns (it
  starts its own `redis-server`); the README has the table of a full run.

    * An L1 hit of a 1 KB map by handle costs 1.0-1.2x a raw
      `:ets.lookup/2` of the same value, with 1 or 16 runners, with or
      without a ttl; by name, up to 1.25x. The difference is resolving the
      cache's name (one `:persistent_term.get/2`, by name only), the expiry
      check (one atomic read, only for a value with a ttl) and the hit
      counter (one `:counters.add/3`) around the same ETS read, plus the
      row's three extra fields and the result tuple on the caller's heap.
      The bench's loop of hits collects garbage about 1.2x as often as its
      loop of bare lookups, a count it prints.
    * The loader is the caller's cost. A remote capture
      (`&MyApp.Prices.load/0`) is a constant, while a closure or a local
      capture (`&load/0`) is built on every call. On OTP 25 building one
      also bumps a reference count that every scheduler shares, which
      many processes hitting at once contend for. The bench passes a
      remote capture. Where the loader needs the key, read with `get/3`
      first, and call `fetch/3` with a closure only when it returns the
      default.
    * An L1 hit of a large term (60k maps, 8.75 MB) costs what a raw ETS
      lookup of the term costs, since the copy out of ETS is the floor:
      6-12x faster than a Redis `GET` plus `binary_to_term/2`.
    * A repeat hit of a large value by the same process reads a small row
      and copies nothing: thousands of times faster than the Redis read
      (the bench prints the ratio; `:local_copy_min_bytes` decides which
      values get this).
    * 1,000 processes missing one cold key call the loader once, where a
      plain ETS read-through calls it 1,000 times.
    * A miss with Redis down costs the failed L2 call, the loader and the
      L1 write.
    * Cross-node invalidation (a put on one node until another node's L1
      drops the key) costs one pub/sub message; the bench measures its
      median and p99 on loopback.
  """

  alias Larder.Cache.{Config, Loader, Runtime, Stats, Writes}
  alias Larder.Cache.Supervisor, as: CacheSupervisor
  alias Larder.Instance

  require Larder.Instance

  @typedoc """
  A cache's handle, from `handle/1`: the name resolved once, for a caller
  to keep (see `handle/1`).
  """
  @opaque handle :: Runtime.t()

  @typedoc "A cache: the `:name` given to `start_link/1`, or its `handle/1`."
  @type cache :: atom() | handle()
  @type key :: term()
  @type value :: term()
  @type loader :: (() -> {:ok, value()} | {:error, term()})

  @doc """
  Starts a cache.

  Options:

    * `:name` (required) - an atom naming the cache.
    * `:l2` - `nil` for a local-only cache (the default), or `{module, opts}`
      with a `Larder.Cache.L2` module, such as `{Larder.Cache.Redis, host:
      "127.0.0.1", port: 6379}` (see `Larder.Cache.Redis` for its options).
    * `:ttl` - milliseconds before an entry expires, at most
      3_153_600_000_000 (100 years), or `:infinity` (default).
    * `:max_entries` - evict the oldest writes beyond this many L1 entries,
      at most 2^40 (default `:infinity`).
    * `:max_bytes` - evict the oldest writes while the L1 values' external
      size exceeds this, at most 2^50 (default `:infinity`).
    * `:compressed` - create the L1 ETS table `:compressed` (default `false`).
    * `:max_value_bytes` - the largest value taken from the L2, in bytes
      (default `67108864`, 64 MB; at most `1073741824`). It bounds the L2
      bytes, a compressed value's declared uncompressed size and the memory
      the decoded term would take (estimated from its encoding before
      decoding). A larger value read from the L2 is a miss; a larger value
      written by this node stays in L1 only, and its L2 key is deleted.
      Invalidation messages are bounded the same way.
    * `:compression_level` - `term_to_binary` compression for L2 values, 0
      (none) to 9 (default `1`).
    * `:namespace` - a string of 1 to 1024 bytes prefixed to every L2 key
      and to the invalidation channel (default `"larder"`).
    * `:version` - an integer of at most 2^63 - 1 in absolute value, or a
      string of at most 1024 bytes, in every L2 key, to be bumped when the
      shape of the values changes (default `1`).
    * `:local_copy_min_bytes` - values at least this large (external size),
      at most 2^40, are kept in the reading process for repeat hits;
      `:infinity` turns that off (default `65536`).
    * `:local_copy_max_bytes` - the most (external size) of such copies one
      process keeps for this cache, 0 to 2^40 (default `67108864`, 64 MiB);
      a value larger than this is copied on every hit.
    * `:telemetry` - `false` turns off this cache's `:telemetry` events
      (default `true`: emitted when `:telemetry` is loaded when the cache
      starts; see `Larder.Telemetry`).
    * `:invalidation` - how a node learns that a key changed in the L2:
      `:pubsub` (default), the invalidations that Larder nodes publish on
      the cache's channel (a Redis that refuses the subscription stops the
      start, or turns the L1 off, the same way: see "Redis refusing the
      subscription" under Concurrency); or `:tracking`, those plus Redis's own report of
      every write to the cache's keys by any program (server-assisted
      client-side caching, `CLIENT TRACKING ... BCAST`), so that a key
      another service writes, deletes, expires or flushes is dropped from
      every node's L1. Needs an `:l2` that tracks (`Larder.Cache.Redis`
      does; the cache passes it the prefix to track as its
      `:tracking_prefix` option). It is an option of the cache, not of the
      L2, because the cache alone knows which L2 keys are its own and how
      they map back to its keys. A Redis that refuses tracking stops the
      start with an error naming what to grant (or, refused later, turns
      the L1 off until tracking is back). See "Cross-node invalidation"
      and "Redis refusing tracking" under Concurrency.
    * `:codec` - how keys and values are stored in the L2: `:term`
      (default), any term, its key built from `:namespace`, `:version`, the
      generation and the key, and the value encoded with
      `term_to_binary/2`; or `:raw`, for data another program reads or
      writes: keys and values must be binaries (anything else raises
      `ArgumentError` naming the key or the value; a loader that returns a
      non-binary gives `{:error, %Larder.Error{reason: :loader_failed}}`),
      the L2 key is exactly `:key_prefix <> key`, with no namespace,
      version or generation in it, and the value is stored as its bytes.
      A value read from the L2 above `:max_value_bytes` is not served (a
      miss, counted in `:decode_errors`) and not overwritten (the load
      writes with `SET NX`). See `invalidate_all/1` for what it does in
      this mode.
    * `:key_prefix` - with `codec: :raw`, a string of 0 to 1024 bytes put
      before every key in the L2 (default `""`); with `invalidation:
      :tracking` it is also the prefix Redis tracks (all keys when empty).
      Given with `codec: :term`, it raises `ArgumentError`.
  """
  @spec start_link(keyword()) ::
          {:ok, pid()} | {:error, Larder.Error.t() | {:already_started, pid()} | term()}
  def start_link(opts) do
    opts = Config.validate!(opts)
    Instance.started!("Larder.Cache")
    CacheSupervisor.start_link(opts)
  end

  @doc """
  A child specification for a supervisor; takes `start_link/1`'s options.
  The child is the cache's own supervisor (`type: :supervisor`; see
  "Processes").
  """
  @spec child_spec(keyword()) :: Supervisor.child_spec()
  def child_spec(opts) do
    opts = Config.validate!(opts)

    # (through Instance's child spec, which records the supervisor that
    # starts it: drop/1 terminates it through that supervisor)
    Instance.child_spec(__MODULE__, opts[:name], {CacheSupervisor, :start_link, [opts]},
      type: :supervisor,
      restart: :permanent
    )
  end

  @doc """
  The cache's handle: what `fetch/3` and `get/3` otherwise look up by
  the cache's name on every call, resolved once. A call given the handle
  skips that look-up (a `:persistent_term` read and a match), which is
  part of an L1 hit's cost (`mix run bench/cache_bench.exs --only hits`
  measures a hit by handle and by name against a raw ETS lookup). Every
  function that takes the cache's name takes its handle.

  A handle stays usable when its cache is restarted (by its supervisor,
  with new tables): a read given a handle whose cache has stopped looks the
  name up again and reads the running cache, so a handle costs a restart
  one look-up per call until the caller takes a new one, never an error
  while a cache of that name runs. Raises `ArgumentError` for a name that
  runs no cache.

      iex> {:ok, _} = Larder.Cache.start_link(name: :doc_handle)
      iex> cache = Larder.Cache.handle(:doc_handle)
      iex> Larder.Cache.fetch(cache, :k, fn -> {:ok, 1} end)
      {:ok, 1}
      iex> Larder.Cache.get(cache, :k)
      1
      iex> Larder.Cache.drop(:doc_handle)
      :ok
  """
  @spec handle(cache()) :: handle()
  def handle(cache), do: config!(cache)

  @doc """
  Reads `key` through L1, L2 and `loader`.

  `loader` is called at most once for all the concurrent misses on `key` in
  this node, and its `{:ok, value}` is written to L1 and (if the key is
  absent there) L2. Returns `{:ok, value}`, or `{:error, %Larder.Error{}}`
  when the loader fails.
  """
  @spec fetch(cache(), key(), loader()) :: {:ok, value()} | {:error, Larder.Error.t()}
  # A hit is this call and Loader.read/3's first clause, nothing more: the
  # read itself turns an ETS error from a cache that went away meanwhile
  # into the unknown-cache error, so no try (and no frame) is kept here.
  def fetch(cache, key, loader) when is_function(loader, 0),
    do: Loader.read(config!(cache), key, loader)

  def fetch(_cache, _key, loader) do
    raise ArgumentError, "expected loader to be a function of arity 0, got: #{inspect(loader)}"
  end

  @doc "Like `fetch/3`, but returns the value or raises the `Larder.Error`."
  @spec fetch!(cache(), key(), loader()) :: value()
  def fetch!(cache, key, loader) do
    case fetch(cache, key, loader) do
      {:ok, value} -> value
      {:error, error} -> raise error
    end
  end

  @doc """
  Reads `key` from L1, then L2 (backfilling L1), without loading; returns
  `default` when neither has it (or when the cache stops during the call).
  """
  @spec get(cache(), key(), value()) :: value()
  def get(cache, key, default \\ nil) do
    case Loader.read(config!(cache), key, nil) do
      {:ok, value} -> value
      _none -> default
    end
  end

  @doc """
  Writes `value` under `key` in L1 and L2, and tells the other nodes to drop
  their copy.
  An error from the L2 (or from the invalidation) does not mean the L2 was
  left unchanged: a timed-out `SET` may still land. The key is then deleted
  from the L2 and published to the other nodes as soon as the L2 answers
  again (see "Writes whose L2 outcome is unknown" under Failures).

  Options: `:ttl` - milliseconds, at most 3_153_600_000_000 (100 years), or
  `:infinity` (default: the cache's `:ttl`). Returns `:ok`, or `{:error,
  %Larder.Error{}}` if the L2 write failed (L1 holds the value either way,
  unless its L1 is off: see "Redis refusing tracking" and "Redis refusing
  the subscription" under Concurrency).
  """
  @spec put(cache(), key(), value(), keyword()) :: :ok | {:error, Larder.Error.t()}
  def put(cache, key, value, opts \\ []) do
    Writes.put(current!(cache), key, value, opts)
  rescue
    e in ArgumentError -> reraise_unknown(cache, e, __STACKTRACE__)
  end

  @doc """
  Deletes `key` from L1 and L2, and tells the other nodes to drop their copy.
  Returns `:ok`, or `{:error, %Larder.Error{}}` if the L2 failed (L1 no
  longer holds the key either way); the delete and the invalidation are
  then retried until the L2 answers.
  """
  @spec delete(cache(), key()) :: :ok | {:error, Larder.Error.t()}
  def delete(cache, key) do
    Writes.delete(current!(cache), key)
  rescue
    e in ArgumentError -> reraise_unknown(cache, e, __STACKTRACE__)
  end

  @doc """
  Makes every entry unreachable: bumps the namespace's generation (kept in
  the L2, so every node moves to it), which orphans the old L2 keys, and
  clears L1 here and, through the invalidation channel, on the other nodes.

  Returns `:ok` once L1 here is clear and this node is on the L2's new
  generation, or `{:error, %Larder.Error{}}` if the L2 could not be reached
  (L1 is cleared here either way); the generation is then bumped and
  published as soon as the L2 answers again. If the generation key was
  lost or holds no generation, a fresh one replaces it (see "Generations"
  under Failures).

  With `codec: :raw` the L2 keys hold no generation: the call clears every
  node's L1 and leaves the keys in Redis alone (only the generation key
  moves), so the next reads load what Redis holds.
  """
  @spec invalidate_all(cache()) :: :ok | {:error, Larder.Error.t()}
  def invalidate_all(cache), do: Writes.invalidate_all(current!(cache))

  @doc """
  Counters since start: `:l1_hits`, `:l1_misses`, `:l2_hits`, `:l2_misses`,
  `:loads` (loader calls), `:load_errors`, `:l2_errors` (unreachable or
  failing L2, bad replies and rejected values), `:decode_errors` (L2 values
  rejected before or while decoding, and a generation key that is not a
  generation), `:evictions`, `:invalidations` (received from other nodes),
  `:bad_messages` (invalidation messages ignored as malformed, out of range
  or too large), plus the current `:entries` and `:bytes`.
  """
  @spec stats(cache()) :: %{atom() => non_neg_integer()}
  def stats(cache) do
    Stats.snapshot(current!(cache))
  rescue
    e in ArgumentError -> reraise_unknown(cache, e, __STACKTRACE__)
  end

  @doc """
  Drops the cache: stops its supervisor, and with it the expiry clock, the
  L2's processes and the cache's process, whose ETS tables (L1, the
  loading rows, the counters) are freed with it; the name is free again
  once it returns. By name or by the pid `start_link/1` returned (or the
  cache's process, registered under its name).

  Under a supervisor (`Supervisor` or `DynamicSupervisor`, as
  `child_spec/1` places it), the cache's child is terminated through that
  supervisor, so it is not restarted: it stays dropped. Otherwise its
  supervisor stops with reason `:normal`, so the process that called
  `start_link/1`, which is linked to it, lives on without trapping exits.

  Returns `:ok` once the cache's supervisor is gone. Idempotent: a name
  or pid that runs no cache (any more) is taken as one already dropped.
  Raises `ArgumentError` for a term that is neither a name nor a pid.
  Every later call on the cache raises `ArgumentError` ("unknown
  Larder.Cache"); a call racing the drop completes, raises that error, or
  (a `fetch/3` or `get/3` loading) returns `{:error, %Larder.Error{reason:
  :cache_stopped}}`. Nothing is written to the L2: its keys stay for the other nodes.
  """
  @spec drop(cache() | pid()) :: :ok
  def drop(cache) when Instance.name?(cache) do
    case Instance.whereis(__MODULE__, cache) do
      nil -> :ok
      owner -> CacheSupervisor.drop(owner)
    end
  end

  def drop(cache) when is_pid(cache), do: CacheSupervisor.drop(cache)
  def drop(%Runtime{name: name}), do: drop(name)
  def drop(other), do: Instance.invalid!(__MODULE__, other)

  ## Internals

  @compile {:inline, config!: 1}
  defp config!(cache) when Instance.name?(cache), do: Instance.resolve(__MODULE__, cache)
  defp config!(%Runtime{} = rt), do: rt
  defp config!(other), do: Instance.invalid!(__MODULE__, other)

  # The running cache: a handle's own only for reads (see handle/1);
  # writes, stats and invalidate_all/1 look its name up, so a handle of a
  # restarted cache reaches the running one.
  defp current!(%Runtime{name: name}), do: config!(name)
  defp current!(cache), do: config!(cache)

  # A cache whose owner died leaves its config behind but not its tables;
  # one that stopped (or was dropped) during the call leaves neither.
  defp reraise_unknown(%Runtime{name: name}, e, stacktrace),
    do: reraise_unknown(name, e, stacktrace)

  defp reraise_unknown(cache, %ArgumentError{} = e, stacktrace) do
    if Instance.name?(cache) and gone?(Instance.lookup(__MODULE__, cache)),
      do: Instance.unknown!(__MODULE__, cache),
      else: reraise(e, stacktrace)
  end

  defp gone?(nil), do: true
  defp gone?(rt), do: Runtime.stopped?(rt)
end
