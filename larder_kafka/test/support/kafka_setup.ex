# Starts the real Kafka broker of an integration test from its setup or
# setup_all, and stops it (and removes its data) when the test, or the test
# module, is done. The broker's JVM also dies with the process that started
# it, and with the VM (Larder.Test.KafkaBroker's wrapper).
defmodule Larder.Test.KafkaSetup do
  @moduledoc false

  import ExUnit.Callbacks, only: [on_exit: 1]

  alias Larder.Test.KafkaBroker

  # In a test module: `import Larder.Test.KafkaSetup`, then `setup_all
  # :kafka_broker` (one broker for the module) or `setup :kafka_broker`.

  @doc """
  Starts a broker with `opts` (see `Larder.Test.KafkaBroker.start/1`)
  and stops it on exit of the test (or, from `setup_all`, of the module).
  A test that restarts the broker gets a new handle; the cleanup finds the
  running JVM through the broker's directory, so it stops that one too.
  The restarted JVM belongs to the process that restarted it, and dies
  with it: a test that restarts a broker starts its own, not the module's.
  """
  def start(opts \\ []) do
    broker = KafkaBroker.start(opts)
    on_exit(fn -> KafkaBroker.stop(broker) end)
    broker
  end

  @doc "A setup callback: `%{broker: broker}`, a Kafka broker."
  def kafka_broker(_ctx), do: %{broker: start()}

  @doc "A setup callback: `%{topic: name}`, a topic name unique to the test."
  def kafka_topic(ctx) do
    %{topic: "t#{System.unique_integer([:positive])}-#{:erlang.phash2({ctx.module, ctx.test})}"}
  end
end
