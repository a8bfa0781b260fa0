defmodule Larder.Cache.L2 do
  @moduledoc """
  The behaviour of a second cache level behind `Larder.Cache`'s ETS L1.

  `Larder.Cache` builds every L2 key itself (namespace, version, generation
  and the encoded key) and encodes every value with `term_to_binary/2`, so an
  implementation only stores binaries under binary keys. `Larder.Cache.Redis`
  is the one shipped with Larder; every implementation must pass the shared
  conformance suite in `test/support/l2_conformance.ex`.

  ## Lifecycle

  A cache is a small supervision tree (see "Processes" in `Larder.Cache`),
  and an L2's processes are part of it. The cache's owner process calls
  `c:init/3` once, at start: it checks the options and builds the state,
  which any process may then pass to the other callbacks (callers use it
  directly, they do not go through the cache's owner). `c:init/3` starts
  no process; what it creates (an ETS table, say) belongs to the owner and
  lives as long as the cache.

  The processes (connections, subscribers, watchers) are a child spec
  that `c:init/3` returns with the state (`{:ok, state, child_spec}`, the
  shape of Nebulex's adapters); the cache runs that child under a
  supervisor of its own, after the owner. The state must therefore hold
  only names that stay valid when those processes restart: a process that
  restarts publishes what callers need (its pid, a connection's pid) where
  the state points (`Larder.Cache.Redis` keeps its clients' pids in an ETS
  table that its pools fill again when they restart), so callers never
  see a stale state and the state is never replaced. An L2 with no process
  of its own (an in-memory one, in tests) returns `{:ok, state}`.

  The child must not fail to start when the backend is unreachable: it
  starts, reports errors until the backend comes back, and reconnects on
  its own, with a backoff, without exiting. Crashing is not the way to
  reconnect: the cache treats an exit as a bug. When the child (or any
  process of it) exits, the cache stops them all, counts an `:l2_errors`,
  emits `[:larder, :cache, :l2, :disconnected]` (reason `:process_died`)
  and starts the child again after 100 ms, doubling up to 5 s while it
  keeps stopping within 5 s of its start (each wait +-25% at random: the
  backoff the Redis client's connections use too); L1 keeps serving throughout,
  L2 calls fail with an error meanwhile, and the owner (with its tables)
  is never restarted for it. An L2 caught in a crash loop therefore costs
  a log line and one restart per backoff period, never the cache. A child
  that cannot start when the cache starts makes `Larder.Cache.start_link/1`
  return `{:error, %Larder.Error{reason: :l2_failed}}`; later it is tried
  again with the same backoff.

  When the cache stops, the L2's processes are stopped first (each within
  its child spec's `:shutdown`), then the owner calls `c:stop/1`.

  ## Messages

  The implementation subscribes to `channel` and sends the `subscriber` pid:

    * `{:larder_cache_l2, :message, payload}` for every payload published on
      the channel, by any instance including the subscriber's own;
    * `{:larder_cache_l2, :connected}` each time the subscription is
      (re-)established, so that the cache can re-read what it may have missed.
    * `{:larder_cache_l2, :invalidated, keys}` (with the cache's
      `invalidation: :tracking`, which passes the L2 a `:tracking_prefix`
      option): `keys` is the list of L2 keys under that prefix that any
      client changed, or `:all` after the backend was flushed. `:connected`
      is then sent only once the backend reports changes (the subscription
      is up and tracking is on), and also when the backend may have
      changed keys unreported (the tracking was lost and is back). With any
      invalidation, `:all`
      also means that the backend is being replaced and what was read
      from it may be lost (a Sentinel failover has begun): the cache
      clears its L1. `:bad` in place of the keys is counted in
      `:bad_messages`.
    * `{:larder_cache_l2, :replaced}` (optional) when the L2 moved to
      another server that may hold older values than those written (a
      replica a Sentinel failover promoted, which lacks the writes the
      old server acknowledged but had not replicated). It is sent once
      the L2's calls reach the new server: the cache moves to a new
      generation there (an `c:incr/2` of its generation key, retried
      until it succeeds), so that no node reads what the keys of the old
      generation hold.
    * `{:larder_cache_l2, :refused, error}` when the backend answers but
      refuses what the invalidation needs: to report changes (with
      tracking: an ACL without the commands, a server without the
      feature), or the subscription itself (an ACL without the channel),
      while its other commands may work; `error` is a `Larder.Error` that
      says what to grant. The cache clears its L1 and keeps nothing in it
      (every read goes to the L2 or the loader) until the next
      `:connected`, which the implementation sends once the backend
      reports changes (or delivers the channel's messages) again. An
      implementation that can tell at start (its child's start) that the
      backend refuses returns that error from the start instead, which
      `Larder.Cache.start_link/1` returns. (`:tracking_refused` is taken
      as an older name of `:refused`.)
    * `{:larder_cache_l2, :disconnected}` (optional) each time the
      subscription's connection is lost, or the L2 moves to another server
      (a Sentinel failover) whether or not it was subscribed: the cache
      reports it (the `[:larder, :cache, :l2, :disconnected]` event of
      `Larder.Telemetry`) and clears its L1 at the next `:connected`.

  ## Failures

  Every callback other than `c:init/3` returns within the implementation's
  configured timeout, and reports an unreachable or failing backend as
  `{:error, %Larder.Error{reason: :l2_unavailable}}` (or another reason),
  never by raising or exiting. The cache checks what comes back anyway: a
  return value outside a callback's spec is counted as an L2 error, and
  values, generations and messages are bounded and shape-checked before
  use.

  ## Deadlines

  One call of the cache can make several L2 calls (a `fetch/3` of a new key
  reads then writes; a `put/4` writes then publishes). An implementation
  that exports `c:deadline/2` bounds them all together: the cache asks it
  for the state of one call, and every callback given that state returns
  by the call's deadline, so the call waits for the L2 at most the
  implementation's timeout in all. Without it, each L2 call is bounded by
  that timeout on its own.
  """

  @typedoc "Whatever `c:init/3` returns; passed back to every other callback."
  @type state :: term()
  @type key :: binary()
  @type error :: {:error, Larder.Error.t()}

  @doc """
  Builds the state, in the cache's owner process, and the child spec of the
  L2's processes (see "Lifecycle"), which subscribe `subscriber` to
  `channel`; an L2 that runs no process returns `{:ok, state}`. Starts no
  process; may raise `ArgumentError` for bad options.
  """
  @callback init(opts :: keyword(), subscriber :: pid(), channel :: binary()) ::
              {:ok, state()} | {:ok, state(), Supervisor.child_spec()}

  @doc "Reads `key`: `{:ok, binary}`, `:miss`, or an error."
  @callback get(state(), key()) :: {:ok, binary()} | :miss | error()

  @doc """
  Writes `value` under `key`, expiring after `ttl` milliseconds. With mode
  `:new` the write happens only if the key is absent (both outcomes are `:ok`).
  """
  @callback put(
              state(),
              key(),
              value :: binary(),
              ttl :: pos_integer() | :infinity,
              :always | :new
            ) ::
              :ok | error()

  @doc "Deletes `key`; deleting an absent key is `:ok`."
  @callback delete(state(), key()) :: :ok | error()

  @doc "Atomically increments the integer counter at `key` (absent is 0) and returns the new value."
  @callback incr(state(), key()) :: {:ok, integer()} | error()

  @doc "Publishes `payload` to every subscriber of `channel`."
  @callback publish(state(), channel :: binary(), payload :: binary()) :: :ok | error()

  @doc "Releases what `c:init/3` made, once the L2's processes have stopped."
  @callback stop(state()) :: :ok

  @doc """
  Checks the options `c:init/3` will get and raises `ArgumentError` naming
  a bad one. `Larder.Cache.start_link/1` calls it in the caller's process,
  so bad options fail there rather than in the cache's process.
  """
  @callback validate_opts!(opts :: keyword()) :: keyword()

  @doc """
  The state for one call of the cache, whose callbacks must all return by
  one deadline (a `System.monotonic_time(:millisecond)`), and that deadline:
  with `nil`, the implementation's timeout from now; with an integer, that
  one (the cache moves a call's deadline past the time its loader took).
  A callback given that state when the deadline has passed returns an
  error without waiting. Pure: it starts and sends nothing.
  """
  @callback deadline(state(), deadline :: integer() | nil) :: {state(), integer()}

  @optional_callbacks validate_opts!: 1, deadline: 2
end
