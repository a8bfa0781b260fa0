# The program of test/dependency_test.exs: the lib/ of a fresh Mix project
# that depends on Larder, as a service of someone else's would use it.
# Each step raises (a MatchError) when Larder answers otherwise.
defmodule Dependent do
  @moduledoc false

  def run(redis_url, stream) do
    # Larder.Bag: ETS :bag's semantics.
    bag = Larder.Bag.new()
    :ok = Larder.Bag.insert(bag, "user:1", "admin")
    :ok = Larder.Bag.insert(bag, "user:1", "ops")
    :ok = Larder.Bag.insert(bag, "user:1", "admin")
    ["admin", "ops"] = Larder.Bag.lookup(bag, "user:1")

    # Larder.Register: versioned hot values.
    flags = Larder.Register.new()
    :ok = Larder.Register.put(flags, :checkout, %{enabled: true})
    %{enabled: true} = Larder.Register.get(flags, :checkout)

    # Larder.Table with an index.
    books = Larder.Table.new(key: :id, index: [:kind])

    :ok =
      Larder.Table.insert_many(books, [
        %{id: 1, kind: "novel", title: "Emma"},
        %{id: 2, kind: "poetry", title: "Odes"}
      ])

    [%{title: "Emma"}] = Larder.Table.search(books, kind: "novel")

    # A Cache on Redis and a Replica of a Redis Stream, supervised.
    children = [
      {Larder.Cache, name: :prices, l2: {Larder.Cache.Redis, url: redis_url}},
      {Larder.Replica,
       name: :orders,
       into: {Larder.Table, name: :orders, key: :id, index: [:status]},
       source: {Larder.Replica.RedisStream, redis: [url: redis_url], stream: stream},
       apply: &order/1}
    ]

    {:ok, _} = Supervisor.start_link(children, strategy: :one_for_one)

    {:ok, 42} = Larder.Cache.fetch(:prices, {:sku, 1}, fn -> {:ok, 42} end)
    :ok = Larder.Cache.put(:prices, {:sku, 1}, 43)
    {:ok, 43} = Larder.Cache.fetch(:prices, {:sku, 1}, fn -> {:error, :not_called} end)

    :ok = Larder.Replica.await(:orders, :latest, 30_000)
    [%{id: 2}] = Larder.Table.search(:orders, status: "paid")

    IO.puts("dependent: ok")
  end

  # A stream entry's fields (binaries) as a record.
  defp order(%{"id" => id, "status" => status}),
    do: {:insert, %{id: String.to_integer(id), status: status}}
end
