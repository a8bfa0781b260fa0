defmodule Larder.Postgres.SnapshotCopyTest do
  # Larder.Postgres.SnapshotCopy against a real server (tagged :postgres):
  # the copy reads a table as the publication sends it (its column list,
  # its row filter), inside the exported snapshot, in bounded batches; a
  # snapshot that is gone is a clean error.
  use ExUnit.Case, async: true

  alias Larder.Postgres.{Catalog, Connection, Options, Replication, SnapshotCopy}
  alias Larder.Test.PostgresServer

  @moduletag :postgres

  setup_all do
    server = PostgresServer.start()
    on_exit(fn -> PostgresServer.stop(server) end)
    %{opts: Options.validate!(PostgresServer.options(server), "test")}
  end

  defp connect!(opts) do
    {:ok, conn} = Connection.connect(opts)
    conn
  end

  defp query!(conn, sql) do
    {:ok, results, conn} = Connection.query(conn, sql, 10_000)
    {results, conn}
  end

  defp copy_all(conn, table, count, acc \\ []) do
    case SnapshotCopy.read(conn, table, count, 10_000) do
      {:ok, entries, conn} ->
        assert length(entries) in 1..count
        copy_all(conn, table, count, acc ++ entries)

      {:done, conn} ->
        {acc, conn}
    end
  end

  test "the copy and the stream describe the same columns and rows", %{opts: opts} do
    {_, conn} =
      query!(connect!(opts), """
      CREATE TABLE "Cols" (id int PRIMARY KEY, shown text, secret text, n int);
      INSERT INTO "Cols" SELECT g, E'shown\\t' || g, 'secret', g FROM generate_series(1, 40) g;
      CREATE PUBLICATION cols FOR TABLE "Cols" (id, shown, n) WHERE (n % 2 = 0);
      """)

    {:ok, repl} = Replication.connect(opts)
    {:ok, created, repl} = Replication.create_slot(repl, "cols", 10_000)

    {:ok, [table], conn} = Catalog.publication_tables(conn, "cols", 10_000)
    {:ok, conn} = SnapshotCopy.begin(conn, created.snapshot_name, 10_000)
    {:ok, conn} = SnapshotCopy.start_table(conn, table, 10_000)
    {copied, conn} = copy_all(conn, table, 7)
    {:ok, conn} = SnapshotCopy.finish(conn, 10_000)

    assert length(copied) == 20

    assert hd(copied) == %{
             "op" => "insert",
             "table" => "public.Cols",
             "new" => %{"id" => "2", "shown" => "shown\t2", "n" => "2"}
           }

    {_, _conn} =
      query!(
        conn,
        ~s[INSERT INTO "Cols" VALUES (100, 'late', 'secret', 100), (101, 'odd', 'secret', 101)]
      )

    {:ok, repl} = Replication.start(repl, "cols", ["cols"], created.consistent_point)
    {streamed, _} = read(repl, 1)

    assert [{_, %{"op" => "insert", "new" => new}}] = streamed
    assert new == %{"id" => "100", "shown" => "late", "n" => "100"}
    assert Map.keys(new) == Map.keys(hd(copied)["new"])
  end

  defp read(repl, n, acc \\ []) do
    if length(acc) >= n do
      {acc, repl}
    else
      {:ok, entries, repl} = Replication.read(repl, 10, 1_000)
      read(repl, n, acc ++ entries)
    end
  end

  test "a TRUNCATE after the snapshot: the copy then the stream still end equal to the table",
       %{opts: opts} do
    {_, conn} =
      query!(connect!(opts), """
      CREATE TABLE trunc (id int PRIMARY KEY, v text);
      INSERT INTO trunc VALUES (1, 'a'), (2, 'b');
      CREATE PUBLICATION trunc FOR TABLE trunc;
      """)

    {:ok, repl} = Replication.connect(opts)
    {:ok, created, repl} = Replication.create_slot(repl, "trunc", 10_000)
    {_, conn} = query!(conn, "TRUNCATE trunc; INSERT INTO trunc VALUES (3, 'c')")

    copy = connect!(opts)
    {:ok, [table], copy} = Catalog.publication_tables(copy, "trunc", 10_000)
    {:ok, copy} = SnapshotCopy.begin(copy, created.snapshot_name, 10_000)
    {:ok, copy} = SnapshotCopy.start_table(copy, table, 10_000)
    {copied, copy} = copy_all(copy, table, 10)
    {:ok, _} = SnapshotCopy.finish(copy, 10_000)

    {:ok, repl} = Replication.start(repl, "trunc", ["trunc"], created.consistent_point)
    {streamed, _} = read(repl, 2)

    replica =
      Enum.reduce(copied ++ Enum.map(streamed, &elem(&1, 1)), %{}, fn
        %{"op" => "insert", "new" => new}, acc -> Map.put(acc, new["id"], new)
        %{"op" => "truncate"}, _acc -> %{}
      end)

    {[%{rows: rows}], _} = query!(conn, "SELECT id::text, v FROM trunc")
    assert Enum.sort(Enum.map(replica, fn {_, r} -> [r["id"], r["v"]] end)) == Enum.sort(rows)
  end

  test "a snapshot that is gone: a clean error, the connection usable", %{opts: opts} do
    {:ok, repl} = Replication.connect(opts)
    {:ok, created, repl} = Replication.create_slot(repl, "gone", 10_000)
    # any other command on the replication connection ends the export
    {:ok, _, repl} = Replication.query(repl, "IDENTIFY_SYSTEM", 10_000)

    conn = connect!(opts)

    assert {:error, %Larder.Error{reason: :source_failed, details: %{code: "22023"}}, conn} =
             SnapshotCopy.begin(conn, created.snapshot_name, 10_000)

    assert {[%{rows: [["1"]]}], _} = query!(conn, "SELECT 1")

    # a name that is not a snapshot's at all
    assert {:error, %Larder.Error{reason: :source_failed}, _} =
             SnapshotCopy.begin(conn, "it's not\\ one", 10_000)

    Replication.close(repl)
  end

  test "the COPY statement quotes names and keeps the filter" do
    assert SnapshotCopy.copy_sql(%{
             schema: "s",
             table: ~s(t"x),
             columns: ["a", "b c"],
             row_filter: "(a > 1)"
           }) == ~s[COPY (SELECT "a", "b c" FROM "s"."t""x" WHERE (a > 1)) TO STDOUT]
  end
end

defmodule Larder.Postgres.SnapshotCopyHostileTest do
  # Larder.Postgres.SnapshotCopy against a fake server: what it announces
  # is checked against what was asked. No real server needed.
  use ExUnit.Case, async: true

  alias Larder.Postgres.{Connection, Options, SnapshotCopy}
  alias Larder.Test.FakePostgres

  import FakePostgres, only: [msg: 2]

  test "a COPY of another column count than the table's is a bad reply, not a short row" do
    # two columns announced and sent, for a table of three
    fake =
      FakePostgres.start(
        FakePostgres.answering(
          msg(?H, <<0, 2::16, 0::16, 0::16>>) <>
            msg(?d, "1\tx\n") <> msg(?c, "") <> msg(?C, "COPY 1\0") <> msg(?Z, "I")
        )
      )

    on_exit(fn -> FakePostgres.stop(fake) end)
    table = %{schema: "public", table: "t", columns: ["id", "a", "b"]}
    opts = Options.validate!([port: fake.port, username: "u", timeout: 5_000], "test")
    {:ok, conn} = Connection.connect(opts)
    {:ok, conn} = SnapshotCopy.start_table(conn, table, 5_000)

    assert {:error, %Larder.Error{reason: :source_bad_reply, details: %{cause: cause}}, conn} =
             SnapshotCopy.read(conn, table, 10, 5_000)

    assert cause == {:copy_columns, 3}
    assert conn.state == :closed
  end
end
