defmodule Larder.Cache.L2 do
  @moduledoc """
  The behaviour of a second cache level behind `Larder.Cache`'s ETS L1.

  `Larder.Cache` builds every L2 key itself (namespace, version, generation
  and the encoded key) and encodes every value with `term_to_binary/2`, so an
  implementation only stores binaries under binary keys. `Larder.Cache.Redis`
  is the one shipped with Larder; every implementation must pass the shared
  conformance suite in `test/support/l2_conformance.ex`.

  ## Lifecycle

  The cache's owner process calls `c:init/3` once. The implementation starts
  whatever processes it needs *linked to the caller* and returns a state that
  any process may then pass to the other callbacks (callers use it directly,
  they do not go through the cache's owner). `c:init/3` must not fail when the
  backend is unreachable: it returns a state that reports errors until the
  backend comes back, and reconnects on its own.

  If a process the implementation linked to the caller exits (with a reason
  other than `:normal`), the cache calls `c:stop/1` and then `c:init/3`
  again after a backoff, and serves L1 meanwhile; the implementation should
  replace its own crashed processes itself where it can, as
  `Larder.Cache.Redis` does, so that this stays rare.

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
      is then also sent when the backend may have changed keys unreported
      (the tracking was lost and is back).
    * `{:larder_cache_l2, :disconnected}` (optional) each time the
      subscription's connection is lost; the cache only reports it (the
      `[:larder, :cache, :l2, :disconnected]` event of `Larder.Telemetry`).

  ## Failures

  Every callback other than `c:init/3` returns within the implementation's
  configured timeout, and reports an unreachable or failing backend as
  `{:error, %Larder.Error{reason: :l2_unavailable}}` (or another reason),
  never by raising or exiting. The cache checks what comes back anyway: a
  return value outside a callback's spec is counted as an L2 error, and
  values, generations and messages are bounded and shape-checked before
  use.
  """

  @typedoc "Whatever `c:init/3` returns; passed back to every other callback."
  @type state :: term()
  @type key :: binary()
  @type error :: {:error, Larder.Error.t()}

  @doc "Starts the level (linked to the caller) and subscribes `subscriber` to `channel`."
  @callback init(opts :: keyword(), subscriber :: pid(), channel :: binary()) :: {:ok, state()}

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

  @doc "Stops what `c:init/3` started."
  @callback stop(state()) :: :ok

  @doc """
  Checks the options `c:init/3` will get and raises `ArgumentError` naming
  a bad one. `Larder.Cache.start_link/1` calls it in the caller's process,
  so bad options fail there rather than in the cache's process.
  """
  @callback validate_opts!(opts :: keyword()) :: keyword()

  @optional_callbacks validate_opts!: 1
end
