# Larder.Table search on the 487,200-price catalogue, side by side with a
# Go-style map index (offering -> list of its prices, scanned) and an ETS
# match-spec select, all in this run. Every answer is checked against the
# expected price computed by a plain filter over the loaded catalogue.
#
#   mix run bench/index_bench.exs [--quick] [--json PATH]
# The catalogue and the map index are PriceCatalogue's
# (examples/price_catalogue, a :dev dependency), the table's options
# Larder.Test.Prices' (test/support, compiled for :dev); jiffy (Debian's erlang-jiffy) is on the code path and loads its
# NIF on first use.
alias Larder.{Bench, Table}
alias Larder.Test.Prices
alias PriceCatalogue.MapIndex

# The timed loops live in a compiled module: a closure written at the top
# level of a script is interpreted, which would add microseconds per call.
defmodule IndexBench.Loops do
  alias PriceCatalogue.MapIndex

  def table_searches(table, requests), do: Enum.each(requests, &Larder.Table.search(table, &1))

  # Go's FindPriceBy takes the request's fields, already decoded: so does
  # this row (map_args/1 splits the conditions before the timing).
  def map_searches(map_index, args),
    do: Enum.each(args, fn {o, g, s, chars} -> MapIndex.find(map_index, o, g, s, chars) end)

  def map_args(requests), do: Enum.map(requests, &MapIndex.args/1)

  def ets_searches(tab, requests), do: Enum.each(requests, &ets_search(tab, &1))

  # One search per call, cycling through the requests, for `each:` timing
  # (a cheap BIF picks the request). Made here, as a closure written at the
  # top level of a script is interpreted.
  def one_table_search(table, requests) do
    {tuple, n} = cycle(requests)
    fn -> Larder.Table.search(table, elem(tuple, rem(:erlang.unique_integer([:positive]), n))) end
  end

  def one_map_search(map_index, args) do
    {tuple, n} = cycle(args)

    fn ->
      {o, g, s, chars} = elem(tuple, rem(:erlang.unique_integer([:positive]), n))
      MapIndex.find(map_index, o, g, s, chars)
    end
  end

  defp cycle(requests), do: {List.to_tuple(requests), length(requests)}

  # A partial map pattern; chars are a map in this table so it can match them.
  def ets_search(tab, conditions) do
    pattern =
      Enum.reduce(conditions, %{chars: %{}}, fn
        {:char, {c, v}}, acc -> put_in(acc, [:chars, c], v)
        {field, v}, acc -> Map.put(acc, field, v)
      end)

    :ets.select(tab, [{{:_, pattern}, [], [{:element, 2, :"$_"}]}])
  end
end

alias IndexBench.Loops

bench = Bench.start("Larder.Table: price search on the catalogue")
{source, prices, requests} = PriceCatalogue.reference_or_generated()

# The catalogue and the map index live off this process's heap
# (Bench.off_heap/2): with 487k prices on the heap, the collection before
# every timed run would copy hundreds of MB and leave the caches cold for
# the searches timed right after it.
prices = Bench.off_heap(:prices, prices)
requests = Bench.off_heap(:requests, requests)
IO.puts("# catalogue: #{source}: #{length(prices)} prices, #{length(requests)} requests")

# Expected answers by a plain filter: each request matches exactly one price.
expected =
  Enum.map(requests, fn conditions ->
    case PriceCatalogue.filter(prices, conditions) do
      [price] -> price.value
      other -> raise "request #{inspect(conditions)} matches #{length(other)} prices, not one"
    end
  end)

## The contenders

# Go's map variant: offering -> its prices; a search scans that list.
build_map_index = fn -> MapIndex.new(prices) end
map_search = &MapIndex.search/2

store = [:idx, :spec, :value, :currency]

build_table = fn opts ->
  table = Table.new(Prices.table_opts(opts))
  :ok = Table.insert_many(table, prices)
  table
end

# ETS with a match spec: chars become a map so a partial map pattern matches them.
build_ets = fn ->
  tab = :ets.new(:prices_select, [:set, :public, read_concurrency: true])

  :ets.insert(
    tab,
    for(p <- prices, do: {p.idx, %{p | chars: Map.new(p.chars, &{&1.char, &1.value})}})
  )

  tab
end

ets_search = &Loops.ets_search/2

## Check every contender's answers before timing them

map_index = Bench.off_heap(:map_index, build_map_index.())
table = build_table.(store: store)
full_table = build_table.([])
ets = build_ets.()

check = fn name, answers ->
  bad =
    Enum.zip(answers, expected)
    |> Enum.count(fn
      {[%{value: v}], v} -> false
      {{:ok, %{value: v}}, v} -> false
      _ -> true
    end)

  IO.puts(
    "# checked #{name}: #{length(answers) - bad}/#{length(answers)} answers are the expected price"
  )

  if bad > 0, do: raise("#{name} returned #{bad} wrong answers")
end

ets_requests = Bench.pick(bench, Enum.take(requests, 3), Enum.take(requests, 10))
check.("map index", Enum.map(requests, &map_search.(map_index, &1)))
map_args = Loops.map_args(requests)
check.("Table store:", Enum.map(requests, &Table.search(table, &1)))
check.("Table full", Enum.map(requests, &Table.search(full_table, &1)))
check.("Table search_many", Table.search_many(table, requests))

for {conditions, [%{value: v}]} <-
      Enum.zip(ets_requests, Enum.map(ets_requests, &ets_search.(ets, &1))),
    do:
      if(v != Enum.at(expected, Enum.find_index(requests, &(&1 == conditions))),
        do: raise("ETS select answered wrong")
      )

IO.puts("# checked ETS select: #{length(ets_requests)} requests (a full scan each)")

## Build, memory

columns = ["map index", "Table store:", "Table full", "ETS select"]

# What a build run made is dropped after the run, untimed, so the builds do
# not pile up gigabytes of ETS while the searches are measured.
built = fn value -> Process.put(:built, value) end

drop_built = fn _ ->
  case Process.delete(:built) do
    %Table{} = t -> Table.drop(t)
    tab when is_reference(tab) -> :ets.delete(tab)
    _ -> :ok
  end
end

build_runs = [warmup: 0, runs: Bench.pick(bench, 1, 3), teardown: drop_built]

bench =
  bench
  |> Bench.table("build from records in memory", columns)
  |> Bench.row(
    "build (#{length(prices)} records)",
    %{
      "map index" => build_map_index,
      "Table store:" => fn -> built.(build_table.(store: store)) end,
      "Table full" => fn -> built.(build_table.([])) end,
      "ETS select" => fn -> built.(build_ets.()) end
    },
    build_runs
  )

mb = fn bytes -> Bench.value(Float.round(bytes / 1_000_000, 1), "MB") end
words = :erlang.system_info(:wordsize)

# The map index's live heap, like the Go figure.
map_heap = MapIndex.heap_bytes()

bench =
  bench
  |> Bench.table(
    "memory: ETS words x #{words} + NIF bytes (map index: its process heap)",
    columns
  )
  |> Bench.row("memory", %{
    "map index" => mb.(map_heap),
    "Table store:" => mb.(Table.memory(table)),
    "Table full" => mb.(Table.memory(full_table)),
    "ETS select" => mb.(:ets.info(ets, :memory) * words)
  })

## Searches

n = length(requests)
many = requests |> Stream.cycle() |> Enum.take(1000)
many_args = Loops.map_args(many)
many_check = Table.search_many(table, many)
check.("Table search_many x1000", many_check |> Enum.take(n))

bench =
  bench
  |> Bench.table("search, per request (#{n} reference requests per run)", columns, per_op: true)
  |> Bench.row(
    "search (one request)",
    %{
      "map index" => fn -> Loops.map_searches(map_index, map_args) end,
      "Table store:" => fn -> Loops.table_searches(table, requests) end,
      "Table full" => fn -> Loops.table_searches(full_table, requests) end,
      "ETS select" =>
        {fn -> Loops.ets_searches(ets, ets_requests) end,
         [ops: length(ets_requests), runs: Bench.pick(bench, 1, 3)]}
    },
    warmup: 1,
    runs: Bench.pick(bench, 15, 51),
    ops: n
  )
  |> Bench.row(
    "1,000 searches in one call (search_many)",
    %{
      "map index" => fn -> Loops.map_searches(map_index, many_args) end,
      "Table store:" => fn -> Table.search_many(table, many) end,
      "Table full" => fn -> Table.search_many(full_table, many) end
    },
    warmup: 1,
    runs: Bench.pick(bench, 5, 21),
    ops: 1000
  )
  # Every search timed on its own (each:), so the tail under the median is a
  # real p99 of single searches (each sample includes one clock read).
  |> Bench.row(
    "search (one request), each timed",
    %{
      # A map search takes ~0.5 ms: 500 of them in 5 runs give its p99.
      "map index" =>
        {Loops.one_map_search(map_index, map_args),
         [runs: Bench.pick(bench, 3, 5), each: Bench.pick(bench, 100, 500)]},
      "Table store:" => Loops.one_table_search(table, requests),
      "Table full" => Loops.one_table_search(full_table, requests)
    },
    warmup: 1,
    runs: Bench.pick(bench, 5, 15),
    each: Bench.pick(bench, 1_000, 5_000)
  )

## Targets

[search_row, many_row | _each_row] = hd(bench.tables).rows
[build_row] = Enum.find(bench.tables, &(&1.title =~ "build")).rows
[mem_row] = Enum.find(bench.tables, &(&1.title =~ "memory")).rows

IO.puts("")

bench
|> Bench.target(
  "Table store: search median (us)",
  search_row.results["Table store:"].per_op_median_us,
  :<=,
  4
)
|> Bench.target(
  "Table store: search_many (searches/s)",
  many_row.results["Table store:"].ops_per_s,
  :>=,
  300_000
)
|> Bench.target("Table store: memory (MB)", mem_row.results["Table store:"].value, :<=, 127)
|> Bench.target(
  "Table store: build (s)",
  build_row.results["Table store:"].median_us / 1_000_000,
  :<=,
  2
)
|> Bench.target(
  "Table full: build (s)",
  build_row.results["Table full"].median_us / 1_000_000,
  :<=,
  2
)
|> Bench.finish()
