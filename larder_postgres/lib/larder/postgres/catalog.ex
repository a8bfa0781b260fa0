# What a replication source asks a server over a normal connection: its
# wal_level, a slot's state, a publication's tables and the current WAL
# end; each answer's shape checked.
defmodule Larder.Postgres.Catalog do
  @moduledoc false

  # Contract (internal).
  #
  # Plain functions over a Larder.Postgres.Connection (a normal one, not
  # a replication connection), each within `timeout` ms, each returning
  # {:ok, answer, conn} or {:error, %Larder.Error{}, conn}; an answer of
  # the wrong shape is :source_bad_reply (the connection closed). Names
  # are sent as quoted string literals, so any name is safe to pass.
  #
  #   wal_level(conn, timeout)           "replica" | "logical" | ...
  #   slot(conn, name, timeout)          nil | %{slot: name, plugin:,
  #                                        type: "logical" | "physical",
  #                                        database:, active:, active_pid:
  #                                        (the backend using it, or nil),
  #                                        restart_lsn:,
  #                                        confirmed_flush_lsn:, wal_status:}
  #                                      LSNs as integers or nil; wal_status
  #                                      "reserved" | "extended" |
  #                                      "unreserved" | "lost" (invalidated:
  #                                      the slot can no longer stream) or nil
  #   publication_tables(conn, name, timeout)
  #                                      nil (no such publication) | [%{schema:,
  #                                        table:, columns: [name], row_filter:
  #                                        nil | sql}] in (schema, table) order,
  #                                        columns in the table's order without
  #                                        generated ones (pgoutput does not
  #                                        send those), as the publication's
  #                                        column list and row filter say (a
  #                                        table with no such column is left
  #                                        out: there is nothing to copy)
  #   current_wal_lsn(conn, timeout)     the server's WAL end now: a replica
  #                                      whose position reaches it has every
  #                                      transaction committed before the call
  #
  # current_wal_lsn/2 reads the insert position, not pg_current_wal_lsn()
  # (the write position): with synchronous_commit off, a commit returns
  # before its record is written, and the write position may be below it.
  # The stream reaches the insert position once the WAL is flushed (the WAL
  # writer does it within wal_writer_delay) and decoded, except that an
  # insert position at a page's start points past the page's header, where
  # no record ends: there it is moved back to the page's start, which is
  # where the last record ended.

  alias Larder.Postgres.{Connection, Protocol}

  @doc "The server's wal_level."
  @spec wal_level(Connection.t(), timeout()) ::
          {:ok, String.t(), Connection.t()} | {:error, Larder.Error.t(), Connection.t()}
  def wal_level(conn, timeout) do
    case Connection.query(conn, "SHOW wal_level", timeout) do
      {:ok, [%{rows: [[level]]}], conn} when is_binary(level) -> {:ok, level, conn}
      {:ok, _, conn} -> Connection.bad_reply(conn, {:bad_row, "SHOW wal_level"})
      error -> error
    end
  end

  @doc "The state of the replication slot `name`, or nil."
  @spec slot(Connection.t(), String.t(), timeout()) ::
          {:ok, map() | nil, Connection.t()} | {:error, Larder.Error.t(), Connection.t()}
  def slot(conn, name, timeout) do
    sql =
      "SELECT slot_name, plugin, slot_type, database, active, active_pid, restart_lsn, " <>
        "confirmed_flush_lsn, wal_status FROM pg_replication_slots WHERE slot_name = " <>
        literal(name)

    case Connection.query(conn, sql, timeout) do
      {:ok, [%{rows: []}], conn} ->
        {:ok, nil, conn}

      {:ok,
       [
         %{
           rows: [[slot, plugin, type, database, active, pid, restart, confirmed, wal_status]]
         }
       ], conn}
      when slot == name and active in ["t", "f"] ->
        with {:ok, restart} <- lsn_or_nil(restart),
             {:ok, confirmed} <- lsn_or_nil(confirmed),
             {:ok, pid} <- pid_or_nil(pid) do
          {:ok,
           %{
             slot: slot,
             plugin: plugin,
             type: type,
             database: database,
             active: active == "t",
             active_pid: pid,
             restart_lsn: restart,
             confirmed_flush_lsn: confirmed,
             wal_status: wal_status
           }, conn}
        else
          :error -> Connection.bad_reply(conn, {:bad_row, "pg_replication_slots"})
        end

      {:ok, _, conn} ->
        Connection.bad_reply(conn, {:bad_row, "pg_replication_slots"})

      error ->
        error
    end
  end

  @doc "The tables of the publication `name`, or nil when it does not exist."
  @spec publication_tables(Connection.t(), String.t(), timeout()) ::
          {:ok, [map()] | nil, Connection.t()} | {:error, Larder.Error.t(), Connection.t()}
  def publication_tables(conn, name, timeout) do
    sql = """
    SELECT count(*) FROM pg_publication WHERE pubname = #{literal(name)};
    SELECT p.schemaname, p.tablename, c.attname, p.rowfilter
      FROM pg_publication_tables p
      CROSS JOIN LATERAL unnest(p.attnames) WITH ORDINALITY AS c(attname, ord)
      JOIN pg_attribute a
        ON a.attrelid = format('%I.%I', p.schemaname, p.tablename)::regclass
       AND a.attname = c.attname
     WHERE p.pubname = #{literal(name)} AND a.attgenerated = ''
     ORDER BY p.schemaname, p.tablename, c.ord
    """

    case Connection.query(conn, sql, timeout) do
      {:ok, [%{rows: [["0"]]}, %{rows: []}], conn} ->
        {:ok, nil, conn}

      {:ok, [%{rows: [["1"]]}, %{rows: rows}], conn} ->
        if Enum.all?(
             rows,
             &match?([s, t, c, _] when is_binary(s) and is_binary(t) and is_binary(c), &1)
           ),
           do: {:ok, tables(rows), conn},
           else: Connection.bad_reply(conn, {:bad_row, "pg_publication_tables"})

      {:ok, _, conn} ->
        Connection.bad_reply(conn, {:bad_row, "pg_publication_tables"})

      error ->
        error
    end
  end

  # Rows of (schema, table, column, filter), already in order.
  defp tables(rows) do
    rows
    |> Enum.chunk_by(fn [schema, table, _, _] -> {schema, table} end)
    |> Enum.map(fn [[schema, table, _, filter] | _] = chunk ->
      %{
        schema: schema,
        table: table,
        columns: Enum.map(chunk, fn [_, _, column, _] -> column end),
        row_filter: filter
      }
    end)
  end

  @doc """
  The server's current WAL insert position (pg_current_wal_insert_lsn()),
  moved back to the end of the page before when it points just past a
  page header, where no record ends (see the contract above).
  """
  @spec current_wal_lsn(Connection.t(), timeout()) ::
          {:ok, non_neg_integer(), Connection.t()} | {:error, Larder.Error.t(), Connection.t()}
  def current_wal_lsn(conn, timeout) do
    sql =
      "SELECT pg_current_wal_insert_lsn(), current_setting('wal_block_size'), " <>
        "current_setting('wal_segment_size', true)"

    with {:ok, [%{rows: [[text, block, segment]]}], conn} when is_binary(text) <-
           Connection.query(conn, sql, timeout),
         {:ok, lsn} <- Protocol.parse_lsn(text),
         {block, ""} when block > 0 <- Integer.parse(block || ""),
         {:ok, segment} <- bytes(segment) do
      {:ok, record_end(lsn, block, segment), conn}
    else
      {:error, _, _} = error -> error
      {:ok, _, conn} -> Connection.bad_reply(conn, {:bad_row, "pg_current_wal_insert_lsn()"})
      _ -> Connection.bad_reply(conn, {:bad_row, "pg_current_wal_insert_lsn()"})
    end
  end

  # The page headers' sizes (SizeOfXLogShortPHD, SizeOfXLogLongPHD): an
  # insert position at a page's start points past its header, while the
  # record before ends at the page's start.
  @short_header 24
  @long_header 40

  defp record_end(lsn, block, segment) do
    cond do
      rem(lsn, segment) == @long_header -> lsn - @long_header
      rem(lsn, block) == @short_header -> lsn - @short_header
      true -> lsn
    end
  end

  # wal_segment_size as SHOW writes it ("16MB").
  defp bytes(text) when is_binary(text) do
    case Integer.parse(text) do
      {n, "MB"} when n > 0 -> {:ok, n * 1_048_576}
      {n, "GB"} when n > 0 -> {:ok, n * 1_073_741_824}
      {n, "kB"} when n > 0 -> {:ok, n * 1024}
      {n, ""} when n > 0 -> {:ok, n}
      _ -> :error
    end
  end

  defp bytes(_), do: :error

  defp pid_or_nil(nil), do: {:ok, nil}

  defp pid_or_nil(text) do
    case Integer.parse(text) do
      {pid, ""} when pid > 0 -> {:ok, pid}
      _ -> :error
    end
  end

  defp lsn_or_nil(nil), do: {:ok, nil}
  defp lsn_or_nil(text), do: Protocol.parse_lsn(text)

  @doc """
  `text` as an SQL string literal (E'...', backslashes and quotes
  escaped), whatever standard_conforming_strings is. Raises ArgumentError
  on a NUL byte, which no query can hold.
  """
  @spec literal(binary()) :: String.t()
  def literal(text) when is_binary(text) do
    unless Protocol.query_text?(text) do
      raise ArgumentError, "expected a string without NUL bytes, got: #{inspect(text, limit: 10)}"
    end

    "E'" <> (text |> String.replace("\\", "\\\\") |> String.replace("'", "''")) <> "'"
  end

  @doc "`name` as a quoted SQL identifier (double quotes doubled)."
  @spec identifier(binary()) :: String.t()
  def identifier(name) when is_binary(name) do
    unless Protocol.query_text?(name) do
      raise ArgumentError, "expected a name without NUL bytes, got: #{inspect(name, limit: 10)}"
    end

    ~s["] <> String.replace(name, ~s["], ~s[""]) <> ~s["]
  end
end
