# Larder.Replica: the price catalogue as a `prices` Redis Stream (the shared
# 487,200-price file, read from ../shared/data, or the generated catalogue),
# followed into a `store:` Table by a replica: a fresh node catching up from
# zero, a restarted node catching up from its snapshot, and the lag under a
# steady producer. The catalogue and its entries' encoding: PriceCatalogue
# (examples/price_catalogue); the replica's options and the producer:
# Larder.Test.Prices (test/support).

defmodule Demo.Replica do
  alias Larder.{Bench, Replica, Table}
  alias Larder.Test.{Prices, RedisServer}
  alias PriceCatalogue.Changes

  @stream "prices"
  @rate 5_000

  def run do
    IO.puts("\n## Larder.Replica: a Table on every node, fed from a Redis Stream\n")

    if RedisServer.available?() do
      redis = RedisServer.start()
      dir = Path.join(System.tmp_dir!(), "larder-replica-demo-#{System.pid()}")
      File.mkdir_p!(dir)

      try do
        demo(redis, dir)
      after
        RedisServer.stop(redis)
        File.rm_rf(dir)
      end
    else
      IO.puts("redis-server is not installed: skipped.")
    end
  end

  defp opts(redis, dir) do
    Prices.replica_opts(:demo_replica, :demo_prices, [port: redis.port], @stream,
      snapshot: Path.join(dir, "prices.snap"),
      snapshot_every: 86_400_000
    )
  end

  defp start!(opts) do
    {:ok, pid} = Replica.start_link(opts)
    Process.unlink(pid)
    pid
  end

  # A node started on the stream (and its snapshot, if any), once it has
  # applied everything the stream held when it asked.
  defp ready!(redis, dir) do
    pid = start!(opts(redis, dir))
    :ok = Replica.await(pid, :latest, :infinity)
    pid
  end

  defp ms(us), do: "#{round(us / 1_000)} ms"
  defp rate(n, us), do: "#{round(n * 1_000_000 / max(us, 1))} entries/s"

  defp demo(redis, dir) do
    {source, prices, requests} = PriceCatalogue.reference_or_generated()
    n = length(prices)
    client = Prices.connect(port: redis.port)

    {us, _} = :timer.tc(fn -> Prices.fill(client, @stream, prices) end)

    IO.puts(
      "stream #{inspect(@stream)} filled with #{n} prices of #{source}: #{ms(us)} (#{rate(n, us)})"
    )

    # A fresh node: from zero to await(:latest).
    {us, pid} = :timer.tc(fn -> ready!(redis, dir) end)

    IO.puts(
      "fresh node caught up from zero: #{Table.size(:demo_prices)} prices in #{ms(us)} (#{rate(n, us)})"
    )

    # Its answers are the catalogue's.
    conditions = hd(requests)
    [answer] = Table.search(:demo_prices, conditions)
    [expected] = PriceCatalogue.filter(prices, conditions)
    true = answer.value == expected.value

    IO.puts(
      "  a reference request answers #{answer.value} #{answer.currency}, as the catalogue says"
    )

    # A restarted node: a snapshot, a crash, 10,000 changes, a restart.
    {snap_us, {:ok, _}} = :timer.tc(fn -> Replica.dump(pid) end)
    Process.exit(pid, :kill)
    IO.puts("snapshot written in #{ms(snap_us)}; the node is killed")
    table = List.to_tuple(prices)
    Prices.add(client, @stream, for(_ <- 1..10_000, do: Changes.random(table)))

    {us, pid} = :timer.tc(fn -> ready!(redis, dir) end)

    IO.puts("restarted node: snapshot loaded and 10,000 new entries applied, ready in #{ms(us)}")

    # Lag under a steady producer.
    seconds = 3
    producer_client = Prices.connect(port: redis.port)
    # Two disjoint samples, the producer's and the markers': a process
    # holding the whole catalogue would stall a scheduler at each of its
    # garbage collections, and a change to a marker's price would hide it.
    {sample, markers} = prices |> Enum.take_random(20_000) |> Enum.split(10_000)
    {sample, markers} = {List.to_tuple(sample), List.to_tuple(markers)}

    producer =
      Task.async(fn ->
        Prices.produce(producer_client, @stream, sample, @rate, seconds * 1_000)
      end)

    deadline = System.monotonic_time(:millisecond) + seconds * 1_000

    lags =
      Task.async(fn ->
        Prices.marker_lags(client, @stream, pid, :demo_prices, markers, deadline)
      end)
      |> Task.await(seconds * 1_000 + 60_000)

    sent = Task.await(producer, 60_000)
    result = Bench.summarize(lags, nil, 1)

    IO.puts(
      "lag under a producer of #{@rate} entries/s (#{sent} entries in #{seconds} s), " <>
        "XADD to visible in a search, #{length(lags)} markers: median #{Bench.fmt_us(result.median_us)}, " <>
        "p99 #{Bench.fmt_us(result.p99_us)}"
    )

    :ok = GenServer.stop(pid)
    :eredis.stop(producer_client)
    :eredis.stop(client)
    IO.puts("`mix run bench/replica_bench.exs` measures these against their targets.")
  end
end

Demo.Replica.run()
