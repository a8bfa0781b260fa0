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
