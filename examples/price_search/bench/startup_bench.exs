# The price search service's start-up: `make serve` (in the Larder root;
# the application already compiled, as on a restart) from spawn to the
# first 200 on GET /health, cold (no snapshot: the CSV is parsed and indexed, then the
# snapshot written) and warm (the snapshot loaded), each RUNS times (default
# 3), with the service's RSS when /health first answers; then
# Larder.Table.load/2 of the 487,200-price snapshot against its anchor,
# Larder.Table.insert_many/2 of the same prices already in memory.
# Targets (issue 18): warm <= 1.5 s (Go restarts in 0.96 s, a remembered
# figure), cold <= 2.5 s, Table.load/2 <= 0.3 s, RSS <= 400 MB.
#
#   make bench-startup                   # from the Larder root
#   RUNS=3 mix run --no-start bench/startup_bench.exs [--json PATH]
alias Larder.Table

defmodule StartupBench do
  @root Path.expand("../../..", __DIR__)

  def free_port do
    {:ok, socket} = :gen_tcp.listen(0, ip: {127, 0, 0, 1})
    {:ok, port} = :inet.port(socket)
    :gen_tcp.close(socket)
    port
  end

  # Polls /health every 10 ms over a raw socket (no client start-up in the
  # measured span); returns the ms since `t0`.
  def await_health(port, t0, deadline) do
    with {:ok, s} <- :gen_tcp.connect({127, 0, 0, 1}, port, [:binary, active: false], 100),
         :ok <- :gen_tcp.send(s, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
         {:ok, "HTTP/1.1 200" <> _} <- :gen_tcp.recv(s, 0, 1_000) do
      :gen_tcp.close(s)
      System.monotonic_time(:millisecond) - t0
    else
      _ ->
        if System.monotonic_time(:millisecond) > deadline, do: raise("no 200 on /health")
        Process.sleep(10)
        await_health(port, t0, deadline)
    end
  end

  # The VM that `make serve` execs, among the descendants of `os_pid`.
  def beam(os_pid) do
    children =
      case File.read("/proc/#{os_pid}/task/#{os_pid}/children") do
        {:ok, text} -> text |> String.split() |> Enum.map(&String.to_integer/1)
        _ -> []
      end

    if File.read("/proc/#{os_pid}/comm") == {:ok, "beam.smp\n"},
      do: os_pid,
      else: Enum.find_value(children, &beam/1)
  end

  def rss_mb(os_pid) do
    "/proc/#{os_pid}/status"
    |> File.read!()
    |> then(&Regex.run(~r/VmRSS:\s+(\d+) kB/, &1))
    |> then(fn [_, kb] -> String.to_integer(kb) / 1024 end)
  end

  # Starts the service; returns {ms to the first 200, RSS then in MB, port}.
  def start(snapshot_dir, wait_for_snapshot?) do
    port = free_port()
    t0 = System.monotonic_time(:millisecond)

    server =
      Port.open({:spawn_executable, System.find_executable("make")}, [
        :binary,
        :exit_status,
        :stderr_to_stdout,
        args: ["-s", "-C", @root, "serve"],
        env: [
          {'PORT', '#{port}'},
          {'MIX_ENV', 'dev'},
          {'PRICE_SEARCH_SNAPSHOT_DIR', String.to_charlist(snapshot_dir)}
        ]
      ])

    ms = await_health(port, t0, t0 + 120_000)
    {:os_pid, make_pid} = Port.info(server, :os_pid)
    os_pid = beam(make_pid) || raise("no VM under make serve")
    rss = rss_mb(os_pid)
    log = collect(server, wait_for_snapshot?, "")
    stop(server, os_pid)
    {ms, rss, log}
  end

  # The service's log, until its "loaded" line (and the snapshot written, when asked).
  defp collect(server, wait?, acc) do
    receive do
      {^server, {:data, data}} ->
        acc = acc <> data

        done? =
          String.contains?(acc, "catalogue loaded") and
            (not wait? or String.contains?(acc, "snapshot written"))

        if done?, do: acc, else: collect(server, wait?, acc)
    after
      if(wait?, do: 60_000, else: 2_000) -> acc
    end
  end

  defp stop(server, os_pid) do
    System.cmd("kill", ["#{os_pid}"])

    receive do
      {^server, {:exit_status, _}} -> :ok
    after
      10_000 -> System.cmd("kill", ["-9", "#{os_pid}"])
    end
  end

  def median(list), do: list |> Enum.sort() |> Enum.at(div(length(list), 2))
end

{opts, _, _} = OptionParser.parse(System.argv(), strict: [json: :string])
runs = String.to_integer(System.get_env("RUNS", "3"))
dir = Path.join(System.tmp_dir!(), "price_search_startup_bench_#{System.pid()}")
csv = Path.join(PriceCatalogue.default_dir(), "prices-487k.csv.gz")
unless File.exists?(csv), do: raise("the reference catalogue #{csv} is needed")

IO.puts("start-up of `make serve` to the first 200 on /health (#{runs} runs each)")

cold =
  for _ <- 1..runs do
    File.rm_rf!(dir)
    {ms, rss, log} = StartupBench.start(dir, true)
    unless log =~ "(csv)", do: raise("a cold start did not load the CSV:\n" <> log)
    {ms, rss}
  end

warm =
  for _ <- 1..runs do
    {ms, rss, log} = StartupBench.start(dir, false)
    unless log =~ "(snapshot)", do: raise("a warm start did not load the snapshot:\n" <> log)
    {ms, rss}
  end

# Table.load/2 in this VM, against inserting the same prices. The script
# runs with --no-start (the service under test is another OS process):
# Larder's tables need its application.
{:ok, _} = Application.ensure_all_started(:larder)
[table_file] = Path.wildcard(Path.join(dir, "*.table"))
table_opts = PriceSearch.Store.table_opts()
{:ok, prices} = PriceCatalogue.load(csv)

time = fn fun ->
  for _ <- 1..runs do
    {us, table} = :timer.tc(fun)
    Table.drop(table)
    :erlang.garbage_collect()
    us / 1000
  end
end

loads = time.(fn -> Table.load!(table_file, table_opts) end)

inserts =
  time.(fn ->
    table = Table.new(table_opts)
    :ok = Table.insert_many(table, prices)
    table
  end)

File.rm_rf!(dir)

row = fn name, ms, target -> :io.format("~-44s ~10.1f ~12s~n", [name, ms * 1.0, target]) end
:io.format("~-44s ~10s ~12s~n", ["", "median", "target"])

row.(
  "cold start to /health 200, ms",
  StartupBench.median(Enum.map(cold, &elem(&1, 0))),
  "<= 2500"
)

row.(
  "warm start (snapshot) to /health 200, ms",
  StartupBench.median(Enum.map(warm, &elem(&1, 0))),
  "<= 1500"
)

row.("RSS at first 200, cold, MB", StartupBench.median(Enum.map(cold, &elem(&1, 1))), "<= 400")
row.("RSS at first 200, warm, MB", StartupBench.median(Enum.map(warm, &elem(&1, 1))), "<= 400")
row.("Table.load/2 of 487,200 prices, ms", StartupBench.median(loads), "<= 300")
row.("anchor: Table.insert_many/2 of them, ms", StartupBench.median(inserts), "")

:io.format("~-44s ~10.2f~n", [
  "Table.load/2 / insert_many/2",
  StartupBench.median(loads) / StartupBench.median(inserts)
])

if path = opts[:json] do
  File.write!(
    path,
    :jiffy.encode(%{
      cold_ms: Enum.map(cold, &elem(&1, 0)),
      warm_ms: Enum.map(warm, &elem(&1, 0)),
      cold_rss_mb: Enum.map(cold, &elem(&1, 1)),
      warm_rss_mb: Enum.map(warm, &elem(&1, 1)),
      table_load_ms: loads,
      insert_many_ms: inserts
    })
  )
end
