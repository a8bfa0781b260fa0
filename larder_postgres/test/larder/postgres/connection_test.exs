defmodule Larder.Postgres.ConnectionTest do
  # Larder.Postgres.Connection against a real server (tagged :postgres):
  # authentication by SCRAM-SHA-256, MD5 and cleartext, TLS, simple
  # queries and COPY; a server killed or paused mid-session; and against
  # fake servers that send garbage, huge lengths, truncated messages and
  # endless streams.
  use ExUnit.Case, async: true

  alias Larder.Postgres.{Connection, Options}
  alias Larder.Test.{FakePostgres, PostgresServer}

  import FakePostgres, only: [msg: 2]

  defp options(server, extra \\ []),
    do: Options.validate!(PostgresServer.options(server, extra), "test")

  defp connect!(server, extra \\ []) do
    {:ok, conn} = Connection.connect(options(server, extra))
    conn
  end

  defp rows!(conn, sql) do
    {:ok, [%{rows: rows}], _conn} = Connection.query(conn, sql, 10_000)
    rows
  end

  @moduletag :postgres

  setup_all do
    server = PostgresServer.start(ssl: true)

    PostgresServer.sql!(server, """
    SET password_encryption = 'md5';
    CREATE ROLE md5_user LOGIN PASSWORD 'md5 pass';
    RESET password_encryption;
    CREATE ROLE plain_user LOGIN PASSWORD 'plain pass';
    CREATE ROLE scram_user LOGIN PASSWORD 'scram pass';
    """)

    on_exit(fn -> PostgresServer.stop(server) end)
    %{server: server}
  end

  describe "a real server" do
    test "SCRAM-SHA-256 with the right password", %{server: server} do
      # the role's password is a SCRAM verifier, and pg_hba asks for SCRAM
      assert rows!(
               connect!(server),
               "SELECT rolpassword LIKE 'SCRAM-SHA-256$%' " <>
                 "FROM pg_authid WHERE rolname = 'scram_user'"
             ) == [["t"]]

      conn = connect!(server, username: "scram_user", password: "scram pass")
      assert rows!(conn, "SELECT current_user") == [["scram_user"]]
      assert conn.parameters["server_version"] =~ ~r/^\d+/
      assert is_integer(conn.backend_pid)
      assert Connection.close(conn) == :ok
    end

    test "a wrong password is an error naming the user and the server", %{server: server} do
      assert {:error, %Larder.Error{reason: :source_failed} = error} =
               Connection.connect(options(server, username: "scram_user", password: "nope"))

      assert error.details.code == "28P01"
      assert error.details.severity == "FATAL"
      assert error.message =~ ~s(user "scram_user")
      assert error.message =~ "127.0.0.1:#{server.port}"
    end

    test "no password when the server asks for one: the error names the option",
         %{server: server} do
      assert {:error, %Larder.Error{reason: :source_failed} = error} =
               Connection.connect(options(server, username: "scram_user", password: nil))

      assert error.message =~ ":password"
      assert error.message =~ "scram_user"
    end

    test "MD5", %{server: server} do
      conn = connect!(server, username: "md5_user", password: "md5 pass")
      assert rows!(conn, "SELECT current_user") == [["md5_user"]]

      assert {:error, %Larder.Error{reason: :source_failed, details: %{code: "28P01"}}} =
               Connection.connect(options(server, username: "md5_user", password: "md5 nope"))
    end

    test "a cleartext password", %{server: server} do
      conn = connect!(server, username: "plain_user", password: "plain pass")
      assert rows!(conn, "SELECT current_user") == [["plain_user"]]

      assert {:error, %Larder.Error{reason: :source_failed, details: %{code: "28P01"}}} =
               Connection.connect(options(server, username: "plain_user", password: "no"))
    end

    test "an unknown database", %{server: server} do
      assert {:error, %Larder.Error{reason: :source_failed} = error} =
               Connection.connect(options(server, database: "nosuchdb"))

      assert error.details.code == "3D000"
      assert error.message =~ "nosuchdb"
    end

    @tag :capture_log
    test "TLS when asked (sslmode require)", %{server: server} do
      conn = connect!(server, sslmode: :require)
      assert conn.transport == :ssl
      assert rows!(conn, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()") == [["t"]]

      # a self-signed certificate is not one the system's CAs vouch for
      assert {:error, %Larder.Error{reason: :source_failed, details: %{cause: {:tls, _}}}} =
               Connection.connect(options(server, sslmode: :verify_full, host: "localhost"))
    end

    test "queries: values as text, NULL as nil, a result per statement", %{server: server} do
      conn = connect!(server)

      sql = """
      SELECT 1::int AS i, 2.50::numeric AS n, true AS b, 'x'::text AS t, NULL AS z,
             '2024-01-02'::date AS d, '{1,2}'::int[] AS a, '\\x00ff'::bytea AS y, 'é🎉' AS u;
      SELECT 2;
      CREATE TEMP TABLE q (id int)
      """

      assert {:ok, [first, second, third], conn} = Connection.query(conn, sql, 10_000)
      assert first.columns == ~w(i n b t z d a y u)
      assert first.rows == [["1", "2.50", "t", "x", nil, "2024-01-02", "{1,2}", "\\x00ff", "é🎉"]]
      assert first.command == "SELECT 1"
      assert second.rows == [["2"]]
      assert third == %{command: "CREATE TABLE", columns: [], rows: []}
      assert {:ok, [], _conn} = Connection.query(conn, "", 10_000)
    end

    test "a server error carries its SQLSTATE and leaves the connection usable",
         %{server: server} do
      conn = connect!(server)

      assert {:error, %Larder.Error{reason: :source_failed} = error, conn} =
               Connection.query(conn, "SELECT * FROM no_such_table", 10_000)

      assert error.details.code == "42P01"
      assert error.details.severity == "ERROR"
      assert error.details.message =~ "no_such_table"

      assert {:error, %Larder.Error{details: %{code: "22012"}}, conn} =
               Connection.query(conn, "SELECT 1; SELECT 1/0; SELECT 3", 10_000)

      assert {:error, %Larder.Error{details: %{code: "42601"}}, conn} =
               Connection.query(conn, "SELEC 1", 10_000)

      assert rows!(conn, "SELECT 'still here'") == [["still here"]]
    end

    test "a COPY reads exactly what a SELECT reads, awkward values and all", %{server: server} do
      conn = connect!(server)

      {:ok, _, conn} =
        Connection.query(
          conn,
          """
          CREATE TEMP TABLE awkward (id int PRIMARY KEY, t text, n int, b bytea);
          INSERT INTO awkward VALUES
            (1, E'tab\\there', 1, '\\x00'),
            (2, E'new\\nline and \\r carriage', NULL, NULL),
            (3, E'back\\\\slash \\\\N and \\\\\\\\', 3, '\\x5c4e'),
            (4, '\\N', 4, ''),
            (5, NULL, NULL, NULL),
            (6, '', 0, '\\x09'),
            (7, 'ünïcødé 🎉 中文', -7, '\\xffee'),
            (8, E'\\x01\\x7f controls \\b \\f \\v', 8, NULL),
            (9, repeat(E'long\\t\\\\\\n', 20000), 9, NULL);
          INSERT INTO awkward SELECT g, 'row ' || g, g, NULL FROM generate_series(10, 1000) g
          """,
          10_000
        )

      select =
        rows!(conn, "SELECT id::text, t, n::text, b::text FROM awkward ORDER BY awkward.id")

      assert length(select) == 1000

      {:ok, conn} =
        Connection.copy_out(
          conn,
          "COPY (SELECT id, t, n, b FROM awkward ORDER BY id) TO STDOUT",
          10_000
        )

      {copied, conn} = copy_all(conn, 7, [])
      assert copied == select
      assert Enum.at(copied, 4) == ["5", nil, nil, nil]
      assert Enum.at(copied, 3) == ["4", "\\N", "4", "\\x"]
      assert rows!(conn, "SELECT 'ready again'") == [["ready again"]]
    end

    test "a COPY that fails midway is an error; the connection stays usable",
         %{server: server} do
      conn = connect!(server)

      {:ok, conn} =
        Connection.copy_out(
          conn,
          "COPY (SELECT 1 / (100 - g) FROM generate_series(1, 200) g) TO STDOUT",
          10_000
        )

      assert {:error, %Larder.Error{reason: :source_failed, details: %{code: "22012"}}, conn} =
               copy_until_error(conn)

      assert rows!(conn, "SELECT 1") == [["1"]]

      # not a COPY at all
      assert {:error, %Larder.Error{reason: :source_failed}, conn} =
               Connection.copy_out(conn, "SELECT 1", 10_000)

      assert conn.state == :closed
    end

    test "a query that starts a COPY is refused, not half read", %{server: server} do
      conn = connect!(server)

      assert {:error, %Larder.Error{reason: :source_failed}, conn} =
               Connection.query(conn, "COPY (SELECT 1) TO STDOUT", 10_000)

      assert conn.state == :closed

      assert {:error, %Larder.Error{reason: :source_unavailable}, _} =
               Connection.query(conn, "SELECT 1", 1_000)
    end

    test "a connection dies with the process that holds it: the server's session ends",
         %{server: server} do
      parent = self()

      holder =
        spawn(fn ->
          conn = connect!(server)
          send(parent, {:backend, conn.backend_pid})
          Process.sleep(:infinity)
        end)

      assert_receive {:backend, pid}, 30_000
      sessions = "SELECT count(*) FROM pg_stat_activity WHERE pid = #{pid}"
      assert PostgresServer.sql!(server, sessions) == "1"
      Process.exit(holder, :kill)

      PostgresServer.wait_until(30_000, "the session of a killed holder to end", fn ->
        PostgresServer.sql!(server, sessions) == "0"
      end)
    end

    test "a call in the wrong state raises ArgumentError naming the state", %{server: server} do
      conn = connect!(server)
      {:ok, copying} = Connection.copy_out(conn, "COPY (SELECT 1) TO STDOUT", 10_000)

      error = assert_raise ArgumentError, fn -> Connection.query(copying, "SELECT 1", 1_000) end
      assert error.message =~ ":copy_out"

      assert_raise ArgumentError, fn -> Connection.query(conn, "SELECT 1\0", 1_000) end

      assert_raise ArgumentError, ~r/timeout/, fn ->
        Connection.query(conn, "SELECT 1", :infinity)
      end

      assert_raise ArgumentError, ~r/max_rows/, fn -> Connection.copy_read(copying, 0, 1_000) end
    end
  end

  defp copy_all(conn, batch, acc) do
    case Connection.copy_read(conn, batch, 10_000) do
      {:ok, rows, conn} ->
        assert length(rows) in 1..batch
        copy_all(conn, batch, acc ++ rows)

      {:done, conn} ->
        {acc, conn}
    end
  end

  defp copy_until_error(conn) do
    case Connection.copy_read(conn, 10, 10_000) do
      {:ok, _rows, conn} -> copy_until_error(conn)
      other -> other
    end
  end

  describe "a server killed or paused" do
    setup do
      server = PostgresServer.start()
      on_exit(fn -> PostgresServer.stop(server) end)
      %{server: server}
    end

    test "SIGKILL mid-session: every call is a clean :source_unavailable, until a new connection",
         %{server: server} do
      conn = connect!(server)

      {:ok, copying} =
        Connection.copy_out(
          conn,
          "COPY (SELECT g FROM generate_series(1, 10000000) g) TO STDOUT",
          10_000
        )

      {:ok, _rows, copying} = Connection.copy_read(copying, 10, 10_000)
      other = connect!(server)

      PostgresServer.kill(server)

      assert {:error, %Larder.Error{reason: :source_unavailable}, closed} =
               Connection.query(other, "SELECT 1", 10_000)

      assert closed.state == :closed

      assert {:error, %Larder.Error{reason: :source_unavailable}, _} =
               Connection.query(closed, "SELECT 1", 10_000)

      assert {:error, %Larder.Error{reason: :source_unavailable}, _} = copy_until_error(copying)

      assert {:error, %Larder.Error{reason: :source_unavailable} = error} =
               Connection.connect(options(server))

      assert error.message =~ "127.0.0.1:#{server.port}"

      server = PostgresServer.restart(server)
      assert rows!(connect!(server), "SELECT 1") == [["1"]]
    end

    test "SIGSTOP: a call waits no longer than its timeout", %{server: server} do
      conn = connect!(server)
      PostgresServer.pause(server)

      try do
        assert {:error, %Larder.Error{reason: :source_unavailable, details: %{cause: :timeout}},
                conn} = Connection.query(conn, "SELECT 1", 300)

        assert conn.state == :closed

        assert {:error, %Larder.Error{reason: :source_unavailable}} =
                 Connection.connect(options(server, timeout: 300))
      after
        PostgresServer.resume(server)
      end

      assert rows!(connect!(server), "SELECT 1") == [["1"]]
    end
  end
end

defmodule Larder.Postgres.ConnectionHostileTest do
  # Larder.Postgres.Connection against fake servers that send garbage, huge
  # lengths, truncated messages and endless streams: errors, never a
  # raise, and bounded memory. No real server needed.
  use ExUnit.Case, async: true

  alias Larder.Postgres.{Connection, Options}
  alias Larder.Test.FakePostgres

  import FakePostgres, only: [msg: 2]

  describe "a hostile server" do
    defp fake_options(fake, extra \\ []) do
      Options.validate!(
        [port: fake.port, username: "u", password: "p", timeout: 5_000] ++ extra,
        "test"
      )
    end

    defp fake(handler) do
      fake = FakePostgres.start(handler)
      on_exit(fn -> FakePostgres.stop(fake) end)
      fake
    end

    # The largest amount of binary data `pid` held while `fun` ran in it
    # (sampled every few ms) and `fun`'s result.
    defp peak_memory(fun) do
      parent = self()
      pid = spawn(fn -> send(parent, {:done, self(), fun.()}) end)
      sample(pid, 0)
    end

    defp sample(pid, peak) do
      receive do
        {:done, ^pid, result} -> {result, peak}
      after
        2 ->
          held =
            case {Process.info(pid, :binary), Process.info(pid, :memory)} do
              {{:binary, bins}, {:memory, heap}} ->
                heap + Enum.sum(Enum.map(bins, &elem(&1, 1)))

              _ ->
                0
            end

          sample(pid, max(peak, held))
      end
    end

    test "random bytes: an error, never a raise" do
      for _ <- 1..30 do
        bytes = :crypto.strong_rand_bytes(:rand.uniform(200))

        fake =
          fake(fn socket ->
            FakePostgres.recv_startup(socket)
            :gen_tcp.send(socket, bytes)
            :gen_tcp.close(socket)
          end)

        assert {:error, %Larder.Error{reason: reason}} = Connection.connect(fake_options(fake))
        assert reason in [:source_bad_reply, :source_unavailable, :source_failed]
      end
    end

    test "a length of 1 GiB is refused from the header, before any of it is buffered" do
      fake =
        fake(fn socket ->
          FakePostgres.recv_startup(socket)
          :gen_tcp.send(socket, <<?R, 0x40000000::32>>)
          FakePostgres.send_forever(socket, :binary.copy("x", 65_536))
        end)

      {result, peak} =
        peak_memory(fn -> Connection.connect(fake_options(fake, max_message_bytes: 1_048_576)) end)

      assert {:error, %Larder.Error{reason: :source_bad_reply, details: %{cause: cause}}} = result
      assert cause == {:too_large, ?R, 0x40000000 - 4}
      assert peak < 4_000_000
    end

    test "a truncated message, then a close: :source_unavailable" do
      fake =
        fake(fn socket ->
          FakePostgres.recv_startup(socket)
          :gen_tcp.send(socket, binary_part(FakePostgres.ready(), 0, 12))
          :gen_tcp.close(socket)
        end)

      assert {:error, %Larder.Error{reason: :source_unavailable, details: %{cause: :closed}}} =
               Connection.connect(fake_options(fake))
    end

    test "a truncated message, then silence: the timeout" do
      fake =
        fake(fn socket ->
          FakePostgres.recv_startup(socket)
          :gen_tcp.send(socket, binary_part(FakePostgres.ready(), 0, 12))
          Process.sleep(:infinity)
        end)

      assert {:error, %Larder.Error{reason: :source_unavailable, details: %{cause: :timeout}}} =
               Connection.connect(fake_options(fake, timeout: 300))
    end

    test "an endless stream of notices: the timeout, with bounded memory" do
      notice = msg(?N, "SNOTICE\0C00000\0M" <> String.duplicate("n", 60_000) <> "\0\0")

      fake =
        fake(fn socket ->
          FakePostgres.recv_startup(socket)
          :gen_tcp.send(socket, msg(?R, <<0::32>>))
          FakePostgres.send_forever(socket, :binary.copy(notice, 16))
        end)

      {result, peak} =
        peak_memory(fn -> Connection.connect(fake_options(fake, timeout: 1_500)) end)

      assert {:error, %Larder.Error{reason: :source_unavailable, details: %{cause: :timeout}}} =
               result

      assert peak < 8_000_000
    end

    test "SCRAM: a server that skips its proof, or proves nothing, is refused" do
      for ending <- [:skip_final, :bad_signature] do
        fake =
          fake(fn socket ->
            FakePostgres.recv_startup(socket)
            :gen_tcp.send(socket, msg(?R, <<10::32, "SCRAM-SHA-256\0\0">>))
            {?p, initial} = FakePostgres.recv_message(socket)

            ["SCRAM-SHA-256", <<_length::32, "n,,n=,r=", nonce::binary>>] =
              :binary.split(initial, <<0>>)

            server_first = "r=#{nonce}srv,s=#{Base.encode64("salt")},i=4096"
            :gen_tcp.send(socket, msg(?R, <<11::32, server_first::binary>>))
            {?p, _final} = FakePostgres.recv_message(socket)

            case ending do
              :skip_final ->
                :gen_tcp.send(socket, FakePostgres.ready())

              :bad_signature ->
                signature = Base.encode64(:binary.copy(<<1>>, 32))

                :gen_tcp.send(
                  socket,
                  msg(?R, <<12::32, "v=", signature::binary>>) <> FakePostgres.ready()
                )
            end

            Process.sleep(:infinity)
          end)

        assert {:error, %Larder.Error{reason: :source_bad_reply} = error} =
                 Connection.connect(fake_options(fake))

        assert error.message =~ "SCRAM" or error.message =~ "unexpected message"
      end
    end

    test "an authentication method the client does not do is named" do
      fake =
        fake(fn socket ->
          FakePostgres.recv_startup(socket)
          :gen_tcp.send(socket, msg(?R, <<7::32>>))
          Process.sleep(:infinity)
        end)

      assert {:error, %Larder.Error{reason: :source_failed} = error} =
               Connection.connect(fake_options(fake))

      assert error.message =~ "GSSAPI"
    end

    test "TLS asked of a server that refuses it" do
      fake =
        fake(fn socket ->
          {:ok, <<8::32, 80_877_103::32>>} = :gen_tcp.recv(socket, 8, 5_000)
          :gen_tcp.send(socket, "N")
          Process.sleep(:infinity)
        end)

      assert {:error, %Larder.Error{reason: :source_failed, details: %{cause: :tls_refused}}} =
               Connection.connect(fake_options(fake, sslmode: :require))
    end

    test "answers of the wrong shape to a query close the connection with :source_bad_reply" do
      for answer <- [
            # a row without a description
            msg(?D, <<1::16, 1::32, "1">>) <> msg(?Z, "I"),
            # a row with more values than columns
            FakePostgres.description("a") <> msg(?D, <<2::16, 1::32, "1", 1::32, "2">>),
            # an authentication request in the middle of a session
            msg(?R, <<0::32>>),
            # a message type that does not exist
            msg(?!, "")
          ] do
        fake = fake(FakePostgres.answering(answer))

        {:ok, conn} = Connection.connect(fake_options(fake))

        assert {:error, %Larder.Error{reason: :source_bad_reply}, conn} =
                 Connection.query(conn, "SELECT 1", 5_000)

        assert conn.state == :closed
      end
    end

    test "a query result larger than :max_message_bytes is refused, with bounded memory" do
      row = msg(?D, <<1::16, 60_000::32>> <> :binary.copy("r", 60_000))

      fake =
        fake(fn socket ->
          FakePostgres.recv_startup(socket)
          :gen_tcp.send(socket, FakePostgres.ready())
          {?Q, _} = FakePostgres.recv_message(socket)
          :gen_tcp.send(socket, FakePostgres.description("a"))
          FakePostgres.send_forever(socket, :binary.copy(row, 16))
        end)

      {result, peak} =
        peak_memory(fn ->
          {:ok, conn} = Connection.connect(fake_options(fake, max_message_bytes: 1_048_576))
          Connection.query(conn, "SELECT 1", 5_000)
        end)

      assert {:error,
              %Larder.Error{reason: :source_bad_reply, details: %{cause: {:result_too_large, _}}},
              _} = result

      assert peak < 8_000_000
    end

    test "a COPY row that never ends is refused at :max_message_bytes, with bounded memory" do
      chunk = msg(?d, :binary.copy("x", 60_000))

      fake =
        fake(fn socket ->
          FakePostgres.recv_startup(socket)
          :gen_tcp.send(socket, FakePostgres.ready())
          {?Q, _} = FakePostgres.recv_message(socket)
          :gen_tcp.send(socket, msg(?H, <<0, 1::16, 0::16>>))
          FakePostgres.send_forever(socket, :binary.copy(chunk, 16))
        end)

      {result, peak} =
        peak_memory(fn ->
          {:ok, conn} = Connection.connect(fake_options(fake, max_message_bytes: 1_048_576))
          {:ok, conn} = Connection.copy_out(conn, "COPY t TO STDOUT", 5_000)
          Connection.copy_read(conn, 10, 5_000)
        end)

      assert {:error,
              %Larder.Error{reason: :source_bad_reply, details: %{cause: {:row_too_large, _}}},
              _} = result

      assert peak < 8_000_000
    end

    test "a COPY row that is not the text format is refused" do
      fake =
        fake(
          FakePostgres.answering(
            msg(?H, <<0, 2::16, 0::16, 0::16>>) <> msg(?d, "only one field\n")
          )
        )

      {:ok, conn} = Connection.connect(fake_options(fake))
      {:ok, conn} = Connection.copy_out(conn, "COPY t TO STDOUT", 5_000)

      assert {:error, %Larder.Error{reason: :source_bad_reply, details: %{cause: :bad_copy_row}},
              _} = Connection.copy_read(conn, 10, 5_000)
    end

    test "COPY rows however the CopyData messages cut them: each once, in order" do
      # several rows in one message, a row over three, a NULL, an escape
      fake =
        fake(
          FakePostgres.answering(
            msg(?H, <<0, 2::16, 0::16, 0::16>>) <>
              msg(?d, "a\t1\nb\t2\nc") <>
              msg(?d, "\t3") <>
              msg(?d, "\n") <>
              msg(?d, "d\t\\N\n") <>
              msg(?d, "e\\tf\t5\n") <>
              msg(?c, "") <> msg(?C, "COPY 5\0") <> msg(?Z, "I")
          )
        )

      {:ok, conn} = Connection.connect(fake_options(fake))
      {:ok, conn} = Connection.copy_out(conn, "COPY t TO STDOUT", 5_000)
      assert {:ok, [["a", "1"], ["b", "2"]], conn} = Connection.copy_read(conn, 2, 5_000)
      assert {:ok, [["c", "3"], ["d", nil]], conn} = Connection.copy_read(conn, 2, 5_000)
      assert {:ok, [["e\tf", "5"]], conn} = Connection.copy_read(conn, 2, 5_000)
      assert {:done, conn} = Connection.copy_read(conn, 2, 5_000)
      assert conn.state == :ready
    end

    test "nothing listening: :source_unavailable naming the server" do
      port = Larder.Test.FreePort.get()

      assert {:error, %Larder.Error{reason: :source_unavailable} = error} =
               Connection.connect(Options.validate!([port: port, username: "u"], "test"))

      assert error.message =~ "127.0.0.1:#{port}"
      assert error.details.cause == :econnrefused
    end
  end
end
