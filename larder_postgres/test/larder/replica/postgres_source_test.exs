defmodule Larder.Replica.PostgresSourceTest do
  # Larder.Replica.Postgres's callbacks on their own, against a real
  # server (tagged :postgres): options, positions, the conformance suite
  # (test/support/source_conformance.ex), the log's end, and what each
  # reader's call does with a slot that is missing, invalidated, ahead of
  # the position or in use, a server whose WAL ends before the position,
  # and a bad configuration. The replica over this source is tested in
  # test/larder/replica/postgres_test.exs.
  use ExUnit.Case, async: true

  import Bitwise

  alias Larder.Replica.Postgres
  alias Larder.Test.{PostgresServer, PostgresSetup}

  @moduletag :postgres

  setup_all do
    %{server: PostgresSetup.start()}
  end

  # Every test gets a table, a publication and a slot name of its own:
  # the conformance suite's log, whose entries are the rows inserted, in
  # order (one part: a single stream of transactions).
  setup %{server: server} = ctx do
    name = PostgresSetup.name(ctx)

    PostgresServer.sql!(server, """
    CREATE TABLE #{name} (seq bigserial PRIMARY KEY, v text NOT NULL);
    CREATE PUBLICATION #{name} FOR TABLE #{name};
    """)

    %{
      name: name,
      source_opts: PostgresSetup.source_opts(server, name),
      bad_opts: [
        PostgresSetup.source_opts(server, name, slot: "Upper"),
        PostgresSetup.source_opts(server, name, publication: ""),
        PostgresServer.options(server, publication: name),
        PostgresSetup.source_opts(server, name, max_transaction_entries: 0),
        PostgresSetup.source_opts(server, name, timeout: 600_001)
      ],
      append: fn values ->
        rows = Enum.map_join(values, ", ", &"('#{&1}')")
        PostgresServer.sql!(server, "INSERT INTO #{name} (v) VALUES #{rows}")
        :ok
      end,
      value: fn fields -> fields["new"]["v"] end,
      part: fn _id -> :all end,
      trim: fn ->
        PostgresSetup.await_slot_free(server, name)

        PostgresServer.sql!(server, """
        SELECT pg_drop_replication_slot('#{name}');
        DELETE FROM #{name} WHERE seq < (SELECT max(seq) FROM #{name});
        """)

        :ok
      end
    }
  end

  use Larder.Test.SourceConformance, source: Larder.Replica.Postgres, idle_moves: true

  # Reads from `position` until `fun.(entries, position)` (all entries so
  # far) is true: {entries, position, conn}.
  defp read_until(conn, position, fun, acc \\ [], tries \\ 300) do
    if fun.(acc, position) do
      {acc, position, conn}
    else
      assert tries > 0, "read_until: #{inspect(acc, limit: 5)} at #{inspect(position)}"
      assert {:ok, entries, position, conn} = Postgres.read(conn, position, 50, 100)
      read_until(conn, position, fun, acc ++ entries, tries - 1)
    end
  end

  defp latest!(opts) do
    {:ok, latest} = Postgres.latest(opts, 10_000)
    latest
  end

  # Runs `fun` in a process of its own, as the replica's reader does.
  defp in_reader(fun), do: fun |> Task.async() |> Task.await(120_000)

  defp slot(server, name) do
    PostgresServer.sql!(
      server,
      "SELECT active, confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '#{name}'"
    )
  end

  describe "validate!/1" do
    test "takes a :url or the keys, and fills the defaults", %{server: server} do
      opts =
        Postgres.validate!(
          url: "postgres://larder:secret@127.0.0.1:#{server.port}/shop",
          publication: "larder_pub",
          slot: "larder_slot"
        )

      assert opts[:host] == "127.0.0.1" and opts[:port] == server.port
      assert opts[:username] == "larder" and opts[:password] == "secret"
      assert opts[:database] == "shop"
      assert opts[:max_transaction_entries] == 10_000
      assert Postgres.validate!(opts) == opts

      assert Postgres.identity(opts) ==
               ~s(database "shop", publication "larder_pub", slot "larder_slot")
    end

    test "an ArgumentError names the bad option" do
      good = [username: "u", publication: "p", slot: "s"]

      for {key, value} <- [
            slot: "Has-Upper",
            slot: String.duplicate("s", 64),
            slot: 1,
            publication: "",
            publication: "nul\0",
            max_transaction_entries: 0,
            max_transaction_entries: 10_000_001,
            max_transaction_bytes: 17_179_869_185,
            port: 0,
            timeout: 600_001
          ] do
        error =
          assert_raise ArgumentError, fn -> Postgres.validate!(Keyword.put(good, key, value)) end

        assert Exception.message(error) =~ inspect(key)
      end

      for missing <- [:publication, :slot, :username] do
        error =
          assert_raise ArgumentError, fn -> Postgres.validate!(Keyword.delete(good, missing)) end

        assert Exception.message(error) =~ inspect(missing)
      end
    end
  end

  describe "positions" do
    test "{lsn, index}: the copy's rows are {0, n}, and only {0, 0} of them is resumable" do
      assert Postgres.origin([]) == {0, 0}
      assert Postgres.advance({0, 0}, {0, 0}) == {0, 1}
      assert Postgres.advance({5, 0}, {9, 3}) == {9, 4}
      assert Postgres.resumable?({0, 0})
      refute Postgres.resumable?({0, 1})
      assert Postgres.resumable?({1, 0}) and Postgres.resumable?({1, 7})
      assert Postgres.reached?({2, 0}, {1, 9}) and not Postgres.reached?({1, 9}, {2, 0})

      for bad <- [{-1, 0}, {0, -1}, {1 <<< 64, 0}, {1, 1.0}, {1}, "0/16B3748", nil] do
        assert Postgres.cast_position(bad) == :error
      end
    end
  end

  describe "the log's end" do
    test "the origin while no slot exists and the tables are empty; the WAL's end otherwise",
         %{server: server, name: name, source_opts: opts} do
      opts = Postgres.validate!(opts)
      assert latest!(opts) == {0, 0}
      ctx_append(server, name, ["a"])
      assert {lsn, 0} = latest!(opts)
      assert lsn > 0

      PostgresServer.sql!(server, "DELETE FROM #{name}")
      assert latest!(opts) == {0, 0}

      # a slot (this replica's reading began): the WAL's end, even with no row
      in_reader(fn ->
        {:ok, conn} = Postgres.connect(opts)
        {_, _, conn} = read_until(conn, {0, 0}, fn _, position -> position > {0, 0} end)
        Postgres.close(conn)
      end)

      assert {lsn, 0} = latest!(opts)
      assert lsn > 0
    end

    test "a missing publication or a server down is an error naming it",
         %{server: server, name: name} do
      opts = Postgres.validate!(PostgresSetup.source_opts(server, name, publication: "nope"))

      assert {:error, %Larder.Error{reason: :source_failed} = error} =
               Postgres.latest(opts, 5_000)

      assert error.message =~ "nope" and error.message =~ "127.0.0.1:#{server.port}"

      port = Larder.Test.FreePort.get()
      opts = Postgres.validate!(PostgresSetup.source_opts(server, name, port: port))

      assert {:error, %Larder.Error{reason: :source_unavailable} = error} =
               Postgres.latest(opts, 5_000)

      assert error.message =~ "127.0.0.1:#{port}"
      assert error.message =~ ":host and :port"
    end
  end

  defp ctx_append(server, name, values) do
    rows = Enum.map_join(values, ", ", &"('#{&1}')")
    PostgresServer.sql!(server, "INSERT INTO #{name} (v) VALUES #{rows}")
  end

  describe "committed/2" do
    test "the slot's confirmed position moves only to what is committed, never back",
         %{server: server, name: name, source_opts: opts} do
      opts = Postgres.validate!(opts)
      ctx_append(server, name, ["a", "b"])

      in_reader(fn ->
        {:ok, conn} = Postgres.connect(opts)
        {:ok, conn} = Postgres.committed(conn, {0, 0})
        latest = latest!(opts)
        {_, at_end, conn} = read_until(conn, {0, 0}, fn _, p -> Postgres.reached?(p, latest) end)
        ["t|" <> created] = String.split(slot(server, name), "\n")
        ctx_append(server, name, ["c"])
        latest = latest!(opts)
        {[_], later, conn} = read_until(conn, at_end, fn _, p -> Postgres.reached?(p, latest) end)

        # read, not committed: the slot stays at its consistent point
        Process.sleep(200)
        assert slot(server, name) == "t|" <> created

        {:ok, conn} = Postgres.committed(conn, later)
        {lsn, _} = later
        want = "t|" <> Larder.Postgres.Protocol.format_lsn(lsn)
        PostgresServer.wait_until(10_000, "the flush", fn -> slot(server, name) == want end)

        # an earlier position (a snapshot restored) is not sent: the slot
        # does not go back
        {:ok, conn} = Postgres.committed(conn, at_end)
        {:ok, [], _, conn} = Postgres.read(conn, later, 10, 300)
        assert slot(server, name) == want
        Postgres.close(conn)
      end)
    end
  end

  describe "read/4 from a position" do
    setup %{server: server, name: name, source_opts: opts} do
      opts = Postgres.validate!(opts)
      ctx_append(server, name, ["a", "b"])

      # read past the copy, then two more rows streamed
      {position, middle} =
        in_reader(fn ->
          {:ok, conn} = Postgres.connect(opts)

          {_, position, conn} =
            read_until(conn, {0, 0}, fn acc, p -> acc != [] and Postgres.resumable?(p) end)

          ctx_append(server, name, ["c", "d"])
          latest = latest!(opts)

          {[{middle, _} | _], _, conn} =
            read_until(conn, position, fn _, p -> Postgres.reached?(p, latest) end)

          {:ok, conn} = Postgres.committed(conn, position)
          Postgres.close(conn)
          {position, middle}
        end)

      PostgresSetup.await_slot_free(server, name)
      %{opts: opts, position: position, middle: middle}
    end

    test "a stream position, on a new connection: what follows it, once", ctx do
      in_reader(fn ->
        {:ok, conn} = Postgres.connect(ctx.opts)
        {:ok, conn} = Postgres.committed(conn, ctx.position)
        latest = latest!(ctx.opts)

        {entries, _, conn} =
          read_until(conn, ctx.position, fn _, p -> Postgres.reached?(p, latest) end)

        assert Enum.map(entries, &elem(&1, 1)["new"]["v"]) == ["c", "d"]

        # from the middle of that transaction: its second row only
        Postgres.close(conn)
        {:ok, conn} = Postgres.connect(ctx.opts)

        {entries, _, conn} =
          read_until(conn, Postgres.advance(ctx.middle, ctx.middle), fn _, p ->
            Postgres.reached?(p, latest)
          end)

        assert Enum.map(entries, &elem(&1, 1)["new"]["v"]) == ["d"]
        Postgres.close(conn)
      end)
    end

    test "a slot that is missing, ahead of the position, or invalidated: a trim to the origin",
         ctx do
      {lsn, _} = ctx.position

      in_reader(fn ->
        # ahead: the slot confirmed past the position (a snapshot older than it)
        {:ok, conn} = Postgres.connect(ctx.opts)
        {:ok, conn} = Postgres.committed(conn, ctx.position)
        latest = latest!(ctx.opts)

        {_, at_end, conn} =
          read_until(conn, ctx.position, fn _, p -> Postgres.reached?(p, latest) end)

        {:ok, conn} = Postgres.committed(conn, at_end)
        {at_end_lsn, _} = at_end
        want = "t|" <> Larder.Postgres.Protocol.format_lsn(at_end_lsn)

        PostgresServer.wait_until(10_000, "the flush", fn ->
          slot(ctx.server, ctx.name) == want
        end)

        Postgres.close(conn)
        PostgresSetup.await_slot_free(ctx.server, ctx.name)

        {:ok, conn} = Postgres.connect(ctx.opts)
        assert {:trimmed, {0, 0}, conn} = Postgres.read(conn, {lsn, 0}, 10, 100)
        # the WAL's end before the position (a server restored from a backup)
        assert {:trimmed, {0, 0}, conn} =
                 Postgres.read(conn, {at_end_lsn + (1 <<< 40), 0}, 10, 100)

        Postgres.close(conn)

        # missing
        PostgresSetup.await_slot_free(ctx.server, ctx.name)
        PostgresServer.sql!(ctx.server, "SELECT pg_drop_replication_slot('#{ctx.name}')")
        {:ok, conn} = Postgres.connect(ctx.opts)
        assert {:trimmed, {0, 0}, conn} = Postgres.read(conn, at_end, 10, 100)

        # and reading from the origin copies the table again
        {entries, _, conn} =
          read_until(conn, {0, 0}, fn acc, p -> acc != [] and Postgres.resumable?(p) end)

        assert Enum.map(entries, &elem(&1, 1)["new"]["v"]) == ["a", "b", "c", "d"]
        Postgres.close(conn)
      end)
    end

    test "a slot in use by another connection: an error naming :slot, after a wait", ctx do
      in_reader(fn ->
        {:ok, first} = Postgres.connect(ctx.opts)
        {:ok, _, _, first} = Postgres.read(first, ctx.position, 10, 100)

        {:ok, second} = Postgres.connect(ctx.opts)
        started = System.monotonic_time(:millisecond)
        assert {:error, error, second} = Postgres.read(second, ctx.position, 10, 100)
        assert System.monotonic_time(:millisecond) - started >= 4_000
        assert error.reason == :source_unavailable
        assert error.details.option == :slot
        assert error.message =~ "in use" and error.message =~ "127.0.0.1:#{ctx.server.port}"

        # reading from the origin would drop it: refused the same way
        assert {:error, %{details: %{option: :slot}}, second} =
                 Postgres.read(second, {0, 0}, 10, 100)

        Postgres.close(second)
        Postgres.close(first)
      end)
    end
  end

  describe "a bad configuration: one error each, naming the server, the option and what to do" do
    setup %{server: server} do
      PostgresServer.sql!(server, """
      DO $$ BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'no_repl') THEN
          CREATE ROLE no_repl LOGIN PASSWORD 'no-repl';
        END IF;
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'no_select') THEN
          CREATE ROLE no_select LOGIN REPLICATION PASSWORD 'no-select';
        END IF;
      END $$;
      """)

      :ok
    end

    defp connect_error(opts) do
      assert {:error, %Larder.Error{} = error} = Postgres.connect(Postgres.validate!(opts))
      error
    end

    test "bad credentials", %{server: server, name: name} do
      error = connect_error(PostgresSetup.source_opts(server, name, password: "wrong"))
      assert error.reason == :source_failed
      assert error.details.option == :password
      assert error.message =~ "127.0.0.1:#{server.port}"
      assert error.message =~ ":username and :password"
      refute error.message =~ "wrong"
    end

    test "a database that does not exist", %{server: server, name: name} do
      error = connect_error(PostgresSetup.source_opts(server, name, database: "nowhere"))
      assert error.details.option == :database
      assert error.message =~ "nowhere" and error.message =~ ":database"
    end

    test "a missing publication", %{server: server, name: name} do
      error = connect_error(PostgresSetup.source_opts(server, name, publication: "missing_pub"))
      assert error.reason == :source_failed
      assert error.details.option == :publication
      assert error.message =~ "127.0.0.1:#{server.port}"
      assert error.message =~ "CREATE PUBLICATION" and error.message =~ "missing_pub"
    end

    test "a role without REPLICATION", %{server: server, name: name} do
      opts = PostgresSetup.source_opts(server, name, username: "no_repl", password: "no-repl")
      error = connect_error(opts)
      assert error.reason == :source_failed
      assert error.details.option == :username
      assert error.message =~ "REPLICATION" and error.message =~ "ALTER ROLE"
    end

    test "a role that cannot read a published table: the copy's error says so",
         %{server: server, name: name} do
      opts =
        Postgres.validate!(
          PostgresSetup.source_opts(server, name, username: "no_select", password: "no-select")
        )

      in_reader(fn ->
        {:ok, conn} = Postgres.connect(opts)
        assert {:error, error, conn} = Postgres.read(conn, {0, 0}, 10, 100)
        assert error.reason == :source_failed
        assert error.message =~ "GRANT SELECT" and error.message =~ name
        Postgres.close(conn)
      end)
    end

    test "nothing listening", %{server: server, name: name} do
      port = Larder.Test.FreePort.get()
      error = connect_error(PostgresSetup.source_opts(server, name, port: port))
      assert error.reason == :source_unavailable
      assert error.message =~ "127.0.0.1:#{port}" and error.message =~ ":host and :port"
    end

    test "a slot of another kind", %{server: server, name: name} do
      PostgresServer.sql!(server, "SELECT pg_create_physical_replication_slot('#{name}')")
      opts = Postgres.validate!(PostgresSetup.source_opts(server, name))

      in_reader(fn ->
        {:ok, conn} = Postgres.connect(opts)
        assert {:error, error, conn} = Postgres.read(conn, {0, 0}, 10, 100)
        assert error.details.option == :slot
        assert error.message =~ "physical" and error.message =~ "another :slot"
        Postgres.close(conn)
      end)
    end
  end

  describe "wal_level" do
    test "not logical: an error saying what to set" do
      server = PostgresSetup.start(config: [{"wal_level", "replica"}])

      PostgresServer.sql!(
        server,
        "CREATE TABLE t (k int PRIMARY KEY); CREATE PUBLICATION p FOR TABLE t"
      )

      opts = Postgres.validate!(PostgresSetup.source_opts(server, "p", slot: "s"))
      assert {:error, error} = Postgres.connect(opts)
      assert error.reason == :source_failed
      assert error.message =~ "127.0.0.1:#{server.port}"

      assert error.message =~ ~s(wal_level is "replica") and
               error.message =~ "wal_level = logical"
    end
  end
end
