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
#     of their own, each on its own sample of 10,000 prices).
#
#   mix run bench/replica_bench.exs [--quick] [--json PATH]
#
# --quick: 50,000 prices, one run each, a 2 s producer. Starts its own
# redis-server on a free loopback port (does nothing without one).
Code.require_file("../examples/price_search/lib/price_search/catalogue.ex", __DIR__)
Code.require_file("../examples/price_search/lib/price_search/price_stream.ex", __DIR__)

defmodule Larder.ReplicaBench do
  alias Larder.Bench
  alias Larder.Replica
  alias Larder.Support.RedisServer
  alias Larder.Table
  alias PriceSearch.{Catalogue, PriceStream}

  @store [:idx, :spec, :value, :currency, :is_default]
  @stream "prices"
  # Prices the lag's producer changes, and as many the probe changes.
  @sample 10_000

  def run(argv) do
    bench = Bench.start("Larder.Replica: a Table fed from a Redis Stream", argv)

    if RedisServer.available?() do
      redis = RedisServer.start()
      dir = Path.join(System.tmp_dir!(), "larder-replica-bench-#{System.pid()}")
      File.mkdir_p!(dir)

      try do
        {source, prices, _requests} = Catalogue.reference_or_generated()
        prices = Enum.take(prices, Bench.pick(bench, 50_000, length(prices)))
        client = PriceStream.connect(port: redis.port)
        {us, _} = :timer.tc(fn -> PriceStream.fill(client, @stream, prices) end)

        IO.puts(
          "\n#{length(prices)} prices of #{source} XADDed in #{Bench.fmt_us(us)} " <>
            "(#{round(length(prices) * 1_000_000 / us)} entries/s, pipelined)"
        )

        ctx = %{redis: redis, client: client, prices: prices, dir: dir}

        bench
        |> catch_up(ctx)
        |> restart(ctx)
        |> lag(ctx)
        |> Bench.finish()

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
    PriceStream.replica_opts(
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
      table = Table.new(Catalogue.table_opts(store: @store))
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
      PriceStream.add(ctx.client, @stream, for(_ <- 1..10_000, do: PriceStream.change(prices)))
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
    producer_client = PriceStream.connect(port: ctx.redis.port)

    producer =
      Task.async(fn -> PriceStream.produce(producer_client, @stream, prices, rate, duration) end)

    deadline = System.monotonic_time(:millisecond) + duration
    client = ctx.client

    probe =
      Task.async(fn ->
        PriceStream.marker_lags(client, @stream, pid, :bench_prices, markers, deadline)
      end)

    samples = Task.await(probe, duration + 60_000)
    sent = Task.await(producer, duration + 60_000)
    kill(pid)
    :eredis.stop(producer_client)

    IO.puts("\n#{sent} entries produced in #{duration} ms; #{length(samples)} markers timed")
    result = Bench.summarize(samples, nil, 1)

    bench =
      bench
      |> Bench.table(title, [col])
      |> Bench.row("p50 / p99 over the markers", %{col => result})

    IO.puts(
      "lag: median #{Bench.fmt_us(result.median_us)}, p99 #{Bench.fmt_us(result.p99_us)}, " <>
        "max #{Bench.fmt_us(Enum.max(samples))}"
    )

    Bench.target(bench, "lag p99 at #{rate} entries/s (ms)", result.p99_us / 1_000, :<=, 20)
  end
end

Larder.ReplicaBench.run(System.argv())
