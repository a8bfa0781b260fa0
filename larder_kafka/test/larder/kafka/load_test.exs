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

  # librdkafka starts threads for each client; a handle dropped without a
  # close must stop them (the resource's destructor closes the client on a
  # thread of its own).
  @tag :linux
  test "dropped consumers, producers and admin clients stop their threads" do
    assert {:ok, {before, held, left}} =
             Isolated.run(
               quote do
                 threads = fn -> length(File.ls!("/proc/self/task")) end
                 # No broker needed: the clients start, and try to connect.
                 config = [{"bootstrap.servers", "127.0.0.1:1"}]
                 Larder.Kafka.Native.load!()
                 before = threads.()

                 {held, _} =
                   (fn ->
                      handles =
                        for open <- [:consumer_open, :producer_open, :admin_open], _ <- 1..4 do
                          {:ok, h} = apply(Larder.Kafka.Native, open, [config])
                          h
                        end

                      {threads.(), length(handles)}
                    end).()

                 # The handles are garbage now: collect them and wait for
                 # the closing threads.
                 :erlang.garbage_collect()

                 left =
                   Enum.reduce_while(1..100, threads.(), fn _, _ ->
                     Process.sleep(100)
                     n = threads.()
                     if n <= before, do: {:halt, n}, else: {:cont, n}
                   end)

                 {before, held, left}
               end,
               60_000
             )

    assert held > before + 12
    assert left <= before
  end
end
