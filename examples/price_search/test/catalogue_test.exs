defmodule PriceSearch.CatalogueTest do
  use ExUnit.Case, async: true

  alias Larder.Table
  alias PriceSearch.Catalogue

  @moduletag :tmp_dir

  test "the generator has the reference's shape and is deterministic" do
    prices = Catalogue.generate(offerings: 2)
    assert length(prices) == 2 * 9_744
    assert prices == Catalogue.generate(offerings: 2)
    refute prices == Catalogue.generate(offerings: 2, seed: 7)

    assert prices |> Enum.map(& &1.offering_id) |> Enum.uniq() |> length() == 2

    assert prices |> Enum.map(& &1.group_id) |> Enum.uniq() |> Enum.sort() ==
             ~w(group1 group2 group3 group4 group5)

    assert Enum.all?(prices, &(&1.spec == if(rem(&1.idx, 2) == 0, do: "MRC", else: "NRC")))

    counts =
      for name <- ["Term", "B2B Traffic", "VPN", "B2B Bandwidth", "Router"] do
        prices
        |> Enum.map(fn p -> Enum.find(p.chars, &(&1.char == name)).value end)
        |> Enum.uniq()
        |> length()
      end

    assert counts == [6, 7, 4, 29, 2]
    # An offering plus the five values identify a price.
    assert prices |> Enum.uniq_by(&{&1.offering_id, &1.chars}) |> length() == length(prices)
  end

  test "sampled requests each match exactly one price, through Table and a plain filter" do
    prices = Catalogue.generate(offerings: 1)
    table = Table.new(Catalogue.table_opts(store: [:idx, :spec, :value, :currency]))
    :ok = Table.insert_many(table, prices)

    for conditions <- Catalogue.sample_requests(prices, 20) do
      assert [expected] = Catalogue.filter(prices, conditions)

      assert Table.search(table, conditions) == [
               Map.take(expected, [:idx, :spec, :value, :currency])
             ]
    end
  end

  test "map_find answers as a scan of the prices in row order: offerings interleaved, characteristics of several widths" do
    # Offerings in runs that come back ("o1" again after "o2"), prices with
    # 0 to 3 characteristics (padded to an offering's widest), a name given
    # twice (the first counts), defaults and currencies.
    rows = [
      {"o1", "g1", "MRC", [{"a", "1"}, {"b", "x"}], false, ""},
      {"o1", "g1", "MRC", [{"a", "1"}], false, "EUR"},
      {"o2", "g2", "NRC", [], false, ""},
      {"o2", "g1", "MRC", [{"a", "2"}, {"c", "y"}, {"a", "1"}], false, "USD"},
      {"o1", "g1", "MRC", [{"a", "1"}, {"b", "z"}], true, ""},
      {"o1", "g2", "NRC", [{"b", "x"}], false, "EUR"},
      {"o2", "g1", "MRC", [{"a", "1"}, {"c", "y"}], false, ""},
      {"o3", "g1", "MRC", [{"a", "1"}], true, ""},
      {"o3", "g1", "MRC", [{"a", "1"}], true, "USD"}
    ]

    prices =
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

    index = Catalogue.map_index(prices)
    assert Catalogue.map_index?(index)
    assert Catalogue.map_index_size(index) == length(prices)

    values =
      [[], [{"a", "1"}], [{"a", "2"}], [{"b", "x"}], [{"a", "1"}, {"b", "x"}]] ++
        [[{"c", "y"}], [{"a", "1"}, {"c", "y"}], [{"b", "z"}], [{"a", "9"}], [{"d", "1"}]]

    for o <- ~w(o1 o2 o3 o4), g <- ~w(g1 g2 g9), s <- ~w(MRC NRC), chars <- values do
      assert Catalogue.map_find(index, o, g, s, chars) == scan(prices, o, g, s, chars),
             inspect({o, g, s, chars})
    end
  end

  # The Go map variant's answer by a plain scan: the first matching default,
  # else the one match.
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

  test "load reads the CSV, plain or gzipped", %{tmp_dir: dir} do
    csv = """
    idx,offeringId,groupId,spec,chars,values,value,isDefault,currency
    0,off-1,group3,MRC,Term|Router,12|Included,0,false,
    1,off-1,group2,NRC,Term|Router,12|Not Included,1,false,EUR
    """

    plain = Path.join(dir, "p.csv")
    gz = Path.join(dir, "p.csv.gz")
    File.write!(plain, csv)
    File.write!(gz, :zlib.gzip(csv))

    assert {:ok, [first, second]} = Catalogue.load(plain)
    assert {:ok, [^first, ^second]} = Catalogue.load(gz)

    assert first == %{
             idx: 0,
             offering_id: "off-1",
             group_id: "group3",
             spec: "MRC",
             chars: [%{char: "Term", value: "12"}, %{char: "Router", value: "Included"}],
             value: 0,
             is_default: false,
             currency: ""
           }

    assert second.currency == "EUR"
  end

  test "load failures are Larder.Error values", %{tmp_dir: dir} do
    assert {:error, %Larder.Error{reason: :loader_failed}} =
             Catalogue.load(Path.join(dir, "missing.csv"))

    bad = Path.join(dir, "bad.csv.gz")
    File.write!(bad, "not gzip")
    assert {:error, %Larder.Error{reason: :loader_failed}} = Catalogue.load(bad)

    short = Path.join(dir, "short.csv")
    File.write!(short, "header\n1,2,3\n")
    assert {:error, %Larder.Error{reason: :loader_failed}} = Catalogue.load(short)

    uneven = Path.join(dir, "uneven.csv")
    File.write!(uneven, "header\n0,o,group1,MRC,Term|Router,12,0,false,\n")
    assert {:error, %Larder.Error{reason: :loader_failed}} = Catalogue.load(uneven)

    not_int = Path.join(dir, "not_int.csv")
    File.write!(not_int, "header\nx,o,group1,MRC,Term,12,0,false,\n")
    assert {:error, %Larder.Error{reason: :loader_failed}} = Catalogue.load(not_int)
  end

  test "load keeps one copy of each repeated string and characteristics list", %{tmp_dir: dir} do
    path = Path.join(dir, "shared.csv")

    File.write!(path, """
    idx,offeringId,groupId,spec,chars,values,value,isDefault,currency
    0,off-1,group3,MRC,Term|Router,12|Included,0,false,EUR
    1,off-1,group3,MRC,Term|Router,12|Included,1,true,EUR
    2,off-2,group3,NRC,Term|Router,24|Included,2,false,EUR
    """)

    assert {:ok, [a, b, c]} = Catalogue.load(path)
    assert b.is_default and not a.is_default
    assert :erts_debug.same(a.chars, b.chars)
    assert :erts_debug.same(a.offering_id, b.offering_id)
    assert :erts_debug.same(a.group_id, c.group_id)
    assert :erts_debug.same(a.currency, c.currency)
    # "Router" and "Included" shared across different lists
    assert :erts_debug.same(Enum.at(a.chars, 1).char, Enum.at(c.chars, 1).char)
    assert :erts_debug.same(Enum.at(a.chars, 1).value, Enum.at(c.chars, 1).value)
  end

  test "requests are read from JSON lines into conditions", %{tmp_dir: dir} do
    path = Path.join(dir, "r.jsonl")

    File.write!(path, """
    {"offeringId":"o","groupId":"group1","priceSpecId":"MRC","charValues":[{"char":"Term","value":"12"}]}
    """)

    assert Catalogue.requests(path) ==
             {:ok, [[offering_id: "o", group_id: "group1", spec: "MRC", char: {"Term", "12"}]]}
  end
end
