defmodule PriceSearch.PriceStreamTest do
  # The prices stream: a price survives its trip through the stream's
  # fields, and a store that follows a stream (through a Larder.Replica on
  # a real redis-server) answers with the stream's latest prices.
  use ExUnit.Case, async: true

  alias Larder.Replica
  alias Larder.Table
  alias PriceSearch.{Catalogue, PriceStream, Store, TestRedis}

  @moduletag :redis

  test "a price as stream fields and back" do
    for price <- Enum.take(Catalogue.generate(), 50) do
      fields =
        price |> PriceStream.fields() |> Enum.chunk_every(2) |> Map.new(fn [k, v] -> {k, v} end)

      assert PriceStream.apply_entry(fields) == {:insert, price}
    end

    assert PriceStream.apply_entry(Map.new([PriceStream.delete_fields(7) |> List.to_tuple()])) ==
             {:delete, 7}

    assert_raise ArgumentError, fn -> PriceStream.apply_entry(%{"price" => "1\t2"}) end

    price = hd(Catalogue.generate())
    assert_raise ArgumentError, fn -> PriceStream.fields(%{price | spec: "a\tb"}) end
  end

  test "a store that follows a stream answers with its latest prices", ctx do
    redis = TestRedis.start()
    on_exit(fn -> TestRedis.stop(redis) end)
    prices = Enum.take(Catalogue.generate(), 500)
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
      TestRedis.wait_until(30_000, "the store", fn ->
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
    :eredis.stop(client)
  end
end
