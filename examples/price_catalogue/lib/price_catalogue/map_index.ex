defmodule PriceCatalogue.MapIndex do
  @moduledoc """
  The Go reference service's map index: offering -> its prices in row
  order, scanned by `find/5` as the Go map variant (`FindPriceBy`) scans
  them. The baseline that Larder's benchmarks and demo measure
  `Larder.Table` against, and the price search example's `map` route.

  ## Layout

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
  back whole. A term read back from a file is untrusted: `valid?/1` checks
  that a search over it cannot raise.

  ## Complexity

  `new/1` is O(n) in the prices (a map update per string met). `find/5`
  is a map lookup for the offering, then a scan of its prices: O(prices of
  the offering x requested characteristics) integer comparisons; it
  allocates the request's numbers and the answer, nothing per price
  scanned.
  """

  import Bitwise

  @opaque t :: %{
            ids: %{String.t() => pos_integer()},
            names: tuple(),
            offerings: %{
              String.t() => {[non_neg_integer()], non_neg_integer(), tuple(), tuple()}
            }
          }

  @typedoc "What `find/5` answers with: a price's answered fields."
  @type answer :: %{
          idx: non_neg_integer(),
          spec: String.t(),
          value: non_neg_integer(),
          currency: String.t(),
          is_default: boolean()
        }

  @doc "The map index of `prices` (`t:PriceCatalogue.price/0`s)."
  @spec new([PriceCatalogue.price()]) :: t()
  def new(prices) do
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
    {numbers, ids} = char_numbers(cs, ids, [])
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
  defp char_numbers([], ids, acc), do: {:lists.reverse(acc), ids}

  defp char_numbers([%{char: c, value: v} | chars], ids, acc) do
    {c, ids} = number(ids, c)
    {v, ids} = number(ids, v)
    char_numbers(chars, ids, [v, c | acc])
  end

  defp pad(numbers, stride) do
    case length(numbers) do
      ^stride -> numbers
      n -> numbers ++ List.duplicate(0, stride - n)
    end
  end

  defp code(group, spec), do: group <<< 32 ||| spec

  @doc """
  Whether `term` has the shape of a map index (one read back from a file
  is untrusted): the containers, their sizes, and every answer an integer
  that names a string, so that `find/5` over it cannot raise. The
  characteristic numbers are only compared, so any term there is safe.
  O(prices).
  """
  @spec valid?(term()) :: boolean()
  def valid?(%{ids: ids, names: names, offerings: offerings} = index)
      when map_size(index) == 3 and is_map(ids) and is_tuple(names) and is_map(offerings) do
    # A group's and a spec's numbers are shifted into a code: integers. A
    # price's characteristics are read in pairs: an even stride.
    Enum.all?(ids, fn {string, n} -> is_binary(string) and is_integer(n) end) and
      Enum.all?(offerings, fn
        {offering, {codes, stride, chars, answers}}
        when is_binary(offering) and is_list(codes) and is_integer(stride) and stride >= 0 and
               rem(stride, 2) == 0 and is_tuple(chars) and is_tuple(answers) ->
          n = proper_length(codes, 0)

          is_integer(n) and tuple_size(chars) == n * stride and tuple_size(answers) == 3 * n and
            answers?(answers, 0, tuple_size(answers), tuple_size(names))

        _ ->
          false
      end) and Enum.all?(Tuple.to_list(names), &is_binary/1)
  end

  def valid?(_), do: false

  # The length of a proper list, nil for an improper one (which the scan
  # would meet at its end).
  defp proper_length([], n), do: n
  defp proper_length([_ | rest], n), do: proper_length(rest, n + 1)
  defp proper_length(_improper, _n), do: nil

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

  @doc "The number of prices in the index. O(offerings)."
  @spec size(t()) :: non_neg_integer()
  def size(%{offerings: offerings}) do
    Enum.reduce(offerings, 0, fn {_, {_, _, _, answers}}, n -> n + div(tuple_size(answers), 3) end)
  end

  @doc """
  Searches the index as the Go map variant (`FindPriceBy`) does: fetch the
  offering's prices and scan them in row order. A price whose group or
  spec differs is skipped at once; each requested characteristic is looked
  up in the price's characteristics by name (the first with that name) and
  its value compared, the first mismatch skipping the price. The first
  matching default price is the answer at once; otherwise a single match
  is, and several matches without a default are `{:error, :no_default}`.

  `chars` is the request's `{char, value}` list. A string the catalogue
  does not have matches no price.
  """
  @spec find(t(), String.t(), String.t(), String.t(), [{String.t(), String.t()}]) ::
          {:ok, answer()} | {:error, :no_price | :no_default}
  def find(%{ids: ids, names: names, offerings: offerings}, offering, group, spec, chars) do
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
  `find/5` with search conditions (`t:PriceCatalogue.conditions/0`).
  """
  @spec search(t(), PriceCatalogue.conditions()) ::
          {:ok, answer()} | {:error, :no_price | :no_default}
  def search(index, conditions) do
    {o, g, s, chars} = args(conditions)
    find(index, o, g, s, chars)
  end

  @doc """
  `find/5`'s arguments after the index, `{offering, group, spec, chars}`,
  of search conditions: a request split before the timing, as a Go request
  arrives already decoded. A field not given is `nil`, which matches no
  price.
  """
  @spec args(PriceCatalogue.conditions()) ::
          {String.t() | nil, String.t() | nil, String.t() | nil, [{String.t(), String.t()}]}
  def args(conditions) do
    {o, g, s, chars} =
      Enum.reduce(conditions, {nil, nil, nil, []}, fn
        {:offering_id, v}, {_, g, s, c} -> {v, g, s, c}
        {:group_id, v}, {o, _, s, c} -> {o, v, s, c}
        {:spec, v}, {o, g, _, c} -> {o, g, v, c}
        {:char, cv}, {o, g, s, c} -> {o, g, s, [cv | c]}
      end)

    {o, g, s, :lists.reverse(chars)}
  end

  defp numbers([], _ids, acc), do: {:ok, :lists.reverse(acc)}

  defp numbers([{char, value} | chars], ids, acc) do
    case ids do
      %{^char => c, ^value => v} -> numbers(chars, ids, [{c, v} | acc])
      _ -> :unknown
    end
  end

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

  @doc """
  The live heap in bytes of the map index of the catalogue in `dir` (as
  `PriceCatalogue.reference_or_generated/1` reads it), comparable with the
  Go service's live heap: a fresh process loads the catalogue, builds the
  index, drops everything else, collects its garbage and reports its
  memory.
  """
  @spec heap_bytes(Path.t()) :: non_neg_integer()
  def heap_bytes(dir \\ PriceCatalogue.default_dir()) do
    Task.async(fn ->
      {_, loaded, _} = PriceCatalogue.reference_or_generated(dir)
      index = new(loaded)
      loaded = nil
      :erlang.garbage_collect()
      {:memory, bytes} = Process.info(self(), :memory)
      # Returning the index keeps it alive until the memory is read.
      {map_size(index), loaded, bytes}
    end)
    |> Task.await(:infinity)
    |> elem(2)
  end
end
