defmodule Larder.Telemetry do
  @moduledoc """
  The `:telemetry` events Larder emits, with their measurements and metadata.

  Larder does not depend on `:telemetry`: it emits events only when the
  `:telemetry` application is loadable at run time, which each cache,
  register, bag and table checks once, when it is created or started
  (`Code.ensure_loaded?(:telemetry)`), and stores in its own handle or
  configuration. An instance created before `:telemetry` was available
  emits nothing until it is created again. Without `:telemetry`, or with
  the per-instance option `telemetry: false` (`Larder.Cache.start_link/1`,
  `Larder.Register.new/1`, `Larder.Bag.new/1` and `Larder.Bag.load/2`,
  `Larder.Table.new/1`), an event costs one boolean check of that stored
  answer.

  Event names are fixed; the instance is in the metadata (`:cache`, the
  cache's name; `:register`, `:bag` and `:table`, the instance's name, or
  its handle when it has none). Spans follow `:telemetry.span/3`: a
  `:start` event, then a `:stop` event or, when the call raises, exits or
  throws, an `:exception` event.

  Handlers run in the process that emits the event: a caller of the
  instance, or the cache's own process (invalidations received, L2
  connection events). Never in the middle of a write: events are emitted
  after the slot lock of the write is released. A handler that is slow
  slows that process down; one that raises is handled as `:telemetry`
  handles it (detached).

  ## Attaching

      :telemetry.attach_many(
        "my-larder-handler",
        [
          [:larder, :cache, :fetch, :stop],
          [:larder, :cache, :l2, :error]
        ],
        &MyApp.Metrics.handle_event/4,
        nil
      )

  ## Cache spans

  Each of these emits `[:larder, :cache, op, :start]`, then
  `[:larder, :cache, op, :stop]` or `[:larder, :cache, op, :exception]`:

    * `op = :fetch`: `Larder.Cache.fetch/3`, `fetch!/3` and `get/3`.
    * `op = :put`: `Larder.Cache.put/4`.
    * `op = :delete`: `Larder.Cache.delete/2`.

  `:start` measurements: `:system_time` (`System.system_time/0`) and
  `:monotonic_time` (native units). Metadata: `:cache` (the name) and
  `:key`, plus `:telemetry_span_context`.

  `:stop` measurements: `:duration` and `:monotonic_time` (native units).
  Metadata: `:cache`, `:key` and `:result`:

    * for `:fetch`: `:hit` (L1), `:l2_hit` (read from the L2, written back
      to L1), `:load` (this call ran the loader), `:waited` (another
      process's load of the key answered it), `:miss` (`get/3` found
      nothing) or `:error` (the loader failed, or the cache stopped during
      the call);
    * for `:put` and `:delete`: `:ok` or `:error` (L1 was written either
      way; the L2 outcome is being repaired).

  When `:result` is `:error`, the metadata also holds `:error`, the
  `Larder.Error` returned to the caller.

  `:exception` measurements: `:duration`, `:monotonic_time`. Metadata:
  `:cache`, `:key`, `:kind`, `:reason`, `:stacktrace` (an unknown cache,
  a loader calling `fetch/3` for its own key).

  ## Cache events

    * `[:larder, :cache, :eviction]`: a value was evicted from L1 by
      `:max_entries` or `:max_bytes`. Measurements: `:count` (1). Metadata:
      `:cache`, `:key`.
    * `[:larder, :cache, :invalidation, :sent]`: this node published an
      invalidation on the L2 channel (after `put/4`, `delete/2` or
      `invalidate_all/1`, or the repair of one whose L2 outcome was
      unknown). Measurements: `:count` (1). Metadata: `:cache`, `:message`:
      `{:key, key}` or `{:all, generation}`.
    * `[:larder, :cache, :invalidation, :received]`: another node's
      invalidation arrived and was applied. Measurements: `:count` (1).
      Metadata: `:cache`, `:message` as above. With `invalidation:
      :tracking`, also for each key Redis reported changed (`{:key, key}`,
      whoever wrote it, this node included) and for a `FLUSHDB` or
      `FLUSHALL` (`:flush`, L1 cleared).
    * `[:larder, :cache, :l2, :error]`: an L2 call failed, returned a value
      outside the `Larder.Cache.L2` behaviour, or returned a value that
      failed its checks, or a process of the L2 died; counted in `:l2_errors`
      of `Larder.Cache.stats/1` at the same place. Measurements: `:count`
      (1). Metadata: `:cache`, `:reason`: the `Larder.Error` reason
      (`:l2_unavailable`, `:l2_failed`, `:l2_bad_reply`, ...),
      `:bad_value` (a value rejected by its checks) or `:process_died`.
    * `[:larder, :cache, :l2, :connected]`: the L2's subscription to the
      invalidation channel is (re-)established. Measurements:
      `:system_time`. Metadata: `:cache`.
    * `[:larder, :cache, :l2, :disconnected]`: the L2 lost its
      subscription connection (reported by the L2, see `Larder.Cache.L2`),
      or a process of the L2 died and the cache restarts it. Measurements:
      `:system_time`. Metadata: `:cache`, `:reason` (`:connection_lost` or
      `:process_died`).

  ## Bag spans

  Each of these emits `[:larder, :bag, op, :start]`, then
  `[:larder, :bag, op, :stop]` or `[:larder, :bag, op, :exception]`:

    * `op = :dump`: `Larder.Bag.dump/2` and `dump!/2`.
    * `op = :load`: `Larder.Bag.load/2` and `load!/2`; on or off by
      `load/2`'s own `:telemetry` option, which the loaded bag keeps.

  `:start` measurements: `:system_time`, `:monotonic_time`. Metadata:
  `:bag` (the name, or the handle of a bag without one; for `:load`, the
  `:name` option, or `nil`) and `:path`, plus `:telemetry_span_context`.

  `:stop` measurements: `:duration`, `:monotonic_time`. Metadata: `:bag`
  (for `:load`, the loaded bag: its name, or its handle), `:path` and
  `:result`: `:ok`, or `:error` with `:error`, the `Larder.Error` returned
  (`:file_error`, `:corrupt_snapshot`).

  `:exception` measurements: `:duration`, `:monotonic_time`. Metadata:
  `:bag`, `:path`, `:kind`, `:reason`, `:stacktrace` (a bag dropped during
  its dump).

  ## Table spans

  Each of these emits `[:larder, :table, op, :start]`, then
  `[:larder, :table, op, :stop]` or `[:larder, :table, op, :exception]`:

    * `op = :search`: `Larder.Table.search/2`, `search_keys/2`,
      `search_many/2` and `count/2`. Metadata `:op` says which (`:search`,
      `:search_keys`, `:search_many`, `:count`) and `:conditions` holds the
      conditions (for `:search_many`, the list of them). `:stop` metadata
      adds `:results`: the records or keys returned, the count, or for
      `:search_many` the records of all the searches together.
    * `op = :write`: `Larder.Table.insert/2`, `insert_many/2`, `merge/3`,
      `update/4` and `delete/2`, one span per call (`insert_many/2`'s
      chunks are one span). Metadata `:op` (`:insert`, `:insert_many`,
      `:merge`, `:update`, `:delete`) and, for the last three, `:key`.
      `:stop` metadata adds `:result`: `:ok`, or `:not_found` for a
      `merge/3` into a key with no record.

  Measurements as for the Cache spans. Metadata also `:table` (the name, or
  the handle of a table without one) and `:telemetry_span_context`;
  `:exception` adds `:kind`, `:reason`, `:stacktrace` (bad conditions or
  records, a dropped table, an `update/4` function that raised). A table
  without events costs each search one check of a field of its handle.

  ## Replica events

  `Larder.Replica` emits `[:larder, :replica, :batch]`, `[:larder, :replica,
  :rejected]`, `[:larder, :replica, :snapshot]`, `[:larder, :replica,
  :trimmed]` and `[:larder, :replica, :source, :error]`, from the replica's
  own process; their measurements and metadata are listed in
  `Larder.Replica`, "Telemetry". `telemetry: false` turns them off.

  ## Register events

    * `[:larder, :register, :lock, :takeover]`: a writer took over a slot
      whose holder died while holding it, and committed what that holder
      left (unless a reader had committed it already). Measurements:
      `:count` (1). Metadata: `:register`, `:slot` (1-based).
  """

  # Larder is compiled without :telemetry; it is called only after
  # enabled?/1 found it loaded.
  @compile {:no_warn_undefined, :telemetry}

  @doc false
  # Whether an instance started with `telemetry: opt` emits events: checked
  # once, when the instance starts, and stored in it.
  @spec enabled?(boolean()) :: boolean()
  def enabled?(false), do: false

  def enabled?(true) do
    Code.ensure_loaded?(:telemetry) and function_exported?(:telemetry, :execute, 3) and
      function_exported?(:telemetry, :span, 3)
  end

  @doc false
  # :telemetry.span/3 when enabled: `fun` returns {result, stop_metadata}.
  @spec span(boolean(), [atom()], map(), (() -> {result, map()})) :: result when result: var
  def span(true, event, meta, fun), do: :telemetry.span(event, meta, fun)
  def span(false, _event, _meta, fun), do: elem(fun.(), 0)

  @doc false
  @spec execute(boolean(), [atom()], map(), map()) :: :ok
  def execute(true, event, measurements, meta), do: :telemetry.execute(event, measurements, meta)
  def execute(false, _event, _measurements, _meta), do: :ok
end
