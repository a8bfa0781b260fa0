# The application (started by mix test) serves on a free loopback port and
# loads the catalogue as `make serve` does: the shared CSV when present,
# the generated one otherwise. The suites wait for it through GET /health.
ExUnit.start(assert_receive_timeout: 5_000, timeout: 300_000)

# Tests whose expected answers are the reference catalogue's need it loaded.
unless File.exists?(Path.join(PriceSearch.Catalogue.default_dir(), "prices-487k.csv.gz")) do
  ExUnit.configure(exclude: [:reference_catalogue])
end

defmodule PriceSearch.TestClient do
  # A real HTTP client (OTP's httpc) against a listener on 127.0.0.1.

  def url(port, path), do: 'http://127.0.0.1:#{port}#{path}'

  def post(port, path, body, content_type \\ 'application/json') do
    request(:post, {url(port, path), [], content_type, body})
  end

  def get(port, path), do: request(:get, {url(port, path), []})

  def request(method, request) do
    {:ok, {{_, status, _}, headers, body}} =
      :httpc.request(method, request, [timeout: 60_000], body_format: :binary)

    {status, Map.new(headers, fn {k, v} -> {List.to_string(k), List.to_string(v)} end), body}
  end

  # Waits for GET /health to answer 200 (the catalogue loads at start).
  def await_loaded(port, deadline_ms \\ 240_000) do
    case get(port, '/health') do
      {200, _, _} ->
        :ok

      {503, _, _} when deadline_ms > 0 ->
        Process.sleep(200)
        await_loaded(port, deadline_ms - 200)
    end
  end
end

defmodule PriceSearch.TestRedis do
  # A throwaway redis-server on a free loopback port, for the stream test.
  # The example's own: an example depends on Larder's public API only, not
  # on Larder's test support. The server is killed when the VM exits (the
  # shell that started it waits on its stdin).

  def start do
    {:ok, socket} = :gen_tcp.listen(0, ip: {127, 0, 0, 1})
    {:ok, port} = :inet.port(socket)
    :gen_tcp.close(socket)
    dir = Path.join(System.tmp_dir!(), "price-search-redis-#{System.unique_integer([:positive])}")
    File.mkdir_p!(dir)
    redis = System.find_executable("redis-server") || raise "redis-server is not installed"

    args =
      ~w(--port #{port} --bind 127.0.0.1 --save "" --appendonly no --dir #{dir}) ++
        ~w(--logfile #{Path.join(dir, "redis.log")})

    script = ~s(#{redis} #{Enum.join(args, " ")} & echo "pid $!"; read _; kill -9 $! 2>/dev/null)

    shell =
      Port.open({:spawn_executable, "/bin/sh"}, [:binary, :exit_status, args: ["-c", script]])

    os_pid =
      receive do
        {^shell, {:data, "pid " <> rest}} -> rest |> String.trim() |> String.to_integer()
      after
        5_000 -> raise "redis-server did not start"
      end

    redis = %{port: port, shell: shell, os_pid: os_pid, dir: dir}
    wait_until(10_000, "redis-server to answer PING", fn -> ping(port) end)
    redis
  end

  def stop(%{shell: shell, os_pid: os_pid, dir: dir}) do
    System.cmd("kill", ["-9", Integer.to_string(os_pid)], stderr_to_stdout: true)

    try do
      Port.close(shell)
    rescue
      ArgumentError -> :ok
    end

    File.rm_rf(dir)
  end

  def wait_until(timeout, what, fun) do
    deadline = System.monotonic_time(:millisecond) + timeout
    wait_until_deadline(deadline, what, fun)
  end

  defp wait_until_deadline(deadline, what, fun) do
    result = fun.()

    cond do
      result ->
        result

      System.monotonic_time(:millisecond) > deadline ->
        raise "timed out waiting for #{what}"

      true ->
        Process.sleep(100)
        wait_until_deadline(deadline, what, fun)
    end
  end

  defp ping(port) do
    with {:ok, socket} <- :gen_tcp.connect({127, 0, 0, 1}, port, [:binary, active: false]) do
      reply = with :ok <- :gen_tcp.send(socket, "PING\r\n"), do: :gen_tcp.recv(socket, 0, 1_000)

      :gen_tcp.close(socket)
      reply == {:ok, "+PONG\r\n"}
    else
      _ -> false
    end
  end
end
