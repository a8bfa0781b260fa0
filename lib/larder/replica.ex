defmodule Larder.Replica do
  @moduledoc """
  Keeps a `Larder.Table` or `Larder.Bag` equal to the state a log describes:
  a supervised process that reads the log (a Redis Stream, through
  `Larder.Replica.RedisStream`, or any `Larder.Replica.Source`) in batches,
  applies each entry with a function of yours, and writes snapshots that
  hold the structure and the replica's position in the log (its offset:
  for a Redis Stream the id of the last entry applied, for a Kafka topic
  the next offset to read in each partition), so a restart catches up from
  there rather than from the beginning.

      children = [
        {Larder.Replica,
         name: :prices_replica,
         into: {Larder.Table, name: :prices, key: :id, index: [:product]},
         source: {Larder.Replica.RedisStream, redis: [host: "127.0.0.1"], stream: "prices"},
         apply: &MyApp.Prices.apply_entry/1,
         snapshot: "/var/lib/app/prices.snap",
         snapshot_every: 60_000}
      ]

      # before the service reports ready:
      :ok = Larder.Replica.await(:prices_replica, :latest, 30_000)
      Larder.Table.search(:prices, product: "p1")

  ## The structure

  The replica creates the structure itself, from `:into` (`{Larder.Table,
  opts}` or `{Larder.Bag, opts}`, the options of `new/1` and `load/2`), in
  its own process, which owns it: empty, or loaded from the snapshot. Give it
  a `:name` and read it by that name (`Larder.Table.search(:prices, ...)`);
  `target/1` returns the current handle. The structure lives and dies with
  the replica: a replica that is restarted builds it again from its
  snapshot, never on top of what the dead one left (see "Failures"). Only
  the replica writes it; a write from elsewhere is lost at the next restart.
  A replica whose structure's name is still held (by its predecessor's
  structure, which goes once that process's exit is seen) waits for it up
  to 5 s; if the name is still taken then, `start_link/1` raises
  `ArgumentError`, as `Larder.Table.new/1` does.

  ## Applying entries

  `:apply` is called on each entry's fields (a term of the source's: for
  a Redis Stream a map `%{binary => binary}`, for Kafka a `kafka_record`
  tuple, see `Larder.Replica.Kafka`), in the log's order (for a topic,
  each partition's entries in offset order):

    * `(fields -> ops)`, arity 1 (pure; the fast path), called in the
      replica's reader process, on each batch as it is read (while the
      replica writes the previous one): returns what to do, one op or a
      list of them, each checked there, which the replica writes in runs
      (the inserts between two deletes as one write: a Table's records are
      not checked a second time). For a Table: `{:insert, record}` (the
      record holds the key field) and `{:delete, key}`; for a Bag:
      `{:insert, key, value}`, `{:delete, key}` and `{:delete, key, value}`.
      `:ok` or `[]` does nothing.
    * `(fields, into -> :ok | ops)`, arity 2, called in a *step* of the
      replica (a short-lived process, linked to the replica's, that applies
      one batch; one step at a time, so entries are applied in order, each
      batch's after the one before): may write `into` itself (the handle)
      and return `:ok`, or return ops as above; what earlier entries queued
      is written before each call, so this path writes every entry on its
      own.

  The function never runs in the replica's own process, the one linked to
  the caller of `start_link/1` (or its supervisor): one that does not
  return holds the reader or a step, which `drop/1` and a clean stop can
  end without ending that caller (see "Failures"). Called from a step,
  `drop/1` of its own replica does nothing, and `dump/1` returns
  `{:error, %Larder.Error{reason: :in_apply}}` (a snapshot begins after
  the batch).

  An entry is *rejected* when the function raises, throws, exits, returns
  `nil` or anything else, or an op of the wrong shape, or when writing its
  ops raises (an index function): it is reported by a
  `[:larder, :replica, :rejected]` event and then, by `:on_error`, the
  replica stops (`:stop`, the default) or skips it (`:skip`). An arity-1
  function's rejected entry has written nothing; an arity-2 function that
  wrote part of its writes before raising leaves them.

  ## Options

  `start_link/1` and `child_spec/1` take:

    * `:name` (required) - an atom; the replica's registered name.
    * `:into` (required) - `{Larder.Table, opts}` or `{Larder.Bag, opts}`.
    * `:source` (required) - `{module, opts}`, a `Larder.Replica.Source`
      and its options (checked by its `validate!/1`).
    * `:apply` (required) - a function of arity 1 or 2 (see above).
    * `:snapshot` - the snapshot's path, or `nil` (default: no snapshots;
      a restart reads the log from its beginning). Its directory must
      exist and be writable; its file name is at most 174 bytes and is not
      a name a replica derives from another path (see "Snapshots").
    * `:snapshot_every` - ms between snapshots, `100..86_400_000`,
      default `60_000`. A snapshot is written only when the offset moved.
    * `:batch_size` - entries per read, `1..100_000`, default `1_000`.
    * `:block_ms` - how long a read waits for new entries,
      `1..60_000`, default `1_000`.
    * `:on_trimmed` - `:stop` (default) or `:rebuild`, see "Failures".
    * `:on_error` - `:stop` (default) or `:skip`, see "Applying entries".
    * `:telemetry` - `false` turns off this replica's events, default `true`.

  Bad options raise `ArgumentError` naming the option.

  ## Snapshots

  Every `:snapshot_every` ms, and on a clean stop (the supervisor's shutdown,
  `GenServer.stop/1`), the replica dumps the structure (`Larder.Table.dump/2`
  or `Larder.Bag.dump/2`) to `<snapshot>.<stamp>.dump` and then writes the
  file `:snapshot`, a small manifest that names the log (the source module
  and its identity, a stream's name), the structure (kind and name), the
  replica's position and the dump. The manifest is written to a
  temporary file, fsynced and renamed (`Larder.SnapshotFile`): its rename
  is the snapshot's commit, and a dump is deleted only once a newer manifest
  names another. Once it is committed the source is told
  (`c:Larder.Replica.Source.committed/2`, for a source that keeps the
  reader's place on its server).

  The replica goes on applying entries while a snapshot is written. The
  snapshot's position is the replica's offset when the snapshot begins
  (between two batches), and what the dump holds depends on the structure:

    * **A Table** (any `:apply`): the dump is the table as it was at that
      position, every entry up to it and none after (`Larder.Table.dump/2`
      is a consistent cut, taken by the table's writer in constant time;
      a process of its own writes the file while the replica writes on).
    * **A deduplicating Bag** (`dedup: true`, the default) **fed by an
      arity-1 `:apply`**: the dump reads the bag while the replica writes
      it (`Larder.Bag.dump/2` is not a snapshot), so it holds every pair
      as of the position that no later entry changes, and each pair a later
      entry inserts or deletes either as before or as after that entry. A
      restart applies those later entries again, onto the dump: their ops
      are the same (an arity-1 function is pure), and inserting a pair that
      is there or deleting one that is not changes nothing, so each pair
      ends as the log leaves it. (As after any restart, the order of a
      key's values can differ from the live bag's, since
      `Larder.Bag.insert_many/2` orders a batch's values as ETS does.)
    * **Any other Bag** (`dedup: false`, where an insert applied twice
      leaves two copies, or an arity-2 `:apply`, which may read what it
      writes): the replica's process dumps it and applies nothing until the
      dump is written, so the dump and the position are one consistent cut.

  So a snapshot never names a position whose effects its dump lacks, and
  a restart from it ends equal to the log. One snapshot is written at a
  time: a timer that fires meanwhile is skipped, and `dump/1` called
  meanwhile waits for the one after it.

  Nor does a snapshot name a position a restart cannot read on from (the
  source's `c:Larder.Replica.Source.resumable?/1`: the rows of
  `Larder.Replica.Postgres`'s initial copy, which a new connection cannot
  go on with). A snapshot due there (the timer's, `dump/1`'s) waits for
  the first batch that ends past it, and a clean stop there writes none:
  a restart then reads from the last snapshot, or from the origin.

  A replica writes these files, all in the directory of its `:snapshot`
  path, and no other:

    * `<snapshot>` itself, the manifest;
    * `<snapshot>.<stamp>.dump`, the dumps, where `<stamp>` is
      `<ms>-<8 hex digits>` (the OS time in ms and 4 random bytes): the one
      the manifest names, and, while a snapshot is written, the next;
    * `<snapshot>.lock`, its lock (see below);
    * temporary files, renamed over their target once whole:
      `<snapshot>.<os pid>.<token>-<n>.tmp` for the manifest and
      `<snapshot>.<stamp>.dump.<os pid>.<token>-<n>.tmp` for a dump
      (`<token>` is 16 hex digits).

  After each commit the replica deletes the dumps of its path but the one
  the manifest names, and the temporary files of its dumps that a kill
  left: only files whose names match these patterns exactly. So replicas
  whose paths are prefixes of one another (`x`, `x.b`, `x.x.dump`,
  `x.1700000000000-abcd1234`) share a directory without touching each
  other's files. A `:snapshot` path that is itself one of these names of
  another path (its file name ends in `.lock`, in `.<ms>-<8 hex>.dump`, or
  in `.<digits>.<16 hex>-<digits>.tmp`) is refused, as is one whose longest
  derived name (a dump's temporary file, 81 bytes more than the path's file
  name) would be over NAME_MAX (255 bytes: a file name of at most 174
  bytes) or whose expanded path would be over PATH_MAX (4,096 bytes):
  `start_link/1` and `child_spec/1` raise `ArgumentError` naming
  `:snapshot`.

  At start, before it reads anything, the replica checks that the
  directory of its `:snapshot` path exists and is writable (as `access(2)`
  says), and opens its lock file; otherwise `start_link/1` returns
  `{:error, %Larder.Error{reason: :file_error}}`, whose details name the
  option (`option: :snapshot`), the path, the directory or lock file and
  the POSIX reason: a replica whose snapshots cannot be written does not
  start.

  One replica per snapshot path (its sweep deletes every dump of the path
  but its own). A replica claims its path at start, before it reads the
  snapshot, in two ways: in the VM (so a second replica there is refused
  and named), and on the host with a kernel lock (`flock(2)`) on the file
  `<snapshot>.lock`, which it holds open until it stops. A second replica
  on a path in use, in this VM or in another OS process, is refused:
  `start_link/1` returns `{:error, %Larder.Error{reason:
  :snapshot_in_use}}`, whose details name the path and the holder
  (`:holder`, its pid, in this VM; `:holder_os_pid` for another process).
  The kernel drops the lock when the holder's file is closed: when the
  replica stops, when its process exits (killed or not), and when its VM
  dies, even by SIGKILL. So a lock is never left behind by a dead holder: a
  restarted service takes its path at once, however its predecessor died.
  A killed replica's lock goes as its process exits, which may be just
  after its supervisor restarts it: a start that finds the path locked
  tries again for up to 2 s before it refuses. The `.lock` file names
  its holder's OS pid; a clean stop deletes it, and a killed holder
  leaves it for the next one to lock (a lock counts only on the file that
  is at the path, so a starter that opened a file being deleted tries
  again). The lock file is opened without following a symbolic link, and
  written only once it is shown to be a lock file (a regular file, empty
  or holding a holder's note: an OS pid, a space, ...; at most 4 KB): a
  link there, or any other file (a manifest, another program's file), is
  left as it is and the start refused with `:file_error` (`posix:
  :eloop` for a link). Paths are compared expanded: two paths to one file
  through a link are one file to the kernel's lock, two to the VM's claim.

  At start, a snapshot of another log or another structure is refused:
  `start_link/1` returns `{:error, %Larder.Error{reason:
  :snapshot_mismatch}}`, and a Table dump of another definition `{:error,
  %Larder.Error{reason: :definition_mismatch}}`; a damaged one `{:error,
  %Larder.Error{reason: :corrupt_snapshot}}`; one whose manifest or dump
  cannot be read (removed, or the disk refuses) `{:error,
  %Larder.Error{reason: :file_error}}`. The replica does not start
  from zero on its own when its snapshot is bad: remove the file to do so.

  ## Complexity

  A batch of `n` entries costs one read round trip (two when the replica
  had caught up and waited), `n` calls of `:apply`, and the writes: with an
  arity-1 function, one `insert_many/2` per run of inserts. A snapshot is
  O(records) (the structure's dump) plus a manifest of a few hundred
  bytes. `offset/1` and `target/1` are one ETS lookup (a row the replica
  writes after each batch), no call to its process; `await/3` is that
  lookup, plus one call to the replica when the position is not reached
  yet, plus, for `:latest`, one process and one connection to the source
  per ask of its end (one when the source answers).

  ## Concurrency

  The reader (a process linked to the replica's, the one that connects to
  the source and the only one that uses the connection, for every source)
  reads the next batch, and runs an arity-1 `:apply` over it, while the
  replica writes the previous one; at most one more batch waits in the
  replica's mailbox (with an arity-2 `:apply`, batches wait in the
  replica's state while a step applies the one before). A source that
  blocks in its reads (`Larder.Replica.RedisStream`) is read again as
  soon as a read comes back; one that reads ahead in threads of its own
  and implements `c:Larder.Replica.Source.notify/2`
  (`Larder.Replica.Kafka`) is read with no wait, and once caught up the
  reader waits for the source's notice (and reads at least every
  `:block_ms`). The offset moves only after a whole batch is applied (or,
  on a stop, to the position after the last entry applied before the
  rejected one). Readers of the structure see
  each entry's writes as the structure's own writes show them (a Table
  write is whole, see `Larder.Table`); a batch is not atomic as a whole.
  `offset/1` and `target/1` read what the replica wrote after its last
  batch, at once, whatever its process is doing; `await/3` is answered
  when a batch reaches the position, or by its own timeout (an `:apply`
  that does not return holds no more than its batch). A snapshot begins
  between two batches: one requested while a step applies a batch begins
  once it is applied. During a snapshot the replica
  goes on applying (for a Table and a deduplicating Bag fed by an arity-1
  `:apply`; see "Snapshots" for the other Bags), and reads of the
  structure go on. While a Table's dump is written, each row a batch
  changes is first saved as it was (see `Larder.Table.dump/2`).

  ## Failures

    * **A kill at any point** (of the replica, its reader, or the VM)
      loses nothing and applies nothing twice that a snapshot counted: the
      structure dies with the replica, and a restarted replica builds it
      from the last committed snapshot (the dump and its position) and reads
      the log from that position. The entries applied after that snapshot are read
      and applied again, onto the snapshot's state: each entry's effect is
      in the new structure exactly once. (So `:apply` needs no idempotence;
      with a deduplicating Bag and an arity-1 `:apply`, the entries after
      the position may be in the dump already, and their ops are applied
      again, which changes nothing: see "Snapshots".) A kill in the middle
      of a snapshot (of the replica, or of the process writing the dump)
      leaves the previous one: its manifest is replaced only once the new
      dump is whole, and the next snapshot deletes what the killed one
      left.
    * **The source is down** (Redis stopped, paused, restarted): the reader
      reports `[:larder, :replica, :source, :error]`, logs one warning per
      outage (and one line once the source answers again), and connects
      again after 100 ms, doubling to 1 s; it reads on from the last
      position it handed over. A batch too large for the source (the
      reason `:batch_too_large`, see `Larder.Replica.Source`) is read in
      halves from then on. The structure keeps serving reads
      meanwhile. `await/3` waits through the outage up to its timeout
      (`:latest` asks the log's end again until it answers), and its
      `:timeout` error carries the source's last error
      (`details.source_error`): a refusal such as a missing ACL permission
      is the caller's to see, not only the log's. A reply that fails the source's checks (see
      `Larder.Replica.RedisStream`) is counted the same way and closes the
      connection; nothing from the source can crash the replica.
    * **A trimmed log**: when the log lost entries after the replica's
      position (the source's `read/4` says so; for Redis, `XINFO STREAM`'s
      `max-deleted-entry-id` is above it), the replica reports
      `[:larder, :replica, :trimmed]` and, with `on_trimmed: :stop`, logs an
      error and stops with `{:shutdown, %Larder.Error{reason:
      :offset_trimmed}}`; with `:rebuild`, it drops the structure, creates
      it empty and reads what is left of the log. It never skips entries
      silently.
    * **A log that went backwards** (its end is below the replica's
      position: a stream deleted and written again with lower ids, or a failover to
      a server that had not received the last entries the replica applied)
      is a trim: what the replica applied is no longer the log. It is
      reported and handled as above, `:offset_trimmed` or a rebuild from
      the log's beginning (after what was trimmed from it). A replica
      that waits for new entries sees it within one `:block_ms`, since no
      new entry below its id wakes the wait; `await(replica, :latest, t)`
      compares the log's end (the source's `latest/2`) with the offset and waits for that
      rebuild (or gets the stop's error), never answering `:ok` from the
      old entries. A log that lost entries the replica applied and then
      got new ones past its id is detected too, on Redis 7 (see
      `Larder.Replica.RedisStream`).
    * **A log the replica cannot follow**: when the log changed in a way
      that neither reading on nor a rebuild from what it holds can follow
      (the source's `read/4` says so: for Kafka, partitions added to the
      topic, see `Larder.Replica.Kafka`), the replica reports
      `[:larder, :replica, :source, :error]`, logs an error and stops with
      `{:shutdown, %Larder.Error{}}` (`:partitions_changed`), whatever its
      `:on_trimmed`.
    * **A stop** (`on_trimmed: :stop`, `on_error: :stop`, a log the replica
      cannot follow) ends the process
      with `{:shutdown, %Larder.Error{}}`; as a `:transient` child it is not
      restarted, and its structure goes with it. `await/3` callers get that
      error. No snapshot is written on such a stop or on a crash.
    * **An `:apply` that does not return** holds the reader or the step
      it runs in, not the replica's process: no more batches are applied
      and `dump/1` waits, but `offset/1`, `target/1`, `await/3` (by its
      timeout) and `drop/1` answer. In a step (an arity-2 function),
      `drop/1` lets the batch being applied end for up to 5 s, then kills
      the step: the apply ends mid-entry, no snapshot is written (a
      restart starts from the last one), and the structure goes with the
      replica. In the reader (an arity-1 function), nothing of the
      structure is mid-batch: the replica stops at once, with a last
      snapshot of the batches before, and kills the reader. Either way the replica's process
      stops with reason `:normal`, so a process
      linked to it that does not trap exits (the one that called
      `start_link/1`) is not touched, and a supervisor does not restart it
      (`:transient`). A clean stop (the supervisor's shutdown,
      `GenServer.stop/1`) gives the batch the same 5 s, then ends it the
      same way, with the stop's reason.

  ## Performance

  `mix run bench/replica_bench.exs` measures catch-up from zero of the
  487,200-price catalogue into a `store:` Table against
  `Larder.Table.insert_many/2` of the same records in the same run, a
  restart from a snapshot plus 10,000 new entries to `await(:latest)`, and
  the lag from `XADD` to a search under a producer of 10,000 entries/s,
  without snapshots and through snapshots of the whole table every 3 s
  (with the longest gap between two applied batches); the README has the
  table of a full run. Catch-up costs about 1.7-2.4x
  `insert_many/2` of the same records: the stream's replies are read and
  parsed, and `apply` runs once per entry, besides the same Table writes.
  A restart costs `load/2` of the snapshot plus the writes of the entries
  after it: the reader connects, reads and runs an arity-1 `apply` over
  its first batch while the snapshot loads. The lag is a wake-up of the
  blocked `XREAD` plus one batch's apply. A
  snapshot of a Table stops the replica for the cut only (constant time:
  two ETS tables made, the index's snapshot kept); the dump's process then
  runs beside it at low priority (the replica's and the table's processes
  are scheduled first) for the length of the dump, which is what the lag
  through snapshots pays.

  ## Telemetry

  Events (metadata always holds `:replica`, the name):

    * `[:larder, :replica, :batch]`: a batch was applied. Measurements:
      `:count` (entries applied), `:rejected` (skipped), `:duration`
      (native units). Metadata: `:offset` (the position after it).
    * `[:larder, :replica, :rejected]`: an entry was rejected.
      Measurements: `:count` (1). Metadata: `:id` (the entry's), `:reason` (`{kind,
      reason}` of a raise, throw or exit, `{:returned, value}`, or `{:error,
      exception}` of its write), `:action` (`:stop` or `:skip`).
    * `[:larder, :replica, :snapshot]`: a snapshot was written or failed.
      Measurements: `:duration` (from its beginning to its commit). Metadata: `:offset`, `:path`, `:result`
      (`:ok` or `{:error, %Larder.Error{}}`).
    * `[:larder, :replica, :trimmed]`: the log lost entries after the
      offset. Measurements: `:count` (1). Metadata: `:offset`,
      `:resume_after` (the position reading resumes from), `:action`.
    * `[:larder, :replica, :source, :error]`: a connection, a read, a
      notice, a commit or a reply failed (a read too large for the source
      included), or the log cannot be followed (and the replica stops).
      Measurements: `:count` (1). Metadata: `:error`.
  """

  alias Larder.Instance
  alias Larder.Replica.Latest
  alias Larder.Replica.Handle
  alias Larder.Replica.Server
  alias Larder.Replica.Target

  require Larder.Instance

  @typedoc "A replica: its name or pid."
  @type replica :: atom() | pid()

  @what "Larder.Replica"

  @doc """
  Starts a replica linked to the caller (see "Options"). Returns `{:error,
  %Larder.Error{}}` when its snapshot path is in use by another replica
  (`:snapshot_in_use`), cannot hold snapshots (`:file_error` naming
  `option: :snapshot`: a directory that does not exist or is not writable,
  a lock file that cannot be opened, is a symbolic link or is not a lock
  file), or its snapshot is refused (`:snapshot_mismatch`,
  `:definition_mismatch`, `:corrupt_snapshot`, or `:file_error` when the
  dump the manifest names cannot be read); see "Snapshots". Raises
  `ArgumentError` for bad options, a `:snapshot` path too long for its
  derived names or that is another path's derived name included.
  """
  @spec start_link(keyword()) :: GenServer.on_start() | {:error, Larder.Error.t()}
  def start_link(opts) do
    opts = validate!(opts)

    case Server.start_link(opts) do
      {:error, %ArgumentError{} = error} -> raise error
      other -> other
    end
  end

  @doc """
  A child specification; takes the options of `start_link/1`. The child id
  is `{Larder.Replica, name}`; the child is `:transient` (see "Failures").
  """
  @spec child_spec(keyword()) :: Supervisor.child_spec()
  def child_spec(opts) do
    opts = validate!(opts)

    Instance.child_spec(__MODULE__, opts[:name], {__MODULE__, :start_link, [opts]},
      shutdown: 30_000
    )
  end

  @doc """
  Stops the replica as a clean stop does (it writes its last snapshot, if it
  has a `:snapshot` path, given up to 30 s) and frees its structure with it;
  under a supervisor it stays stopped (its child is `:transient`). Returns
  once the replica's process is gone, which exits with reason `:normal`:
  a linked process that does not trap exits (the caller of
  `start_link/1`) lives on. The replica takes the request at once and
  stops once the batch being applied is: an `:apply` that has not
  returned within 5 s is ended, its step killed mid-entry, and the
  replica stops without a snapshot (an arity-1 `:apply` stuck in the
  reader is ended with the reader at once, and the snapshot of the
  batches before it written; see "Failures"). Called from the replica's own `:apply` in a step (see
  "Applying entries"), it does nothing. Idempotent: a
  name or pid that runs no replica (any more) is taken as one already
  dropped. Raises `ArgumentError` for a term that is neither a name nor a
  pid.
  """
  @spec drop(replica()) :: :ok
  def drop(replica) when is_pid(replica) do
    if Instance.holds?(__MODULE__, replica), do: Handle.drop(replica), else: :ok
  end

  def drop(replica) when Instance.name?(replica) do
    case Instance.whereis(__MODULE__, replica) do
      nil -> :ok
      pid -> Handle.drop(pid)
    end
  end

  def drop(other), do: Instance.invalid!(__MODULE__, other)

  @doc """
  The replica's position in the log (see `Larder.Replica.Source`): for a
  Redis Stream the id of the last entry applied (`"0-0"` before any), for
  Kafka a map of partition to the next offset to read (`%{}` before any),
  as the replica wrote it after its last batch;
  read without a call to the replica's process, so it answers at once
  whatever the replica is doing. Raises `ArgumentError` for an unknown
  replica.
  """
  @spec offset(replica()) :: Larder.Replica.Source.position()
  def offset(replica), do: replica |> position!() |> elem(0)

  @doc """
  The structure's current handle (it changes when the replica is restarted
  or rebuilds; a name given in `:into` does not). Read without a call, as
  `offset/1`. Raises `ArgumentError` for an unknown replica.
  """
  @spec target(replica()) :: Larder.Table.t() | Larder.Bag.t()
  def target(replica), do: replica |> position!() |> elem(2)

  @doc """
  Writes a snapshot now, as the `:snapshot_every` timer does (see
  "Snapshots"): dumps the structure next to the `:snapshot` path and
  commits it in the manifest. The replica's `dump/2`, as Bag and Table
  have, with the path fixed by the replica. Returns `{:ok, offset}` (the
  offset the snapshot holds: the replica's when the snapshot began), or
  `{:error, %Larder.Error{}}` (`:file_error`, `:no_snapshot_path` for a
  replica without `:snapshot`, or `:in_apply` when called from the
  replica's own `:apply`). A call to the replica's process: the
  snapshot begins between batches, and the call returns once it is
  committed, while the replica goes on applying (see "Snapshots"); a call
  made while a snapshot is being written gets the next one, and one made
  while the replica is at a position a restart cannot read on from (inside
  a source's initial copy) waits for the first batch that ends past it.
  """
  @spec dump(replica()) :: {:ok, Larder.Replica.Source.position()} | {:error, Larder.Error.t()}
  def dump(replica), do: call!(replica, :snapshot)

  @doc """
  Waits until the replica's offset has reached `position` (a position of
  the source: a stream id such as `"1700000000000-0"`, the entry of that
  id applied; for Kafka `%{partition => offset}`, every partition read up
  to that offset), or with `:latest` the log's end when called (for Kafka
  every partition's high watermark then), or until
  `timeout` ms (`0..3_600_000` or `:infinity`) have passed, whatever the
  replica is doing (an `:apply` that does not return included).

  With `:latest`, a log whose end is below the offset the replica had
  when the call began went backwards (see "Failures"; an offset that
  passes the end while it is asked is a log that grew, and is `:ok`): the
  wait is for the replica to have rebuilt
  from the log (`on_trimmed: :rebuild`) and applied its last entry; with
  `on_trimmed: :stop` the replica stops and the caller gets
  `:offset_trimmed`. Never `:ok` on the strength of entries the log no
  longer holds.

  With `:latest`, the source's end is asked (its `latest/2`, in a process
  of its own) and, while the source fails (a server down, restarting, not
  answering, or refusing), asked again after 50 ms, doubling up to 1 s,
  until it answers or the timeout is spent: the same for every source. So
  a replica started before its log's server is up is awaited as one
  started after. The whole call, asking and waiting, returns by `timeout`
  (an ask that has not answered then is abandoned, and its process
  killed); with `:infinity` each ask has 60 s, and the wait goes on.

  Returns `:ok`, or `{:error, %Larder.Error{}}`: `:timeout` when the
  position was not reached (or, for `:latest`, the log's end not read) in
  time. While the source fails, that error's `details.source_error` is the
  source's last error (`:source_unavailable`, or `:source_failed` for a
  refusal such as an ACL's `NOPERM` on a command the source needs), and its
  message ends with that error's: from asking the log's end, or from the
  replica's own reads. The replica's own error when it stops meanwhile
  (`:offset_trimmed`, `:apply_failed`), or `:replica_stopped`. Raises
  `ArgumentError` for an unknown replica, a position the source does not
  take, or a bad timeout.
  """
  @spec await(replica(), Larder.Replica.Source.position() | :latest, timeout()) ::
          :ok | {:error, Larder.Error.t()}
  def await(replica, position, timeout \\ 5_000) do
    unless timeout == :infinity or (is_integer(timeout) and timeout in 0..3_600_000) do
      raise ArgumentError,
            "expected timeout to be an integer in 0..3600000 or :infinity, got: " <>
              inspect(timeout, limit: 10)
    end

    deadline =
      if timeout == :infinity,
        do: :infinity,
        else: System.monotonic_time(:millisecond) + timeout

    handle = handle!(replica)
    source = handle.source

    target =
      case position do
        :latest ->
          # What the replica had applied before the log's end was asked: an
          # end read after it that has not reached it means the log went
          # backwards, and only a rebuild (the next epoch) can reach it. (The
          # position after the answer may be past the end legitimately: the
          # log grew, and the replica with it, while the end was asked.)
          before = Handle.position(handle)

          with {:ok, latest} <- Latest.fetch(handle, deadline) do
            case before do
              {offset, epoch, _target} ->
                if source.reached?(latest, offset),
                  do: {:ok, latest, epoch},
                  else: {:ok, latest, epoch + 1}

              nil ->
                {:ok, latest, 0}
            end
          end

        position ->
          case source.cast_position(position) do
            {:ok, position} ->
              {:ok, position, 0}

            :error ->
              raise ArgumentError,
                    "expected position to be :latest or a position of #{inspect(source)}, got: " <>
                      inspect(position, limit: 10)
          end
      end

    with {:ok, target, epoch} <- target do
      left =
        if deadline == :infinity,
          do: :infinity,
          else: max(0, deadline - System.monotonic_time(:millisecond))

      Handle.await(handle, target, epoch, left)
    end
  end

  defp call!(replica, message) do
    GenServer.call(pid!(replica), message, :infinity)
  catch
    :exit, {reason, _} when reason in [:noproc, :normal, :shutdown] -> unknown!(replica)
    :exit, {{:shutdown, _}, _} -> unknown!(replica)
  end

  # The replica's pid: a name or pid of a process that runs a replica (not
  # any registered process, which would get messages it does not expect).
  defp pid!(replica) do
    cond do
      is_pid(replica) and Instance.holds?(__MODULE__, replica) -> replica
      Instance.name?(replica) -> Instance.whereis(__MODULE__, replica) || unknown!(replica)
      is_pid(replica) -> unknown!(replica)
      true -> Instance.invalid!(__MODULE__, replica)
    end
  end

  # What the replica publishes for callers (see Larder.Replica.Handle).
  defp handle!(replica) do
    if is_pid(replica) or Instance.name?(replica),
      do: Handle.lookup(replica) || unknown!(replica),
      else: Instance.invalid!(__MODULE__, replica)
  end

  defp position!(replica, handle \\ nil),
    do: Handle.position(handle || handle!(replica)) || unknown!(replica)

  defp unknown!(replica), do: Instance.unknown!(__MODULE__, replica)

  ## Options

  defp validate!(opts) do
    opts =
      Larder.Options.validate!(
        opts,
        [
          name: {:atom, :required},
          into: {{:custom, "{Larder.Table, opts} or {Larder.Bag, opts}", &into?/1}, :required},
          source: {{:custom, "{module, opts}, a Larder.Replica.Source", &source?/1}, :required},
          apply: {{:custom, "a function of arity 1 or 2", &apply?/1}, :required},
          snapshot: {{:or_nil, {:custom, "a path (a string without null bytes)", &path?/1}}, nil},
          snapshot_every: {{:integer, 100, 86_400_000}, 60_000},
          batch_size: {{:integer, 1, 100_000}, 1_000},
          block_ms: {{:integer, 1, 60_000}, 1_000},
          on_trimmed: {{:in, [:stop, :rebuild]}, :stop},
          on_error: {{:in, [:stop, :skip]}, :stop},
          telemetry: {:boolean, true}
        ],
        @what
      )

    Target.new!(opts[:into])
    check_snapshot!(opts[:snapshot])
    {source, source_opts} = opts[:source]
    Keyword.put(opts, :source, {source, source.validate!(source_opts)})
  end

  defp check_snapshot!(nil), do: :ok

  defp check_snapshot!(path) do
    with {:error, expected} <- Larder.Replica.Snapshot.check_path(path) do
      raise ArgumentError, "expected #{@what} option :snapshot to be #{expected}"
    end
  end

  defp into?({module, opts}) when module in [Larder.Table, Larder.Bag] and is_list(opts), do: true
  defp into?(_), do: false

  defp source?({module, opts}) when is_atom(module) and is_list(opts) do
    Code.ensure_loaded?(module) and function_exported?(module, :validate!, 1) and
      function_exported?(module, :read, 4)
  end

  defp source?(_), do: false

  defp apply?(fun), do: is_function(fun, 1) or is_function(fun, 2)

  defp path?(path), do: is_binary(path) and path != "" and not String.contains?(path, <<0>>)
end
