# The price search service under wrk, beside the Go reference service
# measured in the same run: each service on core 0 with one scheduler
# (taskset -c 0, +S 1 / GOMAXPROCS=1), then on both cores (+S 2 /
# GOMAXPROCS=2); wrk -t1 pinned on core 1; four scenarios of DURATION
# (default 10s), ours and Go's interleaved scenario by scenario, ROUNDS
# times (default 5), the order of the two swapped every round (ours first
# in odd rounds, Go's in even ones) so that a drift in the machine's load
# falls on both.
#
# Every round is printed. A scenario's figure is the median of its rounds,
# with the min-max spread beside it; the ratio ours / Go is judged on the
# medians and on every round (round i of ours over round i of Go's, run
# back to back), and the p99 on the median of the rounds' p99s.
#
# What "2 cores" means here. The machine has two cores and wrk needs one:
# on 2 cores the service gets both cores and wrk stays pinned on core 1,
# so the client takes part of the second core from the service. That is
# the same for both services (Go's runtime and the BEAM each see 2 cores,
# GOMAXPROCS=2 / +S 2, and share core 1 with the same wrk), which is what
# makes the ratio fair; the absolute req/s are not those of a 2-core server
# with its client on another machine. wrk is pinned rather than left to the
# kernel so that it never moves onto core 0 and the two services see the
# same placement from run to run. The rounds' spread says how far one
# round can be trusted on a loaded machine; the load average (/proc/loadavg)
# is printed at the start and at the end.
#
# Prints req/s, p50, p99, searches/s for bulk, the ratios to Go, and the
# service's RSS after load. Then, on one core, it holds IDLE (default
# 10,000) idle connections to ours and, a second later, times 20 /health and
# 20 searches on fresh connections (target: the slowest <= 100 ms); this needs
# a file descriptor limit above IDLE (make bench-http raises the soft limit
# to the hard one).
#
# Go is measured when GO_BIN names the reference service's binary, built by
# you from marniks7/bitmap-usage (it is started with ROARING32=true and
# ADDR=127.0.0.1:<free port>); without it only ours is measured, and the
# bench says so.
#
#   make bench-http GO_BIN=/path/to/bitmap-usage-binary   # from the Larder root
#   GO_BIN=... DURATION=2s ROUNDS=3 mix run --no-start bench/http_bench.exs [--json PATH]
#   IDLE=2000 DURATION=1s ...           # a quick check
#   CORES=2 ...                         # only the 2-core runs (CORES=1: only 1 core)
alias PriceCatalogue, as: Catalogue

# One scheduler; no scheduler spins waiting for work, as the dirty
# schedulers' spinning would take the one core from the scheduler serving.
vm_flags = fn cores -> "+S #{cores} +sbwt none +sbwtdcpu none +sbwtdio none" end

defmodule HTTPBench do
  def free_port do
    {:ok, socket} = :gen_tcp.listen(0, ip: {127, 0, 0, 1})
    {:ok, port} = :inet.port(socket)
    :gen_tcp.close(socket)
    port
  end

  # Ours answers /health once loaded; Go listens only once loaded, and
  # answers a search then.
  def await_ready(port, server, probe, deadline) do
    request =
      case probe do
        :health ->
          {:get, {'http://127.0.0.1:#{port}/health', []}}

        {:post, body} ->
          {:post,
           {'http://127.0.0.1:#{port}/v1/search/bitmap/prices', [], 'application/json', body}}
      end

    case :httpc.request(elem(request, 0), elem(request, 1), [timeout: 1_000], []) do
      {:ok, {{_, 200, _}, _, _}} ->
        :ok

      _ ->
        drain(server)
        if System.monotonic_time(:millisecond) > deadline, do: raise("the service did not load")
        Process.sleep(200)
        await_ready(port, server, probe, deadline)
    end
  end

  # The service's log goes to our stdout, and is kept for its load line.
  def drain(server) do
    receive do
      {^server, {:data, data}} ->
        if Process.get({:echo, server}, true), do: IO.write(data)
        Process.put({:log, server}, Process.get({:log, server}, "") <> data)
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

  # Holds `n` idle connections to the service, then times `probes` fresh
  # requests to /health and to a search while they are held; the answer
  # is {connections held, the slowest /health in ms, the slowest search}.
  # A probe that gets no 200 within 5 s counts as 5,000 ms.
  def idle_probe(port, n, probes, body) do
    held = hold(port, n, [])
    # The kernel completes connections before the service accepts them: the
    # probes start once the service has had a second to accept the held ones
    # (held, not a burst of new connections, is what is measured).
    Process.sleep(1_000)

    time = fn request ->
      for _ <- 1..probes do
        t0 = System.monotonic_time(:microsecond)

        ok =
          with {:ok, s} <-
                 :gen_tcp.connect({127, 0, 0, 1}, port, [:binary, active: false], 5_000),
               :ok <- :gen_tcp.send(s, request),
               {:ok, "HTTP/1.1 200" <> _} <- :gen_tcp.recv(s, 0, 5_000) do
            :gen_tcp.close(s)
            true
          else
            _ -> false
          end

        if ok, do: (System.monotonic_time(:microsecond) - t0) / 1000, else: 5_000.0
      end
      |> Enum.max()
    end

    health = time.("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")

    search =
      time.(
        "POST /v1/search/bitmap/prices HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" <>
          "Content-Type: application/json\r\nContent-Length: #{byte_size(body)}\r\n\r\n" <> body
      )

    Enum.each(held, &:gen_tcp.close/1)
    {length(held), health, search}
  end

  defp hold(_port, 0, acc), do: acc

  defp hold(port, n, acc) do
    case :gen_tcp.connect({127, 0, 0, 1}, port, [:binary, active: false], 5_000) do
      {:ok, s} -> hold(port, n - 1, [s | acc])
      # Out of file descriptors (ulimit -n): hold what we have.
      {:error, _} -> acc
    end
  end

  def wrk(port, path, connections, duration, script, args) do
    script = Path.join(__DIR__, script)
    url = "http://127.0.0.1:#{port}#{path}"

    {out, _} =
      System.cmd(
        "taskset",
        ["-c", "1", "wrk", "-t1", "-c#{connections}", "-d#{duration}", "--latency", "-s"] ++
          [script, url, "--" | args],
        stderr_to_stdout: true
      )

    [_, json] = Regex.run(~r/WRK_JSON (\{.*\})/, out) || raise("wrk failed: #{out}")
    r = :jiffy.decode(json, [:return_maps])
    Map.put(r, "req_per_s", r["requests"] / (r["duration_us"] / 1_000_000))
  end
end

{opts, _, _} = OptionParser.parse(System.argv(), strict: [json: :string])
duration = System.get_env("DURATION", "10s")
rounds = String.to_integer(System.get_env("ROUNDS", "5"))

core_counts =
  case System.get_env("CORES") do
    nil -> [1, 2]
    "1" -> [1]
    "2" -> [2]
  end

loadavg = fn ->
  "/proc/loadavg" |> File.read!() |> String.split() |> Enum.take(3) |> Enum.join(" ")
end

load_at_start = loadavg.()
go_bin = System.get_env("GO_BIN")
idle_connections = String.to_integer(System.get_env("IDLE", "10000"))

if go_bin && !File.exists?(go_bin), do: raise("GO_BIN #{go_bin} does not exist")
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

IO.puts(
  if go_bin,
    do: "# Go reference: #{go_bin} (ROARING32=true), measured in this run",
    else: "# Go reference: not measured (set GO_BIN to the binary you built)"
)

## The services

elixir = System.find_executable("elixir")
taskset = System.find_executable("taskset")
single_body = File.read!(single_file)

cpus = fn
  1 -> "0"
  2 -> "0,1"
end

start = fn
  :larder, cores ->
    port = HTTPBench.free_port()

    server =
      Port.open({:spawn_executable, taskset}, [
        :binary,
        :exit_status,
        :stderr_to_stdout,
        args: [
          "-c",
          cpus.(cores),
          elixir,
          "--erl",
          vm_flags.(cores),
          "-S",
          "mix",
          "run",
          "--no-halt"
        ],
        env: [{'PORT', '#{port}'}]
      ])

    HTTPBench.await_ready(port, server, :health, System.monotonic_time(:millisecond) + 300_000)
    {server, port}

  :go, cores ->
    port = HTTPBench.free_port()

    server =
      Port.open({:spawn_executable, taskset}, [
        :binary,
        :exit_status,
        :stderr_to_stdout,
        args: ["-c", cpus.(cores), go_bin],
        env: [
          {'ROARING32', 'true'},
          {'ADDR', '127.0.0.1:#{port}'},
          {'GOMAXPROCS', '#{cores}'},
          {'LOGGING_LEVEL', 'warn'}
        ]
      ])

    # Go logs each request it cannot answer: kept, not echoed.
    Process.put({:echo, server}, false)

    HTTPBench.await_ready(
      port,
      server,
      {:post, single_body},
      System.monotonic_time(:millisecond) + 300_000
    )

    {server, port}
end

stop = fn {server, _port} ->
  {:os_pid, os_pid} = Port.info(server, :os_pid)
  System.cmd("kill", ["-TERM", "#{os_pid}"])

  receive do
    {^server, {:exit_status, _}} -> :ok
  after
    30_000 -> System.cmd("kill", ["-KILL", "#{os_pid}"])
  end

  HTTPBench.drain(server)
end

bitmap = "/v1/search/bitmap/prices"
bulk = "/v5/search/bitmap/bulk/prices"

# Per scenario: name, path, connections, wrk script and arguments, searches
# per request.
scenarios = [
  {"single request, 1 connection", bitmap, 1, "single.lua", [single_file], 1},
  {"100 mixed requests, 1 connection", bitmap, 1, "mixed.lua", [requests_file], 1},
  {"100 mixed requests, 4 connections", bitmap, 4, "mixed.lua", [requests_file], 1},
  {"bulk, 1,000 searches per request, 1 connection", bulk, 1, "bulk.lua", [requests_file, "1000"],
   1000}
]

services = if go_bin, do: [:larder, :go], else: [:larder]

median = fn xs ->
  sorted = Enum.sort(xs)
  n = length(sorted)

  if rem(n, 2) == 1,
    do: Enum.at(sorted, div(n, 2)),
    else: (Enum.at(sorted, div(n, 2) - 1) + Enum.at(sorted, div(n, 2))) / 2
end

# A service's figure over its rounds (in round order): the median req/s
# (searches/s), p50 and p99, the min-max of req/s, and the errors of all.
summary = fn runs ->
  req = Enum.map(runs, & &1["req_per_s"])

  %{
    "req_per_s" => median.(req),
    "searches_per_s" => median.(Enum.map(runs, & &1["searches_per_s"])),
    "p50_us" => median.(Enum.map(runs, & &1["p50_us"])),
    "p99_us" => median.(Enum.map(runs, & &1["p99_us"])),
    "min_req_per_s" => Enum.min(req),
    "max_req_per_s" => Enum.max(req),
    "requests" => Enum.sum(Enum.map(runs, & &1["requests"])),
    "non_2xx" => Enum.sum(Enum.map(runs, & &1["non_2xx"])),
    "errors" => Enum.sum(Enum.map(runs, & &1["errors"]))
  }
end

fmt = fn
  nil -> "-"
  n when is_float(n) and n >= 100 -> n |> round() |> Integer.to_string()
  n when is_float(n) and n < 10 -> :erlang.float_to_binary(n, decimals: 2)
  n when is_float(n) -> :erlang.float_to_binary(n, decimals: 1)
  n -> to_string(n)
end

us = fn us -> if us >= 1000, do: "#{fmt.(us / 1000)} ms", else: "#{fmt.(us)} us" end

ratio = fn
  nil -> "-"
  x -> "#{:erlang.float_to_binary(x, decimals: 2)}x"
end

IO.puts("# load average at start: #{load_at_start}")

{results, rss} =
  Enum.map_reduce(core_counts, %{}, fn cores, rss ->
    running = Map.new(services, &{&1, start.(&1, cores)})
    {larder_server, _} = running.larder
    {:os_pid, os_pid} = Port.info(larder_server, :os_pid)
    HTTPBench.drain(larder_server)
    rss_loaded = HTTPBench.rss_mb(os_pid)

    # The VM hands the load's garbage back to the OS over a few seconds: the
    # RSS after load is read once it holds within 1% for 3 s (at most 60 s).
    rss_settled = if cores == 1, do: HTTPBench.settled_rss(os_pid, rss_loaded, 0, 60), else: nil

    load_ms =
      case Regex.run(
             ~r/catalogue loaded from .*: \d+ prices in (\d+) ms/,
             Process.get({:log, larder_server}, "")
           ) do
        [_, ms] -> String.to_integer(ms)
        nil -> nil
      end

    # Warm-up (not reported).
    for {_, {_, port}} <- running,
        do: HTTPBench.wrk(port, bitmap, 1, "1s", "mixed.lua", [requests_file])

    rows =
      for {name, path, conns, script, args, per_request} <- scenarios do
        label = "#{name} (#{cores} core#{if cores > 1, do: "s"})"

        per_round =
          for round <- 1..rounds do
            order = if rem(round, 2) == 1, do: services, else: Enum.reverse(services)

            by_service =
              Map.new(order, fn service ->
                {server, port} = running[service]
                HTTPBench.drain(server)
                r = HTTPBench.wrk(port, path, conns, duration, script, args)
                {service, Map.put(r, "searches_per_s", r["req_per_s"] * per_request)}
              end)

            l = by_service.larder
            g = by_service[:go]

            IO.puts(
              "#   #{label}, round #{round}: ours #{fmt.(l["req_per_s"])} req/s p99 #{us.(l["p99_us"])}" <>
                if(g,
                  do:
                    ", Go #{fmt.(g["req_per_s"])} req/s p99 #{us.(g["p99_us"])}, " <>
                      ratio.(l["req_per_s"] / g["req_per_s"]),
                  else: ""
                ) <> " (load #{loadavg.()})"
            )

            by_service
          end

        runs = Map.new(services, fn s -> {s, Enum.map(per_round, & &1[s])} end)
        measured = Map.new(runs, fn {service, rs} -> {service, summary.(rs)} end)

        round_ratios =
          if go_bin,
            do: Enum.map(per_round, &(&1.larder["req_per_s"] / &1.go["req_per_s"])),
            else: []

        %{
          "scenario" => name,
          "cores" => cores,
          "searches_per_request" => per_request,
          "larder" => measured.larder,
          "go" => measured[:go],
          "ratio" => measured[:go] && measured.larder["req_per_s"] / measured.go["req_per_s"],
          "round_ratios" => round_ratios,
          "rounds" => runs |> Map.new(fn {s, rs} -> {s, Enum.map(rs, & &1["req_per_s"])} end),
          "rounds_p99_us" => runs |> Map.new(fn {s, rs} -> {s, Enum.map(rs, & &1["p99_us"])} end)
        }
      end

    rss_after = HTTPBench.rss_mb(os_pid)

    # Idle connections held (issue 18): ours only, on one core.
    idle =
      if cores == 1 do
        {_, port} = running.larder
        HTTPBench.idle_probe(port, idle_connections, 20, single_body)
      end

    Enum.each(running, fn {_, service} -> stop.(service) end)

    rss =
      if cores == 1,
        do: %{
          loaded: rss_loaded,
          settled: rss_settled,
          after: rss_after,
          load_ms: load_ms,
          idle: idle
        },
        else: rss

    {rows, rss}
  end)

results = List.flatten(results)
File.rm_rf!(dir)

## Report

load_at_end = loadavg.()

IO.puts("""

Larder price search over HTTP: service on core 0 (1 core) or cores 0-1 (2 cores),
wrk -t1 pinned on core 1, #{duration} each, #{rounds} round(s), ours and Go's interleaved
(the order swapped every round); medians of the rounds, req/s min-max beside them;
ours/Go on the medians, and its lowest and highest over the rounds (round i of each).
Load average: #{load_at_start} at start, #{load_at_end} at end.
#{if go_bin, do: "Go: #{go_bin}, ROARING32=true, GOMAXPROCS = cores, measured in this run.", else: "Go: not measured in this run (GO_BIN not set)."}
""")

IO.puts(
  String.pad_trailing("scenario", 56) <>
    String.pad_leading("req/s", 9) <>
    String.pad_leading("p50", 10) <>
    String.pad_leading("p99", 10) <>
    String.pad_leading("non-2xx", 8) <>
    String.pad_leading("Go req/s", 10) <>
    String.pad_leading("Go p99", 10) <>
    String.pad_leading("ours/Go", 9) <>
    "  ours min-max / Go min-max, ratio per round min-max"
)

for r <- results do
  l = r["larder"]
  g = r["go"]

  IO.puts(
    String.pad_trailing("#{r["scenario"]} (#{r["cores"]} core#{if r["cores"] > 1, do: "s"})", 56) <>
      String.pad_leading(fmt.(l["req_per_s"]), 9) <>
      String.pad_leading(us.(l["p50_us"]), 10) <>
      String.pad_leading(us.(l["p99_us"]), 10) <>
      String.pad_leading("#{l["non_2xx"] + l["errors"]}", 8) <>
      String.pad_leading(if(g, do: fmt.(g["req_per_s"]), else: "-"), 10) <>
      String.pad_leading(if(g, do: us.(g["p99_us"]), else: "-"), 10) <>
      String.pad_leading(ratio.(r["ratio"]), 9) <>
      "  #{fmt.(l["min_req_per_s"])}-#{fmt.(l["max_req_per_s"])}" <>
      if(g,
        do:
          " / #{fmt.(g["min_req_per_s"])}-#{fmt.(g["max_req_per_s"])}, " <>
            "#{ratio.(Enum.min(r["round_ratios"]))}-#{ratio.(Enum.max(r["round_ratios"]))}",
        else: ""
      )
  )
end

one_core? = 1 in core_counts

if one_core? do
  {idle_held, idle_health, idle_search} = rss.idle

  IO.puts("""

  service RSS after load: #{fmt.(rss.settled)} MB once settled (#{fmt.(rss.loaded)} MB as loading ended), after the 1-core runs: #{fmt.(rss.after)} MB
  load and index at start: #{if rss.load_ms, do: "#{fmt.(rss.load_ms / 1000)} s", else: "?"}
  """)

  IO.puts(
    "#{idle_held} idle connections held (of #{idle_connections} asked; 1 core): " <>
      "slowest of 20 /health #{fmt.(idle_health)} ms, of 20 searches #{fmt.(idle_search)} ms\n"
  )
end

find = fn name, cores ->
  Enum.find(results, &(&1["scenario"] =~ name and &1["cores"] == cores))
end

one_core_targets =
  if one_core? do
    mixed4 = find.("4 connections", 1)
    {idle_held, idle_health, idle_search} = rss.idle

    [
      {"100 mixed, 4 connections, 1 core (req/s)", mixed4["larder"]["req_per_s"], :>=, 22_000},
      {"single request, 1 connection (req/s)", find.("single", 1)["larder"]["req_per_s"], :>=,
       10_000},
      {"p99, 100 mixed, 4 connections (ms)", mixed4["larder"]["p99_us"] / 1000, :<=, 2.9},
      {"bulk, 1,000 per body (searches/s)", find.("bulk", 1)["larder"]["searches_per_s"], :>=,
       150_000},
      {"RSS after load (MB)", rss.settled, :<=, 300},
      {"start: load and index (s)", rss.load_ms && rss.load_ms / 1000, :<=, 3},
      {"#{idle_held} idle connections held: /health and a search latency (ms)",
       max(idle_health, idle_search), :<=, 100}
    ]
  else
    []
  end

# Issue 28: every scenario, on 1 and 2 cores, >= 1.2x Go's req/s in every
# round (the lowest round's ratio), and a better p99 (medians of the rounds).
go_targets =
  if go_bin do
    for r <- results, cores = "#{r["cores"]} core#{if r["cores"] > 1, do: "s"}" do
      [
        {"#{r["scenario"]}, #{cores}: ours / Go, lowest round", Enum.min(r["round_ratios"]), :>=,
         1.2},
        {"#{r["scenario"]}, #{cores}: p99 ours / Go", r["larder"]["p99_us"] / r["go"]["p99_us"],
         :<, 1.0}
      ]
    end
    |> List.flatten()
  else
    []
  end

targets = one_core_targets ++ go_targets

for {name, value, op, bar} <- targets do
  met = value != nil and apply(Kernel, op, [value, bar])
  IO.puts("target #{name}: #{fmt.(value)} #{op} #{bar}: #{if met, do: "met", else: "MISSED"}")
end

if !go_bin, do: IO.puts("target ours / Go (>= 1.2x): not measured, GO_BIN not set")

if path = opts[:json] do
  File.mkdir_p!(Path.dirname(path))

  # The report (make report) reads tables/rows/results, the shape of
  # bench/support/bench.ex's --json output: throughput (req/s, searches/s for
  # bulk) beside Go's from this run, and latency as p50 with its p99.
  value = fn r, unit ->
    v = if unit == "searches/s", do: r["searches_per_s"], else: r["req_per_s"]
    %{"kind" => "value", "value" => v, "unit" => unit}
  end

  tables =
    for cores <- core_counts do
      rows = Enum.filter(results, &(&1["cores"] == cores))

      [
        %{
          "title" => "throughput, #{cores} core(s) (req/s; searches/s for bulk)",
          "anchor" => if(go_bin, do: "Go (same run)", else: "Larder"),
          "columns" => if(go_bin, do: ["Larder", "Go (same run)"], else: ["Larder"]),
          "rows" =>
            for r <- rows do
              unit = if r["searches_per_request"] > 1, do: "searches/s", else: "req/s"
              results = %{"Larder" => value.(r["larder"], unit)}

              results =
                if r["go"],
                  do: Map.put(results, "Go (same run)", value.(r["go"], unit)),
                  else: results

              %{"label" => r["scenario"], "results" => results}
            end
        },
        %{
          "title" => "latency, #{cores} core(s) (p50, bar to p99)",
          "anchor" => "Larder",
          "columns" => if(go_bin, do: ["Larder", "Go (same run)"], else: ["Larder"]),
          "rows" =>
            for r <- rows do
              time = fn m ->
                %{
                  "kind" => "time",
                  "p50_us" => m["p50_us"],
                  "p99_us" => m["p99_us"],
                  "requests" => m["requests"]
                }
              end

              results = %{"Larder" => time.(r["larder"])}

              results =
                if r["go"], do: Map.put(results, "Go (same run)", time.(r["go"])), else: results

              %{"label" => r["scenario"], "results" => results}
            end
        }
      ]
    end
    |> List.flatten()

  json = %{
    "title" =>
      "price search over HTTP (wrk; Go #{if go_bin, do: "measured in the same run", else: "not measured"})",
    "quick" => duration != "10s",
    "system" =>
      "service: taskset -c 0 (or 0,1), #{vm_flags.(1)} (or +S 2); wrk -t1 pinned on core 1; #{duration} per scenario, #{rounds} rounds, medians",
    "duration" => duration,
    "rounds" => rounds,
    "go_measured" => go_bin != nil,
    "catalogue" => source,
    "load_average" => %{"start" => load_at_start, "end" => load_at_end},
    "rss_after_load_mb" => rss[:settled],
    "rss_as_loading_ended_mb" => rss[:loaded],
    "rss_after_runs_mb" => rss[:after],
    "load_ms" => rss[:load_ms],
    "idle_connections" =>
      case rss[:idle] do
        {held, health, search} ->
          %{
            "asked" => idle_connections,
            "held" => held,
            "health_max_ms" => health,
            "search_max_ms" => search
          }

        nil ->
          nil
      end,
    "scenarios" => results,
    "tables" => tables,
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
