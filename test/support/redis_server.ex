# Starts a throwaway redis-server on a free loopback port (no persistence, a
# temp dir), and kills or restarts it on demand. One home for the tests
# (compiled with test/support), the benchmarks and the demo (compiled for
# them too: see mix.exs); not part of the library.
defmodule Larder.Test.RedisServer do
  @moduledoc false

  import Bitwise

  alias Larder.Redis.Socket

  defstruct [:port, :dir, :os_pid, :erl_port, config: nil, args: []]

  @doc "True when a redis-server binary is on the PATH."
  def available?, do: System.find_executable("redis-server") != nil

  @doc """
  Starts redis-server on `port` (default: a free one). The server is killed
  when the returned handle's owner exits, even if the VM dies (it watches
  its stdin).

  `:config` is a config file passed first (a sentinel needs one it can
  rewrite); `:args` are more command-line words, after the defaults (e.g.
  `["--sentinel"]` or `["--cluster-enabled", "yes"]`).
  """
  def start(opts \\ []) do
    port = Keyword.get_lazy(opts, :port, &free_port/0)
    dir = Keyword.get_lazy(opts, :dir, fn -> tmp_dir(port) end)
    File.mkdir_p!(dir)
    redis = System.find_executable("redis-server") || raise "redis-server is not installed"

    config = Keyword.get(opts, :config)
    extra = Keyword.get(opts, :args, [])

    args =
      List.wrap(config) ++
        ~w(--port #{port} --bind 127.0.0.1 --save "" --appendonly no --dir #{dir}) ++
        ~w(--logfile #{Path.join(dir, "redis.log")}) ++ extra

    script = ~s(#{redis} #{Enum.join(args, " ")} & echo "pid $!"; read _; kill -9 $! 2>/dev/null)

    erl_port =
      Port.open({:spawn_executable, "/bin/sh"}, [:binary, :exit_status, args: ["-c", script]])

    os_pid =
      receive do
        {^erl_port, {:data, "pid " <> rest}} -> rest |> String.trim() |> String.to_integer()
      after
        5_000 -> raise "redis-server did not start"
      end

    server = %__MODULE__{
      port: port,
      dir: dir,
      os_pid: os_pid,
      erl_port: erl_port,
      config: config,
      args: extra
    }

    wait_ready(server, 100)
    server
  end

  @doc "Kills the server at once (SIGKILL), as a crash would."
  def kill(%__MODULE__{os_pid: os_pid, erl_port: erl_port} = server) do
    System.cmd("kill", ["-9", Integer.to_string(os_pid)], stderr_to_stdout: true)
    wait_down(server, 100)

    if Port.info(erl_port) do
      Port.close(erl_port)
    end

    :ok
  catch
    _, _ -> :ok
  end

  @doc "Pauses the server (SIGSTOP): sockets stay open, nothing answers."
  def pause(%__MODULE__{os_pid: os_pid}) do
    {_, 0} = System.cmd("kill", ["-STOP", Integer.to_string(os_pid)], stderr_to_stdout: true)
    :ok
  end

  @doc "Resumes a paused server (SIGCONT)."
  def resume(%__MODULE__{os_pid: os_pid}) do
    System.cmd("kill", ["-CONT", Integer.to_string(os_pid)], stderr_to_stdout: true)
    :ok
  end

  @doc "Starts a new server on the same port, dir, config file and arguments."
  def restart(%__MODULE__{} = server) do
    start(port: server.port, dir: server.dir, config: server.config, args: server.args)
  end

  @doc "Kills the server and removes its dir."
  def stop(%__MODULE__{} = server) do
    kill(server)
    File.rm_rf(server.dir)
    :ok
  end

  @doc """
  Calls `fun` every 100 ms until it returns a truthy value, which it
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
        Process.sleep(100)
        do_wait_until(deadline, what, fun)
    end
  end

  @doc "A TCP port nothing listens on right now (`Larder.Test.FreePort.get/0`)."
  defdelegate free_port, to: Larder.Test.FreePort, as: :get

  # A test's own commands are not what it measures: on a loaded 2-core
  # machine a reply can take over a second, so they wait up to 5 s.
  @command_timeout_ms 5_000

  @doc "Sends one command over a fresh connection (RESP) and returns the raw reply."
  def command(%__MODULE__{port: port}, args) do
    {:ok, socket} =
      :gen_tcp.connect(~c"127.0.0.1", port, [:binary, active: false], @command_timeout_ms)

    payload = ["*#{length(args)}\r\n" | Enum.map(args, &"$#{byte_size(&1)}\r\n#{&1}\r\n")]
    :ok = :gen_tcp.send(socket, payload)
    {:ok, reply} = :gen_tcp.recv(socket, 0, @command_timeout_ms)
    :gen_tcp.close(socket)
    reply
  end

  @doc """
  Sends one command over a fresh connection and returns its whole reply,
  parsed (`{:ok, value}` or `{:error, text}`, as `Larder.Redis.RESP` reads
  them), with `Larder.Redis.Socket.request/4`. Binary-safe both ways,
  unlike `redis-cli`'s arguments and output.
  """
  def request(%__MODULE__{port: port}, args) do
    opts = [timeout: @command_timeout_ms, max_reply_bytes: 1 <<< 30]
    {:ok, [reply]} = Socket.request("127.0.0.1", port, [args], opts)
    reply
  end

  defp tmp_dir(port) do
    Path.join(System.tmp_dir!(), "larder-redis-#{port}-#{System.unique_integer([:positive])}")
  end

  defp wait_ready(_server, 0), do: raise("redis-server did not become ready")

  defp wait_ready(server, tries) do
    case :gen_tcp.connect(~c"127.0.0.1", server.port, [:binary, active: false], 200) do
      {:ok, socket} ->
        :gen_tcp.send(socket, "PING\r\n")
        reply = :gen_tcp.recv(socket, 0, 500)
        :gen_tcp.close(socket)

        case reply do
          {:ok, "+PONG\r\n"} -> :ok
          _ -> retry_ready(server, tries)
        end

      {:error, _} ->
        retry_ready(server, tries)
    end
  end

  defp retry_ready(server, tries) do
    Process.sleep(20)
    wait_ready(server, tries - 1)
  end

  defp wait_down(_server, 0), do: :ok

  defp wait_down(server, tries) do
    case :gen_tcp.connect(~c"127.0.0.1", server.port, [:binary, active: false], 100) do
      {:ok, socket} ->
        :gen_tcp.close(socket)
        Process.sleep(20)
        wait_down(server, tries - 1)

      {:error, _} ->
        :ok
    end
  end
end
