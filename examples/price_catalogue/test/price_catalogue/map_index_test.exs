defmodule PriceCatalogue.MapIndexTest do
  use ExUnit.Case, async: true

  alias Larder.Test.PropEr
  alias PriceCatalogue.MapIndex
  alias PriceCatalogue.Test.Gen

  defp prices(rows) do
    for {{o, g, s, chars, default, currency}, idx} <- Enum.with_index(rows) do
      %{
        idx: idx,
        offering_id: o,
        group_id: g,
        spec: s,
        chars: for({c, v} <- chars, do: %{char: c, value: v}),
        value: 100 + idx,
        is_default: default,
        currency: currency
      }
    end
  end

  # The Go map variant's answer by a plain scan: the first matching default,
  # else the one match. A characteristic is looked up by name: the first
  # with that name counts.
  defp scan(prices, o, g, s, chars) do
    matches =
      Enum.filter(prices, fn p ->
        p.offering_id == o and p.group_id == g and p.spec == s and
          Enum.all?(chars, fn {c, v} ->
            match?(%{value: ^v}, Enum.find(p.chars, &(&1.char == c)))
          end)
      end)

    answer = &{:ok, Map.take(&1, [:idx, :spec, :value, :currency, :is_default])}

    case {Enum.find(matches, & &1.is_default), matches} do
      {%{} = default, _} -> answer.(default)
      {nil, [one]} -> answer.(one)
      {nil, []} -> {:error, :no_price}
      {nil, _} -> {:error, :no_default}
    end
  end

  test "find answers as a scan of the prices in row order: offerings interleaved, characteristics of several widths" do
    # Offerings in runs that come back ("o1" again after "o2"), prices with
    # 0 to 3 characteristics (padded to an offering's widest), a name given
    # twice (the first counts), defaults and currencies.
    prices =
      prices([
        {"o1", "g1", "MRC", [{"a", "1"}, {"b", "x"}], false, ""},
        {"o1", "g1", "MRC", [{"a", "1"}], false, "EUR"},
        {"o2", "g2", "NRC", [], false, ""},
        {"o2", "g1", "MRC", [{"a", "2"}, {"c", "y"}, {"a", "1"}], false, "USD"},
        {"o1", "g1", "MRC", [{"a", "1"}, {"b", "z"}], true, ""},
        {"o1", "g2", "NRC", [{"b", "x"}], false, "EUR"},
        {"o2", "g1", "MRC", [{"a", "1"}, {"c", "y"}], false, ""},
        {"o3", "g1", "MRC", [{"a", "1"}], true, ""},
        {"o3", "g1", "MRC", [{"a", "1"}], true, "USD"}
      ])

    index = MapIndex.new(prices)
    assert MapIndex.valid?(index)
    assert MapIndex.size(index) == length(prices)

    values =
      [[], [{"a", "1"}], [{"a", "2"}], [{"b", "x"}], [{"a", "1"}, {"b", "x"}]] ++
        [[{"c", "y"}], [{"a", "1"}, {"c", "y"}], [{"b", "z"}], [{"a", "9"}], [{"d", "1"}]]

    for o <- ~w(o1 o2 o3 o4), g <- ~w(g1 g2 g9), s <- ~w(MRC NRC), chars <- values do
      assert MapIndex.find(index, o, g, s, chars) == scan(prices, o, g, s, chars),
             inspect({o, g, s, chars})
    end
  end

  test "search and args take conditions; a missing field matches nothing" do
    index = MapIndex.new(prices([{"o", "g", "MRC", [{"a", "1"}, {"b", "2"}], false, ""}]))

    conditions = [
      offering_id: "o",
      group_id: "g",
      spec: "MRC",
      char: {"a", "1"},
      char: {"b", "2"}
    ]

    assert MapIndex.args(conditions) == {"o", "g", "MRC", [{"a", "1"}, {"b", "2"}]}
    assert {:ok, %{idx: 0, value: 100}} = MapIndex.search(index, conditions)
    assert MapIndex.search(index, Keyword.delete(conditions, :group_id)) == {:error, :no_price}
    assert MapIndex.args([]) == {nil, nil, nil, []}
  end

  test "every price of the generated catalogue is found by its own conditions" do
    prices = PriceCatalogue.generate(offerings: 1)
    index = MapIndex.new(prices)
    assert MapIndex.size(index) == length(prices)

    for price <- Enum.take_every(prices, 97) do
      assert {:ok, answer} = MapIndex.search(index, PriceCatalogue.conditions_of(price))
      assert answer == Map.take(price, [:idx, :spec, :value, :currency, :is_default])
    end
  end

  test "property: find over random catalogues answers as the scan" do
    char =
      :proper_types.tuple([:proper_types.elements(~w(a b c)), :proper_types.elements(~w(1 2))])

    row =
      :proper_types.tuple([
        :proper_types.elements(~w(o1 o2)),
        :proper_types.elements(~w(g1 g2)),
        :proper_types.elements(~w(MRC NRC)),
        :proper_types.list(char),
        :proper_types.frequency([{4, false}, {1, true}]),
        :proper_types.elements(["", "EUR"])
      ])

    request =
      :proper_types.tuple([
        :proper_types.elements(~w(o1 o2 o3)),
        :proper_types.elements(~w(g1 g2 g3)),
        :proper_types.elements(~w(MRC NRC)),
        :proper_types.list(char)
      ])

    PropEr.check(
      PropEr.forall({:proper_types.list(row), :proper_types.list(request)}, fn {rows, requests} ->
        prices = prices(rows)
        index = MapIndex.new(prices)

        got = for {o, g, s, chars} <- requests, do: MapIndex.find(index, o, g, s, chars)
        want = for {o, g, s, chars} <- requests, do: scan(prices, o, g, s, chars)
        :proper.equals(got, want)
      end),
      numtests: 300,
      max_size: 20
    )
  end

  test "valid? refuses terms a find over which could raise" do
    index = MapIndex.new(prices([{"o", "g", "MRC", [{"a", "1"}], false, ""}]))
    assert MapIndex.valid?(index)
    %{ids: ids, names: names, offerings: %{"o" => {codes, stride, chars, answers}}} = index

    forged = [
      :not_a_map,
      %{},
      Map.put(index, :extra, 1),
      %{index | names: List.to_tuple([:atom | tl(Tuple.to_list(names))])},
      # A group's number that is not an integer: the search shifts it.
      %{index | ids: Map.put(ids, "g", :g)},
      # An odd stride: characteristics are read in pairs, past the tuple's end.
      %{index | offerings: %{"o" => {codes, 1, {elem(chars, 0)}, answers}}},
      # An improper list of codes: the scan would meet its tail.
      %{index | offerings: %{"o" => {[hd(codes) | :tail], stride, chars, answers}}},
      # Sizes that disagree.
      %{index | offerings: %{"o" => {codes, stride, {}, answers}}},
      %{index | offerings: %{"o" => {codes, stride, chars, {1, 2}}}},
      # An answer naming a string the index does not have.
      %{
        index
        | offerings: %{"o" => {codes, stride, chars, put_elem(answers, 2, Bitwise.bsl(1, 40))}}
      },
      %{index | offerings: %{"o" => {codes, stride, chars, put_elem(answers, 0, "1")}}},
      %{index | offerings: %{:o => {codes, stride, chars, answers}}}
    ]

    for term <- forged, do: refute(MapIndex.valid?(term), inspect(term))
  end

  test "property: find over any term valid? accepts does not raise" do
    base = MapIndex.new(prices([{"o", "g", "MRC", [{"a", "1"}, {"b", "2"}], true, "EUR"}]))
    %{offerings: %{"o" => {codes, _stride, chars, answers}}} = base
    int = :proper_types.oneof([:proper_types.integer(), :proper_types.elements([0, 1, 2, 3])])
    term = :proper_types.oneof([int, :proper_types.any()])

    # Indexes with the right containers and random contents: most are
    # refused, and any accepted one must be searchable.
    gen =
      Gen.let(
        {:proper_types.vector(8, term),
         :proper_types.list(:proper_types.elements(["", "g", "MRC", "a", "1"])),
         :proper_types.list(term), :proper_types.elements([0, 2, 4]), :proper_types.list(term),
         :proper_types.list(int)},
        fn {ids, names, codes2, stride, table, answers2} ->
          %{
            ids: Map.new(Enum.zip(~w(g MRC a 1 b 2 EUR x), ids)),
            names: List.to_tuple(names),
            offerings: %{
              "o" =>
                {codes ++ codes2, stride, List.to_tuple(Tuple.to_list(chars) ++ table),
                 List.to_tuple(Tuple.to_list(answers) ++ answers2)}
            }
          }
        end
      )

    PropEr.check(
      PropEr.forall(gen, fn index ->
        if MapIndex.valid?(index) do
          for g <- ~w(g x),
              s <- ~w(MRC x),
              chars <- [[], [{"a", "1"}], [{"b", "2"}, {"a", "x"}]] do
            MapIndex.find(index, "o", g, s, chars)
          end

          MapIndex.size(index)
        end

        true
      end),
      numtests: 500,
      max_size: 20
    )
  end
end
