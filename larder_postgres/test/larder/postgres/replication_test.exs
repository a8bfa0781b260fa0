defmodule Larder.Postgres.ReplicationTest do
  # Larder.Postgres.Replication against a real server (tagged :postgres):
  # a slot's exported snapshot copied while writers insert, then the
  # stream from its consistent point; every kind of change decoded; big
  # transactions in batches; restarts from inside a transaction; the flush
  # position the server is told; keepalives; a killed server.
  use ExUnit.Case, async: true

  alias Larder.Postgres.{Catalog, Connection, Options, Protocol, Replication, SnapshotCopy}
  alias Larder.Test.PostgresServer

  @moduletag :postgres

  setup_all do
    server = PostgresServer.start()

    PostgresServer.sql!(server, """
    CREATE ROLE slow_reader LOGIN REPLICATION PASSWORD 'slow';
    ALTER ROLE slow_reader SET wal_sender_timeout = '5s';
    """)

    on_exit(fn -> PostgresServer.stop(server) end)
    %{server: server}
  end

  # Each test gets its own tables, publication and slot, named after it.
  setup %{server: server, test: test} do
    name =
      "t" <>
        (:crypto.hash(:md5, inspect(test)) |> Base.encode16(case: :lower) |> binary_part(0, 12))

    %{name: name, opts: Options.validate!(PostgresServer.options(server), "test")}
  end

  defp connect!(opts) do
    {:ok, conn} = Connection.connect(opts)
    conn
  end

  defp sql!(opts, sql) do
    conn = connect!(opts)
    {:ok, results, conn} = Connection.query(conn, sql, 30_000)
    Connection.close(conn)
    results
  end

  # A slot created with its snapshot, and a stream started from its
  # consistent point.
  defp stream!(opts, slot, publication, start_opts \\ []) do
    {:ok, repl} = Replication.connect(opts)
    {:ok, created, repl} = Replication.create_slot(repl, slot, 10_000)

    {:ok, repl} =
      Replication.start(repl, slot, [publication], created.consistent_point, start_opts)

    {repl, created}
  end

  # Reads until `fun.(entries_so_far, repl)` is true.
  defp read_until(repl, fun, count \\ 50, acc \\ [], deadline \\ nil) do
    deadline = deadline || System.monotonic_time(:millisecond) + 60_000

    if fun.(acc, repl) do
      {acc, repl}
    else
      if System.monotonic_time(:millisecond) > deadline,
        do: flunk("read_until timed out: #{inspect(acc, limit: 20)}")

      {:ok, entries, repl} = Replication.read(repl, count, 1_000)
      assert length(entries) <= count
      read_until(repl, fun, count, acc ++ entries, deadline)
    end
  end

  defp caught_up?(opts) do
    {:ok, lsn, conn} = Catalog.current_wal_lsn(connect!(opts), 10_000)
    Connection.close(conn)
    fn _entries, repl -> Replication.position(repl) >= {lsn, 0} end
  end

  test "the copy in the slot's snapshot and the stream from its consistent point: every row once",
       %{opts: opts, name: name} do
    sql!(opts, """
    CREATE TABLE #{name} (id bigserial PRIMARY KEY, writer int NOT NULL, n int NOT NULL);
    CREATE PUBLICATION #{name} FOR TABLE #{name};
    """)

    # writers insert, each row its own transaction, before, during and
    # after the slot's creation and the copy
    parent = self()

    writers =
      for w <- 1..3 do
        spawn_link(fn ->
          conn = connect!(opts)
          write_loop(conn, name, w, 0, parent)
        end)
      end

    wait_rows(opts, name, 50)
    {:ok, repl} = Replication.connect(opts)
    {:ok, created, repl} = Replication.create_slot(repl, name, 10_000)
    wait_rows(opts, name, 50 + count_rows(opts, name))

    copy = connect!(opts)
    {:ok, copy} = SnapshotCopy.begin(copy, created.snapshot_name, 10_000)
    {:ok, [table], copy} = Catalog.publication_tables(copy, name, 10_000)
    {:ok, copy} = SnapshotCopy.start_table(copy, table, 10_000)
    {copied, copy} = copy_all(copy, table, [])
    {:ok, _copy} = SnapshotCopy.finish(copy, 10_000)

    for pid <- writers, do: send(pid, :stop)
    for _ <- writers, do: assert_receive({:stopped, _}, 30_000)

    {:ok, repl} = Replication.start(repl, name, [name], created.consistent_point)
    {streamed, _repl} = read_until(repl, caught_up?(opts))

    all = sql!(opts, "SELECT id FROM #{name}") |> hd() |> Map.fetch!(:rows) |> Enum.map(&hd/1)
    copied_ids = Enum.map(copied, & &1["new"]["id"])

    streamed_ids =
      Enum.map(streamed, fn {_pos, e} ->
        assert e["op"] == "insert"
        e["new"]["id"]
      end)

    assert copied_ids != [] and streamed_ids != []
    assert MapSet.disjoint?(MapSet.new(copied_ids), MapSet.new(streamed_ids))
    assert Enum.sort(copied_ids ++ streamed_ids) == Enum.sort(all)
    assert length(copied_ids ++ streamed_ids) == length(all)

    # positions: one entry per transaction here, in commit order
    positions = Enum.map(streamed, &elem(&1, 0))
    assert positions == Enum.sort(positions)
    assert Enum.all?(positions, fn {_lsn, index} -> index == 0 end)
    assert positions |> Enum.map(&elem(&1, 0)) |> Enum.all?(&(&1 >= created.consistent_point))
  end

  defp write_loop(conn, name, w, i, parent) do
    receive do
      :stop ->
        Connection.close(conn)
        send(parent, {:stopped, w})
    after
      0 ->
        {:ok, _, conn} =
          Connection.query(conn, "INSERT INTO #{name} (writer, n) VALUES (#{w}, #{i})", 10_000)

        write_loop(conn, name, w, i + 1, parent)
    end
  end

  defp count_rows(opts, name) do
    [%{rows: [[n]]}] = sql!(opts, "SELECT count(*) FROM #{name}")
    String.to_integer(n)
  end

  defp wait_rows(opts, name, n) do
    PostgresServer.wait_until(60_000, "#{n} rows", fn -> count_rows(opts, name) >= n end)
  end

  defp copy_all(conn, table, acc) do
    case SnapshotCopy.read(conn, table, 17, 10_000) do
      {:ok, entries, conn} -> copy_all(conn, table, acc ++ entries)
      {:done, conn} -> {acc, conn}
    end
  end

  test "inserts, updates, deletes and truncates, with REPLICA IDENTITY DEFAULT and FULL",
       %{opts: opts, name: name} do
    sql!(opts, """
    CREATE TABLE #{name}_d (id int PRIMARY KEY, v text);
    CREATE TABLE #{name}_f (a int, b text);
    ALTER TABLE #{name}_f REPLICA IDENTITY FULL;
    CREATE PUBLICATION #{name} FOR TABLE #{name}_d, #{name}_f;
    """)

    {repl, _} = stream!(opts, name, name)
    d = "public.#{name}_d"
    f = "public.#{name}_f"

    sql!(opts, """
    BEGIN;
    INSERT INTO #{name}_d VALUES (1, 'one'), (2, NULL);
    INSERT INTO #{name}_f VALUES (1, 'x'), (2, E'tab\\there');
    COMMIT;
    BEGIN;
    UPDATE #{name}_d SET v = 'uno' WHERE id = 1;
    UPDATE #{name}_d SET id = 3 WHERE id = 2;
    UPDATE #{name}_f SET b = 'y' WHERE a = 1;
    DELETE FROM #{name}_d WHERE id = 3;
    DELETE FROM #{name}_f WHERE a = 2;
    COMMIT;
    TRUNCATE #{name}_d, #{name}_f;
    """)

    {entries, repl} = read_until(repl, fn acc, _ -> length(acc) >= 11 end)

    assert Enum.map(entries, &elem(&1, 1)) == [
             %{"op" => "insert", "table" => d, "new" => %{"id" => "1", "v" => "one"}},
             %{"op" => "insert", "table" => d, "new" => %{"id" => "2", "v" => nil}},
             %{"op" => "insert", "table" => f, "new" => %{"a" => "1", "b" => "x"}},
             %{"op" => "insert", "table" => f, "new" => %{"a" => "2", "b" => "tab\there"}},
             %{
               "op" => "update",
               "table" => d,
               "new" => %{"id" => "1", "v" => "uno"},
               "old" => %{"id" => "1"}
             },
             %{
               "op" => "update",
               "table" => d,
               "new" => %{"id" => "3", "v" => nil},
               "old" => %{"id" => "2"}
             },
             %{
               "op" => "update",
               "table" => f,
               "new" => %{"a" => "1", "b" => "y"},
               "old" => %{"a" => "1", "b" => "x"}
             },
             %{"op" => "delete", "table" => d, "old" => %{"id" => "3"}},
             %{"op" => "delete", "table" => f, "old" => %{"a" => "2", "b" => "tab\there"}},
             %{"op" => "truncate", "table" => d},
             %{"op" => "truncate", "table" => f}
           ]

    # three transactions: indexes 0.. within each, one commit LSN each
    by_tx = Enum.chunk_by(entries, fn {{lsn, _}, _} -> lsn end)
    assert Enum.map(by_tx, &length/1) == [4, 5, 2]

    for tx <- by_tx do
      assert Enum.map(tx, fn {{_, index}, _} -> index end) == Enum.to_list(0..(length(tx) - 1))
    end

    # after the last whole transaction, the position is past its commit
    [{last_lsn, _} | _] = by_tx |> List.last() |> Enum.map(&elem(&1, 0))
    assert Replication.position(repl) > {last_lsn, 2}
    refute Replication.in_transaction?(repl)
  end

  test "an update that leaves a TOASTed value alone says so: :unchanged_toast",
       %{opts: opts, name: name} do
    sql!(opts, """
    CREATE TABLE #{name} (id int PRIMARY KEY, small text, big text);
    ALTER TABLE #{name} ALTER COLUMN big SET STORAGE EXTERNAL;
    CREATE PUBLICATION #{name} FOR TABLE #{name};
    """)

    {repl, _} = stream!(opts, name, name)
    big = String.duplicate("0123456789", 1_000)

    sql!(opts, """
    INSERT INTO #{name} VALUES (1, 'a', repeat('0123456789', 1000));
    UPDATE #{name} SET small = 'b' WHERE id = 1;
    UPDATE #{name} SET big = 'short now' WHERE id = 1;
    """)

    {entries, _repl} = read_until(repl, fn acc, _ -> length(acc) >= 3 end)

    assert [
             {_, %{"op" => "insert", "new" => %{"big" => ^big}}},
             {_,
              %{
                "op" => "update",
                "new" => %{"id" => "1", "small" => "b", "big" => :unchanged_toast}
              }},
             {_, %{"op" => "update", "new" => %{"small" => "b", "big" => "short now"}}}
           ] = entries
  end

  test "a transaction above :max_transaction_entries comes in batches; a restart inside it loses and doubles nothing",
       %{opts: opts, name: name} do
    sql!(opts, """
    CREATE TABLE #{name} (id int PRIMARY KEY);
    CREATE PUBLICATION #{name} FOR TABLE #{name};
    """)

    {repl, _} = stream!(opts, name, name, max_transaction_entries: 10)
    sql!(opts, "INSERT INTO #{name} SELECT g FROM generate_series(1, 100) g")

    # read 25 entries: the transaction's first batches, handed over before its commit
    {first, repl} = read_until(repl, fn acc, _ -> length(acc) >= 25 end)
    first = Enum.take(first, 25)
    {{commit_lsn, 24}, _} = List.last(first)
    position = {commit_lsn, 25}
    assert Enum.map(first, fn {{lsn, i}, _} -> {lsn, i} end) == Enum.map(0..24, &{commit_lsn, &1})

    # what the server is told stays below the transaction's end
    assert Replication.flush_lsn(position) == commit_lsn
    {:ok, repl} = Replication.flush(repl, Replication.flush_lsn(position), 5_000)
    Replication.close(repl)

    # a new connection from the position: the rest of the transaction, once
    {:ok, repl} = Replication.connect(opts)
    wait_inactive(opts, name)
    {:ok, repl} = Replication.start(repl, name, [name], position)
    assert Replication.in_transaction?(repl)
    {rest, repl} = read_until(repl, fn acc, _ -> length(acc) >= 75 end)

    ids = Enum.map(first ++ rest, fn {_, e} -> String.to_integer(e["new"]["id"]) end)
    assert Enum.sort(ids) == Enum.to_list(1..100)
    assert Enum.map(rest, fn {{lsn, i}, _} -> {lsn, i} end) == Enum.map(25..99, &{commit_lsn, &1})
    refute Replication.in_transaction?(repl)
    assert Replication.position(repl) > {commit_lsn, 100}
  end

  defp wait_inactive(opts, slot) do
    PostgresServer.wait_until(30_000, "slot #{slot} inactive", fn ->
      {:ok, state, conn} = Catalog.slot(connect!(opts), slot, 10_000)
      Connection.close(conn)
      state.active == false
    end)
  end

  defp slot_state(opts, slot) do
    conn = connect!(opts)
    {:ok, state, conn} = Catalog.slot(conn, slot, 10_000)
    Connection.close(conn)
    state
  end

  test "the server is told the flush position the caller gives, never more",
       %{opts: opts, name: name} do
    sql!(opts, """
    CREATE TABLE #{name} (id int PRIMARY KEY);
    CREATE PUBLICATION #{name} FOR TABLE #{name};
    """)

    {repl, created} = stream!(opts, name, name, status_interval: 100)
    sql!(opts, "INSERT INTO #{name} VALUES (1)")
    sql!(opts, "INSERT INTO #{name} VALUES (2)")
    {entries, repl} = read_until(repl, caught_up?(opts))
    assert length(entries) == 2

    # status updates went (every 100 ms) and none told more than nothing
    {:ok, [], repl} = Replication.read(repl, 10, 500)
    assert slot_state(opts, name).confirmed_flush_lsn == created.consistent_point

    [{{first_lsn, 0}, _}, _] = entries
    {:ok, repl} = Replication.flush(repl, first_lsn, 5_000)

    PostgresServer.wait_until(10_000, "confirmed_flush_lsn #{first_lsn}", fn ->
      slot_state(opts, name).confirmed_flush_lsn == first_lsn
    end)

    # a lower LSN later does not take it back
    {:ok, repl} = Replication.flush(repl, created.consistent_point, 5_000)
    {:ok, [], repl} = Replication.read(repl, 10, 300)
    assert slot_state(opts, name).confirmed_flush_lsn == first_lsn

    end_position = Replication.position(repl)
    {:ok, _repl} = Replication.flush(repl, Replication.flush_lsn(end_position), 5_000)

    PostgresServer.wait_until(10_000, "confirmed_flush_lsn at the end", fn ->
      slot_state(opts, name).confirmed_flush_lsn == elem(end_position, 0)
    end)
  end

  test "a slow reader is not dropped: keepalives are answered while it reads and while it waits",
       %{server: server, name: name} do
    # wal_sender_timeout is 5 s for this role: the server drops a client
    # that says nothing for 5 s. The reader below takes 6 s over what it
    # reads, then waits 7 s in read/3: without its status updates (every
    # third of the timeout, as read/3 runs) it would be dropped; with them
    # it is silent for at most about 2 s.
    admin = Options.validate!(PostgresServer.options(server), "test")

    sql!(admin, """
    CREATE TABLE #{name} (id int PRIMARY KEY);
    CREATE PUBLICATION #{name} FOR TABLE #{name};
    GRANT SELECT ON #{name} TO slow_reader;
    """)

    opts =
      Options.validate!(
        PostgresServer.options(server, username: "slow_reader", password: "slow"),
        "test"
      )

    {repl, _} = stream!(opts, name, name)

    [%{rows: [[pid]]}] =
      sql!(admin, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = '#{name}'")

    sql!(admin, "INSERT INTO #{name} SELECT g FROM generate_series(1, 6) g")

    # one entry at a time, 1 s apart
    repl =
      Enum.reduce(1..6, repl, fn _, repl ->
        Process.sleep(1_000)
        {entries, repl} = read_until(repl, fn acc, _ -> acc != [] end, 1)
        assert length(entries) == 1
        repl
      end)

    # waiting inside read/3 with nothing to read
    {:ok, [], repl} = Replication.read(repl, 10, 7_000)
    {:ok, [], repl} = Replication.read(repl, 10, 0)

    [%{rows: [[^pid]]}] =
      sql!(admin, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = '#{name}'")

    Replication.close(repl)
  end

  test "a killed server: a clean :source_unavailable from read/3", %{name: name} do
    server = PostgresServer.start()
    on_exit(fn -> PostgresServer.stop(server) end)
    opts = Options.validate!(PostgresServer.options(server), "test")

    sql!(opts, """
    CREATE TABLE #{name} (id int PRIMARY KEY);
    CREATE PUBLICATION #{name} FOR TABLE #{name};
    """)

    {repl, _} = stream!(opts, name, name)
    {:ok, [], repl} = Replication.read(repl, 10, 100)
    PostgresServer.kill(server)

    assert {:error, %Larder.Error{reason: :source_unavailable}, repl} =
             Replication.read(repl, 10, 5_000)

    assert {:error, %Larder.Error{reason: :source_unavailable}, _repl} =
             Replication.read(repl, 10, 100)
  end

  test "errors of the server: a slot that exists, a publication that does not",
       %{opts: opts, name: name} do
    sql!(
      opts,
      "CREATE TABLE #{name} (id int PRIMARY KEY); CREATE PUBLICATION #{name} FOR TABLE #{name}"
    )

    {repl, _} = stream!(opts, name, name)

    {:ok, other} = Replication.connect(opts)

    assert {:error, %Larder.Error{reason: :source_failed, details: %{code: "42710"}}, other} =
             Replication.create_slot(other, name, 10_000)

    # the slot is active on the first connection
    assert {:error, %Larder.Error{reason: :source_failed, details: %{code: "55006"}}, _} =
             Replication.start(other, name, [name], 0)

    Replication.close(repl)
    wait_inactive(opts, name)
    {:ok, other} = Replication.connect(opts)
    {:ok, other} = Replication.start(other, name, ["no_such_publication"], 0)
    sql!(opts, "INSERT INTO #{name} VALUES (1)")

    assert {:error, %Larder.Error{reason: :source_failed} = error, _} = read_error(other)

    assert error.message =~ "no_such_publication"
  end

  defp read_error(repl) do
    case Replication.read(repl, 10, 1_000) do
      {:ok, _, repl} -> read_error(repl)
      error -> error
    end
  end

  test "a role without REPLICATION is refused a replication connection, by name",
       %{server: server, opts: opts} do
    sql!(opts, "CREATE ROLE no_replication LOGIN PASSWORD 'pw'")

    opts =
      Options.validate!(
        PostgresServer.options(server, username: "no_replication", password: "pw"),
        "test"
      )

    assert {:error, %Larder.Error{reason: :source_failed} = error} = Replication.connect(opts)
    assert error.details.code == "42501"
    assert error.message =~ ~s(user "no_replication")

    # a normal connection is allowed
    assert {:ok, conn} = Connection.connect(opts)
    Connection.close(conn)
  end

  test "IDENTIFY_SYSTEM, and bad arguments raise ArgumentError", %{opts: opts} do
    {:ok, repl} = Replication.connect(opts)
    {:ok, system, repl} = Replication.identify_system(repl, 10_000)
    assert system.dbname == "postgres"
    assert system.timeline >= 1
    assert system.xlogpos > 0
    assert Protocol.parse_lsn(Protocol.format_lsn(system.xlogpos)) == {:ok, system.xlogpos}

    assert_raise ArgumentError, ~r/slot name/, fn ->
      Replication.create_slot(repl, "Bad-Name", 1_000)
    end

    assert_raise ArgumentError, ~r/publications/, fn -> Replication.start(repl, "s", [], 0) end
    assert_raise ArgumentError, ~r/from/, fn -> Replication.start(repl, "s", ["p"], -1) end

    assert_raise ArgumentError, ~r/status_interval/, fn ->
      Replication.start(repl, "s", ["p"], 0, status_interval: 0)
    end

    assert_raise ArgumentError, ~r/started/, fn -> Replication.read(repl, 1, 0) end
  end
end

defmodule Larder.Postgres.ReplicationHostileTest do
  # Larder.Postgres.Replication against a fake walsender: status updates
  # tell the caller's flush position and no more; garbage in the stream is
  # an error, never a raise; a transaction that never ends is handed over
  # in batches with bounded memory. No real server needed.
  use ExUnit.Case, async: true

  alias Larder.Postgres.{Options, Replication}
  alias Larder.Test.FakePostgres

  import FakePostgres, only: [msg: 2]

  # A fake walsender: the startup, SHOW wal_sender_timeout,
  # START_REPLICATION, then `stream.(socket)`.
  defp walsender(stream, start_opts \\ []) do
    fake =
      FakePostgres.start(fn socket ->
        FakePostgres.recv_startup(socket)
        :gen_tcp.send(socket, FakePostgres.ready())
        {?Q, "SHOW wal_sender_timeout\0"} = FakePostgres.recv_message(socket)
        :gen_tcp.send(socket, FakePostgres.result("wal_sender_timeout", ["60s"]))
        {?Q, "START_REPLICATION" <> _} = FakePostgres.recv_message(socket)
        :gen_tcp.send(socket, msg(?W, <<0, 0::16>>))
        stream.(socket)
      end)

    on_exit(fn -> FakePostgres.stop(fake) end)
    opts = Options.validate!([port: fake.port, username: "u", password: "p"], "test")
    {:ok, repl} = Replication.connect(opts)
    {:ok, repl} = Replication.start(repl, "slot", ["pub"], 0, start_opts)
    repl
  end

  defp xlog(payload, lsn \\ 1), do: msg(?d, <<?w, lsn::64, lsn::64, 0::64, payload::binary>>)

  defp keepalive(wal_end, reply?),
    do: msg(?d, <<?k, wal_end::64, 0::64, if(reply?, do: 1, else: 0)>>)

  defp begin(lsn), do: <<?B, lsn::64, 0::64, 1::32>>
  defp relation, do: <<?R, 1::32, "s", 0, "t", 0, ?d, 1::16, 1, "id", 0, 23::32, -1::32>>
  defp insert(id), do: <<?I, 1::32, ?N, 1::16, ?t, byte_size(id)::32, id::binary>>

  # Forwards the client's Standby Status Updates to `parent`.
  defp forward_status(socket, parent) do
    case FakePostgres.recv_message(socket) do
      {?d, <<?r, write::64, flush::64, apply::64, _time::64, _reply>>} ->
        send(parent, {:status, write, flush, apply})
        forward_status(socket, parent)

      {?d, other} ->
        send(parent, {:unexpected, other})

      _ ->
        :ok
    end
  end

  test "a keepalive asking for a reply gets one, with the caller's flush LSN and no more" do
    parent = self()

    repl =
      walsender(fn socket ->
        send(parent, {:fake, self()})
        spawn_link(fn -> forward_status(socket, parent) end)
        :gen_tcp.send(socket, keepalive(1_000, true))

        receive do
          :second -> :gen_tcp.send(socket, keepalive(5_000, true))
        end

        Process.sleep(:infinity)
      end)

    assert_receive {:fake, fake}
    repl = read_until_status(repl, {:status, 1_000, 0, 0})

    # the caller says 700 is durable: an update says so at once
    {:ok, repl} = Replication.flush(repl, 700, 1_000)
    assert_receive {:status, 1_000, 700, 700}

    send(fake, :second)
    repl = read_until_status(repl, {:status, 5_000, 700, 700})

    # a lower LSN later does not take it back
    {:ok, _repl} = Replication.flush(repl, 100, 1_000)
    assert_receive {:status, 5_000, 700, 700}
    refute_received {:unexpected, _}
  end

  # Reads (answering what arrives) until `status` reached the fake.
  defp read_until_status(repl, status, tries \\ 300) do
    {:ok, [], repl} = Replication.read(repl, 10, 100)

    receive do
      ^status -> repl
    after
      0 ->
        if tries == 0, do: flunk("no #{inspect(status)}")
        read_until_status(repl, status, tries - 1)
    end
  end

  # Timeouts far past the test's own: only a read that returns once the
  # position moved, rather than at its timeout, passes.
  @tag timeout: 30_000
  test "a keepalive, or a transaction with nothing published, ends a read at once" do
    parent = self()

    repl =
      walsender(fn socket ->
        send(parent, {:fake, self()})
        :gen_tcp.send(socket, keepalive(9_000, false))

        receive do
          :next ->
            :gen_tcp.send(
              socket,
              xlog(begin(9_500), 9_500) <> xlog(<<?C, 0, 9_500::64, 9_600::64, 0::64>>, 9_500)
            )
        end

        Process.sleep(:infinity)
      end)

    assert_receive {:fake, fake}
    assert {:ok, [], repl} = Replication.read(repl, 10, 600_000)
    assert Replication.position(repl) == {9_000, 0}

    send(fake, :next)
    assert {:ok, [], repl} = Replication.read(repl, 10, 600_000)
    assert Replication.position(repl) == {9_600, 0}
  end

  test "status updates go every :status_interval while read/3 waits" do
    parent = self()
    repl = walsender(fn socket -> forward_status(socket, parent) end, status_interval: 100)

    # a read that lasts longer than the interval sends at least one
    Enum.reduce(1..3, repl, fn _, repl ->
      {:ok, [], repl} = Replication.read(repl, 10, 300)
      assert_receive {:status, 0, 0, 0}
      repl
    end)
  end

  test "garbage in the stream is :source_bad_reply, never a raise" do
    for stream <- [
          xlog(<<?Z, 1, 2, 3>>),
          xlog(""),
          xlog(<<?I, 1::32, ?N, 0::16>>),
          xlog(relation()) <> xlog(begin(10)) <> xlog(<<?I, 1::32, ?N, 2::16, ?n, ?n>>),
          xlog(begin(10)) <> xlog(<<?C, 0, 11::64, 12::64, 0::64>>),
          msg(?d, <<?x, 1, 2>>),
          msg(?d, <<?k, 1::64>>),
          msg(?Z, "I"),
          msg(?d, "") <> keepalive(1, false),
          :crypto.strong_rand_bytes(64) |> then(&msg(?d, <<?w, &1::binary>>))
        ] do
      repl =
        walsender(fn socket ->
          :gen_tcp.send(socket, stream)
          Process.sleep(:infinity)
        end)

      assert {:error, %Larder.Error{reason: :source_bad_reply}, repl} =
               Replication.read(repl, 10, 2_000)

      assert {:error, %Larder.Error{reason: :source_unavailable}, _} =
               Replication.read(repl, 10, 100)
    end
  end

  test "random XLogData payloads: an entry list or an error, never a raise" do
    for _ <- 1..100 do
      payloads =
        for _ <- 1..5 do
          type = Enum.random(~c"BCRIUDTMOY")
          <<type, :crypto.strong_rand_bytes(:rand.uniform(40))::binary>>
        end

      repl =
        walsender(fn socket ->
          :gen_tcp.send(socket, Enum.map(payloads, &xlog/1))
          Process.sleep(:infinity)
        end)

      assert {kind, _, _} = Replication.read(repl, 10, 200)
      assert kind in [:ok, :error]
      Replication.close(repl)
    end
  end

  test "the server's error or end of stream" do
    error = msg(?E, "SFATAL\0C57P01\0Mterminating connection due to administrator command\0\0")

    repl =
      walsender(fn socket ->
        :gen_tcp.send(socket, error)
        Process.sleep(:infinity)
      end)

    assert {:error, %Larder.Error{reason: :source_failed, details: %{code: "57P01"}}, _} =
             Replication.read(repl, 10, 2_000)

    repl =
      walsender(fn socket ->
        :gen_tcp.send(socket, msg(?c, ""))
        Process.sleep(:infinity)
      end)

    assert {:error, %Larder.Error{reason: :source_unavailable, details: %{cause: :copy_done}}, _} =
             Replication.read(repl, 10, 2_000)
  end

  test "a transaction that never ends: batches of :max_transaction_entries, bounded memory" do
    inserts = Enum.map_join(1..1_000, fn i -> xlog(insert(Integer.to_string(i)), 100) end)

    repl =
      walsender(
        fn socket ->
          :gen_tcp.send(socket, xlog(relation()) <> xlog(begin(100)))
          FakePostgres.send_forever(socket, inserts)
        end,
        max_transaction_entries: 100
      )

    parent = self()

    pid =
      spawn(fn ->
        {last, max_queue} =
          Enum.reduce(1..200, {nil, 0}, fn _, {_last, max_queue} ->
            {:ok, entries, repl} = Process.get(:repl, repl) |> Replication.read(10, 5_000)
            Process.put(:repl, repl)
            assert length(entries) in 1..10
            true = Replication.in_transaction?(repl)
            {List.last(entries), max(max_queue, repl.queued)}
          end)

        send(parent, {:done, last, max_queue})
      end)

    peak = sample(pid, 0)
    assert_receive {:done, {{100, 1_999}, _}, max_queue}
    # what is held: one batch of the transaction at most, and its queue
    assert max_queue <= 100
    assert peak < 4_000_000
  end

  defp sample(pid, peak) do
    if Process.alive?(pid) do
      held =
        case {Process.info(pid, :binary), Process.info(pid, :memory)} do
          {{:binary, bins}, {:memory, heap}} -> heap + Enum.sum(Enum.map(bins, &elem(&1, 1)))
          _ -> 0
        end

      Process.sleep(2)
      sample(pid, max(peak, held))
    else
      peak
    end
  end
end
