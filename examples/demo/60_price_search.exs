# The price search service (examples/price_search) over HTTP: started as its
# own OS process (as `make serve` does), sent the single request and a
# 1,000-line bulk request with OTP's httpc, then stopped with SIGTERM.
# The requests come from the price catalogue (PriceCatalogue,
# examples/price_catalogue).

defmodule Demo.PriceSearch do
  def post(port, path, body, type) do
    url = 'http://127.0.0.1:#{port}#{path}'

    {:ok, {{_, status, _}, _, answer}} =
      :httpc.request(:post, {url, [], type, body}, [], body_format: :binary)

    {status, answer}
  end

  def await_loaded(port, server, deadline) do
    case :httpc.request(:get, {'http://127.0.0.1:#{port}/health', []}, [timeout: 1_000], []) do
      {:ok, {{_, 200, _}, _, _}} ->
        :ok

      _ ->
        receive do
          {^server, {:exit_status, status}} -> raise "the service exited with status #{status}"
        after
          200 -> :ok
        end

        if System.monotonic_time(:millisecond) > deadline, do: raise("the service did not load")
        await_loaded(port, server, deadline)
    end
  end
end

IO.puts(
  "\n## Price search over HTTP (examples/price_search, its own HTTP/1.1 listener + jiffy)\n"
)

{:ok, _} = Application.ensure_all_started(:inets)

{source, prices, requests} = PriceCatalogue.reference_or_generated()
single = PriceCatalogue.single_request(prices, source)
_ = prices
{:ok, socket} = :gen_tcp.listen(0, ip: {127, 0, 0, 1})
{:ok, port} = :inet.port(socket)
:gen_tcp.close(socket)

started = System.monotonic_time(:millisecond)

server =
  Port.open({:spawn_executable, System.find_executable("mix")}, [
    :binary,
    :exit_status,
    :stderr_to_stdout,
    args: ["run", "--no-halt"],
    cd: Path.expand("../price_search", __DIR__),
    env: [{'PORT', '#{port}'}]
  ])

{:os_pid, os_pid} = Port.info(server, :os_pid)
Demo.PriceSearch.await_loaded(port, server, started + 300_000)

IO.puts(
  "# service up on port #{port} (OS pid #{os_pid}), catalogue loaded, in " <>
    "#{System.monotonic_time(:millisecond) - started} ms (VM start included)"
)

single_body = :jiffy.encode(PriceCatalogue.request_json(single))

{status, answer} =
  Demo.PriceSearch.post(port, "/v1/search/bitmap/prices", single_body, 'application/json')

IO.puts("POST /v1/search/bitmap/prices  #{single_body}\n  -> #{status} #{answer}")

bulk_body =
  requests
  |> Stream.cycle()
  |> Enum.take(1000)
  |> Enum.with_index()
  |> Enum.map(fn {conditions, id} ->
    [:jiffy.encode(Map.put(PriceCatalogue.request_json(conditions), "id", id)), "\n"]
  end)
  |> IO.iodata_to_binary()

{status, answer} =
  Demo.PriceSearch.post(port, "/v5/search/bitmap/bulk/prices", bulk_body, 'application/x-ndjson')

lines = String.split(answer, "\n", trim: true)
found = Enum.count(lines, &String.starts_with?(&1, ~s({"price")))

IO.puts(
  "POST /v5/search/bitmap/bulk/prices  (1,000 lines, #{byte_size(bulk_body)} bytes)\n" <>
    "  -> #{status}, #{length(lines)} lines, #{found} prices; first two:\n     " <>
    Enum.join(Enum.take(lines, 2), "\n     ")
)

# A short throughput figure: 2 s of each, one client, sequential requests.
measure = fn path, body, type ->
  t0 = System.monotonic_time(:microsecond)

  n =
    Stream.repeatedly(fn -> Demo.PriceSearch.post(port, path, body, type) end)
    |> Stream.take_while(fn {200, _} -> System.monotonic_time(:microsecond) - t0 < 2_000_000 end)
    |> Enum.count()

  n / ((System.monotonic_time(:microsecond) - t0) / 1_000_000)
end

single_rate = measure.("/v1/search/bitmap/prices", single_body, 'application/json')
bulk_rate = measure.("/v5/search/bitmap/bulk/prices", bulk_body, 'application/x-ndjson')

IO.puts("""
# one httpc client, 2 s each (client and service share this machine's cores;
# `make bench-http` pins them apart and uses wrk):
  single request: #{round(single_rate)} req/s
  bulk of 1,000:  #{Float.round(bulk_rate, 1)} req/s = #{round(bulk_rate * 1000)} searches/s
""")

System.cmd("kill", ["-TERM", "#{os_pid}"])

receive do
  {^server, {:exit_status, status}} ->
    IO.puts("# service stopped on SIGTERM (exit status #{status})")
after
  30_000 -> IO.puts("# the service did not stop within 30 s")
end
