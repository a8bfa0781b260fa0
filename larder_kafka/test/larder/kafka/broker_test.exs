defmodule Larder.Kafka.BrokerTest do
  # The test broker itself (test/support/kafka_broker.ex): it starts, serves
  # records, and keeps them across a SIGKILL and a restart on the same data,
  # so the Kafka source's tests can rely on it.
  # One broker for the module (a start takes 10-40 s on a loaded 2-core
  # machine); the tests run one after another on it.
  use ExUnit.Case, async: false

  import Larder.Test.KafkaSetup

  alias Larder.Test.KafkaBroker

  @moduletag :kafka

  setup_all :kafka_broker
  setup :kafka_topic

  test "a record produced before a SIGKILL is read back after a restart on the same data",
       %{topic: topic} do
    # Its own broker: a restarted broker belongs to the process that
    # restarted it (this test's), not to the module's.
    broker = start()
    :ok = KafkaBroker.create_topic(broker, topic, 2, [{"cleanup.policy", "compact"}])
    assert %{partitions: 2, topic_id: id} = KafkaBroker.describe_topic(broker, topic)

    :ok = KafkaBroker.produce(broker, topic, [{"k1", "v\t1"}, {"k2", nil}])
    assert Enum.sum(Map.values(KafkaBroker.offsets(broker, topic))) == 2

    pid = KafkaBroker.os_pid(broker)
    :ok = KafkaBroker.kill(broker)
    refute KafkaBroker.os_pid(broker)

    refute File.exists?("/proc/#{pid}/cmdline") and
             File.read!("/proc/#{pid}/cmdline") =~ broker.root

    broker = KafkaBroker.restart(broker)
    assert KafkaBroker.os_pid(broker) != pid

    assert %{partitions: 2, topic_id: ^id} = KafkaBroker.describe_topic(broker, topic)

    records = KafkaBroker.consume(broker, topic, 2)

    assert Enum.sort_by(records, & &1.key) |> Enum.map(&{&1.key, &1.value}) ==
             [{"k1", "v\t1"}, {"k2", nil}]
  end

  test "delete-records moves a partition's log start offset; a deleted topic is gone",
       %{broker: broker, topic: topic} do
    :ok = KafkaBroker.create_topic(broker, topic, 1)
    :ok = KafkaBroker.produce(broker, topic, for(i <- 1..5, do: {"k#{i}", "v#{i}"}))
    assert KafkaBroker.offsets(broker, topic, :earliest) == %{0 => 0}

    :ok = KafkaBroker.delete_records(broker, topic, [{0, 3}])
    assert KafkaBroker.offsets(broker, topic, :earliest) == %{0 => 3}
    assert KafkaBroker.offsets(broker, topic, :latest) == %{0 => 5}

    :ok = KafkaBroker.delete_topic(broker, topic)
    assert KafkaBroker.describe_topic(broker, topic) == :error
  end

  test "a broker dies with the process that started it", %{broker: broker} do
    # A second broker, started by a process that then exits without
    # stopping it: its wrapper must kill the JVM.
    parent = self()

    {pid, ref} =
      spawn_monitor(fn ->
        other = KafkaBroker.start()
        send(parent, {:started, other})
      end)

    assert_receive {:started, other}, 300_000
    assert_receive {:DOWN, ^ref, :process, ^pid, :normal}

    Larder.Test.RedisServer.wait_until(30_000, "the orphaned broker's JVM to exit", fn ->
      KafkaBroker.os_pid(other) == nil
    end)

    KafkaBroker.stop(other)
    assert KafkaBroker.os_pid(broker)
  end
end
