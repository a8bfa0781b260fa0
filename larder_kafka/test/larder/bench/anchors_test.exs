defmodule Larder.Bench.AnchorsTest do
  # The outside anchors of bench/replica_kafka_bench.exs
  # (bench/support/anchors.ex): a ratio against an anchor means something
  # only if the anchor read the same records, all of them, and touched
  # their bytes. Each drain is checked against the records produced.
  use ExUnit.Case, async: false

  import Larder.Test.KafkaSetup

  alias Larder.Bench.{Anchors, KafkaLoad}
  alias Larder.Test.KafkaBroker

  @moduletag :kafka

  setup_all :kafka_broker
  setup :kafka_topic

  setup %{broker: broker} do
    bootstrap = KafkaBroker.bootstrap(broker)
    admin = KafkaLoad.admin!(bootstrap)
    %{bootstrap: bootstrap, admin: admin, config: KafkaLoad.consumer_config(bootstrap)}
  end

  defp bytes(records) do
    for {k, v} <- records, reduce: 0 do
      acc -> acc + Enum.sum(:binary.bin_to_list(k)) + Enum.sum(:binary.bin_to_list(v))
    end
  end

  test "the C drain, the Java drains and the NIF loop read every record of every partition",
       %{bootstrap: bootstrap, admin: admin, topic: topic, config: config} do
    KafkaLoad.create_topic!(admin, topic, 4)
    # Three chunks of the producer: several batches in each partition.
    records = KafkaLoad.story_records(120_000, 60)
    ends = KafkaLoad.fill!(KafkaLoad.producer!(bootstrap), topic, records)
    assert map_size(ends) == 4
    n = length(records)
    sum = bytes(records)

    assert {:ok, c} = Anchors.c_drain()
    assert %{records: ^n, kept: ^sum} = Anchors.run_c(c, topic, config)

    assert {:ok, java} = Anchors.java_drain()
    assert %{records: ^n, kept: ^sum} = Anchors.run_java(java, "drain", topic, config)
    # 60 keys: the story's decode into a map of lists, the raw map by key.
    assert %{records: ^n, kept: 60} = Anchors.run_java(java, "story", topic, config)
    assert %{records: ^n, kept: 60} = Anchors.run_java(java, "map", topic, config)

    assert %{records: ^n, acc: ^sum} =
             KafkaLoad.drain(bootstrap, topic, 1_000, 0, fn entries, acc ->
               for {_id, {:kafka_record, k, v, _h, _ts, _p, _o}} <- entries,
                   reduce: acc,
                   do: (acc -> acc + bytes([{k, v}]))
             end)
  end

  test "an empty topic is drained at once, with no record", %{admin: admin, topic: topic} = ctx do
    KafkaLoad.create_topic!(admin, topic, 2)

    assert {:ok, c} = Anchors.c_drain()
    assert %{records: 0, kept: 0} = Anchors.run_c(c, topic, ctx.config)
    assert {:ok, java} = Anchors.java_drain()
    assert %{records: 0, kept: 0} = Anchors.run_java(java, "map", topic, ctx.config)
  end

  test "Java reads at the replica's fetch settings, under their Java names" do
    config = KafkaLoad.consumer_config("127.0.0.1:9092")
    java = Map.new(Anchors.java_config(config))

    assert java["isolation.level"] == "read_committed"
    assert java["fetch.max.bytes"] == "52428800"
    assert java["max.partition.fetch.bytes"] == "4194304"
    assert java["fetch.max.wait.ms"] == "100"
    assert java["max.poll.records"] == "1000"
    # librdkafka's defaults where Java's differ: no CRC check, the
    # system's socket receive buffer.
    assert java["check.crcs"] == "false"
    assert java["receive.buffer.bytes"] == "-1"
    refute Map.has_key?(java, "bootstrap.servers")
  end
end
