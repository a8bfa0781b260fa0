# The price search service under wrk, as the Go reference was measured: the
# service on core 0 with one scheduler (taskset -c 0, +S 1, no busy waiting),
# wrk on core 1, four scenarios of DURATION (default 10s) each. Prints req/s,
# p50, p99, searches/s for bulk and the service's RSS after load, beside the
# Go figures (measured on the same kind of machine, not in this run).
#
#   make bench-http                      # from the Larder root
#   DURATION=2s mix run --no-start bench/http_bench.exs [--json PATH]
alias PriceSearch.Catalogue

# One scheduler; no scheduler spins waiting for work, as the dirty
# schedulers' spinning would take the one core from the scheduler serving.
vm_flags = "+S 1 +sbwt none +sbwtdcpu none +sbwtdio none"

defmodule HTTPBench do
  def free_port do
    {:ok, socket} = :gen_tcp.listen(0, ip: {127, 0, 0, 1})
    {:ok, port} = :inet.port(socket)
    :gen_tcp.close(socket)
    port
  end

  def await_health(port, server, deadline) do
    url = 'http://127.0.0.1:#{port}/health'

    case :httpc.request(:get, {url, []}, [timeout: 1_000], []) do
      {:ok, {{_, 200, _}, _, _}} ->
        :ok

      _ ->
        drain(server)
        if System.monotonic_time(:millisecond) > deadline, do: raise("the service did not load")
        Process.sleep(200)
        await_health(port, server, deadline)
    end
  end

  # The service's log goes to our stdout, and is kept for its load line.
  def drain(server) do
    receive do
      {^server, {:data, data}} ->
        IO.write(data)
        Process.put(:log, Process.get(:log, "") <> data)
        drain(server)

      {^server, {:exit_status, status}} ->
        raise "the service exited with status #{status}"
    after
      0 -> :ok
    end
  end

  def rss_mb(pid) do
    "/proc/#{pid}/status"
    |> File.read!()
    |> then(&Regex.run(~r/VmRSS:\s+(\d+) kB/, &1))
    |> then(fn [_, kb] -> String.to_integer(kb) / 1024 end)
  end

  def settled_rss(_pid, rss, _stable, 0), do: rss
  def settled_rss(_pid, rss, 3, _left), do: rss

  def settled_rss(pid, rss, stable, left) do
    Process.sleep(1_000)
    now = rss_mb(pid)
    stable = if abs(now - rss) <= rss / 100, do: stable + 1, else: 0
    settled_rss(pid, now, stable, left - 1)
  end

  def wrk(port, path, connections, duration, script, args) do
    script = Path.join(__DIR__, script)
    url = "http://127.0.0.1:#{port}#{path}"

    {out, 0} =
      System.cmd(
        "taskset",
        ["-c", "1", "wrk", "-t1", "-c#{connections}", "-d#{duration}", "--latency", "-s"] ++
          [script, url, "--" | args],
        stderr_to_stdout: true
      )

    [_, json] = Regex.run(~r/WRK_JSON (\{.*\})/, out)
    r = :jiffy.decode(json, [:return_maps])
    Map.put(r, "req_per_s", r["requests"] / (r["duration_us"] / 1_000_000))
  end
end

{opts, _, _} = OptionParser.parse(System.argv(), strict: [json: :string])
duration = System.get_env("DURATION", "10s")
{:ok, _} = Application.ensure_all_started(:inets)

# The request files for wrk, from the catalogue the service will load.
{source, prices, requests} = Catalogue.reference_or_generated()
single = Catalogue.single_request(prices, source)
prices = nil
_ = prices
:erlang.garbage_collect()

dir = Path.join(System.tmp_dir!(), "price_search_bench_#{System.pid()}")
File.mkdir_p!(dir)
requests_file = Path.join(dir, "requests.jsonl")
single_file = Path.join(dir, "single.json")

File.write!(
  requests_file,
  Enum.map(requests, &[:jiffy.encode(Catalogue.request_json(&1)), "\n"])
)

File.write!(single_file, :jiffy.encode(Catalogue.request_json(single)))
IO.puts("# catalogue: #{source}; #{length(requests)} requests; wrk for #{duration} per scenario")

## The service, pinned

port = HTTPBench.free_port()
elixir = System.find_executable("elixir")

server =
  Port.open({:spawn_executable, System.find_executable("taskset")}, [
    :binary,
    :exit_status,
    :stderr_to_stdout,
    args: ["-c", "0", elixir, "--erl", vm_flags, "-S", "mix", "run", "--no-halt"],
    env: [{'PORT', '#{port}'}]
  ])

{:os_pid, os_pid} = Port.info(server, :os_pid)
HTTPBench.await_health(port, server, System.monotonic_time(:millisecond) + 300_000)
HTTPBench.drain(server)
rss_loaded = HTTPBench.rss_mb(os_pid)
# The VM hands the load's garbage back to the OS over a few seconds: the RSS
# after load is read once it holds within 1% for 3 s (at most 60 s).
rss = HTTPBench.settled_rss(os_pid, rss_loaded, 0, 60)

# The load time from the service's log line (logged asynchronously).
HTTPBench.drain(server)

load_ms =
  case Regex.run(~r/catalogue loaded from .*: \d+ prices in (\d+) ms/, Process.get(:log, "")) do
    [_, ms] -> String.to_integer(ms)
    nil -> nil
  end

IO.puts(
  "# service: OS pid #{os_pid} (#{File.read!("/proc/#{os_pid}/comm") |> String.trim()}), port #{port}"
)

## The scenarios

bitmap = "/v1/search/bitmap/prices"
bulk = "/v5/search/bitmap/bulk/prices"

# Warm-up (not reported).
HTTPBench.wrk(port, bitmap, 1, "1s", "mixed.lua", [requests_file])

# Per scenario: name, path, connections, wrk script and arguments, searches
# per request, the Go figures as printed, and the Go figures per day (req/s,
# or searches/s for bulk) for the report, which marks them "not same run".
scenarios = [
  {"single request, 1 connection", bitmap, 1, "single.lua", [single_file], 1,
   "10,099 req/s, p99 201 us / 6,968 req/s, p99 635 us", [10_099, 6_968]},
  {"100 mixed requests, 1 connection", bitmap, 1, "mixed.lua", [requests_file], 1,
   "8,572 req/s, p99 235 us", [8_572]},
  {"100 mixed requests, 4 connections", bitmap, 4, "mixed.lua", [requests_file], 1,
   "44,148 req/s, p99 2.92 ms / 28,052 req/s, p99 3.35 ms", [44_148, 28_052]},
  {"bulk, 1,000 searches per request, 1 connection", bulk, 1, "bulk.lua", [requests_file, "1000"],
   1000, "145 req/s; 59k searches/s pinned", [59_000]}
]

results =
  for {name, path, conns, script, args, per_request, go, go_days} <- scenarios do
    HTTPBench.drain(server)
    r = HTTPBench.wrk(port, path, conns, duration, script, args)

    Map.merge(r, %{
      "scenario" => name,
      "searches_per_request" => per_request,
      "searches_per_s" => r["req_per_s"] * per_request,
      "go" => go,
      "go_days" => go_days
    })
  end

rss_after = HTTPBench.rss_mb(os_pid)
System.cmd("kill", ["-TERM", "#{os_pid}"])

receive do
  {^server, {:exit_status, status}} ->
    IO.puts("# service stopped on SIGTERM, exit status #{status}")
after
  30_000 -> IO.puts("# service did not stop within 30 s of SIGTERM")
end

File.rm_rf!(dir)

## Report

fmt = fn
  n when is_float(n) and n >= 100 -> n |> round() |> Integer.to_string()
  n when is_float(n) -> :erlang.float_to_binary(n, decimals: 1)
  n -> to_string(n)
end

us = fn us -> if us >= 1000, do: "#{fmt.(us / 1000)} ms", else: "#{us} us" end

IO.puts("""

Larder price search over HTTP: service on core 0 (#{vm_flags}), wrk -t1 on core 1, #{duration} each.
Go figures: the reference service on the same kind of 2-core machine (one
core, GOMAXPROCS=1), from earlier runs on two days, not measured in this run.
""")

IO.puts(
  String.pad_trailing("scenario", 48) <>
    String.pad_leading("req/s", 9) <>
    String.pad_leading("p50", 10) <>
    String.pad_leading("p99", 10) <>
    String.pad_leading("searches/s", 12) <> "   non-2xx  Go"
)

for r <- results do
  IO.puts(
    String.pad_trailing(r["scenario"], 48) <>
      String.pad_leading(fmt.(r["req_per_s"]), 9) <>
      String.pad_leading(us.(r["p50_us"]), 10) <>
      String.pad_leading(us.(r["p99_us"]), 10) <>
      String.pad_leading(fmt.(r["searches_per_s"]), 12) <>
      String.pad_leading("#{r["non_2xx"] + r["errors"]}", 10) <> "  " <> r["go"]
  )
end

IO.puts("""

service RSS after load: #{fmt.(rss)} MB once settled (#{fmt.(rss_loaded)} MB as loading ended), after the runs: #{fmt.(rss_after)} MB
  (Go: 126 MB live heap, which is not RSS)
load and index at start: #{if load_ms, do: "#{fmt.(load_ms / 1000)} s", else: "?"} (Go: 0.8-1.0 s)
""")

[single_r, _mixed1, mixed4, bulk_r] = results

targets = [
  {"100 mixed, 4 connections (req/s)", mixed4["req_per_s"], :>=, 22_000},
  {"single request, 1 connection (req/s)", single_r["req_per_s"], :>=, 10_000},
  {"p99, 100 mixed, 4 connections (ms)", mixed4["p99_us"] / 1000, :<=, 2.9},
  {"bulk, 1,000 per body (searches/s)", bulk_r["searches_per_s"], :>=, 150_000},
  {"RSS after load (MB)", rss, :<=, 300},
  {"start: load and index (s)", load_ms && load_ms / 1000, :<=, 3}
]

for {name, value, op, bar} <- targets do
  met = value != nil and apply(Kernel, op, [value, bar])
  IO.puts("target #{name}: #{fmt.(value)} #{op} #{bar}: #{if met, do: "met", else: "MISSED"}")
end

if path = opts[:json] do
  File.mkdir_p!(Path.dirname(path))

  # The report (make report) reads tables/rows/results, the shape of
  # bench/support/bench.ex's --json output: throughput (req/s, searches/s
  # for bulk) beside the Go figures, marked as not from this run, and
  # latency as p50 with its p99.
  go_columns = ["Go (not same run)", "Go, another day (not same run)"]

  throughput_rows =
    for r <- results do
      {value, unit} =
        if r["searches_per_request"] > 1,
          do: {r["searches_per_s"], "searches/s"},
          else: {r["req_per_s"], "req/s"}

      go =
        for {day, col} <- Enum.zip(r["go_days"], go_columns), into: %{} do
          {col,
           %{"kind" => "value", "value" => day, "unit" => unit, "reference" => "not same run"}}
        end

      %{
        "label" => r["scenario"],
        "results" => Map.put(go, "Larder", %{"kind" => "value", "value" => value, "unit" => unit})
      }
    end

  latency_rows =
    for r <- results do
      %{
        "label" => r["scenario"],
        "results" => %{
          "Larder" => %{
            "kind" => "time",
            "p50_us" => r["p50_us"],
            "p99_us" => r["p99_us"],
            "requests" => r["requests"]
          }
        }
      }
    end

  json = %{
    "title" => "price search over HTTP (wrk, service on one core)",
    "quick" => duration != "10s",
    "system" => "service: taskset -c 0, #{vm_flags}; wrk -t1 on core 1; #{duration} per scenario",
    "duration" => duration,
    "catalogue" => source,
    "rss_after_load_mb" => rss,
    "rss_as_loading_ended_mb" => rss_loaded,
    "rss_after_runs_mb" => rss_after,
    "load_ms" => load_ms,
    "scenarios" => results,
    "tables" => [
      %{
        "title" => "throughput (req/s; searches/s for bulk)",
        "anchor" => "Larder",
        "columns" => ["Larder" | go_columns],
        "rows" => throughput_rows
      },
      %{
        "title" => "latency (p50, bar to p99)",
        "anchor" => "Larder",
        "columns" => ["Larder"],
        "rows" => latency_rows
      }
    ],
    # name/value/bar, and what/measured/limit/status as the harness writes them.
    "targets" =>
      for(
        {name, value, op, bar} <- targets,
        do: %{
          "name" => name,
          "what" => name,
          "value" => value,
          "measured" => value,
          "op" => "#{op}",
          "bar" => bar,
          "limit" => bar,
          "status" =>
            cond do
              value == nil -> "n/a"
              apply(Kernel, op, [value, bar]) -> "ok"
              true -> "MISSED"
            end
        }
      )
  }

  File.write!(path, :jiffy.encode(json, [:pretty]))
  IO.puts("# wrote #{path}")
end
