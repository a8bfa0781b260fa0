defmodule PriceSearch.SearchTest do
  use ExUnit.Case, async: true

  alias PriceCatalogue.MapIndex
  alias PriceSearch.Search

  test "conditions/1 of a request: offering, group, spec, then its characteristics" do
    request = %{
      offering: "o",
      group: "group1",
      spec: "MRC",
      chars: [{"Term", "12"}, {"VPN", "v"}],
      id: 0
    }

    assert Search.conditions(request) ==
             [
               offering_id: "o",
               group_id: "group1",
               spec: "MRC",
               char: {"Term", "12"},
               char: {"VPN", "v"}
             ]
  end

  # Go's FindPriceIndexBy looks values up in this order and names the first
  # one it does not know: offering, each characteristic (name, then value),
  # spec, group; with more than 64 characteristics they are checked first.
  test "the bitmap search names the first unknown value in Go's order" do
    name = :"#{__MODULE__}.order"
    prices = PriceCatalogue.generate(offerings: 1)
    start_supervised!({PriceSearch.Store, name: name, load: fn -> {"test", prices} end})
    {:ok, store} = await(name)
    [p | _] = prices
    chars = Enum.map(p.chars, &{&1.char, &1.value})
    good = %{offering: p.offering_id, group: p.group_id, spec: p.spec, chars: chars, id: 0}
    assert {:ok, %{idx: idx}} = Search.bitmap(store, good)
    assert idx == p.idx

    answer = fn changes -> Search.bitmap(store, Map.merge(good, changes)) end
    bad_char = [{"Colour", "red"} | chars]
    bad_value = chars ++ [{"Term", "999"}]

    for {changes, message} <- [
          {%{offering: "x", group: "x", spec: "x", chars: bad_char},
           "unable find offeringId in index"},
          {%{group: "x", spec: "x", chars: bad_char}, "unable to find charId in index"},
          {%{group: "x", spec: "x", chars: bad_value}, "unable to find charValue in index"},
          {%{chars: [{"Term", "999"}, {"Colour", "red"}]}, "unable to find charValue in index"},
          {%{group: "x", spec: "x"}, "unable find specId in index"},
          {%{group: "x"}, "unable find groupId in index"},
          {%{chars: []}, "unable find price, no default and >1 found"},
          {%{chars: List.duplicate(hd(chars), 70) ++ [{"Colour", "red"}]},
           "unable to find charId in index"},
          {%{spec: "x", chars: List.duplicate(hd(chars), 70)}, "unable find specId in index"}
        ] do
      assert answer.(changes) == {:error, message}

      assert [{:error, ^message}, {:ok, %{idx: ^idx}}] =
               Search.bitmap_many(store, [Map.merge(good, changes), good])
    end

    # Repeated characteristics, many of them: the same price.
    assert {:ok, %{idx: ^idx}} = answer.(%{chars: Enum.flat_map(1..30, fn _ -> chars end)})

    # The map search says only "unable find price".
    assert Search.map(store, Map.merge(good, %{group: "x", chars: bad_char})) ==
             {:error, "unable find price"}
  end

  # Go's FindPriceBy: in row order, a characteristic is the price's first one
  # with that name; the first matching default answers, several matches
  # without one are refused.
  test "the map index finds prices as Go's map variant does" do
    price = fn idx, group, chars, default ->
      %{
        idx: idx,
        offering_id: "o",
        group_id: group,
        spec: "MRC",
        chars: for({c, v} <- chars, do: %{char: c, value: v}),
        value: idx,
        is_default: default,
        currency: ""
      }
    end

    index =
      MapIndex.new([
        price.(0, "g1", [{"A", "1"}, {"A", "2"}], false),
        price.(1, "g1", [{"A", "3"}, {"B", "1"}], false),
        price.(2, "g1", [{"A", "3"}, {"B", "2"}], false),
        price.(3, "g1", [{"A", "3"}, {"B", "2"}], true),
        price.(4, "g2", [{"A", "4"}], false),
        price.(5, "g2", [{"A", "4"}], false)
      ])

    find = fn group, chars -> MapIndex.find(index, "o", group, "MRC", chars) end

    # Only the first "A" counts: its value is "1", so "2" matches nothing.
    assert {:ok, %{idx: 0}} = find.("g1", [{"A", "1"}])
    assert find.("g1", [{"A", "2"}]) == {:error, :no_price}
    assert {:ok, %{idx: 1}} = find.("g1", [{"B", "1"}, {"A", "3"}])
    # Two matches, the second a default.
    assert {:ok, %{idx: 3}} = find.("g1", [{"B", "2"}])
    # Two matches, no default.
    assert find.("g2", []) == {:error, :no_default}
    assert find.("g3", []) == {:error, :no_price}
    assert MapIndex.find(index, "p", "g1", "MRC", []) == {:error, :no_price}

    assert MapIndex.search(index,
             offering_id: "o",
             group_id: "g1",
             spec: "MRC",
             char: {"B", "1"}
           ) ==
             find.("g1", [{"B", "1"}])
  end

  test "the store and the listener refuse bad options with an ArgumentError naming them" do
    assert_raise ArgumentError, ~r/unknown keys \[:bogus\]/, fn ->
      PriceSearch.Store.start_link(bogus: 1)
    end

    assert_raise ArgumentError, ~r/Store option :load to be a function/, fn ->
      PriceSearch.Store.start_link(name: :x, load: :nope)
    end

    assert_raise ArgumentError, ~r/HTTP option :port to be an integer in 0..65535/, fn ->
      PriceSearch.HTTP.start_link(port: 70_000)
    end

    assert_raise ArgumentError, ~r/unknown keys \[:bogus\]/, fn ->
      PriceSearch.HTTP.start_link(bogus: 1)
    end

    for bad <- [:x, [1, 2], [{:port, 1} | :tail]] do
      assert_raise ArgumentError, ~r/options to be a keyword list/, fn ->
        PriceSearch.HTTP.start_link(bad)
      end

      assert_raise ArgumentError, ~r/options to be a keyword list/, fn ->
        PriceSearch.Store.start_link(bad)
      end
    end

    assert_raise ArgumentError, ~r/Store option :follow to be/, fn ->
      PriceSearch.Store.start_link(follow: :x)
    end
  end

  test "a store loads the records its :load gives, and fetch/1 answers :loading before" do
    name = :"#{__MODULE__}.store"
    assert PriceSearch.Store.fetch(name) == :loading
    prices = PriceCatalogue.generate(offerings: 1)
    start_supervised!({PriceSearch.Store, name: name, load: fn -> {"test", prices} end})
    assert {:ok, store} = await(name)
    assert store.size == length(prices)
    assert store.source == "test"
  end

  defp await(name) do
    case PriceSearch.Store.fetch(name) do
      {:ok, store} ->
        {:ok, store}

      :loading ->
        Process.sleep(50)
        await(name)
    end
  end
end
