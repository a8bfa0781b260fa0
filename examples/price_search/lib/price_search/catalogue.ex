defmodule PriceSearch.Catalogue do
  @moduledoc """
  The price catalogue: the CSV loader, a deterministic generator of the same
  shape, the reference requests, and the Go service's map index.
  """

  import Bitwise

  # The shared reference data sits beside the Larder checkout
  # (`<larder>/../shared/data/price-catalogue`); CATALOGUE_DIR overrides it.
  @larder_root Path.expand("../../../..", __DIR__)
  @shared_dir Path.expand("../shared/data/price-catalogue", @larder_root)

  @terms ~w(12 18 24 36 48 60)
  @traffic ~w(1GB 2GB 5GB 10GB 20GB 50GB 100GB)
  @bandwidth ~w(1Mbps 5Mbps 10Mbps 20Mbps 25Mbps 30Mbps 50Mbps 75Mbps 100Mbps 125Mbps
                150Mbps 175Mbps 200Mbps 250Mbps 300Mbps 350Mbps 400Mbps 450Mbps 500Mbps
                550Mbps 600Mbps 650Mbps 700Mbps 750Mbps 800Mbps 850Mbps 900Mbps 950Mbps 1Gbps)
  @router ["Included", "Not Included"]

  @typedoc "A price: the CSV row as a map, characteristics as a list of maps."
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

  @doc """
  The directory of the shared reference data: `CATALOGUE_DIR` when set, else
  `../shared/data/price-catalogue` next to the Larder checkout.
  """
  @spec default_dir() :: Path.t()
  def default_dir, do: System.get_env("CATALOGUE_DIR") || @shared_dir

  @doc """
  The `Larder.Table.new/1` options for the catalogue: the Go service's
  indexes (offering, group, spec, one term per characteristic value), plus
  `store:` when given.
  """
  @spec table_opts(keyword()) :: keyword()
  def table_opts(extra \\ []) do
    [
      key: :idx,
      index: [:offering_id, :group_id, :spec, {:char, &char_terms/1}]
    ] ++ extra
  end

  @doc "The `{char, value}` terms of a price."
  @spec char_terms(price()) :: [{String.t(), String.t()}]
  def char_terms(price), do: Enum.map(price.chars, &{&1.char, &1.value})

  @doc """
  The shared catalogue when `dir` has it, else the generated one:
  `{source, prices, requests}`, where requests are `Larder.Table` conditions.
  """
  @spec reference_or_generated(Path.t()) :: {String.t(), [price()], [keyword()]}
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
  Loads the CSV catalogue (`.csv` or `.csv.gz`). Repeated strings (ids,
  groups, specs, currencies, characteristic names and values) share one
  binary, and prices with the same characteristics share one list of them,
  so the heap holds one copy of each.
  """
  @spec load(Path.t()) :: {:ok, [price()]} | {:error, Larder.Error.t()}
  def load(path) do
    with {:ok, data} <- read_file(path),
         {:ok, text} <- maybe_gunzip(data, path) do
      [_header | lines] = :binary.split(text, "\n", [:global])
      {:ok, parse_lines(lines, patterns(), %{}, [])}
    else
      {:error, %Larder.Error{}} = error ->
        error

      {:error, reason} ->
        {:error,
         Larder.Error.new(:loader_failed, "cannot read the catalogue", path: path, reason: reason)}
    end
  rescue
    error in [MatchError, ArgumentError, CaseClauseError] ->
      {:error,
       Larder.Error.new(:loader_failed, "malformed catalogue",
         path: path,
         error: Exception.message(error)
       )}
  end

  @doc """
  Reads a whole file in the calling process (a raw file): `File.read/1`
  goes through the file server process, which keeps a reference to the
  bytes it read until its next garbage collection, which may never come.
  """
  @spec read_file(Path.t()) :: {:ok, binary()} | {:error, File.posix()}
  def read_file(path) do
    with {:ok, io} <- :file.open(path, [:read, :raw, :binary]) do
      try do
        with {:ok, size} <- :file.position(io, :eof),
             {:ok, 0} <- :file.position(io, :bof) do
          read_all(io, max(size, 1), [])
        end
      after
        :file.close(io)
      end
    end
  end

  defp read_all(io, size, acc) do
    case :file.read(io, size) do
      {:ok, data} -> read_all(io, size, [data | acc])
      :eof when acc == [] -> {:ok, ""}
      :eof when tl(acc) == [] -> {:ok, hd(acc)}
      :eof -> {:ok, acc |> :lists.reverse() |> IO.iodata_to_binary()}
      {:error, _} = error -> error
    end
  end

  defp maybe_gunzip(data, path) do
    if String.ends_with?(path, ".gz") do
      try do
        {:ok, :zlib.gunzip(data)}
      rescue
        ErlangError -> {:error, Larder.Error.new(:loader_failed, "not a gzip file", path: path)}
      end
    else
      {:ok, data}
    end
  end

  # The split patterns, compiled once per load (a compiled pattern is a
  # reference, so it cannot be a module attribute).
  defp patterns, do: {:binary.compile_pattern(","), :binary.compile_pattern("|")}

  # One pass over the lines: a tail-recursive loop (no intermediate list per
  # line), the fields split by a compiled pattern, integers by
  # binary_to_integer. Repeated terms come from `cache`, by two lookups a
  # line: the offering,group,spec span of the line (about 500 distinct in the
  # reference catalogue) gives the three shared strings, and the chars,values
  # span (9,744 distinct) the shared list of characteristics. The keys cannot
  # collide: a head span holds two commas, a chars span one, a single string
  # none.
  defp parse_lines([], _patterns, _cache, acc), do: :lists.reverse(acc)

  defp parse_lines([line | rest], {comma, _bar} = patterns, cache, acc) do
    case :binary.split(line, comma, [:global]) do
      [""] ->
        parse_lines(rest, patterns, cache, acc)

      [idx, offering, group, spec, chars, values, value, default, currency] ->
        head_at = byte_size(idx) + 1
        head_len = byte_size(offering) + byte_size(group) + byte_size(spec) + 2
        head = binary_part(line, head_at, head_len)
        {{offering, group, spec}, cache} = intern_head(head, offering, group, spec, cache)
        span = binary_part(line, head_at + head_len + 1, byte_size(chars) + 1 + byte_size(values))
        {chars, cache} = intern_chars(span, chars, values, patterns, cache)
        {currency, cache} = if currency == "", do: {"", cache}, else: intern(currency, cache)

        price = %{
          idx: :erlang.binary_to_integer(idx),
          offering_id: offering,
          group_id: group,
          spec: spec,
          chars: chars,
          value: :erlang.binary_to_integer(value),
          is_default: default == "true",
          currency: currency
        }

        parse_lines(rest, patterns, cache, [price | acc])

      fields ->
        raise ArgumentError, "a line has #{length(fields)} fields, not 9: #{inspect(line)}"
    end
  end

  defp intern_head(head, offering, group, spec, cache) do
    case cache do
      %{^head => shared} ->
        {shared, cache}

      _ ->
        {offering, cache} = intern(offering, cache)
        {group, cache} = intern(group, cache)
        {spec, cache} = intern(spec, cache)
        shared = {offering, group, spec}
        {shared, Map.put(cache, :binary.copy(head), shared)}
    end
  end

  defp intern(binary, cache) do
    case cache do
      %{^binary => shared} ->
        {shared, cache}

      _ ->
        # A copy, so the price does not keep the whole decompressed file alive.
        shared = :binary.copy(binary)
        {shared, Map.put(cache, shared, shared)}
    end
  end

  # The characteristics list, shared by every price with the same names and
  # values.
  defp intern_chars(span, chars, values, {_comma, bar}, cache) do
    case cache do
      %{^span => shared} ->
        {shared, cache}

      _ ->
        {list, cache} =
          char_list(
            :binary.split(chars, bar, [:global]),
            :binary.split(values, bar, [:global]),
            cache,
            []
          )

        {list, Map.put(cache, :binary.copy(span), list)}
    end
  end

  defp char_list([c | cs], [v | vs], cache, acc) do
    {c, cache} = intern(c, cache)
    {v, cache} = intern(v, cache)
    char_list(cs, vs, cache, [%{char: c, value: v} | acc])
  end

  defp char_list([], [], cache, acc), do: {:lists.reverse(acc), cache}

  defp char_list(_chars, _values, _cache, _acc),
    do: raise(ArgumentError, "the characteristics and their values differ in number")

  @doc """
  Generates a catalogue of the reference's shape, the same for the same
  options: `offerings` (default 50) offerings of 9,744 prices, every
  combination of Term (6 values), B2B Traffic (7), VPN (4), B2B Bandwidth (29)
  and Router (2) once per offering; spec alternating MRC/NRC by row; group
  `group1`..`group5` drawn from a generator seeded with `seed` (default 1).
  """
  @spec generate(keyword()) :: [price()]
  def generate(opts \\ []) do
    offerings = Keyword.get(opts, :offerings, 50)
    rand = :rand.seed_s(:exsss, Keyword.get(opts, :seed, 1))
    {offering_ids, rand} = Enum.map_reduce(1..offerings, rand, fn _, r -> uuid(r) end)
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

  @doc "The `Larder.Table` conditions of one reference request (a decoded JSON map)."
  @spec conditions(map()) :: keyword()
  def conditions(request) do
    [
      offering_id: request["offeringId"],
      group_id: request["groupId"],
      spec: request["priceSpecId"]
    ] ++ for(cv <- request["charValues"], do: {:char, {cv["char"], cv["value"]}})
  end

  @doc """
  The JSON request (a map, as jiffy decodes it) for `conditions`: the inverse
  of `conditions/1`.
  """
  @spec request_json(keyword()) :: map()
  def request_json(conditions) do
    %{
      "offeringId" => Keyword.fetch!(conditions, :offering_id),
      "groupId" => Keyword.fetch!(conditions, :group_id),
      "priceSpecId" => Keyword.fetch!(conditions, :spec),
      "charValues" => for({:char, {c, v}} <- conditions, do: %{"char" => c, "value" => v})
    }
  end

  @doc """
  The single-request benchmark's conditions: `request-single.json` in `dir`
  when `prices` came from there, else the request for the price with value
  2320 (the reference's choice) found in `prices`.
  """
  @spec single_request([price()], String.t(), Path.t()) :: keyword()
  def single_request(prices, source, dir \\ default_dir()) do
    path = Path.join(dir, "request-single.json")

    if Path.dirname(source) == dir and File.exists?(path) do
      path |> File.read!() |> :jiffy.decode([:return_maps]) |> conditions()
    else
      p = Enum.find(prices, &(&1.value == 2320)) || hd(prices)

      [offering_id: p.offering_id, group_id: p.group_id, spec: p.spec] ++
        for({c, v} <- char_terms(p), do: {:char, {c, v}})
    end
  end

  @doc "Reads `requests-100.jsonl` into `Larder.Table` conditions."
  @spec requests(Path.t()) :: {:ok, [keyword()]} | {:error, Larder.Error.t()}
  def requests(path) do
    case File.read(path) do
      {:ok, text} ->
        requests =
          for line <- String.split(text, "\n", trim: true) do
            line |> :jiffy.decode([:return_maps]) |> conditions()
          end

        {:ok, requests}

      {:error, reason} ->
        {:error,
         Larder.Error.new(:loader_failed, "cannot read the requests", path: path, reason: reason)}
    end
  end

  @doc "Conditions that match `n` prices picked with a seeded generator, one each."
  @spec sample_requests([price()], pos_integer()) :: [keyword()]
  def sample_requests(prices, n) do
    tuple = List.to_tuple(prices)

    {picks, _} =
      Enum.map_reduce(1..n, :rand.seed_s(:exsss, 2), fn _, r ->
        :rand.uniform_s(tuple_size(tuple), r)
      end)

    for i <- picks do
      p = elem(tuple, i - 1)

      [offering_id: p.offering_id, group_id: p.group_id, spec: p.spec] ++
        for({c, v} <- char_terms(p), do: {:char, {c, v}})
    end
  end

  @doc """
  The expected answer to `conditions` by a plain filter over `prices`: the
  prices for which every condition holds, in order.
  """
  @spec filter([price()], keyword()) :: [price()]
  def filter(prices, conditions), do: Enum.filter(prices, &matches?(&1, conditions))

  @doc "Whether every condition holds for `price`."
  @spec matches?(price(), keyword()) :: boolean()
  def matches?(price, conditions) do
    Enum.all?(conditions, fn
      {:char, {c, v}} -> Enum.any?(price.chars, &(&1.char == c and &1.value == v))
      {field, value} -> Map.fetch!(price, field) == value
    end)
  end

  @typedoc "The Go-style map index: see `map_index/1`."
  @opaque map_index :: %{
            ids: %{String.t() => pos_integer()},
            names: tuple(),
            offerings: %{
              String.t() => {[non_neg_integer()], pos_integer(), tuple(), tuple()}
            }
          }

  @typedoc """
  What `map_find/5` answers with: a price's answered fields, the fields the
  price search's table stores.
  """
  @type map_price :: %{
          idx: non_neg_integer(),
          spec: String.t(),
          value: non_neg_integer(),
          currency: String.t(),
          is_default: boolean()
        }

  @doc """
  The Go service's map index, the baseline of the service's `map` search:
  offering -> its prices in row order, scanned by `map_find/5`.

  The strings are numbered (one map of the distinct group, spec, currency,
  characteristic and value strings, and their tuple by number), so
  comparing two is comparing two integers, as cheap as Go's
  length-then-bytes comparison of strings that differ; and each offering's
  prices are laid out for a scan: a list of their group-and-spec numbers,
  one flat tuple of their characteristics' name and value numbers (each
  price's padded to the offering's most), and one flat tuple of their
  answers (id, value, and spec, currency and default packed in one
  integer). Every element is an integer, so the index is one compact term:
  about 60 MB for the 487,200-price catalogue, which
  `:erlang.term_to_binary/1` writes and `:erlang.binary_to_term/1` reads
  back whole (`PriceSearch.Snapshot`).
  """
  @spec map_index([price()]) :: map_index()
  def map_index(prices) do
    # One pass over each offering's prices numbers the strings as it meets
    # them and gathers the offering's layout (no pass to number them first).
    {offerings, ids} =
      prices
      |> Enum.group_by(& &1.offering_id)
      |> Enum.map_reduce(%{}, fn {offering, prices}, ids ->
        {layout, ids} = lay_out(prices, ids, [], [], [], 0)
        {{offering, layout}, ids}
      end)

    names =
      ids
      |> Enum.sort_by(&elem(&1, 1))
      |> Enum.map(&elem(&1, 0))
      |> then(&List.to_tuple(["" | &1]))

    %{ids: ids, names: names, offerings: Map.new(offerings)}
  end

  # An offering's prices laid out for a scan: `{layout, ids}`. Codes,
  # characteristics' numbers and answers gather newest first; each price's
  # characteristics are padded to the widest when the tuple is built.
  defp lay_out([price | prices], ids, codes, chars, answers, stride) do
    %{group_id: g, spec: s, currency: c, chars: cs, idx: idx, value: value} = price
    {g, ids} = number(ids, g)
    {s, ids} = number(ids, s)
    {c, ids} = number(ids, c)
    {numbers, ids} = char_numbers(cs, ids)
    answers = [meta(s, c, price.is_default), value, idx | answers]
    stride = max(stride, length(numbers))
    lay_out(prices, ids, [code(g, s) | codes], [numbers | chars], answers, stride)
  end

  defp lay_out([], ids, codes, chars, answers, stride) do
    # Prepending each padded list to the rest restores row order.
    table = List.foldl(chars, [], fn numbers, acc -> pad(numbers, stride) ++ acc end)

    layout =
      {:lists.reverse(codes), stride, List.to_tuple(table),
       answers |> :lists.reverse() |> List.to_tuple()}

    {layout, ids}
  end

  # A price's spec and currency numbers and its default flag, in one integer.
  defp meta(spec, currency, default),
    do: spec <<< 30 ||| currency <<< 1 ||| if(default, do: 1, else: 0)

  @doc false
  # Whether `term` has the shape of a `map_index/1` (a snapshot's is
  # untrusted): the containers, their sizes, and every answer an integer
  # that names a string, so a search over it cannot raise. The
  # characteristic numbers are only compared, so any term there is safe.
  @spec map_index?(term()) :: boolean()
  def map_index?(%{ids: ids, names: names, offerings: offerings} = index)
      when map_size(index) == 3 and is_map(ids) and is_tuple(names) and is_map(offerings) do
    Enum.all?(offerings, fn
      {offering, {codes, stride, chars, answers}}
      when is_binary(offering) and is_list(codes) and is_integer(stride) and stride >= 0 and
             is_tuple(chars) and is_tuple(answers) ->
        n = length(codes)

        tuple_size(chars) == n * stride and tuple_size(answers) == 3 * n and
          answers?(answers, 0, tuple_size(answers), tuple_size(names))

      _ ->
        false
    end) and Enum.all?(Tuple.to_list(names), &is_binary/1)
  end

  def map_index?(_), do: false

  defp answers?(_answers, at, at, _names), do: true

  defp answers?(answers, at, size, names) do
    case {elem(answers, at), elem(answers, at + 1), elem(answers, at + 2)} do
      {idx, value, meta} when is_integer(idx) and is_integer(value) and is_integer(meta) ->
        meta >= 0 and meta >>> 30 < names and (meta >>> 1 &&& 0x1FFFFFFF) < names and
          answers?(answers, at + 3, size, names)

      _ ->
        false
    end
  end

  @doc "The number of prices in a `map_index/1`."
  @spec map_index_size(map_index()) :: non_neg_integer()
  def map_index_size(%{offerings: offerings}) do
    Enum.reduce(offerings, 0, fn {_, {_, _, _, answers}}, n -> n + div(tuple_size(answers), 3) end)
  end

  # Strings are numbered 1, 2, ... as first met; 0 pads. `{number, ids}`.
  defp number(ids, string) do
    case ids do
      %{^string => n} ->
        {n, ids}

      _ ->
        n = map_size(ids) + 1
        {n, Map.put(ids, string, n)}
    end
  end

  # A price's characteristics' numbers: name, value, name, value...
  defp char_numbers([], ids), do: {[], ids}

  defp char_numbers([%{char: c, value: v} | chars], ids) do
    {c, ids} = number(ids, c)
    {v, ids} = number(ids, v)
    {rest, ids} = char_numbers(chars, ids)
    {[c, v | rest], ids}
  end

  defp pad(numbers, stride) do
    case length(numbers) do
      ^stride -> numbers
      n -> numbers ++ List.duplicate(0, stride - n)
    end
  end

  defp code(group, spec), do: group <<< 32 ||| spec

  @doc """
  Searches a `map_index/1` as the Go map variant (`FindPriceBy`) does: fetch
  the offering's prices and scan them in row order. A price whose group or
  spec differs is skipped at once; each requested characteristic is looked
  up in the price's characteristics by name (the first with that name) and
  its value compared, the first mismatch skipping the price. The first
  matching default price is the answer at once; otherwise a single match is,
  and several matches without a default are `{:error, :no_default}`.

  `chars` is the request's `{char, value}` list. A string the catalogue does
  not have matches no price. The search allocates the request's numbers
  (a few words per characteristic), nothing per price scanned, and the
  answer: a map of the price's answered fields (`t:map_price/0`).
  """
  @spec map_find(map_index(), String.t(), String.t(), String.t(), [{String.t(), String.t()}]) ::
          {:ok, map_price()} | {:error, :no_price | :no_default}
  def map_find(%{ids: ids, names: names, offerings: offerings}, offering, group, spec, chars) do
    with %{^offering => {codes, stride, table, answers}} <- offerings,
         %{^group => g, ^spec => s} <- ids,
         {:ok, chars} <- numbers(chars, ids, []) do
      case scan(codes, 0, code(g, s), chars, stride, table, answers, nil) do
        i when is_integer(i) -> {:ok, answer(answers, i, names)}
        error -> error
      end
    else
      _ -> {:error, :no_price}
    end
  end

  # The answer is the only term a search builds.
  defp answer(answers, i, names) do
    at = 3 * i
    meta = elem(answers, at + 2)

    %{
      idx: elem(answers, at),
      spec: elem(names, meta >>> 30),
      value: elem(answers, at + 1),
      currency: elem(names, meta >>> 1 &&& 0x1FFFFFFF),
      is_default: (meta &&& 1) == 1
    }
  end

  @doc """
  `map_find/5` with `Larder.Table` conditions (offering, group, spec and
  characteristics, as `conditions/1` makes them).
  """
  @spec map_search(map_index(), keyword()) ::
          {:ok, map_price()} | {:error, :no_price | :no_default}
  def map_search(map_index, conditions) do
    {o, g, s, chars} =
      Enum.reduce(conditions, {nil, nil, nil, []}, fn
        {:offering_id, v}, {_, g, s, c} -> {v, g, s, c}
        {:group_id, v}, {o, _, s, c} -> {o, v, s, c}
        {:spec, v}, {o, g, _, c} -> {o, g, v, c}
        {:char, cv}, {o, g, s, c} -> {o, g, s, [cv | c]}
      end)

    map_find(map_index, o, g, s, :lists.reverse(chars))
  end

  defp numbers([], _ids, acc), do: {:ok, :lists.reverse(acc)}

  defp numbers([{char, value} | chars], ids, acc) do
    case ids do
      %{^char => c, ^value => v} -> numbers(chars, ids, [{c, v} | acc])
      _ -> :unknown
    end
  end

  # found: nil (no match yet), the one match, or :many (only a default answers).
  # found: nil (no match yet), the one match's number, or :many (only a
  # default answers); a default found ends the scan with its number.
  defp scan([code | codes], i, code, chars, stride, table, answers, found) do
    at = i * stride

    if chars_match?(chars, table, at, at + stride) do
      cond do
        (elem(answers, 3 * i + 2) &&& 1) == 1 -> i
        found == nil -> scan(codes, i + 1, code, chars, stride, table, answers, i)
        true -> scan(codes, i + 1, code, chars, stride, table, answers, :many)
      end
    else
      scan(codes, i + 1, code, chars, stride, table, answers, found)
    end
  end

  defp scan([_ | codes], i, code, chars, stride, table, answers, found),
    do: scan(codes, i + 1, code, chars, stride, table, answers, found)

  defp scan([], _, _, _, _, _, _, nil), do: {:error, :no_price}
  defp scan([], _, _, _, _, _, _, :many), do: {:error, :no_default}
  defp scan([], _, _, _, _, _, _, i), do: i

  defp chars_match?([], _table, _at, _stop), do: true

  defp chars_match?([{char, value} | chars], table, at, stop),
    do: value_of(table, at, stop, char, value) and chars_match?(chars, table, at, stop)

  # Whether the price's first characteristic named `char` has `value`.
  defp value_of(_table, at, stop, _char, _value) when at >= stop, do: false

  defp value_of(table, at, stop, char, value) do
    case elem(table, at) do
      ^char -> elem(table, at + 1) == value
      _ -> value_of(table, at + 2, stop, char, value)
    end
  end
end
