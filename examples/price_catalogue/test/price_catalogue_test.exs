defmodule PriceCatalogueTest do
  use ExUnit.Case, async: true

  alias PriceCatalogue.{CSV, Error}

  @moduletag :tmp_dir

  test "the generator has the reference's shape and is deterministic" do
    prices = PriceCatalogue.generate(offerings: 2)
    assert length(prices) == 2 * 9_744
    assert prices == PriceCatalogue.generate(offerings: 2)
    refute prices == PriceCatalogue.generate(offerings: 2, seed: 7)
    assert Enum.map(prices, & &1.idx) == Enum.to_list(0..(2 * 9_744 - 1))
    assert Enum.all?(prices, &(&1.value == &1.idx and not &1.is_default and &1.currency == ""))

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

    assert PriceCatalogue.generate(offerings: 0) == []
    assert_raise ArgumentError, ~r/:offerings/, fn -> PriceCatalogue.generate(offerings: -1) end
    assert_raise ArgumentError, ~r/:seed/, fn -> PriceCatalogue.generate(seed: "1") end
  end

  test "sampled requests each match exactly their price by the plain filter" do
    prices = PriceCatalogue.generate(offerings: 1)
    requests = PriceCatalogue.sample_requests(prices, 20)
    assert requests == PriceCatalogue.sample_requests(prices, 20)
    assert length(requests) == 20

    for conditions <- requests do
      assert [price] = PriceCatalogue.filter(prices, conditions)
      assert PriceCatalogue.conditions_of(price) == conditions
    end

    assert PriceCatalogue.sample_requests(prices, 0) == []
    assert_raise ArgumentError, fn -> PriceCatalogue.sample_requests([], 3) end
  end

  test "matches? holds when every condition does" do
    price = hd(PriceCatalogue.generate(offerings: 1))
    assert PriceCatalogue.matches?(price, [])
    assert PriceCatalogue.matches?(price, offering_id: price.offering_id, char: {"Term", "12"})
    refute PriceCatalogue.matches?(price, char: {"Term", "13"})
    refute PriceCatalogue.matches?(price, spec: "other")
    assert PriceCatalogue.matches?(price, idx: 0)
    refute PriceCatalogue.matches?(price, nope: 0)
  end

  test "load reads the CSV, plain or gzipped", %{tmp_dir: dir} do
    prices = Enum.take(PriceCatalogue.generate(offerings: 1), 100)
    plain = Path.join(dir, "p.csv")
    gz = Path.join(dir, "p.csv.gz")
    File.write!(plain, CSV.encode(prices))
    File.write!(gz, :zlib.gzip(CSV.encode(prices)))

    assert PriceCatalogue.load(plain) == {:ok, prices}
    assert PriceCatalogue.load(gz) == {:ok, prices}
  end

  test "load failures are PriceCatalogue.Error values naming the file", %{tmp_dir: dir} do
    missing = Path.join(dir, "missing.csv")

    assert {:error, %Error{reason: :file_error, posix: :enoent, path: ^missing} = error} =
             PriceCatalogue.load(missing)

    assert Exception.message(error) =~ missing

    bad = Path.join(dir, "bad.csv.gz")
    File.write!(bad, "not gzip")
    assert {:error, %Error{reason: :not_gzip, path: ^bad}} = PriceCatalogue.load(bad)

    truncated = Path.join(dir, "truncated.csv.gz")
    gzipped = :zlib.gzip(CSV.encode(PriceCatalogue.generate(offerings: 1)))
    File.write!(truncated, binary_part(gzipped, 0, div(byte_size(gzipped), 2)))
    assert {:error, %Error{reason: :not_gzip}} = PriceCatalogue.load(truncated)

    short = Path.join(dir, "short.csv")
    File.write!(short, CSV.header() <> "\n1,2,3\n")
    assert {:error, %Error{reason: :malformed} = error} = PriceCatalogue.load(short)
    assert Exception.message(error) =~ "line 2 has 3 fields"

    headless = Path.join(dir, "headless.csv")
    File.write!(headless, "0,o,group1,MRC,Term,12,0,false,\n")
    assert {:error, %Error{reason: :malformed}} = PriceCatalogue.load(headless)
  end

  test "requests are read from JSON lines into conditions", %{tmp_dir: dir} do
    path = Path.join(dir, "r.jsonl")

    File.write!(path, """
    {"offeringId":"o","groupId":"group1","priceSpecId":"MRC","charValues":[{"char":"Term","value":"12"}]}

    {"offeringId":"p","groupId":"group2","priceSpecId":"NRC","charValues":[]}
    """)

    assert PriceCatalogue.requests(path) ==
             {:ok,
              [
                [offering_id: "o", group_id: "group1", spec: "MRC", char: {"Term", "12"}],
                [offering_id: "p", group_id: "group2", spec: "NRC"]
              ]}

    for {line, why} <- [
          {"{\"offeringId\":", "not JSON"},
          {"[1,2]", "not a reference request"},
          {~s({"offeringId":1,"groupId":"g","priceSpecId":"s","charValues":[]}),
           "not a reference"},
          {~s({"offeringId":"o","groupId":"g","priceSpecId":"s","charValues":[{"char":"a"}]}),
           "not a reference"}
        ] do
      File.write!(
        path,
        ~s({"offeringId":"o","groupId":"g","priceSpecId":"s","charValues":[]}\n) <> line
      )

      assert {:error, %Error{reason: :malformed} = error} = PriceCatalogue.requests(path)
      assert Exception.message(error) =~ "line 2: #{why}"
    end

    assert {:error, %Error{reason: :file_error}} = PriceCatalogue.requests(Path.join(dir, "none"))
  end

  test "conditions/1 and request_json/1 are inverses" do
    for conditions <- PriceCatalogue.sample_requests(PriceCatalogue.generate(offerings: 1), 5) do
      json = PriceCatalogue.request_json(conditions)
      assert PriceCatalogue.conditions(json) == conditions

      assert PriceCatalogue.conditions(:jiffy.decode(:jiffy.encode(json), [:return_maps])) ==
               conditions
    end
  end

  test "reference_or_generated reads a directory that has the files, else generates", %{
    tmp_dir: dir
  } do
    prices = Enum.take(PriceCatalogue.generate(offerings: 1), 50)
    requests = PriceCatalogue.sample_requests(prices, 3)
    csv = Path.join(dir, "prices-487k.csv.gz")
    File.write!(csv, :zlib.gzip(CSV.encode(prices)))

    File.write!(
      Path.join(dir, "requests-100.jsonl"),
      Enum.map(requests, &[:jiffy.encode(PriceCatalogue.request_json(&1)), "\n"])
    )

    assert PriceCatalogue.reference_or_generated(dir) == {csv, prices, requests}

    # The single request: request-single.json when the catalogue came from
    # the directory, else the price with value 2320, else the first.
    assert PriceCatalogue.single_request(prices, csv, dir) ==
             PriceCatalogue.conditions_of(hd(prices))

    single = Path.join(dir, "request-single.json")
    File.write!(single, :jiffy.encode(PriceCatalogue.request_json(Enum.at(requests, 1))))
    assert PriceCatalogue.single_request(prices, csv, dir) == Enum.at(requests, 1)
    File.write!(single, "{")

    assert_raise ArgumentError, ~r/request-single.json: not JSON/, fn ->
      PriceCatalogue.single_request(prices, csv, dir)
    end

    # A damaged catalogue falls back to the generated one.
    File.write!(csv, "damaged")
    assert {"generated (seed 1)", generated, sampled} = PriceCatalogue.reference_or_generated(dir)
    assert length(generated) == 50 * 9_744
    assert length(sampled) == 100

    assert PriceCatalogue.single_request(generated, "generated (seed 1)", dir) ==
             PriceCatalogue.conditions_of(Enum.at(generated, 2320))
  end

  test "default_dir is CATALOGUE_DIR when set, else beside the Larder checkout" do
    # Read only: the environment is global, so this test does not set it.
    case System.get_env("CATALOGUE_DIR") do
      nil ->
        assert PriceCatalogue.default_dir() ==
                 Path.expand("../../../../shared/data/price-catalogue", __DIR__)

      dir ->
        assert PriceCatalogue.default_dir() == dir
    end
  end
end
