# Larder.Replica on Kafka: the start-up sync that started Larder. A single-node
# Kafka 4 broker (KRaft, the jars scripts/setup fetched) on free loopback
# ports; a topic of 1M records over 10k keys (about 100 distinct values per
# key) synced at start-up into a Larder.Bag by a replica, beside the sync a
# team writes today (the same Kafka consumer inserting each poll into an ETS
# :bag or :duplicate_bag); then the price catalogue from an 8-partition
# topic into a `store:` Table, a restart from its snapshot, and the lag
# under a steady producer. One run each, at the story's full size: the ETS
# :bag sync alone takes tens of seconds, which is the story. The full
# comparison, with repeated runs and every target:
# larder_kafka/bench/replica_kafka_bench.exs. Topic filling and the anchors' consumer
# loop: larder_kafka/bench/support/kafka_load.ex. Run by `make demo` in larder_kafka/
# (`cd larder_kafka && mix run ../examples/kafka_demo.exs`).

defmodule Demo.Kafka do
  alias Larder.{Bag, Bench, Replica, Table}
  alias Larder.Bench.KafkaLoad
  alias Larder.Test.KafkaBroker
  alias Larder.Test.Prices

  @records 1_000_000
  @keys 10_000
  @partitions 8
  @rate 5_000
  @store [:idx, :spec, :value, :currency, :is_default]

  def run do
    IO.puts("\n## Larder.Replica on Kafka: the start-up sync that started Larder\n")

    if KafkaBroker.available?() do
      {us, broker} = :timer.tc(fn -> KafkaBroker.start() end)
      IO.puts("Kafka 4 broker (KRaft, one node) started in #{ms(us)}")
      dir = Path.join(System.tmp_dir!(), "larder-kafka-demo-#{System.pid()}")
      File.mkdir_p!(dir)

      try do
        demo(KafkaBroker.bootstrap(broker), dir)
      after
        KafkaBroker.stop(broker)
        File.rm_rf(dir)
      end
    else
      IO.puts("Java or the Kafka jars are missing (scripts/setup installs them): skipped.")
    end
  end

  defp ms(us), do: "#{round(us / 1_000)} ms"
  defp rate(n, us), do: "#{round(n * 1_000_000 / max(us, 1))} records/s"

  defp start!(opts) do
    {:ok, pid} = Replica.start_link(opts)
    Process.unlink(pid)
    pid
  end

  defp demo(bootstrap, dir) do
    admin = KafkaLoad.admin!(bootstrap)
    producer = KafkaLoad.producer!(bootstrap)
    story(bootstrap, admin, producer)
    prices(bootstrap, admin, producer, dir)
  end

  defp story(bootstrap, admin, producer) do
    records = KafkaLoad.story_records(@records, @keys)
    KafkaLoad.create_topic!(admin, "story", @partitions)
    {us, _} = :timer.tc(fn -> KafkaLoad.fill!(producer, "story", records) end)

    IO.puts(
      "topic \"story\": #{@records} records over #{@keys} keys, #{@partitions} partitions, " <>
        "produced in #{ms(us)} (#{rate(@records, us)})"
    )

    bench = Bench.start("The story's start-up sync, from the topic's start to its end", [])
    loop = fn insert -> KafkaLoad.consume_all(bootstrap, "story", 1_000, insert) end

    ets = fn type ->
      {fn tab -> loop.(KafkaLoad.ets_insert(tab)) end,
       setup: fn -> :ets.new(:story, [type, :public]) end, teardown: &:ets.delete/1}
    end

    replica = fn ->
      pid =
        start!(
          name: :demo_story,
          into: {Bag, name: :demo_story_bag},
          source: {Larder.Replica.Kafka, brokers: [bootstrap], topic: "story"},
          apply: &KafkaLoad.story_apply/1
        )

      :ok = Replica.await(pid, :latest, :infinity)
      @records = Bag.size(:demo_story_bag)
      :ok = GenServer.stop(pid)
    end

    title = "sync #{@records} records over #{@keys} keys"
    label = "start to every partition's end"
    larder = "Larder.Replica into a Larder.Bag"
    columns = ["ETS :duplicate_bag", "ETS :bag", larder]

    bench =
      bench
      |> Bench.table(title, columns, anchor: "ETS :duplicate_bag")
      |> Bench.row(
        label,
        %{
          "ETS :duplicate_bag" => ets.(:duplicate_bag),
          "ETS :bag" => ets.(:bag),
          larder => replica
        },
        warmup: 0,
        runs: 1
      )

    bag = Bench.ratio(bench, title, label, "ETS :bag")
    replica_ratio = Bench.ratio(bench, title, label, larder)

    IO.puts(
      "The replica keeps ETS :bag's semantics (each pair once) and syncs " <>
        "#{Bench.fmt_ratio(bag / replica_ratio)}x faster than the hand-written sync into " <>
        "ETS :bag, at #{Bench.fmt_ratio(replica_ratio)}x the time of the one into a " <>
        ":duplicate_bag (which would keep repeats); it also keeps the offsets in its snapshot."
    )
  end

  defp price_opts(bootstrap, dir) do
    [
      name: :demo_kafka_replica,
      into: {Table, Prices.table_opts(name: :demo_kafka_prices, store: @store)},
      source: {Larder.Replica.Kafka, brokers: [bootstrap], topic: "prices"},
      apply: &KafkaLoad.price_apply/1,
      snapshot: Path.join(dir, "prices.snap"),
      snapshot_every: 86_400_000
    ]
  end

  defp ready!(bootstrap, dir) do
    pid = start!(price_opts(bootstrap, dir))
    :ok = Replica.await(pid, :latest, :infinity)
    pid
  end

  defp prices(bootstrap, admin, producer, dir) do
    {source, prices, requests} = PriceCatalogue.reference_or_generated()
    n = length(prices)
    KafkaLoad.create_topic!(admin, "prices", @partitions)

    {us, _} =
      :timer.tc(fn ->
        KafkaLoad.fill!(producer, "prices", Enum.map(prices, &KafkaLoad.price_record/1))
      end)

    IO.puts(
      "\ntopic \"prices\": #{n} prices of #{source}, #{@partitions} partitions, " <>
        "produced in #{ms(us)} (#{rate(n, us)})"
    )

    bench = Bench.start("The price catalogue from Kafka into a store: Table", [])
    title = "#{n} prices"
    anchor = "Table.insert_many/2 (in memory)"
    col = "Replica, from zero"

    insert_many = fn ->
      table = Table.new(Prices.table_opts(store: @store))
      :ok = Table.insert_many(table, prices)
      Table.drop(table)
    end

    # One run each: the replica is kept for what follows.
    {anchor_us, _} = :timer.tc(insert_many)
    {us, pid} = :timer.tc(fn -> ready!(bootstrap, dir) end)

    bench
    |> Bench.table(title, [anchor, col])
    |> Bench.row("to every partition's end", %{
      anchor => Bench.summarize([anchor_us], n, 1),
      col => Bench.summarize([us], n, 1)
    })

    IO.puts("fresh node caught up from zero: #{rate(n, us)}")

    # Its answers are the catalogue's.
    conditions = hd(requests)
    [answer] = Table.search(:demo_kafka_prices, conditions)
    [expected] = PriceCatalogue.filter(prices, conditions)
    true = answer.value == expected.value

    IO.puts(
      "  a reference request answers #{answer.value} #{answer.currency}, as the catalogue says"
    )

    # A restarted node: a snapshot, a crash, 10,000 changes, a restart.
    {snap_us, {:ok, _}} = :timer.tc(fn -> Replica.dump(pid) end)
    Process.exit(pid, :kill)

    IO.puts(
      "snapshot (prices and every partition's offset) written in #{ms(snap_us)}; the node is killed"
    )

    table = List.to_tuple(prices)
    changes = for _ <- 1..10_000, do: KafkaLoad.price_record(KafkaLoad.change(table))
    KafkaLoad.fill!(producer, "prices", changes)
    {us, pid} = :timer.tc(fn -> ready!(bootstrap, dir) end)
    IO.puts("restarted node: snapshot loaded and 10,000 new records applied, ready in #{ms(us)}")

    # Lag under a steady producer.
    seconds = 3
    {sample, markers} = prices |> Enum.take_random(20_000) |> Enum.split(10_000)
    {sample, markers} = {List.to_tuple(sample), List.to_tuple(markers)}
    steady = KafkaLoad.producer!(bootstrap)
    probe = KafkaLoad.producer!(bootstrap, KafkaLoad.probe_config())

    producing =
      Task.async(fn ->
        KafkaLoad.produce_steadily(steady, "prices", sample, @rate, seconds * 1_000)
      end)

    deadline = System.monotonic_time(:millisecond) + seconds * 1_000

    lags =
      Task.async(fn ->
        KafkaLoad.marker_lags(probe, "prices", pid, :demo_kafka_prices, markers, deadline)
      end)
      |> Task.await(seconds * 1_000 + 60_000)

    sent = Task.await(producing, 60_000)
    ack = Bench.summarize(Enum.map(lags, &elem(&1, 1)), nil, 1)

    IO.puts(
      "lag under a producer of #{@rate} records/s (#{sent} records in #{seconds} s), from the " <>
        "broker's acknowledgement to visible in a search, #{length(lags)} markers: median " <>
        "#{Bench.fmt_us(ack.median_us)}, p99 #{Bench.fmt_us(ack.p99_us)}"
    )

    :ok = GenServer.stop(pid)

    IO.puts(
      "`mix run bench/replica_kafka_bench.exs` (in larder_kafka/) measures these against their targets."
    )
  end
end

Demo.Kafka.run()
