# The initial copy of a replica of Postgres tables: a transaction on a
# normal connection inside the snapshot a new replication slot exported,
# and each published table's rows read through COPY ... TO STDOUT as
# "insert" entries, in bounded batches.
defmodule Larder.Postgres.SnapshotCopy do
  @moduledoc false

  # Contract (internal).
  #
  #   begin(conn, snapshot_name, timeout)      {:ok, conn}: a REPEATABLE
  #                                            READ, READ ONLY transaction
  #                                            that sees exactly what the
  #                                            snapshot saw
  #   start_table(conn, table, timeout)        {:ok, conn}: a COPY of
  #                                            `table` (one of
  #                                            Larder.Postgres.Catalog.
  #                                            publication_tables/3's) started
  #   read(conn, table, count, timeout)        {:ok, [entry], conn} (1 to
  #                                            count) | {:done, conn}
  #   finish(conn, timeout)                    {:ok, conn}: the transaction
  #                                            ended
  #
  # or {:error, %Larder.Error{}, conn}. The snapshot can be imported only
  # while the replication connection that created the slot has run no
  # other command (Larder.Postgres.Replication), and `begin` must come
  # before anything else in the transaction; an error from the server
  # (the snapshot no longer exists: :source_failed, code 22023) means the
  # copy cannot be made in it. The COPY reads the columns and rows the
  # publication sends (its column list, its row filter), so the copy and
  # the stream describe the same rows; a row of another field count than
  # the columns asked for (a server that announced another count) is a
  # :source_bad_reply, the connection closed. TRUNCATE is not MVCC-safe: one
  # committed after the snapshot makes its table look empty to the copy;
  # the stream then holds that TRUNCATE and every row written after it, so
  # a replica that applies the copy, then the stream, still ends equal to
  # the table. An entry is
  #
  #   %{"op" => "insert", "table" => "schema.table", "new" => %{column => text | nil}}

  alias Larder.Postgres.{Catalog, Connection}

  @doc "Begins a transaction in the exported snapshot `snapshot_name`."
  @spec begin(Connection.t(), String.t(), timeout()) ::
          {:ok, Connection.t()} | {:error, Larder.Error.t(), Connection.t()}
  def begin(conn, snapshot_name, timeout) do
    sql =
      "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY; SET TRANSACTION SNAPSHOT " <>
        Catalog.literal(snapshot_name)

    case Connection.query(conn, sql, timeout) do
      {:ok, _results, conn} -> {:ok, conn}
      {:error, error, conn} -> {:error, error, abort(conn, timeout)}
    end
  end

  # A failed BEGIN; SET leaves a failed transaction block open.
  defp abort(conn, timeout) do
    case Connection.query(conn, "ROLLBACK", timeout) do
      {:ok, _, conn} -> conn
      {:error, _, conn} -> conn
    end
  end

  @doc "The COPY statement that reads `table` as the publication sends it."
  @spec copy_sql(map()) :: String.t()
  def copy_sql(%{schema: schema, table: table, columns: [_ | _] = columns} = info) do
    select = Enum.map_join(columns, ", ", &Catalog.identifier/1)
    from = Catalog.identifier(schema) <> "." <> Catalog.identifier(table)
    where = if info[:row_filter], do: " WHERE " <> info.row_filter, else: ""
    "COPY (SELECT #{select} FROM #{from}#{where}) TO STDOUT"
  end

  @doc "Starts the COPY of `table`."
  @spec start_table(Connection.t(), map(), timeout()) ::
          {:ok, Connection.t()} | {:error, Larder.Error.t(), Connection.t()}
  def start_table(conn, table, timeout), do: Connection.copy_out(conn, copy_sql(table), timeout)

  @doc "Up to `count` rows of the COPY of `table`, as insert entries."
  @spec read(Connection.t(), map(), pos_integer(), timeout()) ::
          {:ok, [map()], Connection.t()}
          | {:done, Connection.t()}
          | {:error, Larder.Error.t(), Connection.t()}
  def read(conn, %{schema: schema, table: table, columns: columns}, count, timeout) do
    name = schema <> "." <> table

    case Connection.copy_read(conn, count, timeout) do
      {:ok, rows, conn} ->
        case entries(rows, name, columns, []) do
          :error -> Connection.bad_reply(conn, {:copy_columns, length(columns)})
          entries -> {:ok, entries, conn}
        end

      other ->
        other
    end
  end

  # Each row as an entry (one pass, no intermediate list), or :error when
  # a row's field count is not the statement's column count (a server
  # whose CopyOutResponse announced another count).
  defp entries([values | rows], name, columns, acc) do
    case row(columns, values, []) do
      :error ->
        :error

      new ->
        entries(rows, name, columns, [%{"op" => "insert", "table" => name, "new" => new} | acc])
    end
  end

  defp entries([], _name, _columns, acc), do: :lists.reverse(acc)

  defp row([column | columns], [value | values], pairs),
    do: row(columns, values, [{column, value} | pairs])

  defp row([], [], pairs), do: :maps.from_list(pairs)
  defp row(_columns, _values, _pairs), do: :error

  @doc "Ends the snapshot's transaction."
  @spec finish(Connection.t(), timeout()) ::
          {:ok, Connection.t()} | {:error, Larder.Error.t(), Connection.t()}
  def finish(conn, timeout) do
    with {:ok, _results, conn} <- Connection.query(conn, "COMMIT", timeout), do: {:ok, conn}
  end
end
