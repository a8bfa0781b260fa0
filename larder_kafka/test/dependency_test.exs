defmodule LarderKafka.DependencyTest do
  # larder_kafka as a dependency of someone else's service: a fresh project
  # made by `mix new` in a temporary folder, depending on this checkout's
  # core and Kafka adapter by path, compiled, then running a program
  # (test/dependency/dependent_kafka.ex) that keeps a Table equal to a topic
  # of a real broker. Tagged :dependency and :kafka.
  use ExUnit.Case, async: false

  alias Larder.Kafka.Native
  alias Larder.Test.{DependentApp, KafkaBroker, KafkaSetup}

  @moduletag :dependency
  @moduletag :kafka
  @moduletag timeout: 900_000

  @adapter Path.expand("..", __DIR__)
  @core Path.expand("../..", __DIR__)
  @program Path.expand("dependency/dependent_kafka.ex", __DIR__)

  setup do
    dir = Path.join(System.tmp_dir!(), "larder_kafka_dep_#{System.unique_integer([:positive])}")
    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf!(dir) end)
    %{dir: dir}
  end

  test "a new Mix project depends on larder and larder_kafka by path and follows a topic",
       %{dir: dir} do
    deps = "[{:larder, path: #{inspect(@core)}}, {:larder_kafka, path: #{inspect(@adapter)}}]"
    app = DependentApp.new!(dir, "dependent_kafka", deps, @program)

    out = DependentApp.mix!(["compile"], app)
    refute out =~ "warning", out
    assert DependentApp.built(app) == ["dependent_kafka", "larder", "larder_kafka"]

    broker = KafkaSetup.start()
    bootstrap = KafkaBroker.bootstrap(broker)
    {:ok, admin} = Native.admin_open([{"bootstrap.servers", bootstrap}])
    :ok = Native.create_topic(admin, "prices", 2, [], 60_000)
    {:ok, producer} = Native.producer_open([{"bootstrap.servers", bootstrap}])

    records = [
      {0, "a", "EUR 100", []},
      {1, "b", "USD 250", []},
      {0, "c", "EUR 5", []},
      {0, "c", nil, []}
    ]

    :ok = Native.produce_batch(producer, "prices", records)
    {:ok, _acks} = Native.producer_flush(producer, 60_000)

    out =
      DependentApp.mix!(
        ["run", "-e", "DependentKafka.run(#{inspect(bootstrap)}, \"prices\")"],
        app
      )

    assert out =~ "dependent_kafka: ok"
  end
end
