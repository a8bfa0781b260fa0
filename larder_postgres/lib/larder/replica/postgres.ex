defmodule Larder.Replica.Postgres do
  @moduledoc """
  A `Larder.Replica.Source` that keeps a replica equal to the tables of a
  Postgres publication: an initial copy of every published row, then the
  changes from the same point, through a logical replication slot
  (`pgoutput`). Debezium's model: the copy and the stream meet exactly,
  and the position is kept with the state, in the replica's snapshot.

      {Larder.Replica,
       name: :pg_prices,
       into: {Larder.Table, key: :id, index: [:kind]},
       source: {Larder.Replica.Postgres,
                url: "postgres://larder:secret@127.0.0.1:5432/shop",
                publication: "larder_pub",   # an existing publication
                slot: "larder_slot"},        # this replica's slot; created if missing
       apply: fn
         %{"op" => op, "table" => "public.prices", "new" => row} when op in ["insert", "update"] ->
           {:insert, decode(row)}

         %{"op" => "delete", "table" => "public.prices", "old" => old} ->
           {:delete, String.to_integer(old["id"])}
       end,
       snapshot: "/var/lib/app/pg"}

  It speaks the wire protocol itself (`Larder.Postgres.*`, plain Elixir
  over `:gen_tcp` and `:ssl`: no NIF, nothing from Hex).

  ## What the server needs

    * PostgreSQL 15 or later, with `wal_level = logical` (a restart of the
      server to change), and room for one more replication slot and WAL
      sender (`max_replication_slots`, `max_wal_senders`).
    * A role with `LOGIN` and `REPLICATION`, `SELECT` on every published
      table, and a `pg_hba.conf` line that lets it make a replication
      connection (`host replication <role> <address> scram-sha-256`) as
      well as a normal one to the database.
    * The publication (`CREATE PUBLICATION larder_pub FOR TABLE prices`):
      its tables, column lists and row filters are what the replica holds.
    * A slot per replica: `:slot` names this replica's own. Every node of a
      service that keeps the same tables needs a slot name of its own (its
      node name in it); two replicas on one slot refuse each other (see
      "Failures"). A replica that starts without a snapshot drops its slot
      and makes it again (a slot exports the snapshot the copy needs only
      when it is created): never give it a slot that something else reads.

  A slot holds the server's WAL from its confirmed position on, whether
  or not its replica runs: a slot whose service is gone for good must be
  dropped (`SELECT pg_drop_replication_slot('larder_slot')`), and
  `max_slot_wal_keep_size` bounds what it can hold (past that, the server
  invalidates it, which is a trim here).

  ## Options

  The connection, as a `:url` or as keys (the url excludes the keys it
  gives):

    * `:url` - `"postgres://[user[:password]@]host[:port][/database]
      [?sslmode=disable|require|verify-full]"` (or `postgresql://`),
      percent-decoded.
    * `:host` (default `"127.0.0.1"`), `:port` (`1..65_535`, default
      `5432`), `:database` (default: the username, as libpq does).
    * `:username` (required) and `:password` (default none): SCRAM-SHA-256
      (the server's proof is checked), MD5 or a cleartext password, as the
      server asks. A password never appears in a message.
    * `:sslmode` - `:disable` (default), `:require` (TLS, the certificate
      not checked, as libpq's `require`) or `:verify_full` (checked against
      the system's CAs, or `:ssl_options`' `cacertfile`, and the host
      name); `:ssl_options` - more `:ssl` client options.
    * `:timeout` - ms, `1..600_000`, default `15_000`: a connection
      (connect, TLS, authentication), and each command of the source's
      (creating the slot, which waits for the transactions open then to
      end; a batch of the copy; a catalog query).
    * `:max_message_bytes` - `1_024..1_073_741_024`, default 64 MiB: the
      largest message taken from the server (a row, a change); a larger
      one is a `:source_bad_reply` error, never buffered.
    * `:application_name` - what `pg_stat_activity` shows, default
      `"larder"`.

  And the replication:

    * `:publication` (required) - the publication's name, 1 to 63 bytes.
    * `:slot` (required) - the slot's name, 1 to 63 lower-case letters,
      digits and underscores.
    * `:max_transaction_entries` - `1..10_000_000`, default `10_000`, and
      `:max_transaction_bytes` - `1_024..17_179_869_184` (16 GiB), default
      16 MiB: a transaction's changes are held until its commit arrives,
      so that only committed transactions are applied; a transaction
      larger than either is handed over in parts before its commit (its
      positions stay below its end, so a restart inside it loses and
      repeats nothing). These bound what the source holds in memory.

  Every option is checked when the replica starts: a bad one raises
  `ArgumentError` naming it.

  ## Entries

  Each row copied and each change streamed is an entry:

      %{"op" => "insert", "table" => "public.prices", "new" => row}
      %{"op" => "update", "table" => "public.prices", "new" => row, "old" => key}
      %{"op" => "delete", "table" => "public.prices", "old" => key}
      %{"op" => "truncate", "table" => "public.prices"}

  `row` maps every published column's name to its value in Postgres's
  text form (`"42"`, `"2024-01-01 10:00:00+00"`, `"t"`), or `nil` for
  NULL. `key` maps the replica identity's columns (the primary key by
  default; every column with `REPLICA IDENTITY FULL`) to their values
  before the change. The copy's rows are `"insert"` entries. An update
  that leaves a large (TOASTed, stored out of line) value unchanged
  carries `:unchanged_toast` for that column: the value is the one the
  row had (with `REPLICA IDENTITY FULL` the old row holds it). A
  `TRUNCATE` is one entry per table; an arity-2 `apply` can empty the
  structure for it. `"schema.table"` joins the names as they are, without
  quotes. Generated columns are not published by Postgres, nor copied.

  Entries come in commit order, a transaction's changes in the order they
  were made, and only those of committed transactions.

  ## Positions

  The replica's position is `{lsn, index}`: every transaction whose
  commit record is before the WAL position `lsn` applied, and the first
  `index` changes of the one that commits at `lsn`. The origin is
  `{0, 0}`; the copy's rows are `{0, 1}`, `{0, 2}`, ..., the rows copied
  so far; the stream starts at the slot's consistent point `{lsn, 0}`.
  The position also moves past stretches of WAL that hold no published
  change (other tables, the server's own records), so a replica that
  applied everything reaches the server's WAL end.

  A snapshot holds the position, and the server is told its LSN as the
  slot's flush position only once that snapshot is durable
  (`c:Larder.Replica.Source.committed/2`): the slot keeps every change a
  restart from the last snapshot needs. A restart reads from the
  snapshot's LSN, without copying again. Postgres writes a slot's
  confirmed position to disk only at checkpoints, so after a server crash
  the slot may be behind what the replica applied: the stream starts from
  the replica's own LSN, and the server skips what is before it (and the
  source the first `index` changes of the transaction there).

  ## The initial copy

  A replica that starts without a snapshot (or rebuilds after a trim)
  drops its slot if it exists, creates it again with an exported snapshot
  (waiting, up to `:timeout`, for the transactions open at that moment to
  end: Postgres needs them done to know where the snapshot is), and
  copies every published table on a second, normal connection inside that
  snapshot (`COPY (SELECT columns FROM table WHERE row filter) TO
  STDOUT`), in batches of the replica's `:batch_size`. Then it streams
  from the slot's consistent point: exactly the transactions that
  committed after the snapshot. No row is missed or applied twice between
  the two, whatever is written meanwhile.

  The copy's positions (`{0, n}`, `n` > 0) cannot be read on from by
  another connection: the exported snapshot lives only as long as the
  replication connection that made it
  (`c:Larder.Replica.Source.resumable?/1` is false for them). So:

    * no snapshot is committed during the copy: a snapshot due then (the
      timer's, `Larder.Replica.dump/1`'s) waits for the first batch of the
      stream, and a clean stop during the copy writes none. A replica
      restarted in the middle of its copy has no snapshot, or the one from
      before a rebuild, and starts from there: its structure is built
      again from nothing, never on top of a part of a copy;
    * a copy whose connection is lost (the server restarted or killed
      during it, the connection cut) cannot be finished: the rows the
      replica holds are a part of it. That is a trim (see below):
      `on_trimmed: :rebuild` empties the structure and copies again, in a
      new slot's snapshot; `:stop` stops the replica.

  ## The log's end

  `Larder.Replica.await(r, :latest, t)` reads the server's WAL insert
  position when it is called and returns once the replica's position
  reached it: every transaction committed before the call is applied
  (one that commits after is not waited for). A read of the stream
  returns as soon as the position moved, with or without changes (the
  copy's end, a transaction with nothing published, the WAL end the
  server reports when it has sent everything), so reaching the log's end
  never waits for a read's `:block_ms`. While the slot does not exist and
  every published table is empty, the log's end is the origin.
  `await(r, {lsn, index}, t)` waits for a position of the source.

  ## Trims

  Each of these is a trim, handled by the replica's `:on_trimmed`:
  `:stop` (the default) stops the replica with `{:shutdown,
  %Larder.Error{reason: :offset_trimmed}}`; `:rebuild` empties the
  structure and copies again, in a new slot's snapshot (the old slot is
  dropped). A warning in the log says which it was.

    * the slot does not exist (dropped, or a server that never had it);
    * the slot was invalidated: `wal_status` `"lost"`, when it held back
      more WAL than `max_slot_wal_keep_size` allows;
    * the slot has confirmed a position past the replica's (a snapshot
      older than the slot's last flush, or a slot made again): the server
      no longer keeps the changes in between;
    * the server's WAL ends before the replica's position (a server
      restored from a backup, a failover to one that had not received
      what the replica applied): the log went backwards;
    * a copy whose connection was lost (see "The initial copy").

  A publication that gets a new table is not a trim: its changes are
  streamed from then on, but its earlier rows were never copied. Start
  the replica without its snapshot (or drop the slot) to copy again.

  ## Failures

  The server restarted, killed (SIGKILL) or unreachable, or a connection
  cut: the read fails with `:source_unavailable`, and the replica's reader
  connects again after 100 ms, doubling up to 1 s, and streams from the
  position of the last entry it handed over, so nothing is lost or applied
  twice (a copy under way is a trim, above). A server that is down when
  the replica starts is the same: `await(r, :latest, t)` waits up to `t`,
  asking the server's WAL end again, then returns `:timeout` with the
  last error in `details.source_error`. A server paused (SIGSTOP) is a
  connection that does not answer: each command times out after
  `:timeout`, the stream's read after the replica's `:block_ms` with
  nothing, and the server drops a reader that sends nothing for
  `wal_sender_timeout` (a status update goes at least every third of it,
  while the replica reads).

  A configuration that cannot work is `:source_failed`, naming the server
  (`details.server`), the option to check (`details.option`) and what to
  do, and retried the same way (so a fix on the server is picked up):

    * a refused password or user: `:password`, `:username`;
    * a database that does not exist: `:database`;
    * a role without `REPLICATION`, or without `SELECT` on a published
      table: `:username`, with the `ALTER ROLE`/`GRANT` to run;
    * no `pg_hba.conf` line for a replication connection;
    * `wal_level` not `logical` (`details.wal_level`): set it and restart
      the server;
    * a publication that does not exist: `:publication`;
    * a slot of another kind (physical, another plugin, another
      database): `:slot`.

  A slot in use by another connection is waited for up to 5 s (the server
  sees a closed connection a moment after it closed: the predecessor of
  a restarted replica), then `:source_unavailable` naming `:slot` and the
  server process that holds it.

  Everything the server sends is checked (lengths before bodies are
  buffered, counts, states, LSNs): a reply of the wrong shape is
  `:source_bad_reply`, the connection closed; no reply can raise in the
  replica or grow its memory past the bounds above.

  ## Complexity

  A batch of the copy is one read of up to `:batch_size` rows of the
  COPY's stream; a batch of the stream is one read of the replication
  socket, up to `:batch_size` changes of committed transactions. Each
  entry costs its decoding (text split, a map per row) and `apply`. A
  snapshot's commit costs one status update to the server. `latest/2`
  opens a connection and runs two or three catalog queries (one more
  when no slot exists: an `EXISTS` per published table).

  ## Concurrency

  The replica's reader (one process) makes the source's two connections,
  the replication connection and, during a copy, a normal one, and reads
  both; it decodes the next batch and runs an arity-1 `apply` over it
  while the replica writes the previous one. `latest/2` runs in a
  process of its own, on a connection of its own, for each ask of
  `await/3`. Nothing is shared between replicas, so several replicas of
  one database (on slots of their own) run side by side.

  ## Performance

  `mix run bench/replica_postgres_bench.exs` (in `larder_postgres/`)
  starts its own server and measures, against `Larder.Table.insert_many/2`
  of the same records decoded from memory in the same run: the initial
  copy of the 487,200-price catalogue into a `store:` Table, a restart
  from a snapshot followed by 10,000 price changes, and the lag from a
  commit to a search that finds it under 5,000 changes a second.
  """

  @behaviour Larder.Replica.Source

  require Logger

  alias Larder.Postgres.{Catalog, Connection, Options, Replication, SnapshotCopy}

  @what "Larder.Replica.Postgres"
  @max_lsn 0xFFFF_FFFF_FFFF_FFFF
  @max_index 0x7FFF_FFFF_FFFF_FFFF
  # How long a read waits for a slot still in use (the server not yet done
  # with a connection that closed, a predecessor killed a moment ago)
  # before it fails, and how often it looks.
  @slot_wait_ms 5_000
  @slot_poll_ms 100

  @typedoc "`{lsn, index}`: see \"Positions\"."
  @type position :: {non_neg_integer(), non_neg_integer()}

  # The connection of the replica's reader:
  #
  #   repl   the replication connection (Larder.Postgres.Replication), or
  #          nil once closed
  #   copy   the normal connection of the copy running, or nil
  #   phase  :idle (repl runs no command: a slot can be created on it, or
  #          a stream started), {:copying, copy_state} (repl holds the
  #          exported snapshot: it may run no command until the copy is
  #          done), or :streaming
  #   committed  the last committed position (committed/2)
  #   floor  the slot's confirmed flush LSN when the stream started: no
  #          flush below it is sent (Postgres 15 would move the slot back)
  @enforce_keys [:opts]
  defstruct [:opts, :repl, :copy, :committed, phase: :idle, floor: 0]

  @opaque conn :: %__MODULE__{}

  ## Options

  @impl true
  def validate!(opts) do
    Options.validate!(opts, @what,
      publication:
        {{:custom, "a publication name (1 to 63 bytes without a NUL byte)",
          &Replication.identifier?/1}, :required},
      slot:
        {{:custom, "a replication slot name (1 to 63 lower-case letters, digits and underscores)",
          &Replication.slot_name?/1}, :required},
      max_transaction_entries: {{:integer, 1, 10_000_000}, 10_000},
      max_transaction_bytes: {{:integer, 1_024, 17_179_869_184}, 16_777_216}
    )
  end

  @impl true
  def identity(opts) do
    ~s(database "#{opts[:database]}", publication "#{opts[:publication]}", ) <>
      ~s(slot "#{opts[:slot]}")
  end

  ## Positions

  @impl true
  def origin(_opts), do: {0, 0}

  @impl true
  def cast_position({lsn, index} = position)
      when is_integer(lsn) and lsn >= 0 and lsn <= @max_lsn and is_integer(index) and
             index >= 0 and index <= @max_index,
      do: {:ok, position}

  def cast_position(_other), do: :error

  @impl true
  def advance(_position, {lsn, index}), do: {lsn, index + 1}

  @impl true
  def reached?(position, target), do: position >= target

  # The rows of the initial copy are {0, 1}, {0, 2}, ...: only the
  # connection that exported the copy's snapshot can go on from them.
  @impl true
  def resumable?({0, index}), do: index == 0
  def resumable?(_position), do: true

  ## Connecting

  @impl true
  def connect(opts) do
    with {:ok, repl} <- open(opts) do
      {:ok, %__MODULE__{opts: opts, repl: repl}}
    end
  end

  # A replication connection, to a server whose wal_level is logical and
  # that has the publication.
  defp open(opts) do
    sql =
      "SELECT current_setting('wal_level'), " <>
        "EXISTS (SELECT 1 FROM pg_publication WHERE pubname = " <>
        Catalog.literal(opts[:publication]) <> ")"

    with {:ok, repl} <- Replication.connect(opts) do
      case Replication.query(repl, sql, opts[:timeout]) do
        {:ok, [%{rows: [["logical", "t"]]}], repl} ->
          {:ok, repl}

        {:ok, [%{rows: [[level, exists]]}], repl}
        when is_binary(level) and exists in ["t", "f"] ->
          Replication.close(repl)

          if level != "logical",
            do: {:error, wal_level_error(repl.conn, level)},
            else: {:error, no_publication(repl.conn, opts)}

        {:ok, _, repl} ->
          Replication.close(repl)
          {:error, bad_reply(repl.conn, "wal_level and pg_publication")}

        {:error, error, repl} ->
          Replication.close(repl)
          {:error, error}
      end
    end
    |> case do
      {:ok, repl} -> {:ok, repl}
      {:error, error} -> {:error, explain(error, opts)}
    end
  end

  @impl true
  def close(%__MODULE__{} = conn) do
    if conn.repl, do: Replication.close(conn.repl)
    if conn.copy, do: Connection.close(conn.copy)
    :ok
  end

  @impl true
  def committed(%__MODULE__{} = conn, position) do
    flush(%{conn | committed: position})
  end

  # Tells the server the committed position's LSN once it streams, unless
  # the slot is already past it (a position of an earlier slot, before a
  # rebuild): the slot keeps every transaction from there.
  defp flush(%__MODULE__{phase: :streaming, committed: {_, _} = committed} = conn) do
    lsn = Replication.flush_lsn(committed)

    if lsn > 0 and lsn >= conn.floor do
      case Replication.flush(conn.repl, lsn, conn.opts[:timeout]) do
        {:ok, repl} -> {:ok, %{conn | repl: repl}}
        {:error, error, repl} -> {:error, error, %{conn | repl: repl}}
      end
    else
      {:ok, conn}
    end
  end

  defp flush(conn), do: {:ok, conn}

  ## Reading

  @impl true
  def read(%__MODULE__{} = conn, position, count, block_ms) do
    cond do
      copying_at?(conn, position) -> copy_batch(conn, count)
      streaming_at?(conn, position) -> stream_batch(conn, count, block_ms)
      position == {0, 0} -> start_copy(conn, count)
      match?({0, _}, position) -> copy_lost(conn, position)
      true -> start_stream(conn, position, count, block_ms)
    end
  end

  defp copying_at?(%{phase: {:copying, %{copied: n}}}, {0, n}), do: true
  defp copying_at?(_conn, _position), do: false

  defp streaming_at?(%{phase: :streaming, repl: repl}, position),
    do: Replication.position(repl) == position

  defp streaming_at?(_conn, _position), do: false

  # A copy position on a connection that is not running that copy: its
  # snapshot went with the connection that exported it, and the rows the
  # replica holds are a part of a copy that cannot be finished. A trim:
  # the replica rebuilds (on_trimmed: :rebuild) from a new copy.
  defp copy_lost(conn, position) do
    Logger.warning(
      "#{@what} (#{identity(conn.opts)}): the copy the replica was making (#{elem(position, 1)} " <>
        "rows in) ended with the connection that held its snapshot, and cannot be finished; " <>
        "a new copy needs a rebuild (on_trimmed: :rebuild)"
    )

    {:trimmed, {0, 0}, conn}
  end

  # A replication connection that runs no command, its copy closed.
  defp idle(%__MODULE__{phase: :idle, repl: repl} = conn) when repl != nil, do: {:ok, conn}

  defp idle(conn) do
    close(conn)
    conn = %{conn | repl: nil, copy: nil, phase: :idle, floor: 0}

    case open(conn.opts) do
      {:ok, repl} -> {:ok, %{conn | repl: repl}}
      {:error, error} -> {:error, error, conn}
    end
  end

  ## The initial copy

  # A new slot (the old one dropped) whose exported snapshot a second,
  # normal connection imports, then each published table read through
  # COPY in it (Larder.Postgres.SnapshotCopy).
  defp start_copy(conn, count) do
    with {:ok, conn} <- idle(conn),
         {:ok, conn} <- drop_slot(conn),
         {:ok, conn} <- open_copy(conn),
         {:ok, created, conn} <- create_slot(conn),
         {:ok, conn} <- import_snapshot(conn, created.snapshot_name),
         {:ok, tables, conn} <- published_tables(conn) do
      Logger.info(
        "#{@what} (#{identity(conn.opts)}): copying #{length(tables)} " <>
          "table#{if length(tables) == 1, do: "", else: "s"} in the snapshot of the new slot " <>
          "(its consistent point #{format_lsn(created.consistent_point)})"
      )

      state = %{
        consistent_point: created.consistent_point,
        tables: tables,
        table: nil,
        copied: 0,
        started: System.monotonic_time(:millisecond)
      }

      copy_batch(%{conn | phase: {:copying, state}}, count)
    else
      {:error, error, conn} -> {:error, explain(error, conn.opts), conn}
    end
  end

  defp open_copy(conn) do
    case Connection.connect(conn.opts) do
      {:ok, copy} -> {:ok, %{conn | copy: copy}}
      {:error, error} -> {:error, error, conn}
    end
  end

  defp create_slot(conn) do
    case Replication.create_slot(conn.repl, conn.opts[:slot], conn.opts[:timeout]) do
      {:ok, created, repl} -> {:ok, created, %{conn | repl: repl}}
      {:error, error, repl} -> {:error, error, %{conn | repl: repl}}
    end
  end

  defp import_snapshot(conn, name) do
    case SnapshotCopy.begin(conn.copy, name, conn.opts[:timeout]) do
      {:ok, copy} -> {:ok, %{conn | copy: copy}}
      {:error, error, copy} -> {:error, error, %{conn | copy: copy}}
    end
  end

  # The publication's tables as the snapshot sees them.
  defp published_tables(conn) do
    case Catalog.publication_tables(conn.copy, conn.opts[:publication], conn.opts[:timeout]) do
      {:ok, nil, copy} -> {:error, no_publication(copy, conn.opts), %{conn | copy: copy}}
      {:ok, tables, copy} -> {:ok, tables, %{conn | copy: copy}}
      {:error, error, copy} -> {:error, error, %{conn | copy: copy}}
    end
  end

  # Up to `count` rows of the copy, the next table's when one is done;
  # once every table is, the stream from the slot's consistent point.
  defp copy_batch(%{phase: {:copying, state}} = conn, count) do
    timeout = conn.opts[:timeout]

    case state do
      %{table: nil, tables: [table | tables]} ->
        case SnapshotCopy.start_table(conn.copy, table, timeout) do
          {:ok, copy} ->
            state = %{state | table: table, tables: tables}
            copy_batch(%{conn | copy: copy, phase: {:copying, state}}, count)

          {:error, error, copy} ->
            {:error, explain(error, conn.opts), %{conn | copy: copy}}
        end

      %{table: nil, tables: []} ->
        finish_copy(conn, state, count)

      %{table: table, copied: copied} ->
        case SnapshotCopy.read(conn.copy, table, count, timeout) do
          {:ok, rows, copy} ->
            {entries, copied} =
              Enum.map_reduce(rows, copied, fn fields, n -> {{{0, n}, fields}, n + 1} end)

            state = %{state | copied: copied}
            {:ok, entries, {0, copied}, %{conn | copy: copy, phase: {:copying, state}}}

          {:done, copy} ->
            state = %{state | table: nil}
            copy_batch(%{conn | copy: copy, phase: {:copying, state}}, count)

          {:error, error, copy} ->
            {:error, explain(error, conn.opts), %{conn | copy: copy}}
        end
    end
  end

  defp finish_copy(conn, state, count) do
    opts = conn.opts

    case SnapshotCopy.finish(conn.copy, opts[:timeout]) do
      {:ok, copy} ->
        Connection.close(copy)
        conn = %{conn | copy: nil}
        from = {state.consistent_point, 0}

        Logger.info(
          "#{@what} (#{identity(opts)}): copied #{state.copied} " <>
            "row#{if state.copied == 1, do: "", else: "s"} in " <>
            "#{System.monotonic_time(:millisecond) - state.started} ms; streaming from " <>
            format_lsn(state.consistent_point)
        )

        # No wait: the batch moves the position from the copy's last row
        # to the consistent point even when no change is there yet.
        with {:ok, conn} <- stream_from(conn, from, state.consistent_point) do
          stream_batch(conn, count, 0)
        end

      {:error, error, copy} ->
        {:error, explain(error, opts), %{conn | copy: copy}}
    end
  end

  ## The stream

  # From a position of an earlier connection (a restart, a reconnect):
  # the slot is checked first, since the server would start from its
  # confirmed position, silently, when that is past the position.
  defp start_stream(conn, {lsn, _index} = position, count, block_ms) do
    with {:ok, conn} <- idle(conn),
         {:ok, slot, conn} <- slot(conn),
         {:ok, wal_end, conn} <- wal_end(conn) do
      case trim_reason(slot, position, wal_end) do
        nil ->
          with {:ok, conn} <- stream_from(conn, position, slot.confirmed_flush_lsn || 0) do
            stream_batch(conn, count, block_ms)
          end

        reason ->
          Logger.warning(
            "#{@what} (#{identity(conn.opts)}): the replica's position #{format_lsn(lsn)} " <>
              "cannot be streamed from: #{reason}"
          )

          {:trimmed, {0, 0}, conn}
      end
    else
      {:error, error, conn} -> {:error, explain(error, conn.opts), conn}
    end
  end

  # The server's WAL flush position (IDENTIFY_SYSTEM's).
  defp wal_end(conn) do
    case Replication.identify_system(conn.repl, conn.opts[:timeout]) do
      {:ok, system, repl} -> {:ok, system.xlogpos, %{conn | repl: repl}}
      {:error, error, repl} -> {:error, error, %{conn | repl: repl}}
    end
  end

  defp trim_reason(nil, _position, _end) do
    "the slot does not exist (dropped, or never created on this server): the changes since " <>
      "the replica's snapshot are gone"
  end

  defp trim_reason(%{wal_status: "lost"}, _position, _end) do
    "the slot was invalidated (wal_status \"lost\": it held back more WAL than " <>
      "max_slot_wal_keep_size allows), and the server removed the changes it kept"
  end

  defp trim_reason(%{confirmed_flush_lsn: confirmed}, {lsn, _}, _end)
       when is_integer(confirmed) and confirmed > lsn do
    "the slot has confirmed changes up to #{format_lsn(confirmed)}, " <>
      "past the replica's position (a snapshot older than the slot, or a slot made again): " <>
      "the server no longer keeps the changes in between"
  end

  defp trim_reason(_slot, {lsn, _}, wal_end) when lsn > wal_end do
    "the server's WAL ends at #{format_lsn(wal_end)}, before the " <>
      "replica's position (a server restored from a backup, or a failover to one that had not " <>
      "received what the replica applied)"
  end

  defp trim_reason(_slot, _position, _end), do: nil

  defp stream_from(conn, position, floor) do
    opts = conn.opts

    start_opts = [
      timeout: opts[:timeout],
      max_transaction_entries: opts[:max_transaction_entries],
      max_transaction_bytes: opts[:max_transaction_bytes]
    ]

    case Replication.start(conn.repl, opts[:slot], [opts[:publication]], position, start_opts) do
      {:ok, repl} ->
        flush(%{conn | repl: repl, phase: :streaming, floor: floor})

      {:error, error, repl} ->
        {:error, explain(error, opts), %{conn | repl: repl}}
    end
  end

  defp stream_batch(conn, count, block_ms) do
    case Replication.read(conn.repl, count, block_ms) do
      {:ok, entries, repl} ->
        {:ok, entries, Replication.position(repl), %{conn | repl: repl}}

      {:error, error, repl} ->
        {:error, explain(error, conn.opts), %{conn | repl: repl}}
    end
  end

  ## The slot

  # The slot's state, once no other connection uses it (waiting up to
  # @slot_wait_ms for one the server has not yet seen close); a slot of
  # another kind, plugin or database is refused.
  defp slot(conn), do: slot(conn, System.monotonic_time(:millisecond) + @slot_wait_ms)

  defp slot(conn, deadline) do
    opts = conn.opts

    case Catalog.slot(conn.repl.conn, opts[:slot], opts[:timeout]) do
      {:ok, nil, repl_conn} ->
        {:ok, nil, put_repl_conn(conn, repl_conn)}

      {:ok, slot, repl_conn} ->
        conn = put_repl_conn(conn, repl_conn)

        cond do
          slot.type != "logical" or slot.plugin != "pgoutput" or slot.database != opts[:database] ->
            {:error, foreign_slot(repl_conn, slot, opts), conn}

          not slot.active ->
            {:ok, slot, conn}

          System.monotonic_time(:millisecond) < deadline ->
            Process.sleep(@slot_poll_ms)
            slot(conn, deadline)

          true ->
            {:error, slot_in_use(repl_conn, slot, opts), conn}
        end

      {:error, error, repl_conn} ->
        {:error, error, put_repl_conn(conn, repl_conn)}
    end
  end

  defp put_repl_conn(conn, repl_conn), do: %{conn | repl: %{conn.repl | conn: repl_conn}}

  # A replica that starts from the origin makes its slot again: a slot's
  # exported snapshot, which the copy needs, comes only with its creation.
  defp drop_slot(conn) do
    with {:ok, slot, conn} <- slot(conn) do
      if slot == nil do
        {:ok, conn}
      else
        Logger.info(
          "#{@what} (#{identity(conn.opts)}): dropping the slot to make it again with a " <>
            "snapshot to copy the tables in (the replica starts from its origin)"
        )

        case Replication.drop_slot(conn.repl, conn.opts[:slot], conn.opts[:timeout]) do
          {:ok, repl} -> {:ok, %{conn | repl: repl}}
          {:error, error, repl} -> {:error, error, %{conn | repl: repl}}
        end
      end
    end
  end

  ## The log's end

  # The server's WAL insert position: a replica that reaches it has
  # applied every transaction committed before the call. The origin when
  # the log holds nothing: no slot (nothing read from it yet) and no row
  # in the published tables.
  @impl true
  def latest(opts, timeout) do
    deadline = System.monotonic_time(:millisecond) + timeout
    connect_opts = Keyword.put(opts, :timeout, max(min(timeout, opts[:timeout]), 1))

    case Connection.connect(connect_opts) do
      {:ok, conn} ->
        try do
          latest(conn, opts, deadline)
        after
          Connection.close(conn)
        end

      {:error, error} ->
        {:error, explain(error, opts)}
    end
  end

  defp latest(conn, opts, deadline) do
    with {:ok, lsn, conn} <- Catalog.current_wal_lsn(conn, left(deadline)),
         {:ok, slot, conn} <- Catalog.slot(conn, opts[:slot], left(deadline)) do
      if slot do
        {:ok, {lsn, 0}}
      else
        case Catalog.publication_tables(conn, opts[:publication], left(deadline)) do
          {:ok, nil, conn} -> {:error, no_publication(conn, opts)}
          {:ok, tables, conn} -> if_empty(conn, opts, tables, lsn, deadline)
          {:error, error, _conn} -> {:error, explain(error, opts)}
        end
      end
    else
      {:error, error, _conn} -> {:error, explain(error, opts)}
    end
  end

  # Whether, at one instant (one statement's snapshot), the slot was
  # still missing and every published table empty (as the publication's
  # row filters see it).
  defp if_empty(conn, opts, tables, lsn, deadline) do
    empty =
      Enum.map(tables, fn table ->
        from = Catalog.identifier(table.schema) <> "." <> Catalog.identifier(table.table)
        where = if table.row_filter, do: " WHERE " <> table.row_filter, else: ""
        " AND NOT EXISTS (SELECT 1 FROM #{from}#{where})"
      end)

    sql =
      "SELECT NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = " <>
        Catalog.literal(opts[:slot]) <> ")" <> Enum.join(empty)

    case Connection.query(conn, sql, left(deadline)) do
      {:ok, [%{rows: [["t"]]}], _conn} -> {:ok, {0, 0}}
      {:ok, [%{rows: [["f"]]}], _conn} -> {:ok, {lsn, 0}}
      {:ok, _, conn} -> {:error, bad_reply(conn, "the published tables")}
      {:error, error, _conn} -> {:error, explain(error, opts)}
    end
  end

  defp left(deadline), do: max(deadline - System.monotonic_time(:millisecond), 1)

  defp format_lsn(lsn), do: Larder.Postgres.Protocol.format_lsn(lsn)

  ## Errors

  defp wal_level_error(conn, level) do
    Connection.error(
      :source_failed,
      conn.server,
      :wal_level,
      "wal_level is #{inspect(level)}, and logical replication needs \"logical\": set " <>
        "wal_level = logical in the server's postgresql.conf (or ALTER SYSTEM SET wal_level = " <>
        "logical) and restart the server"
    )
    |> put_details(wal_level: level)
  end

  defp no_publication(conn, opts) do
    Connection.error(
      :source_failed,
      conn.server,
      :no_publication,
      "database #{inspect(opts[:database])} has no publication " <>
        "#{inspect(opts[:publication])}: create it (CREATE PUBLICATION " <>
        "#{Catalog.identifier(opts[:publication])} FOR TABLE ...) or check the :publication option"
    )
    |> put_details(option: :publication, publication: opts[:publication])
  end

  defp foreign_slot(conn, slot, opts) do
    Connection.error(
      :source_failed,
      conn.server,
      :foreign_slot,
      "the replication slot #{inspect(opts[:slot])} is a #{slot.type} slot of plugin " <>
        "#{inspect(slot.plugin)} on database #{inspect(slot.database)}, not a pgoutput logical " <>
        "slot of database #{inspect(opts[:database])}: it is not this replica's; choose another " <>
        ":slot"
    )
    |> put_details(option: :slot, slot: slot)
  end

  defp slot_in_use(conn, slot, opts) do
    Connection.error(
      :source_unavailable,
      conn.server,
      :slot_in_use,
      "the replication slot #{inspect(opts[:slot])} is in use by another connection (server " <>
        "process #{slot.active_pid}): is another replica using the same :slot? Each replica " <>
        "(each node) needs a slot of its own"
    )
    |> put_details(option: :slot, active_pid: slot.active_pid)
  end

  defp bad_reply(conn, what) do
    Connection.error(:source_bad_reply, conn.server, {:bad_row, what}, "an unexpected answer")
  end

  # What to do about an error the server or the connection gave: the
  # option to check, or the server setting to change, after its message.
  defp explain(%Larder.Error{details: details} = error, opts) do
    case hint(details, opts) do
      nil ->
        error

      {option, text} ->
        %{error | message: error.message <> ": " <> text}
        |> put_details(if(option, do: [option: option], else: []))
    end
  end

  defp hint(%{option: _}, _opts), do: nil

  defp hint(%{code: "28P01"}, _opts),
    do: {:password, "check the :username and :password options (or :url)"}

  defp hint(%{code: "3D000"}, _opts), do: {:database, "check the :database option (or :url)"}

  defp hint(%{code: "28000", message: message}, opts) when is_binary(message) do
    if message =~ "replication",
      do:
        {nil,
         "the server's pg_hba.conf must let #{inspect(opts[:username])} make a replication " <>
           "connection (a line such as `host replication #{opts[:username]} <address> " <>
           "scram-sha-256`), then reload the server"},
      else: {:username, "check the :username option, and the server's pg_hba.conf"}
  end

  defp hint(%{code: "42501", message: message}, opts) when is_binary(message) do
    if message =~ "replication" or message =~ "walsender",
      do:
        {:username,
         "the role needs the REPLICATION attribute: ALTER ROLE " <>
           "#{Catalog.identifier(opts[:username])} REPLICATION"},
      else:
        {:username,
         "the role needs SELECT on every table of the publication: GRANT SELECT ON ... TO " <>
           Catalog.identifier(opts[:username])}
  end

  defp hint(%{code: "42704", message: message}, _opts) when is_binary(message) do
    if message =~ "publication",
      do: {:publication, "check the :publication option"},
      else: nil
  end

  defp hint(%{code: code}, _opts) when code in ["53300", "53400"],
    do:
      {nil,
       "the server is out of connections, WAL senders or replication slots (max_connections, " <>
         "max_wal_senders, max_replication_slots): raise them or free some"}

  defp hint(%{code: "55006"}, _opts),
    do:
      {:slot,
       "another connection uses the slot: each replica (each node) needs a :slot of its own"}

  defp hint(%{cause: :no_password}, _opts), do: {:password, "give the :password option"}

  defp hint(%{cause: cause}, _opts) when cause in [:econnrefused, :nxdomain, :ehostunreach],
    do: {:host, "is the server up, and are :host and :port (or :url) right?"}

  defp hint(%{cause: {:tls, _}}, _opts), do: {:sslmode, "check :sslmode and :ssl_options"}
  defp hint(%{cause: :tls_refused}, _opts), do: {:sslmode, "check :sslmode"}
  defp hint(_details, _opts), do: nil

  defp put_details(%Larder.Error{details: details} = error, more),
    do: %{error | details: Enum.into(more, details)}
end
