# The program of larder_kafka's test/dependency_test.exs: the lib/ of a
# fresh Mix project that depends on larder and larder_kafka, keeping a
# Table equal to a Kafka topic as a service of someone else's would. Each
# step raises (a MatchError) when Larder answers otherwise.
defmodule DependentKafka do
  @moduledoc false

  import Larder.Replica.Kafka, only: [kafka_record: 1]

  def run(brokers, topic) do
    children = [
      {Larder.Replica,
       name: :prices,
       into: {Larder.Table, name: :prices, key: :sku, index: [:currency]},
       source: {Larder.Replica.Kafka, brokers: [brokers], topic: topic},
       apply: &price/1}
    ]

    {:ok, _} = Supervisor.start_link(children, strategy: :one_for_one)

    :ok = Larder.Replica.await(:prices, :latest, 60_000)
    [%{sku: "b", cents: 250}] = Larder.Table.search(:prices, currency: "USD")
    2 = Larder.Table.size(:prices)

    IO.puts("dependent_kafka: ok")
  end

  # A record's value is "<currency> <cents>"; no value deletes the key.
  defp price(kafka_record(key: sku, value: nil)), do: {:delete, sku}

  defp price(kafka_record(key: sku, value: value)) do
    [currency, cents] = String.split(value, " ")
    {:insert, %{sku: sku, currency: currency, cents: String.to_integer(cents)}}
  end
end
