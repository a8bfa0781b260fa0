defmodule Larder.Bench.KafkaLoadTest do
  # The Kafka bench's support (bench/support/kafka_load.ex): its anchors
  # must read a topic exactly as the replica does, or their ratios compare
  # two different reads.
  use ExUnit.Case, async: true

  alias Larder.Bench.KafkaLoad

  test "the anchors' consumer settings are the replica's default librdkafka settings" do
    bootstrap = "127.0.0.1:9092"

    replica =
      [brokers: [bootstrap], topic: "story"]
      |> Larder.Replica.Kafka.validate!()
      |> Larder.Replica.Kafka.librdkafka_config()

    config = KafkaLoad.consumer_config(bootstrap)
    assert Enum.sort(config) == Enum.sort(replica)
    # The prefetch refill settings the replica sets (librdkafka's own
    # backoff, 1,000 ms, idles a drain each time a queue fills).
    assert {"queued.min.messages", "100000"} in config
    assert {"fetch.queue.backoff.ms", "10"} in config
  end
end
