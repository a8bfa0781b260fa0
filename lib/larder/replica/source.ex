defmodule Larder.Replica.Source do
  @moduledoc """
  The behaviour of a log that a `Larder.Replica` follows: entries, each an
  id and a map of fields, read in order from a *position*, the replica's
  place in the log, which its snapshots store. `Larder.Replica.RedisStream`
  (a Redis Stream, whose position is the id of the last entry applied) and
  `Larder.Replica.Kafka` (a topic, whose position is the next offset to read
  in each partition) implement it; a file of records or a database's change
  feed fit the same callbacks.

  A source is given to the replica as `{module, options}`. The replica
  calls `validate!/1` when it is configured (so bad options raise
  `ArgumentError` in the caller of `Larder.Replica.start_link/1`), then
  `connect/1`, `read/4` in a loop and `close/1`: in a reader process of
  its own, which blocks in `read/4` up to `:block_ms` and hands each batch
  to the replica's process; or, for a source that implements the optional
  `notify/2` (a client that reads ahead in threads of its own, such as
  librdkafka), with `block_ms` 0 in a short-lived process of the
  replica's per batch, which applies what it read (no copy of the batch
  between processes): one such process at a time, each handed the
  connection the one before returned. `latest/2` runs for
  `Larder.Replica.await/3`, in a process of its own that the caller stops
  waiting for (and kills) once its timeout is spent.

  ## The contract

    * A position may be made of several parts (one per partition of a
      topic). `origin/1` is the position before every entry: reading from
      it reads the whole log. `advance/2` gives the position after one
      entry applied at a position; `reached?/2` says whether a position
      includes everything up to a target position (every part at or past
      the target's). Positions are plain terms (they are stored in
      snapshots); `cast_position/1` checks one read from a snapshot or
      given to `Larder.Replica.await/3`.
    * `read(conn, position, count, block_ms)` returns `{:ok, entries,
      position_after, conn}`: up to `count` entries that follow `position`,
      in the order they are to be applied (within a part, increasing; the
      parts' entries may interleave), with no entry of the log skipped,
      and the position after them. Folding `advance/2` over the entries
      from `position` gives a position that `position_after` has reached;
      `position_after` may be further (past gaps of the log that hold no
      entry: a compacted topic's, a transaction marker's), even with no
      entries. It may wait up to `block_ms` for entries when there are
      none, and returns `{:ok, [], position, conn}` when none came.
    * When the log has lost entries after `position` (trimmed, expired,
      deleted and created again), `read/4` returns `{:trimmed,
      resume_position, conn}` instead: reading from `resume_position`
      reads what the log still holds, and skips nothing that is still
      there. A gap that is the log's normal shape (compaction) is not a
      trim. A source must never skip entries silently.
    * When the log changed in a way that neither reading on nor a rebuild
      from what it holds can follow (a Kafka topic whose partitions were
      added: a key's records are then in two partitions whose relative
      order the log does not keep), `read/4` returns `{:stop,
      %Larder.Error{}, conn}`: the replica applies nothing more and stops
      with `{:shutdown, error}`, whatever its `:on_trimmed`.
    * Everything read from the outside is untrusted: a reply of the wrong
      shape or size is `{:error, %Larder.Error{reason: :source_bad_reply}}`,
      a server that cannot be reached or does not answer in time
      `{:error, %Larder.Error{reason: :source_unavailable}}`. Neither may
      raise. After an error the replica calls `close/1` and, after a
      pause, `connect/1` again and reads on from where it was.
    * `latest(opts, timeout)` is the position the log's end has now: a
      replica whose position has reached it has applied every entry the
      log held when `latest/2` was called. A position that this one has
      not reached (`reached?(latest, position)` is false) means the log
      went backwards, below what the replica applied. An error is
      returned at once: the caller asks again (after 50 ms, doubling up to
      1 s) until the source answers or its own timeout is spent, so a
      source needs no retry loop of its own.
    * `notify(conn, pid)` (optional) is called when a read returned no
      entries: `{:armed, conn}` means the source sends `pid` the message
      `:larder_source_ready` once, when something may be read (a later
      read may still find nothing: an end of partition, a spurious
      notice); `{:ready, conn}` means there is something to read now. The
      replica also reads every `:block_ms` while it waits, so a source's
      periodic checks in `read/4` go on when the log is idle. An error is
      `{:error, %Larder.Error{}, conn}`, handled as a read's. It must not
      block: it is called in the replica's process.
    * `identity/1` names the log (a stream's name, a topic): it is stored
      in the replica's snapshots, and a snapshot of another log is
      refused.
  """

  @typedoc """
  The replica's place in the log, stored in its snapshots: a term of the
  source's (a stream id; a map of partition to next offset).
  """
  @type position :: term()

  @typedoc "The id of one entry (a stream id; `{partition, offset}`)."
  @type entry_id :: term()

  @typedoc "One entry of the log: its id and its fields."
  @type entry :: {entry_id(), map()}

  @typedoc "The source's connection state, private to it."
  @type conn :: term()

  @doc """
  Checks the source's options and returns them with their defaults.
  Raises `ArgumentError` naming a bad option.
  """
  @callback validate!(opts :: term()) :: keyword()

  @doc "The name of the log these (validated) options read, stored in snapshots."
  @callback identity(opts :: keyword()) :: binary()

  @doc "The position before every entry: reading from it reads the whole log."
  @callback origin(opts :: keyword()) :: position()

  @doc "`{:ok, position}` when `term` is a position of this source, `:error` otherwise."
  @callback cast_position(term :: term()) :: {:ok, position()} | :error

  @doc "The position after the entry `entry_id`, applied at `position`."
  @callback advance(position(), entry_id()) :: position()

  @doc "Whether `position` includes every entry up to `target` (every part at or past it)."
  @callback reached?(position(), target :: position()) :: boolean()

  @doc "Opens a connection. Must not raise."
  @callback connect(opts :: keyword()) :: {:ok, conn()} | {:error, Larder.Error.t()}

  @doc "Reads the entries that follow `position` (see \"The contract\"). Must not raise."
  @callback read(conn(), position(), count :: pos_integer(), block_ms :: non_neg_integer()) ::
              {:ok, [entry()], position_after :: position(), conn()}
              | {:trimmed, resume_position :: position(), conn()}
              | {:stop, Larder.Error.t(), conn()}
              | {:error, Larder.Error.t(), conn()}

  @doc """
  The position of the log's end now (`origin/1`'s when it is empty), over
  a connection of its own, within `timeout` ms. Must not raise.
  """
  @callback latest(opts :: keyword(), timeout :: non_neg_integer()) ::
              {:ok, position()} | {:error, Larder.Error.t()}

  @doc "Closes a connection. Must not raise."
  @callback close(conn()) :: :ok

  @doc """
  Asks for the message `:larder_source_ready` to `pid` once something can
  be read (see "The contract"). Optional: a source that implements it is
  read in the replica's own process. Must not raise nor block.
  """
  @callback notify(conn(), pid()) ::
              {:armed, conn()} | {:ready, conn()} | {:error, Larder.Error.t(), conn()}

  @optional_callbacks notify: 2
end
