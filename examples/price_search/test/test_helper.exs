# The application (started by mix test) serves on a free loopback port and
# loads the catalogue as `make serve` does: the shared CSV when present,
# the generated one otherwise. The suites wait for it through GET /health.
# The stream test's redis-server is started by Larder's own starter
# (Larder.Test.RedisServer, compiled from Larder's test/support: mix.exs).
ExUnit.start(assert_receive_timeout: 5_000, timeout: 300_000)

# Tests whose expected answers are the reference catalogue's need it loaded.
unless File.exists?(Path.join(PriceCatalogue.default_dir(), "prices-487k.csv.gz")) do
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
