defmodule PriceSearch.StoreTest do
  use ExUnit.Case, async: true

  alias Larder.Table
  alias PriceSearch.Store

  test "the store's table answers sampled requests with the one price a plain filter finds" do
    prices = PriceCatalogue.generate(offerings: 1)
    table = Table.new(Store.table_opts())
    :ok = Table.insert_many(table, prices)

    for conditions <- PriceCatalogue.sample_requests(prices, 20) do
      assert [expected] = PriceCatalogue.filter(prices, conditions)

      assert Table.search(table, conditions) == [
               Map.take(expected, [:idx, :spec, :value, :currency, :is_default])
             ]
    end
  end

  test "table_opts/1 takes a name and overrides" do
    opts = Store.table_opts(name: :some_table)
    assert opts[:name] == :some_table
    assert opts[:key] == :idx
    assert Store.table_opts(store: [:idx])[:store] == [:idx]
    assert length(Keyword.get_values(Store.table_opts(store: [:idx]), :store)) == 1
  end
end
