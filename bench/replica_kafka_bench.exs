# Larder.Replica over Kafka (issue 26): the 487,200-price catalogue
# (../shared/data/price-catalogue; the generated catalogue of the same shape
# when it is absent) in an 8-partition topic, followed into a `store:` Table
# by Larder.Replica.Kafka:
#   * catch-up from zero: start_link/1 to await(:latest), against
#     Larder.Table.insert_many/2 of the same records (already in memory)
#     in the same run, the anchor.
# Each record's key is the price's idx and its value the tab-separated
# payload of the Redis Stream benchmark (PriceStream.fields/1), decoded by
# the same apply function, so the two benchmarks compare.
#
#   mix run bench/replica_kafka_bench.exs [--quick] [--json PATH]
#
# --quick: 50,000 prices, one run. Starts its own Kafka broker on free
# loopback ports (test/support/kafka_broker.ex; does nothing without Java
# and the jars of scripts/setup).
Code.require_file("support/bench.ex", __DIR__)
Code.require_file("../test/support/kafka_broker.ex", __DIR__)
Code.require_file("../examples/price_search/lib/price_search/catalogue.ex", __DIR__)
Code.require_file("../examples/price_search/lib/price_search/price_stream.ex", __DIR__)

defmodule Larder.ReplicaKafkaBench do
  alias Larder.Bench
  alias Larder.Kafka.Native
  alias Larder.Replica
  alias Larder.Support.KafkaBroker
  alias Larder.Table
  alias PriceSearch.{Catalogue, PriceStream}

  @store [:idx, :spec, :value, :currency, :is_default]
  @topic "prices"
  @partitions 8

  def run(argv) do
    bench = Bench.start("Larder.Replica: a Table fed from a Kafka topic", argv)

    if KafkaBroker.available?() do
      broker = KafkaBroker.start()

      try do
        {source, prices, _requests} = Catalogue.reference_or_generated()
        prices = Enum.take(prices, Bench.pick(bench, 50_000, length(prices)))
        bootstrap = KafkaBroker.bootstrap(broker)
        {:ok, admin} = Native.admin_open([{"bootstrap.servers", bootstrap}])
        :ok = Native.create_topic(admin, @topic, @partitions, [], 120_000)
        {us, _} = :timer.tc(fn -> fill(bootstrap, prices) end)

        IO.puts(
          "\n#{length(prices)} prices of #{source} produced to #{@partitions} partitions in " <>
            "#{Bench.fmt_us(us)} (#{round(length(prices) * 1_000_000 / us)} records/s, acknowledged)"
        )

        bench
        |> catch_up(%{bootstrap: bootstrap, prices: prices})
        |> Bench.finish()
      after
        KafkaBroker.stop(broker)
      end
    else
      IO.puts("\nJava or the Kafka jars are missing (scripts/setup): nothing to measure.")
    end
  end

  defp fill(bootstrap, prices) do
    {:ok, producer} =
      Native.producer_open([{"bootstrap.servers", bootstrap}, {"linger.ms", "20"}])

    for chunk <- Enum.chunk_every(prices, 50_000) do
      records =
        for price <- chunk do
          ["price", payload] = PriceStream.fields(price)
          {rem(price.idx, @partitions), Integer.to_string(price.idx), payload, []}
        end

      :ok = Native.produce_batch(producer, @topic, records)
    end

    {:ok, acks} = Native.producer_flush(producer, 600_000)
    length(acks) == length(prices) || raise "not every record was acknowledged"
    Native.producer_close(producer)
  end

  defp opts(ctx) do
    [
      name: :bench_kafka_replica,
      into: {Table, Catalogue.table_opts(name: :bench_kafka_prices, store: @store)},
      source: {Replica.Kafka, brokers: [ctx.bootstrap], topic: @topic},
      apply: fn %{"value" => payload} -> PriceStream.apply_entry(%{"price" => payload}) end,
      batch_size: 2_000
    ]
  end

  def catch_up(bench, ctx) do
    n = length(ctx.prices)
    title = "Catch-up from zero: #{n} records of #{@partitions} partitions into a store: Table"
    anchor = "Table.insert_many/2"
    col = "Replica.Kafka, start_link/1 to await(:latest)"

    insert_many = fn ->
      table = Table.new(Catalogue.table_opts(store: @store))
      :ok = Table.insert_many(table, ctx.prices)
      Table.drop(table)
    end

    replica = fn ->
      {:ok, pid} = Replica.start_link(opts(ctx))
      Process.unlink(pid)
      :ok = Replica.await(pid, :latest, :infinity)
      GenServer.stop(pid)
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
    |> Bench.target("catch-up from zero (records/s)", results[col].ops_per_s, :>=, 300_000)
    |> Bench.target(
      "catch-up / insert_many/2 of the same records (x)",
      results[col].median_us / results[anchor].median_us,
      :<=,
      1.5
    )
  end
end

Larder.ReplicaKafkaBench.run(System.argv())
