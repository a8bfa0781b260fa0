# Larder.Table: price search on the 487,200-price catalogue (the shared file,
# or the generated one), against the Go-style map index, measured now.
# The catalogue and the map index: PriceCatalogue (examples/price_catalogue);
# the table options: Larder.Test.Prices (test/support).
alias Larder.{Bench, Table}
alias Larder.Test.Prices
alias PriceCatalogue.MapIndex

# Compiled loops: closures at a script's top level are interpreted.
defmodule Demo.TableLoops do
  def table_searches(table, requests), do: Enum.each(requests, &Larder.Table.search(table, &1))
  def map_searches(index, requests), do: Enum.each(requests, &MapIndex.search(index, &1))
end

demo = Bench.start("Larder.Table: price search, map index vs Larder.Table", ["--quick"])
{source, prices, requests} = PriceCatalogue.reference_or_generated()
IO.puts("# catalogue: #{source}: #{length(prices)} prices, #{length(requests)} requests")

# The catalogue and the map index live off this process's heap
# (Bench.off_heap/2), so the harness's collection before each timed run does
# not copy 487k prices and leave the caches cold for the searches after it.
prices = Bench.off_heap(:prices, prices)
map_index = Bench.off_heap(:map_index, MapIndex.new(prices))
table = Table.new(Prices.table_opts(store: [:idx, :spec, :value, :currency]))
:ok = Table.insert_many(table, prices)

# Both must give the same single price for every request.
for conditions <- requests do
  {:ok, %{value: v}} = MapIndex.search(map_index, conditions)
  [%{value: ^v}] = Table.search(table, conditions)
end

IO.puts("# all #{length(requests)} answers agree (one price each)")

# The map index's live heap, like the Go figure.
map_bytes = MapIndex.heap_bytes()

mb = fn bytes -> Bench.value(Float.round(bytes / 1_000_000, 1), "MB") end

demo
|> Bench.table("search on the catalogue (per request)", ["map index", "Larder.Table"],
  per_op: true
)
|> Bench.row(
  "search, #{length(requests)} reference requests",
  %{
    "map index" => fn -> Demo.TableLoops.map_searches(map_index, requests) end,
    "Larder.Table" => fn -> Demo.TableLoops.table_searches(table, requests) end
  },
  runs: 9,
  ops: length(requests)
)
|> Bench.table("memory after load", ["map index", "Larder.Table"])
|> Bench.row("memory (Table: store: 4 fields)", %{
  "map index" => mb.(map_bytes),
  "Larder.Table" => mb.(Table.memory(table))
})

Table.drop(table)
Bench.release_off_heap()
