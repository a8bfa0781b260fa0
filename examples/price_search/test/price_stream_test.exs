defmodule PriceSearch.PriceStreamTest do
  # The prices stream: a store that follows a stream (through a
  # Larder.Replica on a real redis-server, with the replica options and
  # the producer of PriceSearch.PriceStream) answers with the stream's
  # latest prices, deletions included. (The entries' encoding is
  # PriceCatalogue.Entry's, tested there.)
  use ExUnit.Case, async: true

  alias Larder.Replica
  alias Larder.Table
  alias Larder.Test.RedisServer
  alias PriceCatalogue.Entry
  alias PriceSearch.{PriceStream, Store}

  @moduletag :redis

  test "a store that follows a stream answers with its latest prices", ctx do
    redis = RedisServer.start()
    on_exit(fn -> RedisServer.stop(redis) end)
    prices = Enum.take(PriceCatalogue.generate(offerings: 1), 500)
    client = PriceStream.connect(port: redis.port)
    PriceStream.fill(client, "prices", prices)

    replica = :"#{ctx.test} replica"
    table = :"#{ctx.test} table"
    store = :"#{ctx.test} store"

    start_supervised!(
      {Replica, PriceStream.replica_opts(replica, table, [port: redis.port], "prices")}
    )

    start_supervised!(
      {Store,
       name: store,
       load: fn -> {"test", prices} end,
       follow: {replica, table},
       snapshot_dir: false}
    )

    loaded =
      RedisServer.wait_until(30_000, "the store", fn ->
        match?({:ok, _}, Store.fetch(store)) and Store.fetch(store)
      end)

    {:ok, %Store{origin: :stream}} = loaded
    price = Enum.at(prices, 42)

    conditions =
      [offering_id: price.offering_id, group_id: price.group_id, spec: price.spec] ++
        Enum.map(price.chars, &{:char, {&1.char, &1.value}})

    assert [%{idx: 42, value: value}] = Table.search(table, conditions)
    assert value == price.value

    PriceStream.add(client, "prices", [%{price | value: 4_242}])
    assert Replica.await(replica, :latest, 10_000) == :ok
    assert [%{idx: 42, value: 4_242}] = Table.search(table, conditions)

    {:ok, _id} = :eredis.q(client, ["XADD", "prices", "*" | Entry.delete_fields(42)])
    assert Replica.await(replica, :latest, 10_000) == :ok
    assert Table.search(table, conditions) == []
    :eredis.stop(client)
  end
end
