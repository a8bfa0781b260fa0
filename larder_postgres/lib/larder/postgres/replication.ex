# A logical replication connection: IDENTIFY_SYSTEM, a slot created with
# an exported snapshot, START_REPLICATION with pgoutput, and the stream
# read as whole transactions of entries with positions, the server told
# only the flush position its caller gives.
defmodule Larder.Postgres.Replication do
  @moduledoc false

  # Contract (internal).
  #
  # A plain struct over a Larder.Postgres.Connection opened with
  # `replication=database`, used by one process, like the connection;
  # every call takes a timeout (ms) and returns the struct to go on with.
  #
  #   connect(opts)                          {:ok, repl} | {:error, error}
  #   identify_system(repl, timeout)         {:ok, %{system_id, timeline,
  #                                            xlogpos, dbname}, repl}
  #   create_slot(repl, slot, timeout)       {:ok, %{slot, consistent_point,
  #                                            snapshot_name, plugin}, repl}
  #   drop_slot(repl, slot, timeout)         {:ok, repl}
  #   start(repl, slot, publications, from, opts)
  #                                          {:ok, repl}
  #   read(repl, count, timeout)             {:ok, [entry], repl}
  #   position(repl)                         {lsn, index}
  #   flush(repl, lsn, timeout)              {:ok, repl}
  #   close(repl)                            :ok
  #
  # (each may also return {:error, %Larder.Error{}, repl}; see
  # Larder.Postgres.Connection for the reasons). LSNs are integers
  # (Larder.Postgres.Protocol.format_lsn/1 writes them as Postgres does).
  #
  # Slots and snapshots. create_slot/3 (PostgreSQL 15's syntax:
  # CREATE_REPLICATION_SLOT ... LOGICAL pgoutput (SNAPSHOT 'export'))
  # returns the slot's consistent point and the name of a snapshot that
  # sees exactly the transactions committed before it. The snapshot lives
  # while this connection runs no other command: copy the tables inside it
  # on a second, normal connection (Larder.Postgres.SnapshotCopy), then
  # start/5 from the consistent point, and the stream holds exactly the
  # transactions that committed after it.
  #
  # Positions. An entry is `{{commit_lsn, index}, fields}`: the LSN of its
  # transaction's commit record and its index (0, 1, ...) within the
  # transaction. A position `{lsn, n}` means: every transaction whose
  # commit LSN is below `lsn` applied, and the first `n` entries of the
  # one committed at `lsn` (the position after entry `{c, i}` is
  # `{c, i + 1}`; after a whole transaction, `{end_lsn, 0}`, its commit
  # record's end, which includes it). Positions compare as tuples.
  # position/1 is the position after everything read/3 has returned; it
  # also moves past empty stretches of the log (transactions with nothing
  # published, a keepalive's WAL end while no transaction is open), so a
  # replica that applied every entry reaches pg_current_wal_lsn().
  #
  # Restarting. start/5 from a position `{lsn, n}` asks the server for
  # the transactions from `lsn` (the server sends every transaction whose
  # commit record starts at or after it, and none before its slot's
  # confirmed_flush_lsn) and drops the first `n` entries of the one
  # committed at `lsn`, and anything below the position. So the flush LSN
  # of a position is its `lsn` (flush_lsn/1): telling the server that
  # never loses the rest of a transaction applied in part; the server
  # sends that transaction again from its start, and the entries already
  # applied are dropped. The server starts from its slot's
  # confirmed_flush_lsn when that is above `lsn`, skipping what lies
  # between: a caller checks the slot (Larder.Postgres.Catalog.slot/3)
  # before it starts from a position below it, and treats that as entries
  # lost.
  #
  # The exported snapshot ends with the next command on this connection,
  # and start/5 runs two (SHOW wal_sender_timeout, START_REPLICATION): the
  # copy's transaction imports it (Larder.Postgres.SnapshotCopy.begin/3)
  # before start/5 is called, and keeps it to its end.
  #
  # Whole transactions. read/3 returns entries only from transactions
  # whose Commit arrived, buffering a transaction's entries meanwhile;
  # a transaction that grows past :max_transaction_entries or
  # :max_transaction_bytes is handed over in batches before its Commit
  # (in_transaction?/1 is then true), whose positions stay below the
  # transaction's end, so its flush LSN does not pass it until the last
  # entry.
  #
  # The server is told (Standby Status Update) the write LSN (the WAL end
  # it reported) and as flush and apply LSN the largest LSN given to
  # flush/3, never more: the slot keeps every transaction from there.
  # Updates go when the server asks for one (a keepalive with a reply
  # requested), at each flush/3, and every :status_interval ms while read/3
  # runs, at most a third of the server's wal_sender_timeout (read at
  # start/5), so a reader that calls read/3 often enough is not dropped
  # however slowly it applies what it reads. Between read/3 calls nothing
  # reads the socket: a caller that does not call read/3 for a
  # wal_sender_timeout is dropped by the server.
  #
  # Memory: one message (:max_message_bytes) being received, the open
  # transaction's buffer (its bounds), the entries of committed
  # transactions not yet returned (the socket is not read while any are
  # left), and the relations described (at most
  # Larder.Postgres.Pgoutput.max_relations/0).

  import Bitwise

  alias Larder.Postgres.{Connection, Pgoutput, Protocol}

  @default_status_interval 10_000
  @default_max_transaction_entries 10_000
  @default_max_transaction_bytes 16_777_216

  @type lsn :: non_neg_integer()
  @type position :: {lsn(), non_neg_integer()}
  @type entry :: {position(), Pgoutput.entry()}
  @type t :: %__MODULE__{}

  @derive {Inspect, only: [:conn, :position, :flush_lsn, :queued]}
  @enforce_keys [:conn]
  defstruct [
    :conn,
    decoder: nil,
    queue: nil,
    queued: 0,
    tx: nil,
    position: {0, 0},
    received_lsn: 0,
    flush_lsn: 0,
    status_interval: @default_status_interval,
    next_status_at: 0,
    max_transaction_entries: @default_max_transaction_entries,
    max_transaction_bytes: @default_max_transaction_bytes,
    ignored: 0
  ]

  ## Commands

  @doc """
  Opens a replication connection (`replication=database`) with
  Larder.Postgres.Options' validated `opts`. The server must be
  PostgreSQL 15 or later.
  """
  @spec connect(keyword()) :: {:ok, t()} | {:error, Larder.Error.t()}
  def connect(opts) do
    with {:ok, conn} <- Connection.connect(opts, true) do
      case server_major(conn) do
        major when is_integer(major) and major >= 15 ->
          {:ok, %__MODULE__{conn: conn}}

        _ ->
          Connection.close(conn)

          {:error,
           Connection.error(
             :source_failed,
             conn.server,
             {:server_version, conn.parameters["server_version"]},
             "logical replication here needs PostgreSQL 15 or later, the server is " <>
               inspect(conn.parameters["server_version"])
           )}
      end
    end
  end

  defp server_major(conn) do
    with version when is_binary(version) <- conn.parameters["server_version"],
         {major, _} <- Integer.parse(version) do
      major
    end
  end

  @doc "A simple query on the replication connection (before start/5)."
  @spec query(t(), binary(), timeout()) ::
          {:ok, [Connection.result()], t()} | {:error, Larder.Error.t(), t()}
  def query(repl, sql, timeout) do
    case Connection.query(repl.conn, sql, timeout) do
      {:ok, results, conn} -> {:ok, results, %{repl | conn: conn}}
      {:error, error, conn} -> {:error, error, %{repl | conn: conn}}
    end
  end

  @doc """
  IDENTIFY_SYSTEM: the server's system id, timeline, current WAL flush
  LSN and the connection's database.
  """
  @spec identify_system(t(), timeout()) :: {:ok, map(), t()} | {:error, Larder.Error.t(), t()}
  def identify_system(repl, timeout) do
    with {:ok, [system_id, timeline, xlogpos, dbname], repl} <-
           one_row(repl, "IDENTIFY_SYSTEM", 4, timeout) do
      with {:ok, timeline} <- integer(timeline),
           {:ok, xlogpos} <- Protocol.parse_lsn(xlogpos || "") do
        {:ok, %{system_id: system_id, timeline: timeline, xlogpos: xlogpos, dbname: dbname}, repl}
      else
        :error -> bad_reply(repl, {:bad_row, "IDENTIFY_SYSTEM"})
      end
    end
  end

  @doc """
  Creates the logical slot `slot` (pgoutput) and exports its snapshot:
  `%{slot: name, consistent_point: lsn, snapshot_name: name, plugin:
  "pgoutput"}`. See "Slots and snapshots" in the contract.
  """
  @spec create_slot(t(), String.t(), timeout()) ::
          {:ok, map(), t()} | {:error, Larder.Error.t(), t()}
  def create_slot(repl, slot, timeout) do
    slot!(slot)
    sql = ~s[CREATE_REPLICATION_SLOT "#{slot}" LOGICAL pgoutput (SNAPSHOT 'export')]

    with {:ok, [name, point, snapshot, plugin], repl} <- one_row(repl, sql, 4, timeout) do
      case Protocol.parse_lsn(point || "") do
        {:ok, point}
        when name == slot and is_binary(snapshot) and snapshot != "" and plugin == "pgoutput" ->
          {:ok, %{slot: name, consistent_point: point, snapshot_name: snapshot, plugin: plugin},
           repl}

        _ ->
          bad_reply(repl, {:bad_row, "CREATE_REPLICATION_SLOT"})
      end
    end
  end

  @doc "Drops the slot `slot`, waiting for it to be free (DROP_REPLICATION_SLOT ... WAIT)."
  @spec drop_slot(t(), String.t(), timeout()) :: {:ok, t()} | {:error, Larder.Error.t(), t()}
  def drop_slot(repl, slot, timeout) do
    slot!(slot)

    with {:ok, _results, repl} <- query(repl, ~s[DROP_REPLICATION_SLOT "#{slot}" WAIT], timeout) do
      {:ok, repl}
    end
  end

  @doc """
  True when `name` can name a replication slot: 1 to 63 lower-case
  letters, digits and underscores (Postgres's own rule).
  """
  @spec slot_name?(term()) :: boolean()
  def slot_name?(name),
    do: is_binary(name) and byte_size(name) in 1..63 and name =~ ~r/\A[a-z0-9_]+\z/

  defp slot!(slot) do
    unless slot_name?(slot) do
      raise ArgumentError,
            "expected a replication slot name of 1 to 63 lower-case letters, digits and " <>
              "underscores, got: #{inspect(slot, limit: 10)}"
    end
  end

  defp one_row(repl, sql, columns, timeout) do
    case query(repl, sql, timeout) do
      {:ok, [%{rows: [row]}], repl} when length(row) == columns -> {:ok, row, repl}
      {:ok, _results, repl} -> bad_reply(repl, {:bad_row, sql})
      {:error, _, _} = error -> error
    end
  end

  defp integer(nil), do: :error

  defp integer(text) do
    case Integer.parse(text) do
      {n, ""} -> {:ok, n}
      _ -> :error
    end
  end

  ## Streaming

  @doc """
  Starts streaming `slot`'s changes of `publications` from `from` (an LSN,
  or a position `{lsn, n}`: see "Restarting"). Options:

    * `:timeout` - ms for the command, default 15_000
    * `:status_interval` - ms between status updates, 100..600_000,
      default #{@default_status_interval} (lowered to a third of the
      server's wal_sender_timeout)
    * `:max_transaction_entries` - entries of an open transaction
      buffered before they are handed over early, 1..10_000_000, default
      #{@default_max_transaction_entries}
    * `:max_transaction_bytes` - the same in bytes of pgoutput messages,
      1..2^34, default #{@default_max_transaction_bytes}
  """
  @spec start(t(), String.t(), [String.t()], lsn() | position(), keyword()) ::
          {:ok, t()} | {:error, Larder.Error.t(), t()}
  def start(repl, slot, publications, from, opts \\ []) do
    slot!(slot)
    publications!(publications)
    position = position!(from)

    opts =
      Larder.Options.validate!(
        opts,
        [
          timeout: {{:integer, 0, 600_000}, 15_000},
          status_interval: {{:integer, 100, 600_000}, @default_status_interval},
          max_transaction_entries: {{:integer, 1, 10_000_000}, @default_max_transaction_entries},
          max_transaction_bytes: {{:integer, 1, 17_179_869_184}, @default_max_transaction_bytes}
        ],
        "Larder.Postgres.Replication.start/5"
      )

    timeout = opts[:timeout]
    {lsn, _} = position

    sql =
      ~s[START_REPLICATION SLOT "#{slot}" LOGICAL #{Protocol.format_lsn(lsn)} ] <>
        "(proto_version '1', publication_names #{publication_names(publications)})"

    with {:ok, sender_timeout, repl} <- wal_sender_timeout(repl, timeout),
         {:ok, conn} <- copy_both(repl.conn, sql, timeout) do
      interval =
        if sender_timeout > 0,
          do: min(opts[:status_interval], max(div(sender_timeout, 3), 50)),
          else: opts[:status_interval]

      {:ok,
       %{
         repl
         | conn: conn,
           decoder: Pgoutput.new(),
           queue: :queue.new(),
           queued: 0,
           tx: nil,
           position: position,
           received_lsn: lsn,
           status_interval: interval,
           next_status_at: now() + interval,
           max_transaction_entries: opts[:max_transaction_entries],
           max_transaction_bytes: opts[:max_transaction_bytes]
       }}
    else
      {:error, error, %Connection{} = conn} -> {:error, error, %{repl | conn: conn}}
      {:error, _, _} = error -> error
    end
  end

  defp copy_both(conn, sql, timeout), do: Connection.copy_both(conn, sql, timeout)

  defp position!({lsn, n} = position)
       when is_integer(lsn) and lsn >= 0 and lsn < 1 <<< 64 and
              is_integer(n) and n >= 0,
       do: position

  defp position!(lsn) when is_integer(lsn) and lsn >= 0 and lsn < 1 <<< 64, do: {lsn, 0}

  defp position!(other) do
    raise ArgumentError,
          "expected from to be an LSN (a 64-bit non-negative integer) or a position " <>
            "{lsn, index}, got: #{inspect(other, limit: 10)}"
  end

  defp publications!(publications) do
    unless is_list(publications) and publications != [] and length(publications) <= 100 and
             Enum.all?(publications, &identifier?/1) do
      raise ArgumentError,
            "expected publications to be a list of 1 to 100 publication names (strings of 1 " <>
              "to 63 bytes without NUL), got: #{inspect(publications, limit: 10)}"
    end
  end

  @doc "True when `name` can be sent as a Postgres identifier (1 to 63 bytes, no NUL)."
  @spec identifier?(term()) :: boolean()
  def identifier?(name),
    do: is_binary(name) and byte_size(name) in 1..63 and :binary.match(name, <<0>>) == :nomatch

  # publication_names is a string literal holding a list of identifiers.
  defp publication_names(publications) do
    list =
      Enum.map_join(publications, ",", &(~s["] <> String.replace(&1, ~s["], ~s[""]) <> ~s["]))

    "'" <> String.replace(list, "'", "''") <> "'"
  end

  # The server's wal_sender_timeout in ms (0: none), which bounds the
  # status interval.
  defp wal_sender_timeout(repl, timeout) do
    case query(repl, "SHOW wal_sender_timeout", timeout) do
      {:ok, [%{rows: [[text]]}], repl} when is_binary(text) ->
        case duration_ms(text) do
          {:ok, ms} -> {:ok, ms, repl}
          :error -> bad_reply(repl, {:bad_row, "SHOW wal_sender_timeout"})
        end

      {:ok, _, repl} ->
        bad_reply(repl, {:bad_row, "SHOW wal_sender_timeout"})

      {:error, _, _} = error ->
        error
    end
  end

  @units %{"ms" => 1, "s" => 1_000, "min" => 60_000, "h" => 3_600_000, "d" => 86_400_000, "" => 1}

  defp duration_ms(text) do
    with {n, unit} when n >= 0 <- Integer.parse(text),
         {:ok, factor} <- Map.fetch(@units, unit) do
      {:ok, n * factor}
    else
      _ -> :error
    end
  end

  @doc """
  Up to `count` entries of committed transactions (see "Whole
  transactions"), waiting up to `timeout` ms for the first: `{:ok, [],
  repl}` when none came. Answers keepalives and sends status updates
  while it waits. Once some entries are at hand, or the position moved
  past a stretch of the log without any (a keepalive's WAL end, a
  transaction with nothing published), it returns with what the socket
  already holds, without waiting for more: a caller that waits for the
  position to reach the server's WAL end sees it move as soon as the
  server says so.
  """
  @spec read(t(), pos_integer(), non_neg_integer()) ::
          {:ok, [entry()], t()} | {:error, Larder.Error.t(), t()}
  def read(%__MODULE__{queue: nil}, _count, _timeout),
    do: raise(ArgumentError, "expected a replication connection started with start/5")

  def read(repl, count, timeout)
      when is_integer(count) and count > 0 and is_integer(timeout) and timeout >= 0 do
    deadline = now() + timeout

    with {:ok, repl} <- status_if_due(repl) do
      read_loop(repl, count, deadline, repl.position)
    end
  end

  def read(_repl, count, timeout) do
    raise ArgumentError,
          "expected count to be a positive integer and timeout a non-negative integer (ms), " <>
            "got: #{inspect(count, limit: 10)} and #{inspect(timeout, limit: 10)}"
  end

  # `from` is the position the read started at.
  defp read_loop(repl, count, deadline, from) do
    cond do
      repl.queued >= count ->
        {entries, repl} = take(repl, count)
        {:ok, entries, repl}

      repl.queued > 0 or repl.position != from ->
        # more only if it is already there
        receive_one(repl, count, deadline, from, now())

      true ->
        receive_one(repl, count, deadline, from, min(deadline, repl.next_status_at))
    end
  end

  defp receive_one(repl, count, deadline, from, wait_until) do
    case Connection.copy_both_recv(repl.conn, wait_until) do
      {:ok, data, conn} ->
        with {:ok, repl} <- handle_data(%{repl | conn: conn}, data) do
          read_loop(repl, count, deadline, from)
        end

      {:timeout, conn} ->
        repl = %{repl | conn: conn}

        cond do
          repl.queued > 0 ->
            {entries, repl} = take(repl, count)
            {:ok, entries, repl}

          repl.position != from or now() >= deadline ->
            with {:ok, repl} <- status_if_due(repl), do: {:ok, [], repl}

          true ->
            with {:ok, repl} <- status_if_due(repl), do: read_loop(repl, count, deadline, from)
        end

      {:error, error, conn} ->
        {:error, error, %{repl | conn: conn}}
    end
  end

  defp handle_data(repl, data) do
    case Protocol.decode_replication(data) do
      {:ok, {:keepalive, wal_end, _time, reply?}} ->
        repl = %{repl | received_lsn: max(repl.received_lsn, wal_end)}
        repl = if repl.tx == nil, do: advance_to(repl, {wal_end, 0}), else: repl
        if reply?, do: send_status(repl), else: {:ok, repl}

      {:ok, {:xlog_data, wal_start, _wal_end, _time, payload}} ->
        repl = %{repl | received_lsn: max(repl.received_lsn, wal_start)}

        with {:ok, message} <- Pgoutput.decode(payload),
             {:ok, output, decoder} <- Pgoutput.handle(repl.decoder, message) do
          {:ok, output(%{repl | decoder: decoder}, output, byte_size(payload))}
        else
          {:error, reason} -> bad_reply(repl, reason)
        end

      {:error, reason} ->
        bad_reply(repl, reason)
    end
  end

  defp output(repl, {:begin, final_lsn}, _bytes),
    do: %{repl | tx: %{lsn: final_lsn, index: 0, entries: [], count: 0, bytes: 0}}

  defp output(%{tx: tx} = repl, {:changes, entries}, bytes) do
    {kept, count, index} =
      Enum.reduce(entries, {tx.entries, tx.count, tx.index}, fn entry, {kept, count, index} ->
        id = {tx.lsn, index}

        # below the position this stream started from: applied already
        if id >= repl.position,
          do: {[{id, entry} | kept], count + 1, index + 1},
          else: {kept, count, index + 1}
      end)

    tx = %{tx | entries: kept, index: index, count: count, bytes: tx.bytes + bytes}

    if tx.count >= repl.max_transaction_entries or tx.bytes >= repl.max_transaction_bytes,
      do: enqueue(%{repl | tx: %{tx | entries: [], count: 0, bytes: 0}}, tx.entries),
      else: %{repl | tx: tx}
  end

  defp output(%{tx: tx} = repl, {:commit, _commit_lsn, end_lsn}, _bytes) do
    repl = enqueue(%{repl | tx: nil}, tx.entries)
    advance_to(repl, {end_lsn, 0})
  end

  defp output(repl, :none, _bytes), do: repl
  defp output(repl, :ignored, _bytes), do: %{repl | ignored: repl.ignored + 1}

  # `entries` in reverse.
  defp enqueue(repl, []), do: repl

  defp enqueue(repl, entries) do
    queue = Enum.reduce(Enum.reverse(entries), repl.queue, &:queue.in({:entry, &1}, &2))
    %{repl | queue: queue, queued: repl.queued + length(entries)}
  end

  # A position reached once what is queued is taken: now when the queue
  # is empty, else as a mark after the queued entries.
  defp advance_to(%{queued: 0} = repl, position),
    do: %{repl | position: max(repl.position, position)}

  defp advance_to(repl, position),
    do: %{repl | queue: :queue.in({:mark, position}, repl.queue)}

  defp take(repl, count), do: take(repl, count, [])

  defp take(repl, 0, acc), do: {Enum.reverse(acc), take_marks(repl)}

  defp take(repl, count, acc) do
    case :queue.out(repl.queue) do
      {{:value, {:entry, {{lsn, index} = id, fields}}}, queue} ->
        repl = %{
          repl
          | queue: queue,
            queued: repl.queued - 1,
            position: max(repl.position, {lsn, index + 1})
        }

        take(repl, count - 1, [{id, fields} | acc])

      {{:value, {:mark, position}}, queue} ->
        take(%{repl | queue: queue, position: max(repl.position, position)}, count, acc)

      {:empty, _} ->
        {Enum.reverse(acc), repl}
    end
  end

  # The marks right after the last entry taken.
  defp take_marks(repl) do
    case :queue.peek(repl.queue) do
      {:value, {:mark, position}} ->
        take_marks(%{
          repl
          | queue: :queue.drop(repl.queue),
            position: max(repl.position, position)
        })

      _ ->
        repl
    end
  end

  @doc "The position after everything read/3 returned (see \"Positions\")."
  @spec position(t()) :: position()
  def position(%__MODULE__{position: position}), do: position

  @doc """
  True while the entries returned so far end inside a transaction (the
  position is `{commit_lsn, n}` with `n` > 0: more of it is to come).
  """
  @spec in_transaction?(t()) :: boolean()
  def in_transaction?(%__MODULE__{position: {_lsn, n}}), do: n > 0

  @doc "The LSN to tell the server once `position` is durable (see \"Restarting\")."
  @spec flush_lsn(position()) :: lsn()
  def flush_lsn({lsn, _n}), do: lsn

  @doc """
  Records `lsn` as durable (the largest LSN given so far counts) and sends
  a status update at once. `timeout` is the caller's bound; the send is
  bounded by the socket's send timeout (the connection's `:timeout`).
  """
  @spec flush(t(), lsn(), timeout()) :: {:ok, t()} | {:error, Larder.Error.t(), t()}
  def flush(%__MODULE__{queue: nil}, _lsn, _timeout),
    do: raise(ArgumentError, "expected a replication connection started with start/5")

  def flush(repl, lsn, _timeout) when is_integer(lsn) and lsn >= 0 and lsn < 1 <<< 64 do
    send_status(%{repl | flush_lsn: max(repl.flush_lsn, lsn)})
  end

  def flush(_repl, lsn, _timeout),
    do:
      raise(
        ArgumentError,
        "expected lsn to be a 64-bit non-negative integer, got: #{inspect(lsn, limit: 10)}"
      )

  @doc "How many logical decoding messages the stream skipped."
  @spec ignored(t()) :: non_neg_integer()
  def ignored(%__MODULE__{ignored: ignored}), do: ignored

  defp status_if_due(repl) do
    if now() >= repl.next_status_at, do: send_status(repl), else: {:ok, repl}
  end

  defp send_status(repl) do
    flush = repl.flush_lsn
    write = max(repl.received_lsn, flush)
    message = Protocol.standby_status(write, flush, flush, Protocol.pg_time(), false)

    case Connection.copy_both_send(repl.conn, message) do
      {:ok, conn} -> {:ok, %{repl | conn: conn, next_status_at: now() + repl.status_interval}}
      {:error, error, conn} -> {:error, error, %{repl | conn: conn}}
    end
  end

  @doc "Closes the connection. Never fails."
  @spec close(t()) :: :ok
  def close(%__MODULE__{conn: conn}), do: Connection.close(conn)

  defp bad_reply(repl, cause) do
    {:error, error, conn} = Connection.bad_reply(repl.conn, cause)
    {:error, error, %{repl | conn: conn}}
  end

  defp now, do: System.monotonic_time(:millisecond)
end
