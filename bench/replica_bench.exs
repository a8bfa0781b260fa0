# Larder.Replica (issue 19): a `prices` Redis Stream holding the 487,200-price
# catalogue (../shared/data/price-catalogue; the generated catalogue of the
# same shape when it is absent), followed into a `store:` Table:
#   * catch-up from zero: every entry to await(:latest), against
#     Larder.Table.insert_many/2 of the same records (already in memory)
#     in the same run, the anchor;
#   * restart from a snapshot (the whole catalogue) with 10,000 new entries
#     after it, from start_link/1 to await(:latest);
#   * lag under a producer of 10,000 entries/s: a marker price change XADDed
#     every 5 ms, timed from before its XADD until a search finds it (after
#     Replica.await/3 on its id; the producer and the probe run in processes
#     of their own, each on its own sample of 10,000 prices);
#   * the same lag through snapshots: the replica has a :snapshot path and
#     :snapshot_every of 3 s over a 12 s producer (so at least 3 snapshots
#     of the whole catalogue), and besides the markers' lag the longest gap
#     between two moves of the replica's offset while the producer runs
#     (from 300 ms after its start, when it and the probe have their
#     samples): a replica that stops applying for a dump shows it there.
#
#   mix run bench/replica_bench.exs [--quick] [--json PATH] [snapshots]
#
# --quick: 50,000 prices, one run each, a 2 s producer (4 s, snapshots every
# second, for the lag through snapshots). `snapshots`: that measurement
# alone, after the fill (it needs no other). Starts its own
# redis-server on a free loopback port (does nothing without one).

defmodule Larder.ReplicaBench do
  alias Larder.Bench
  alias Larder.Replica
  alias Larder.Test.RedisServer
  alias Larder.Table
  alias Larder.Test.Prices
  alias PriceCatalogue.Changes

  @store [:idx, :spec, :value, :currency, :is_default]
  @stream "prices"
  # Prices the lag's producer changes, and as many the probe changes.
  @sample 10_000
  # ms from the start of the producer to the start of the lag's measures
  # through snapshots (see lag_through_snapshots/2)
  @settle 300

  def run(argv) do
    bench = Bench.start("Larder.Replica: a Table fed from a Redis Stream", argv)

    if RedisServer.available?() do
      redis = RedisServer.start()
      dir = Path.join(System.tmp_dir!(), "larder-replica-bench-#{System.pid()}")
      File.mkdir_p!(dir)

      try do
        {source, prices, _requests} = PriceCatalogue.reference_or_generated()
        prices = Enum.take(prices, Bench.pick(bench, 50_000, length(prices)))
        client = Prices.connect(port: redis.port)
        {us, _} = :timer.tc(fn -> Prices.fill(client, @stream, prices) end)

        IO.puts(
          "\n#{length(prices)} prices of #{source} XADDed in #{Bench.fmt_us(us)} " <>
            "(#{round(length(prices) * 1_000_000 / us)} entries/s, pipelined)"
        )

        ctx = %{redis: redis, client: client, prices: prices, dir: dir}

        if "snapshots" in bench.argv do
          bench |> lag_through_snapshots(ctx) |> Bench.finish()
        else
          bench
          |> catch_up(ctx)
          |> restart(ctx)
          |> lag(ctx)
          |> lag_through_snapshots(ctx)
          |> Bench.finish()
        end

        :eredis.stop(client)
      after
        RedisServer.stop(redis)
        File.rm_rf(dir)
      end
    else
      IO.puts("\nredis-server is not installed: nothing to measure.")
    end
  end

  defp opts(ctx, extra \\ []) do
    Prices.replica_opts(
      :bench_replica,
      :bench_prices,
      [port: ctx.redis.port],
      @stream,
      extra
    )
  end

  defp start!(opts) do
    {:ok, pid} = Replica.start_link(opts)
    Process.unlink(pid)
    pid
  end

  defp kill(pid) do
    ref = Process.monitor(pid)
    Process.exit(pid, :kill)
    receive do: ({:DOWN, ^ref, _, _, _} -> :ok)
  end

  def catch_up(bench, ctx) do
    n = length(ctx.prices)
    title = "Catch-up from zero: #{n} entries into a store: Table"
    anchor = "Table.insert_many/2"
    col = "Replica, XREAD to await(:latest)"

    insert_many = fn ->
      table = Table.new(Prices.table_opts(store: @store))
      :ok = Table.insert_many(table, ctx.prices)
      Table.drop(table)
    end

    replica = fn ->
      pid = start!(opts(ctx))
      :ok = Replica.await(pid, :latest, :infinity)
      kill(pid)
    end

    bench =
      bench
      |> Bench.table(title, [anchor, col], per_op: true)
      |> Bench.row("#{n} records", %{anchor => insert_many, col => replica},
        runs: Bench.pick(bench, 1, 3),
        warmup: 0,
        ops: n,
        interleave: true
      )

    [%{results: results}] = Enum.find(bench.tables, &(&1.title == title)).rows

    bench
    |> Bench.target("catch-up from zero (entries/s)", results[col].ops_per_s, :>=, 200_000)
    |> Bench.target(
      "catch-up / insert_many/2 of the same records (x)",
      results[col].median_us / results[anchor].median_us,
      :<=,
      2
    )
  end

  def restart(bench, ctx) do
    path = Path.join(ctx.dir, "prices.snap")
    title = "Restart from a snapshot of #{length(ctx.prices)} prices, then 10,000 new entries"
    col = "start_link/1 to await(:latest)"
    prices = List.to_tuple(ctx.prices)
    snapshot_opts = opts(ctx, snapshot: path, snapshot_every: 86_400_000)

    # The snapshot covers the whole stream; then 10,000 entries are added.
    setup = fn ->
      pid = start!(snapshot_opts)
      :ok = Replica.await(pid, :latest, :infinity)
      {:ok, _} = Replica.dump(pid)
      kill(pid)
      Prices.add(ctx.client, @stream, for(_ <- 1..10_000, do: Changes.random(prices)))
      :ok
    end

    timed = fn _ ->
      pid = start!(snapshot_opts)
      :ok = Replica.await(pid, :latest, :infinity)
      kill(pid)
    end

    bench =
      bench
      |> Bench.table(title, [col])
      |> Bench.row("restart", %{col => timed},
        setup: setup,
        runs: Bench.pick(bench, 1, 5),
        warmup: 0
      )

    [%{results: %{^col => result}}] = Enum.find(bench.tables, &(&1.title == title)).rows

    Bench.target(
      bench,
      "restart + 10k entries, ready (s)",
      result.median_us / 1_000_000,
      :<=,
      0.5
    )
  end

  def lag(bench, ctx) do
    rate = 10_000
    duration = Bench.pick(bench, 2_000, 10_000)
    title = "Lag from XADD to a search, under a producer of #{rate} entries/s"
    col = "XADD to visible"
    # The producer and the probe change prices of two disjoint samples: a
    # process holding the whole catalogue (copied into it) would block a
    # scheduler for a fraction of a second at each garbage collection, and
    # a producer's change to a marker's price would hide the marker.
    {prices, markers} = ctx.prices |> Enum.take_random(2 * @sample) |> Enum.split(@sample)
    {prices, markers} = {List.to_tuple(prices), List.to_tuple(markers)}
    pid = start!(opts(ctx))
    :ok = Replica.await(pid, :latest, :infinity)
    producer_client = Prices.connect(port: ctx.redis.port)

    producer =
      Task.async(fn -> Prices.produce(producer_client, @stream, prices, rate, duration) end)

    deadline = System.monotonic_time(:millisecond) + duration
    client = ctx.client

    probe =
      Task.async(fn ->
        Prices.marker_lags(client, @stream, pid, :bench_prices, markers, deadline)
      end)

    samples = Task.await(probe, duration + 60_000)
    sent = Task.await(producer, duration + 60_000)
    kill(pid)
    :eredis.stop(producer_client)

    IO.puts("\n#{sent} entries produced in #{duration} ms; #{length(samples)} markers timed")
    {bench, result} = lag_table(bench, title, col, samples, "lag")

    Bench.target(bench, "lag p99 at #{rate} entries/s (ms)", result.p99_us / 1_000, :<=, 20)
  end

  def lag_through_snapshots(bench, ctx) do
    rate = 10_000
    duration = Bench.pick(bench, 4_000, 12_000)
    every = Bench.pick(bench, 1_000, 3_000)
    title = "Lag from XADD to a search through snapshots (every #{every} ms), #{rate} entries/s"
    col = "XADD to visible"
    {prices, markers} = ctx.prices |> Enum.take_random(2 * @sample) |> Enum.split(@sample)
    {prices, markers} = {List.to_tuple(prices), List.to_tuple(markers)}
    path = Path.join(ctx.dir, "lag.snap")
    File.rm(path)
    pid = start!(opts(ctx, snapshot: path, snapshot_every: every))
    :ok = Replica.await(pid, :latest, :infinity)

    producer_client = Prices.connect(port: ctx.redis.port)
    deadline = System.monotonic_time(:millisecond) + duration

    producer =
      Task.async(fn -> Prices.produce(producer_client, @stream, prices, rate, duration) end)

    client = ctx.client

    # The probe and the watcher measure from @settle ms on: starting the
    # producer and the probe copies their 10,000-price samples into them
    # (a 30-40 ms spawn, then their first collections), which stalled the
    # replica before any snapshot, in the bench's doing, not the replica's.
    probe =
      Task.async(fn ->
        Process.sleep(@settle)
        Prices.marker_lags(client, @stream, pid, :bench_prices, markers, deadline)
      end)

    Process.sleep(@settle)
    # Watches the replica's offset (one ETS read, no call) every millisecond
    # and the snapshot's dumps (a directory listing every 50 ms).
    watcher = Task.async(fn -> watch(pid, path, deadline) end)

    samples = Task.await(probe, duration + 60_000)
    sent = Task.await(producer, duration + 60_000)
    {gap_us, dumps} = Task.await(watcher, duration + 60_000)
    kill(pid)
    :eredis.stop(producer_client)
    gap = gap_us / 1_000

    IO.puts(
      "\n#{sent} entries produced in #{duration} ms; #{length(samples)} markers timed; " <>
        "#{dumps} snapshots written during the run; longest time the offset did not move " <>
        "#{Float.round(gap, 1)} ms"
    )

    {bench, result} = lag_table(bench, title, col, samples, "lag through snapshots")

    bench
    |> Bench.target("snapshots during the lag run", dumps, :>=, 3)
    |> Bench.target("lag p99 through snapshots (ms)", result.p99_us / 1_000, :<=, 20)
    |> Bench.target("longest time the offset did not move (ms)", gap, :<=, 50)
    |> Bench.target("longest lag through snapshots (ms)", Enum.max(samples) / 1_000, :<=, 50)
  end

  # The markers' lags (us) as a table of one row, and a line with their
  # median, p99 and max; returns the bench and their summary.
  defp lag_table(bench, title, col, samples, label) do
    result = Bench.summarize(samples, nil, 1)

    bench =
      bench
      |> Bench.table(title, [col])
      |> Bench.row("p50 / p99 over the markers", %{col => result})

    IO.puts(
      "#{label}: median #{Bench.fmt_us(result.median_us)}, " <>
        "p99 #{Bench.fmt_us(result.p99_us)}, max #{Bench.fmt_us(Enum.max(samples))}"
    )

    {bench, result}
  end

  # Until `deadline`: the longest time (us) between two moves of the
  # replica's offset, and how many dumps of `path` appeared.
  defp watch(pid, path, deadline) do
    now = System.monotonic_time(:microsecond)
    before = dumps(path)
    {gap, seen} = watch(pid, path, deadline, {Replica.offset(pid), now}, 0, before, now)
    {gap, MapSet.size(MapSet.difference(seen, before))}
  end

  defp watch(pid, path, deadline, {offset, since}, gap, dumps, listed) do
    now = System.monotonic_time(:microsecond)

    {dumps, listed} =
      if now - listed >= 50_000,
        do: {MapSet.union(dumps, dumps(path)), now},
        else: {dumps, listed}

    if div(now, 1_000) >= deadline do
      {max(gap, now - since), MapSet.union(dumps, dumps(path))}
    else
      {last, gap} =
        case Replica.offset(pid) do
          ^offset -> {{offset, since}, gap}
          moved -> {{moved, now}, max(gap, now - since)}
        end

      receive do
      after
        1 -> :ok
      end

      watch(pid, path, deadline, last, gap, dumps, listed)
    end
  end

  # The dumps of the snapshot at `path` now (each snapshot writes one).
  defp dumps(path) do
    prefix = Path.basename(path) <> "."

    case File.ls(Path.dirname(path)) do
      {:ok, names} ->
        for name <- names,
            String.starts_with?(name, prefix),
            String.ends_with?(name, ".dump"),
            into: MapSet.new(),
            do: name

      {:error, _} ->
        MapSet.new()
    end
  end
end

Larder.ReplicaBench.run(System.argv())
