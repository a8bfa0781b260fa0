defmodule PriceCatalogue do
  @moduledoc """
  The price catalogue of the Go reference service (marniks7/bitmap-usage)
  that the price search example serves and that Larder's benchmarks, demo
  and tests search: the shared CSV or a generated catalogue of the same
  shape, the reference requests, and a plain filter that gives the
  expected answers.

  Plain Elixir and OTP (and jiffy, Debian's `erlang-jiffy`, for the
  requests' JSON): nothing of Larder, so that the example depends only on
  Larder's public API and this package, and Larder's own benchmarks and
  tests on no example's code.

    * `PriceCatalogue` - loading, generating, requests, the plain filter;
    * `PriceCatalogue.CSV` - the CSV text, both ways;
    * `PriceCatalogue.Entry` - a price change as a log entry's fields, both
      ways (the `prices` stream a replica follows);
    * `PriceCatalogue.MapIndex` - the Go service's map index and search;
    * `PriceCatalogue.Changes` - random price changes, paced;
    * `PriceCatalogue.RawFile` - a file read without the file server.

  ## The shared data

  `default_dir/0` is where the reference data lies: `CATALOGUE_DIR` when
  set, else `../shared/data/price-catalogue` beside the Larder checkout. It
  is read from there, never copied: `prices-487k.csv.gz` (487,200 prices),
  `requests-100.jsonl` (100 requests, each matching one price) and
  `request-single.json`.
  """

  import Bitwise

  alias PriceCatalogue.{CSV, Error, RawFile}

  # The shared reference data sits beside the Larder checkout
  # (`<larder>/../shared/data/price-catalogue`); CATALOGUE_DIR overrides it.
  @larder_root Path.expand("../../..", __DIR__)
  @shared_dir Path.expand("../shared/data/price-catalogue", @larder_root)

  @terms ~w(12 18 24 36 48 60)
  @traffic ~w(1GB 2GB 5GB 10GB 20GB 50GB 100GB)
  @bandwidth ~w(1Mbps 5Mbps 10Mbps 20Mbps 25Mbps 30Mbps 50Mbps 75Mbps 100Mbps 125Mbps
                150Mbps 175Mbps 200Mbps 250Mbps 300Mbps 350Mbps 400Mbps 450Mbps 500Mbps
                550Mbps 600Mbps 650Mbps 700Mbps 750Mbps 800Mbps 850Mbps 900Mbps 950Mbps 1Gbps)
  @router ["Included", "Not Included"]

  @typedoc "A price: a CSV row as a map, its characteristics as a list of maps."
  @type price :: %{
          idx: non_neg_integer(),
          offering_id: String.t(),
          group_id: String.t(),
          spec: String.t(),
          chars: [%{char: String.t(), value: String.t()}],
          value: non_neg_integer(),
          is_default: boolean(),
          currency: String.t()
        }

  @typedoc """
  A search request as conditions: `offering_id:`, `group_id:`, `spec:`,
  then one `{:char, {name, value}}` per requested characteristic (the
  shape `Larder.Table.search/2` takes for the catalogue's indexes).
  """
  @type conditions :: [
          {:offering_id | :group_id | :spec, String.t()} | {:char, {String.t(), String.t()}}
        ]

  @doc """
  The directory of the shared reference data: `CATALOGUE_DIR` when set, else
  `../shared/data/price-catalogue` next to the Larder checkout.
  """
  @spec default_dir() :: Path.t()
  def default_dir, do: System.get_env("CATALOGUE_DIR") || @shared_dir

  @doc """
  The shared catalogue when `dir` has it, else the generated one:
  `{source, prices, requests}`, where `source` is the CSV's path or
  `"generated (seed 1)"`, and requests are conditions (the reference's
  100, or 100 sampled from the generated prices).

  A catalogue or requests file that is there but cannot be read falls
  back to the generated catalogue too: the caller reports `source`.
  """
  @spec reference_or_generated(Path.t()) :: {String.t(), [price()], [conditions()]}
  def reference_or_generated(dir \\ default_dir()) do
    csv = Path.join(dir, "prices-487k.csv.gz")
    jsonl = Path.join(dir, "requests-100.jsonl")

    with true <- File.exists?(csv) and File.exists?(jsonl),
         {:ok, prices} <- load(csv),
         {:ok, requests} <- requests(jsonl) do
      {csv, prices, requests}
    else
      _ ->
        prices = generate()
        {"generated (seed 1)", prices, sample_requests(prices, 100)}
    end
  end

  @doc """
  Loads a CSV catalogue (`.csv`, or gzipped when the name ends in `.gz`;
  see `PriceCatalogue.CSV` for the text and how repeated strings are
  shared): `{:ok, prices}` in line order, or `{:error,
  %PriceCatalogue.Error{}}` for a file that cannot be read, is not gzip or
  is not a catalogue. The file is read in the caller
  (`PriceCatalogue.RawFile`).
  """
  @spec load(Path.t()) :: {:ok, [price()]} | {:error, Error.t()}
  def load(path) do
    with {:ok, data} <- read(path),
         {:ok, text} <- gunzip(data, path) do
      case CSV.decode(text) do
        {:ok, prices} -> {:ok, prices}
        {:error, message} -> {:error, Error.new(:malformed, path, message)}
      end
    end
  end

  defp read(path) do
    case RawFile.read(path) do
      {:ok, data} ->
        {:ok, data}

      {:error, posix} ->
        {:error,
         Error.new(:file_error, path, "cannot read: #{:file.format_error(posix)}", posix: posix)}
    end
  end

  defp gunzip(data, path) do
    if String.ends_with?(path, ".gz") do
      try do
        {:ok, :zlib.gunzip(data)}
      rescue
        ErlangError -> {:error, Error.new(:not_gzip, path, "not a gzip file, or truncated")}
      end
    else
      {:ok, data}
    end
  end

  @doc """
  Generates a catalogue of the reference's shape, the same for the same
  options: `:offerings` (default 50) offerings of 9,744 prices, every
  combination of Term (6 values), B2B Traffic (7), VPN (4), B2B Bandwidth
  (29) and Router (2) once per offering; `idx` and `value` the row number;
  spec alternating MRC/NRC by row; group `group1`..`group5` drawn from a
  generator seeded with `:seed` (default 1); no default prices, no
  currency.
  """
  @spec generate(keyword()) :: [price()]
  def generate(opts \\ []) do
    offerings = Keyword.get(opts, :offerings, 50)
    seed = Keyword.get(opts, :seed, 1)

    unless is_integer(offerings) and offerings >= 0,
      do:
        raise(
          ArgumentError,
          ":offerings must be a non-negative integer, got: #{inspect(offerings)}"
        )

    unless is_integer(seed),
      do: raise(ArgumentError, ":seed must be an integer, got: #{inspect(seed)}")

    rand = :rand.seed_s(:exsss, seed)

    {offering_ids, rand} =
      Enum.map_reduce(List.duplicate(nil, offerings), rand, fn _, r -> uuid(r) end)

    {vpns, rand} = Enum.map_reduce(1..4, rand, fn _, r -> uuid(r) end)

    combos =
      for t <- @terms, tr <- @traffic, v <- vpns, b <- @bandwidth, ro <- @router do
        Enum.zip_with(
          ["Term", "B2B Traffic", "VPN", "B2B Bandwidth", "Router"],
          [t, tr, v, b, ro],
          &%{char: &1, value: &2}
        )
      end

    groups = List.to_tuple(for g <- 1..5, do: "group#{g}")
    rows = for offering <- offering_ids, chars <- combos, do: {offering, chars}

    {prices, _} =
      rows
      |> Enum.with_index()
      |> Enum.map_reduce(rand, fn {{offering, chars}, idx}, rand ->
        {g, rand} = :rand.uniform_s(5, rand)

        price = %{
          idx: idx,
          offering_id: offering,
          group_id: elem(groups, g - 1),
          spec: if(rem(idx, 2) == 0, do: "MRC", else: "NRC"),
          chars: chars,
          value: idx,
          is_default: false,
          currency: ""
        }

        {price, rand}
      end)

    prices
  end

  defp uuid(rand) do
    {n, rand} = :rand.uniform_s(1 <<< 122, rand)
    <<a::32, b::16, c::12, d::14, e::48>> = <<n - 1::122>>

    hex = fn int, bits ->
      int |> Integer.to_string(16) |> String.downcase() |> String.pad_leading(div(bits, 4), "0")
    end

    {"#{hex.(a, 32)}-#{hex.(b, 16)}-4#{hex.(c, 12)}-#{hex.(0x8000 + d, 16)}-#{hex.(e, 48)}", rand}
  end

  @doc "The `{char, value}` terms of a price's characteristics, in order."
  @spec char_terms(price()) :: [{String.t(), String.t()}]
  def char_terms(price), do: Enum.map(price.chars, &{&1.char, &1.value})

  @doc """
  The conditions of one reference request (a JSON object decoded to a map,
  as jiffy's `:return_maps` decodes it). Raises `ArgumentError` for a map
  of another shape (a field that is not a string, `charValues` that is
  not a list of `{"char", "value"}` objects).
  """
  @spec conditions(map()) :: conditions()
  def conditions(
        %{"offeringId" => o, "groupId" => g, "priceSpecId" => s, "charValues" => cvs} = request
      )
      when is_binary(o) and is_binary(g) and is_binary(s) and is_list(cvs) do
    [offering_id: o, group_id: g, spec: s] ++
      for cv <- cvs do
        case cv do
          %{"char" => c, "value" => v} when is_binary(c) and is_binary(v) -> {:char, {c, v}}
          _ -> raise ArgumentError, "not a reference request: #{inspect(request)}"
        end
      end
  end

  def conditions(request),
    do: raise(ArgumentError, "not a reference request: #{inspect(request)}")

  @doc """
  The JSON request (a map, as jiffy encodes and decodes it) of
  `conditions`: the inverse of `conditions/1`.
  """
  @spec request_json(conditions()) :: map()
  def request_json(conditions) do
    %{
      "offeringId" => Keyword.fetch!(conditions, :offering_id),
      "groupId" => Keyword.fetch!(conditions, :group_id),
      "priceSpecId" => Keyword.fetch!(conditions, :spec),
      "charValues" => for({:char, {c, v}} <- conditions, do: %{"char" => c, "value" => v})
    }
  end

  @doc """
  The conditions that find exactly `price`: its offering, group, spec and
  every characteristic.
  """
  @spec conditions_of(price()) :: conditions()
  def conditions_of(price) do
    [offering_id: price.offering_id, group_id: price.group_id, spec: price.spec] ++
      for({c, v} <- char_terms(price), do: {:char, {c, v}})
  end

  @doc """
  The single-request benchmark's conditions: `request-single.json` in `dir`
  when `source` (as `reference_or_generated/1` returns it) is a file of
  `dir`, else the conditions of the price with value 2320 (the reference's
  choice) in `prices`, or of the first price. Raises `ArgumentError` when
  `request-single.json` is there but is not a request.
  """
  @spec single_request([price()], String.t(), Path.t()) :: conditions()
  def single_request(prices, source, dir \\ default_dir()) do
    path = Path.join(dir, "request-single.json")

    case Path.dirname(source) == dir and RawFile.read(path) do
      {:ok, json} ->
        case decode_request(json) do
          {:ok, conditions} -> conditions
          {:error, why} -> raise ArgumentError, "#{path}: #{why}"
        end

      _ ->
        conditions_of(Enum.find(prices, &(&1.value == 2320)) || hd(prices))
    end
  end

  @doc """
  Reads a requests file (`requests-100.jsonl`: one JSON request a line)
  into conditions: `{:ok, requests}` in line order, or `{:error,
  %PriceCatalogue.Error{}}` for a file that cannot be read or a line that
  is not a request.
  """
  @spec requests(Path.t()) :: {:ok, [conditions()]} | {:error, Error.t()}
  def requests(path) do
    with {:ok, text} <- read(path) do
      text
      |> String.split("\n", trim: true)
      |> Enum.with_index(1)
      |> Enum.reduce_while({:ok, []}, fn {line, n}, {:ok, acc} ->
        case decode_request(line) do
          {:ok, conditions} -> {:cont, {:ok, [conditions | acc]}}
          {:error, why} -> {:halt, {:error, Error.new(:malformed, path, "line #{n}: #{why}")}}
        end
      end)
      |> case do
        {:ok, requests} -> {:ok, :lists.reverse(requests)}
        error -> error
      end
    end
  end

  defp decode_request(json) do
    {:ok, conditions(:jiffy.decode(json, [:return_maps]))}
  rescue
    error in ArgumentError -> {:error, Exception.message(error)}
  catch
    # jiffy's error for text that is not JSON: {byte position, reason}.
    :error, {position, reason} when is_integer(position) ->
      {:error, "not JSON (#{inspect(reason)} at byte #{position})"}
  end

  @doc """
  The conditions of `n` prices picked from `prices` by a generator with a
  fixed seed (the same picks for the same prices), each matching its price
  (and, in a catalogue of the reference's shape, only it).
  """
  @spec sample_requests([price()], non_neg_integer()) :: [conditions()]
  def sample_requests(_prices, 0), do: []

  def sample_requests(prices, n) when is_integer(n) and n > 0 and prices != [] do
    tuple = List.to_tuple(prices)

    {picks, _} =
      Enum.map_reduce(1..n, :rand.seed_s(:exsss, 2), fn _, r ->
        :rand.uniform_s(tuple_size(tuple), r)
      end)

    for i <- picks, do: conditions_of(elem(tuple, i - 1))
  end

  def sample_requests(prices, n) do
    raise ArgumentError,
          "sample_requests/2 takes a non-empty list of prices and a count, got: " <>
            "#{inspect(prices, limit: 3)} and #{inspect(n)}"
  end

  @doc """
  The expected answer to `conditions` by a plain filter over `prices`: the
  prices for which every condition holds, in order. O(prices x
  conditions).
  """
  @spec filter([price()], conditions()) :: [price()]
  def filter(prices, conditions), do: Enum.filter(prices, &matches?(&1, conditions))

  @doc """
  Whether every condition holds for `price`: each `{field, value}` a
  field of the price with that value, and each `{:char, {name, value}}`
  some characteristic with that name and value.
  """
  @spec matches?(price(), conditions()) :: boolean()
  def matches?(price, conditions) do
    Enum.all?(conditions, fn
      {:char, {c, v}} -> Enum.any?(price.chars, &(&1.char == c and &1.value == v))
      {field, value} -> Map.fetch(price, field) == {:ok, value}
    end)
  end
end
