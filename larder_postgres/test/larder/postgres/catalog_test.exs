defmodule Larder.Postgres.CatalogTest do
  # Larder.Postgres.Catalog against a real server (tagged :postgres): a
  # slot's state (including one invalidated: wal_status "lost"), a
  # publication's tables with column lists and row filters, wal_level,
  # the current WAL end.
  use ExUnit.Case, async: true

  alias Larder.Postgres.{Catalog, Connection, Options, Replication}
  alias Larder.Test.PostgresServer

  @moduletag :postgres

  setup_all do
    # a slot that holds back more than 1 MB of WAL is invalidated at the
    # next checkpoint
    server = PostgresServer.start(config: [{"max_slot_wal_keep_size", "'1MB'"}])
    on_exit(fn -> PostgresServer.stop(server) end)
    %{server: server, opts: Options.validate!(PostgresServer.options(server), "test")}
  end

  test "wal_level", %{opts: opts} do
    {:ok, conn} = Connection.connect(opts)
    assert {:ok, "logical", _} = Catalog.wal_level(conn, 10_000)
  end

  test "a slot's state: none, reserved, active, inactive, then lost", %{
    server: server,
    opts: opts
  } do
    {:ok, conn} = Connection.connect(opts)
    assert {:ok, nil, conn} = Catalog.slot(conn, "no_such_slot", 10_000)
    # any name is safe to ask about
    assert {:ok, nil, conn} = Catalog.slot(conn, "it's \\ \"odd\"", 10_000)

    {:ok, repl} = Replication.connect(opts)
    {:ok, created, repl} = Replication.create_slot(repl, "catalog_slot", 10_000)

    assert {:ok, state, conn} = Catalog.slot(conn, "catalog_slot", 10_000)

    assert %{
             slot: "catalog_slot",
             plugin: "pgoutput",
             type: "logical",
             database: "postgres",
             active: false,
             active_pid: nil,
             wal_status: "reserved"
           } = state

    assert state.confirmed_flush_lsn == created.consistent_point
    assert state.restart_lsn <= created.consistent_point

    {:ok, repl} = Replication.start(repl, "catalog_slot", ["any"], 0)

    assert {:ok, %{active: true, active_pid: pid}, conn} =
             Catalog.slot(conn, "catalog_slot", 10_000)

    assert pid == repl.conn.backend_pid
    Replication.close(repl)

    PostgresServer.wait_until(30_000, "the slot inactive", fn ->
      {:ok, state, _} = Catalog.slot(conn, "catalog_slot", 10_000)
      state.active == false
    end)

    # more WAL than max_slot_wal_keep_size, then a checkpoint
    for _ <- 1..3 do
      PostgresServer.sql!(
        server,
        "CREATE TABLE IF NOT EXISTS filler (v text); " <>
          "INSERT INTO filler SELECT repeat('x', 100) FROM generate_series(1, 1000); " <>
          "SELECT pg_switch_wal()"
      )
    end

    PostgresServer.sql!(server, "CHECKPOINT")
    assert {:ok, lost, _conn} = Catalog.slot(conn, "catalog_slot", 10_000)
    assert lost.wal_status == "lost"
    assert lost.restart_lsn == nil
  end

  test "a publication's tables, with its column lists and row filters", %{opts: opts} do
    {:ok, conn} = Connection.connect(opts)

    {:ok, _, conn} =
      Connection.query(
        conn,
        """
        CREATE SCHEMA "odd schema";
        CREATE TABLE "odd schema"."Odd ""Table\""" (id int PRIMARY KEY, "a b" text, c int);
        CREATE TABLE plain (id int PRIMARY KEY, secret text, shown text,
                            doubled int GENERATED ALWAYS AS (id * 2) STORED);
        CREATE TABLE unpublished (id int);
        CREATE PUBLICATION cat_pub FOR TABLE "odd schema"."Odd ""Table\""" WHERE (c > 10),
                                            plain (id, shown);
        CREATE PUBLICATION cat_empty;
        """,
        10_000
      )

    assert {:ok, tables, conn} = Catalog.publication_tables(conn, "cat_pub", 10_000)

    assert tables == [
             %{
               schema: "odd schema",
               table: ~s(Odd "Table"),
               columns: ["id", "a b", "c"],
               row_filter: "(c > 10)"
             },
             %{schema: "public", table: "plain", columns: ["id", "shown"], row_filter: nil}
           ]

    assert {:ok, [], conn} = Catalog.publication_tables(conn, "cat_empty", 10_000)
    assert {:ok, nil, _} = Catalog.publication_tables(conn, "no_such_pub", 10_000)
  end

  test "a generated column is not among the tables' columns", %{opts: opts} do
    {:ok, conn} = Connection.connect(opts)

    {:ok, _, conn} =
      Connection.query(
        conn,
        """
        CREATE TABLE gen (id int PRIMARY KEY, v text, twice int GENERATED ALWAYS AS (id * 2) STORED);
        CREATE PUBLICATION gen_pub FOR TABLE gen;
        """,
        10_000
      )

    assert {:ok, [%{columns: ["id", "v"]}], _} =
             Catalog.publication_tables(conn, "gen_pub", 10_000)
  end

  test "the current WAL end is past every commit that returned", %{opts: opts} do
    {:ok, conn} = Connection.connect(opts)
    {:ok, before, conn} = Catalog.current_wal_lsn(conn, 10_000)

    # synchronous_commit is off on the test server: the commit returns
    # before its record is written
    {:ok, _, conn} =
      Connection.query(
        conn,
        "CREATE TABLE walend (id int); INSERT INTO walend VALUES (1)",
        10_000
      )

    {:ok, [%{rows: [[insert]]}], conn} =
      Connection.query(conn, "SELECT pg_current_wal_insert_lsn()", 10_000)

    {:ok, now, _} = Catalog.current_wal_lsn(conn, 10_000)
    {:ok, insert} = Larder.Postgres.Protocol.parse_lsn(insert)
    assert now > before
    assert now >= insert - 40
  end

  test "names are sent as literals and identifiers, whatever they hold" do
    assert Catalog.literal("it's") == "E'it''s'"
    assert Catalog.literal("a\\b") == "E'a\\\\b'"
    assert Catalog.identifier(~s(a"b)) == ~s("a""b")
    assert_raise ArgumentError, fn -> Catalog.literal("a\0b") end
    assert_raise ArgumentError, fn -> Catalog.identifier("a\0b") end
  end
end
