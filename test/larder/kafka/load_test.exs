defmodule Larder.Kafka.LoadTest do
  # The Kafka NIF library (librdkafka inside) is loaded only when a Kafka
  # function is first called: a VM that never uses Kafka never maps it.
  use ExUnit.Case, async: true

  alias Larder.Test.Isolated

  defp mapped? do
    quote do
      File.read!("/proc/self/maps") =~ "liblarder_kafka"
    end
  end

  @tag :linux
  test "a VM that uses Larder but not Kafka does not map the Kafka library" do
    assert {:ok, {false, false, true, true}} =
             Isolated.run(
               quote do
                 {:ok, _} = Application.ensure_all_started(:larder)
                 # Larder's own NIF and a Table work without it.
                 table = Larder.Table.new(key: :k)
                 Larder.Table.insert(table, %{k: 1})
                 before = unquote(mapped?())
                 loaded = Larder.Kafka.Native.loaded?()
                 # The first Kafka call loads it.
                 {:error, {:config, _}} = Larder.Kafka.Native.consumer_open([{"no.such", "1"}])
                 {before, loaded, unquote(mapped?()), Larder.Kafka.Native.loaded?()}
               end
             )
  end

  test "concurrent first loads all succeed" do
    assert {:ok, results} =
             Isolated.run(
               quote do
                 1..8
                 |> Enum.map(fn _ -> Task.async(fn -> Larder.Kafka.Native.load!() end) end)
                 |> Enum.map(&Task.await(&1, 30_000))
               end
             )

    assert results == List.duplicate(:ok, 8)
  end
end
