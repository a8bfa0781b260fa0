# Starts a throwaway PostgreSQL server from Debian's packages (the newest
# /usr/lib/postgresql/<version>/bin) in a temporary data directory on a
# free loopback port, ready for logical replication, and kills, pauses or
# restarts it on demand; runs SQL as its superuser through psql. For the
# tests (compiled with test/support); not part of the library.
defmodule Larder.Test.PostgresServer do
  @moduledoc false

  alias Larder.Test.FreePort

  defstruct [:port, :dir, :bin, :os_pid, :erl_port, :run_as, config: []]

  @superuser "larder"
  @password "larder-secret"

  # A start, or the crash recovery after a SIGKILL, on a loaded 2-core
  # machine: a bound on waiting, not on speed.
  @start_timeout_ms 120_000

  # Host connections: md5_user with MD5, plain_user with a cleartext
  # password, everyone else with SCRAM-SHA-256; the same for replication
  # connections. No Unix sockets (unix_socket_directories is empty).
  @hba """
  # TYPE  DATABASE     USER        ADDRESS        METHOD
  host    all          md5_user    127.0.0.1/32   md5
  host    replication  md5_user    127.0.0.1/32   md5
  host    all          plain_user  127.0.0.1/32   password
  host    replication  plain_user  127.0.0.1/32   password
  host    all          all         127.0.0.1/32   scram-sha-256
  host    replication  all         127.0.0.1/32   scram-sha-256
  """

  # A test server: logical decoding on, room for slots and senders, no
  # durability (fsync off: the data dir is thrown away), small memory.
  @config [
    {"listen_addresses", "'127.0.0.1'"},
    {"unix_socket_directories", "''"},
    {"wal_level", "logical"},
    {"max_replication_slots", "20"},
    {"max_wal_senders", "20"},
    {"max_connections", "40"},
    {"shared_buffers", "16MB"},
    {"fsync", "off"},
    {"synchronous_commit", "off"},
    {"full_page_writes", "off"},
    {"logging_collector", "off"},
    {"log_min_messages", "warning"},
    {"password_encryption", "'scram-sha-256'"}
  ]

  @doc "The superuser's name and password."
  def superuser, do: {@superuser, @password}

  @doc "The newest Debian PostgreSQL bin directory, or nil."
  def bin_dir do
    "/usr/lib/postgresql/*/bin/postgres"
    |> Path.wildcard()
    |> Enum.map(&Path.dirname/1)
    |> Enum.sort_by(fn dir ->
      case Integer.parse(dir |> Path.dirname() |> Path.basename()) do
        {n, _} -> n
        :error -> 0
      end
    end)
    |> List.last()
  end

  @doc "True when Debian's postgresql package is installed."
  def available?, do: bin_dir() != nil

  @doc """
  Creates a data directory (initdb, the superuser with a SCRAM password)
  and starts the server on it. The server is killed when the VM exits
  (its wrapper shell watches its stdin). When the VM runs as root, initdb
  and the server run as the `postgres` user (Postgres refuses root), with
  the directory owned by it.

  Options: `:port` (default: a free one), `:config` (more `{name,
  value}` settings, after the defaults, e.g. `{"wal_sender_timeout",
  "'2s'"}`), `:ssl` (true: a self-signed certificate and `ssl = on`).
  """
  def start(opts \\ []) do
    bin = bin_dir() || raise "PostgreSQL is not installed (Debian package postgresql)"
    port = Keyword.get_lazy(opts, :port, &FreePort.get/0)

    dir = Path.join(System.tmp_dir!(), "larder-pg-#{port}-#{System.unique_integer([:positive])}")

    File.mkdir_p!(dir)
    run_as = if root?(), do: "postgres"

    server = %__MODULE__{
      port: port,
      dir: dir,
      bin: bin,
      run_as: run_as,
      config: Keyword.get(opts, :config, [])
    }

    File.write!(Path.join(dir, "pwfile"), @password <> "\n")
    chown!(server, dir)

    run!(server, "initdb", [
      "-D",
      data(server),
      "-U",
      @superuser,
      "--pwfile",
      Path.join(dir, "pwfile"),
      "-A",
      "scram-sha-256",
      "-E",
      "UTF8",
      "--locale=C",
      "--no-sync"
    ])

    File.write!(Path.join(data(server), "pg_hba.conf"), @hba)
    ssl = if Keyword.get(opts, :ssl, false), do: ssl_config!(server), else: []

    lines =
      Enum.map([{"port", Integer.to_string(port)} | @config] ++ ssl ++ server.config, fn {k, v} ->
        "#{k} = #{v}\n"
      end)

    File.write!(Path.join(data(server), "postgresql.conf"), lines, [:append])
    chown!(server, dir)
    launch(server)
  end

  defp ssl_config!(server) do
    key = Path.join(data(server), "server.key")
    crt = Path.join(data(server), "server.crt")

    {_, 0} =
      System.cmd(
        "openssl",
        ~w(req -new -x509 -days 2 -nodes -subj /CN=localhost -keyout #{key} -out #{crt}),
        stderr_to_stdout: true
      )

    File.chmod!(key, 0o600)
    [{"ssl", "on"}, {"ssl_cert_file", "'#{crt}'"}, {"ssl_key_file", "'#{key}'"}]
  end

  defp data(server), do: Path.join(server.dir, "data")

  defp launch(server) do
    postgres = Path.join(server.bin, "postgres")
    log = Path.join(server.dir, "postgres.log")

    script =
      ~s(#{postgres} -D #{data(server)} >>#{log} 2>&1 & echo "pid $!"; read _; kill -9 $! 2>/dev/null)

    {exe, args} =
      case server.run_as do
        nil -> {"/bin/sh", ["-c", script]}
        user -> {System.find_executable("runuser"), ["-u", user, "--", "/bin/sh", "-c", script]}
      end

    erl_port = Port.open({:spawn_executable, exe}, [:binary, :exit_status, args: args])

    os_pid =
      receive do
        {^erl_port, {:data, "pid " <> rest}} -> rest |> String.trim() |> String.to_integer()
      after
        10_000 -> raise "postgres did not start"
      end

    server = %{server | os_pid: os_pid, erl_port: erl_port}
    wait_ready!(server)
    server
  end

  @doc "Kills the server at once (SIGKILL to the postmaster and its processes), as a crash would."
  def kill(%__MODULE__{os_pid: os_pid} = server) do
    pids = [os_pid | children(os_pid)]
    signal(pids, "-KILL")

    # the wrapper shell then exits, and the postmaster's zombie is reaped:
    # a new postmaster refuses a data directory whose old one still exists
    if server.erl_port && Port.info(server.erl_port) do
      Port.close(server.erl_port)
    end

    wait_gone(pids, 400)
    wait_down(server, 200)
    :ok
  catch
    _, _ -> :ok
  end

  @doc "Pauses the server (SIGSTOP to every process of it): sockets stay open, nothing answers."
  def pause(%__MODULE__{os_pid: os_pid}) do
    signal([os_pid | children(os_pid)], "-STOP")
    :ok
  end

  @doc "Resumes a paused server (SIGCONT)."
  def resume(%__MODULE__{os_pid: os_pid}) do
    signal([os_pid | children(os_pid)], "-CONT")
    :ok
  end

  @doc "Starts the server again on the same data directory and port (after kill/1)."
  def restart(%__MODULE__{} = server) do
    kill(server)
    launch(%{server | os_pid: nil, erl_port: nil})
  end

  @doc "Kills the server and removes its directory."
  def stop(%__MODULE__{} = server) do
    kill(server)
    File.rm_rf(server.dir)
    :ok
  end

  @doc "The server's log, for a failing test's message."
  def log(%__MODULE__{dir: dir}) do
    case File.read(Path.join(dir, "postgres.log")) do
      {:ok, text} -> text
      _ -> ""
    end
  end

  @doc """
  Connection options for Larder.Postgres.Options: the superuser on
  database "postgres", then `extra` (which override them).
  """
  def options(%__MODULE__{port: port}, extra \\ []) do
    Keyword.merge(
      [
        host: "127.0.0.1",
        port: port,
        username: @superuser,
        password: @password,
        database: "postgres"
      ],
      extra
    )
  end

  @doc """
  Runs `sql` as the superuser through psql (on `database`) and returns its
  output (unaligned, tuples only, `|` between fields); raises on error.
  """
  def sql!(%__MODULE__{} = server, sql, database \\ "postgres") do
    args =
      ~w(-X -q -A -t -v ON_ERROR_STOP=1 -h 127.0.0.1 -p #{server.port} -U #{@superuser} -d) ++
        [database, "-c", sql]

    case System.cmd(Path.join(server.bin, "psql"), args,
           env: [{"PGPASSWORD", @password}, {"PGCONNECT_TIMEOUT", "30"}],
           stderr_to_stdout: true
         ) do
      {out, 0} -> String.trim_trailing(out, "\n")
      {out, status} -> raise "psql exited with #{status}: #{out}\nSQL: #{sql}"
    end
  end

  @doc """
  Calls `fun` every 50 ms until it returns a truthy value, which it
  returns; raises naming `what` once `timeout` ms have passed.
  """
  def wait_until(timeout, what, fun) do
    deadline = System.monotonic_time(:millisecond) + timeout
    do_wait_until(deadline, what, fun)
  end

  defp do_wait_until(deadline, what, fun) do
    result = fun.()

    cond do
      result ->
        result

      System.monotonic_time(:millisecond) > deadline ->
        raise "timed out waiting for #{what}"

      true ->
        Process.sleep(50)
        do_wait_until(deadline, what, fun)
    end
  end

  ## Processes

  defp root? do
    case System.cmd("id", ["-u"]) do
      {"0\n", 0} -> true
      _ -> false
    end
  end

  defp chown!(%__MODULE__{run_as: nil}, _path), do: :ok

  defp chown!(%__MODULE__{run_as: user}, path) do
    {_, 0} = System.cmd("chown", ["-R", "#{user}:#{user}", path], stderr_to_stdout: true)
    :ok
  end

  defp run!(server, tool, args) do
    exe = Path.join(server.bin, tool)

    {cmd, args} =
      case server.run_as do
        nil -> {exe, args}
        user -> {System.find_executable("runuser"), ["-u", user, "--", exe | args]}
      end

    case System.cmd(cmd, args, stderr_to_stdout: true, cd: server.dir) do
      {_, 0} -> :ok
      {out, status} -> raise "#{tool} exited with #{status}: #{out}"
    end
  end

  # The processes whose parent is `pid` (the postmaster's backends).
  defp children(pid) do
    "/proc/[0-9]*/stat"
    |> Path.wildcard()
    |> Enum.flat_map(fn path ->
      with {:ok, stat} <- File.read(path),
           [_, after_name] <- String.split(stat, ") ", parts: 2),
           [_state, ppid | _] <- String.split(after_name, " "),
           {^pid, ""} <- Integer.parse(ppid),
           {child, ""} <- path |> Path.dirname() |> Path.basename() |> Integer.parse() do
        [child]
      else
        _ -> []
      end
    end)
  end

  defp signal(pids, signal) do
    System.cmd("kill", [signal | Enum.map(pids, &Integer.to_string/1)], stderr_to_stdout: true)
  end

  defp wait_gone(_pids, 0), do: :ok

  defp wait_gone(pids, tries) do
    if Enum.any?(pids, &File.exists?("/proc/#{&1}/stat")) do
      Process.sleep(25)
      wait_gone(pids, tries - 1)
    else
      :ok
    end
  end

  defp wait_ready!(server) do
    isready = Path.join(server.bin, "pg_isready")

    wait_until(@start_timeout_ms, "postgres on port #{server.port}\n" <> log(server), fn ->
      match?(
        {_, 0},
        System.cmd(isready, ~w(-q -h 127.0.0.1 -p #{server.port} -t 2), stderr_to_stdout: true)
      )
    end)

    :ok
  end

  defp wait_down(_server, 0), do: :ok

  defp wait_down(server, tries) do
    case :gen_tcp.connect(~c"127.0.0.1", server.port, [:binary, active: false], 100) do
      {:ok, socket} ->
        :gen_tcp.close(socket)
        Process.sleep(25)
        wait_down(server, tries - 1)

      {:error, _} ->
        :ok
    end
  end
end
