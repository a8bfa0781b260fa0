defmodule Larder do
  @moduledoc """
  Fast in-memory state for read-heavy BEAM services, without ETS's sharp edges.

  Larder is for Elixir and Erlang services that sync state from Kafka, Redis
  or a database and serve it at microsecond latency. Each capability is one
  public module:

    * `Larder.Bag` - set-semantic multi-value tables: a `{key, value}` pair is
      stored at most once, without the insert cost of ETS `:bag` that grows
      with every value a key holds, with disk snapshots for fast restarts.
    * `Larder.Register` - versioned hot-key values for any key: a process
      re-reading an unchanged value gets its own copy back after one atomics
      read, with no ETS lookup and no copy, and never a stale one.
    * `Larder.Cache` - a read-through cache: an ETS L1 in every node in front
      of a Redis L2, with miss collapsing, a per-key version that keeps
      backfills from overwriting newer writes, and cross-node L1
      invalidation through Redis pub/sub.
    * `Larder.Table` - map records keyed by a primary key in ETS, with
      secondary indexes held as Roaring bitmaps by a Rust NIF
      (`Larder.Index`), searched by ANDing the bitmaps smallest first.
    * `Larder.Replica` - a Table or Bag on every node kept equal to a log
      (a Redis Stream, or any `Larder.Replica.Source`): read in batches,
      snapshotted with its position in the log, restarted from
      that snapshot, with `await/3` for "caught up".

  Every performance claim in these docs comes from a benchmark under `bench/`
  that measures Larder side by side with the ETS (or Redis) baseline in the
  same run. `make bench` runs them all.

  Errors follow one convention across the library: bad arguments raise
  `ArgumentError` naming the argument; failures that come from the world
  (a corrupt file, a server that is down) are returned as
  `{:error, %Larder.Error{}}`, whose reasons `Larder.Error` lists.

  Larder is an OTP application: it starts with yours once `:larder` is in
  your project's deps (in a script, call
  `Application.ensure_all_started(:larder)`). Creating a structure while it
  is not started (`new/1`, `start_link/1`, `load/2`, a snapshot's
  `dump/2`) raises a `RuntimeError` that says so and what to do. Loading a
  `Larder.Table` or `Larder.Bag` snapshot logs one line at `:info` (its
  name, path, size and time); `Logger.put_application_level(:larder,
  :warning)` turns Larder's info lines off (see "Logging" in those
  modules).

  Every capability has the same shape. Options come last as a keyword
  list, checked the same way everywhere: an unknown option raises
  "unknown Larder.Bag options [:x]; valid options are: [...]", a bad value
  "expected Larder.Bag option :dedup to be a boolean, got: :yes". Every
  structure is freed by `drop/1` (`Larder.Bag.drop/1`,
  `Larder.Register.drop/1`, `Larder.Table.drop/1`, `Larder.Index.drop/1`,
  `Larder.Cache.drop/1`, `Larder.Replica.drop/1`),
  which frees all it holds at once and returns `:ok` again for a structure
  already dropped. Caches, registers, bags and tables take
  `telemetry: false` to turn off their events (`Larder.Telemetry`).

  No input takes the node down: native code never recurses over user terms
  or panics, and moves long calls to dirty schedulers; every numeric option
  has an upper bound; Redis replies, pub/sub messages, L2 values and
  snapshot files are checked for shape, type, range and size before use,
  and hostile ones are ignored and counted. Writers killed mid-write leave
  nothing half done: the next writer repairs it (`Larder.Register`,
  `Larder.Cache`) or the write runs in the table's own process
  (`Larder.Table`).
  """
end
