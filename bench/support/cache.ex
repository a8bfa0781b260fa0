# What bench/cache_bench.exs and the Cache demo share: the large term (60k
# small maps, ~8.7 MB raw, ~1.2 MB with term_to_binary(compressed: 6), built
# the same way every time) and a reader process for repeat hits, which keeps
# its copy of a value between runs without weighing on the measuring
# process's garbage collections.
defmodule Larder.Bench.Cache do
  @moduledoc false

  def large_term do
    for i <- 1..60_000 do
      %{
        id: i,
        sku: "SKU-#{Integer.to_string(i, 36)}",
        price: rem(i * 7919, 100_000),
        stock: rem(i * 31, 977),
        name: "item #{rem(i * 131, 10_007)}",
        tags: [rem(i, 7), rem(i, 11)],
        category: "category-#{rem(i, 20)}",
        warehouse: "warehouse-#{rem(i, 5)}"
      }
    end
  end

  @doc "A linked process that calls `fun` each time it is asked (see `ask/1`)."
  def start_reader(fun), do: spawn_link(fn -> reader_loop(fun) end)

  @doc "Runs the reader's function once and waits for it (one message round trip)."
  def ask(reader) do
    send(reader, {:run, self()})

    receive do
      {:ran, ^reader} -> :ok
    end
  end

  def stop_reader(reader) do
    Process.unlink(reader)
    Process.exit(reader, :kill)
  end

  defp reader_loop(fun) do
    receive do
      {:run, from} ->
        fun.()
        send(from, {:ran, self()})
        reader_loop(fun)
    end
  end
end
