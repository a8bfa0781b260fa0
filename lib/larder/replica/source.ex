defmodule Larder.Replica.Source do
  @moduledoc """
  The behaviour of a log that a `Larder.Replica` follows, version 3:
  entries, each an id and its fields (a term of the source's: a map for
  `Larder.Replica.RedisStream`, a `kafka_record` tuple for
  `Larder.Replica.Kafka`), read in order from a
  *position*, the replica's place in the log, which its snapshots store.
  `Larder.Replica.RedisStream` (a Redis Stream, whose position is the id of
  the last entry applied), `Larder.Replica.Kafka` (a topic, whose
  position is the next offset to read in each partition) and
  `Larder.Replica.Postgres` (the tables of a Postgres publication, copied
  and then followed through a logical replication slot, whose position is
  a WAL position) implement it; a message broker's stream or a file of
  records fit the same callbacks.

  `test/support/source_conformance.ex` is the contract as tests: every
  source in this repository runs it.

  ## Processes

  A source is given to the replica as `{module, options}`. The replica
  calls `validate!/1` when it is configured (so bad options raise
  `ArgumentError` in the caller of `Larder.Replica.start_link/1`). Then
  one process of the replica's, its *reader*, calls `connect/1`, and the
  same process calls every callback that takes the connection: `read/4`
  in a loop, `notify/2`, `committed/2` and `close/1`. A connection is
  used only by the process that made it, so it may own a socket, a port
  or a NIF resource bound to that process. The reader is linked to the
  replica and ends with it: on a stop it is killed, possibly inside
  `read/4` (which blocks up to `block_ms`), and `close/1` is not called
  then, so what a connection holds must go when its process exits (a
  socket or port it owns closes; a NIF resource's destructor frees it).
  The reader takes no message meant for a source: a socket is read in
  passive mode (`active: false`, within `read/4`), and a source told of
  data by a message of its own (a NIF thread, an active socket) says so
  through `notify/2`'s `:larder_source_ready`; the reader drops any other
  message it does not know.
  After a connect that failed, or a read, notice or commit that returned
  an error, the reader calls `close/1` (when it has a connection), waits
  100 ms, doubling up to 1 s, and connects again, reading on from where it
  was. A `connect/1`, `read/4`, `notify/2`, `committed/2` or `close/1`
  that raises, throws or exits, or returns something the contract does
  not allow, is handled as an error of the source's (`:source_failed`,
  `:source_bad_reply`): counted and retried, never a crash of the replica.

  `latest/2` runs for `Larder.Replica.await/3`, in a process of its own
  (per ask) that the caller stops waiting for, and kills, once its timeout
  is spent: it opens and closes a connection of its own.

  ## Positions

  A position may be made of several parts (one per partition of a topic).
  `origin/1` is the position before every entry: reading from it reads the
  whole log. `advance/2` gives the position after one entry applied at a
  position; `reached?/2` says whether a position includes everything up to
  a target position (every part at or past the target's). Positions are
  plain terms (they are stored in snapshots); `cast_position/1` checks one
  read from a snapshot or given to `Larder.Replica.await/3`, and takes
  every position the source returns.

  `resumable?(position)` (optional: without it every position is) says
  whether a read can go on from `position` on another connection than the
  one that returned it. A log that begins with something that lives only
  as long as one connection returns false for the positions inside it:
  `Larder.Replica.Postgres` copies a database's tables inside a snapshot
  that its replication connection exported, and the positions of the
  copied rows, once that connection is gone, lead nowhere. The replica
  commits no snapshot at a position that is not resumable: a snapshot
  that is due then (its timer's, a `Larder.Replica.dump/1` call's) waits
  for the first batch that ends at a resumable one, and a clean stop there
  writes none (a restart reads from the last snapshot, or from the
  origin). A `read/4` from such a position on a connection that cannot go
  on from it returns `{:trimmed, resume_position, conn}` (see "Reading"):
  the replica's structure holds a part of what the log began with, and
  only a rebuild gives it the rest.

  ## Reading

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
      trim. A source must never skip entries silently. The replica then
      stops (`on_trimmed: :stop`) or rebuilds its structure and reads on
      from `resume_position` (`:rebuild`).
    * When the log changed in a way that neither reading on nor a rebuild
      from what it holds can follow (a Kafka topic whose partitions were
      added: a key's records are then in two partitions whose relative
      order the log does not keep), `read/4` returns `{:stop,
      %Larder.Error{}, conn}`: the replica applies nothing more and stops
      with `{:shutdown, error}`, whatever its `:on_trimmed`.
    * `notify(conn, pid)` (optional) marks a source that reads ahead in
      threads of its own (librdkafka): the reader then calls `read/4`
      with `block_ms` 0, and when a read returned no entries it calls
      `notify/2`. `{:armed, conn}` means the source sends `pid` (the
      reader) the message `:larder_source_ready` once, when something may
      be read (a later read may still find nothing: an end of partition, a
      spurious notice); `{:ready, conn}` means there is something to read
      now. The reader also reads every `:block_ms` while it waits, so a
      source's periodic checks in `read/4` go on when the log is idle. It
      must not block. Which kind a source is matters to the reader only.

  ## Errors

  Everything read from the outside is untrusted, and no callback may
  raise. An error is `{:error, %Larder.Error{}, conn}` (`{:error,
  %Larder.Error{}}` from `connect/1` and `latest/2`), whose reason tells
  the replica what to do:

    * `:batch_too_large` - the read's reply would be larger than the
      source takes (`Larder.Replica.RedisStream`'s `:max_reply_bytes`):
      the reader reads half as many entries per batch from then on, down
      to one, after the pause above;
    * `:source_unavailable` - a server that cannot be reached or does not
      answer in time;
    * `:source_bad_reply` - a reply of the wrong shape or size;
    * `:source_failed` - a refusal (an error reply, a failed
      authentication, a configuration the server rejects).

  Each is reported by a `[:larder, :replica, :source, :error]` event and
  kept as the source's last error (in `await/3`'s `:timeout` error) until
  a read succeeds; the reader logs one warning per outage and one line
  once the source answers again.

  ## Commits

  `committed(conn, position)` (optional) tells the source that a snapshot
  holding `position` is durable: its manifest was renamed into place, so
  the replica never needs the entries up to `position` again, and a
  restart reads on from there. A source that keeps a consumer's place on
  its server (a Postgres slot's flush position, a NATS acknowledgement)
  confirms it here. The position a replica starts from (its snapshot's,
  or the origin without one) counts as committed: after every
  successful `connect/1`, before the first read on that connection, the
  reader calls `committed/2` with the last committed position, so a
  source learns it on each connection; then again, between two reads,
  after each snapshot commits. Positions go back after a rebuild
  (`on_trimmed: :rebuild`) or a restart from an older snapshot: each call
  names where a restart would read from now. An error is handled as a
  read's, and the next connection is told again. A replica without
  `:snapshot` commits nothing past the position it started from.

  ## The log's end

  `latest(opts, timeout)` is the position the log's end has now: a
  replica whose position has reached it has applied every entry the log
  held when `latest/2` was called. A position that this one has not
  reached (`reached?(latest, position)` is false) means the log went
  backwards, below what the replica applied. An error is returned at
  once: the caller asks again (after 50 ms, doubling up to 1 s) until the
  source answers or its own timeout is spent, so a source needs no retry
  loop of its own.

  `identity/1` names the log (a stream's name, a topic): it is stored in
  the replica's snapshots, and a snapshot of another log is refused.

  ## Changes from version 2

    * Every callback that takes a connection runs in the process that
      made it, the reader, for every source (version 2 read a source that
      implements `notify/2` in short-lived processes, one per batch, each
      handed the connection the one before returned), and `notify/2`'s
      notice goes to the reader.
    * `committed/2`, optional, is new; so is `resumable?/1`, optional,
      for a log whose first positions cannot be read from on another
      connection.
    * `:batch_too_large` is the reason of a read too large for the source
      (version 2 halved the batch on one source's error details).
    * `{:stop, error, conn}` from `read/4` (added to version 2 late) is
      part of the contract.
    * A callback of the reader's (above) that raises or returns a value
      the contract does not allow is an error of the source's, counted and
      retried (version 2 crashed the reader, and the replica with it).
    * An entry's fields are a term of the source's, not necessarily a map
      (`Larder.Replica.Kafka`'s are `kafka_record` tuples).
  """

  @typedoc """
  The replica's place in the log, stored in its snapshots: a term of the
  source's (a stream id; a map of partition to next offset).
  """
  @type position :: term()

  @typedoc "The id of one entry (a stream id; `{partition, offset}`)."
  @type entry_id :: term()

  @typedoc """
  What `:apply` gets of an entry: a term of the source's, documented by
  it (a map for a Redis Stream; a `kafka_record` tuple for Kafka).
  """
  @type fields :: term()

  @typedoc "One entry of the log: its id and its fields."
  @type entry :: {entry_id(), fields()}

  @typedoc "The source's connection state, private to it and to the process that made it."
  @type conn :: term()

  @doc """
  Checks the source's options and returns them with their defaults.
  Raises `ArgumentError` naming a bad or unknown option.
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

  @doc """
  Whether a read can go on from `position` on another connection (see
  "Positions"). Optional: without it every position is. Must not raise.
  """
  @callback resumable?(position()) :: boolean()

  @doc "Whether `position` includes every entry up to `target` (every part at or past it)."
  @callback reached?(position(), target :: position()) :: boolean()

  @doc """
  Opens a connection, in the process that will use it (see "Processes").
  Must not raise.
  """
  @callback connect(opts :: keyword()) :: {:ok, conn()} | {:error, Larder.Error.t()}

  @doc "Reads the entries that follow `position` (see \"Reading\"). Must not raise."
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
  Asks for the message `:larder_source_ready` to `pid` (the reader) once
  something can be read (see "Reading"). Optional: a source that
  implements it is read with `block_ms` 0. Must not raise nor block.
  """
  @callback notify(conn(), pid()) ::
              {:armed, conn()} | {:ready, conn()} | {:error, Larder.Error.t(), conn()}

  @doc """
  A snapshot holding `position` is durable (see "Commits"). Optional.
  Must not raise.
  """
  @callback committed(conn(), position()) :: {:ok, conn()} | {:error, Larder.Error.t(), conn()}

  @optional_callbacks notify: 2, committed: 2, resumable?: 1
end
