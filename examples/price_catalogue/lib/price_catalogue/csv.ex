defmodule PriceCatalogue.CSV do
  @moduledoc """
  The catalogue's CSV text: a header line, then one price a line,

      idx,offeringId,groupId,spec,chars,values,value,isDefault,currency
      0,a38e432c-…,group3,MRC,Term|B2B Traffic|…,12|1GB|…,0,false,

  `chars` and `values` are the characteristics' names and values joined by
  `|`; `idx` and `value` are non-negative integers, `isDefault` is `true`
  or `false`. No field is quoted: no text holds a comma, a `|`, a tab or a
  line break (`encode/1` refuses such a price), so `decode/1` of
  `encode/1` is the same prices.

  ## Memory

  `decode/1` shares repeated strings (ids, groups, specs, currencies,
  characteristic names and values: one binary each) and gives prices with
  the same characteristics one list of them, so the reference catalogue's
  487,200 prices hold about 500 distinct heads and 9,744 distinct lists.
  Every kept string is a copy: a price does not keep the decoded text
  alive.
  """

  alias PriceCatalogue.Columns

  @header "idx,offeringId,groupId,spec,chars,values,value,isDefault,currency"

  @doc "The header line (without its newline)."
  @spec header() :: String.t()
  def header, do: @header

  @doc """
  The CSV text of `prices`: the header, then a line per price, each ending
  in a newline. Raises `ArgumentError` naming the field for a price that is
  not a `t:PriceCatalogue.price/0` or whose text holds a separator.
  """
  @spec encode([PriceCatalogue.price()]) :: iodata()
  def encode(prices) when is_list(prices) do
    [@header, ?\n | Enum.map(prices, &[Enum.intersperse(Columns.encode!(&1), ?,), ?\n])]
  end

  @doc """
  The prices of a CSV text, in line order: `{:ok, prices}`, or `{:error,
  message}` naming the first line that is not a price (a header other than
  `header/0`, a line of another number of fields, an integer or boolean
  that is not one, characteristics and values that differ in number).
  Empty lines are skipped. Never raises for a binary.
  """
  @spec decode(binary()) :: {:ok, [PriceCatalogue.price()]} | {:error, String.t()}
  def decode(text) when is_binary(text) do
    case :binary.split(text, "\n") do
      [@header, rest] ->
        lines(:binary.split(rest, "\n", [:global]), patterns(), %{}, [], 2)

      [@header] ->
        {:ok, []}

      [other | _] ->
        {:error, "line 1 is not the header #{@header}: #{inspect(other, printable_limit: 200)}"}
    end
  end

  # The split pattern, compiled once per decode (a compiled pattern is a
  # reference, so it cannot be a module attribute).
  defp patterns, do: :binary.compile_pattern(",")

  # One pass over the lines: a tail-recursive loop (no intermediate list per
  # line), the fields split by a compiled pattern. Repeated terms come from
  # `cache`, by two lookups a line: the offering,group,spec span of the line
  # (about 500 distinct in the reference catalogue) gives the three shared
  # strings, and the chars,values span (9,744 distinct) the shared list of
  # characteristics. The keys cannot collide: a head span holds two commas,
  # a chars span one, a single string none.
  defp lines([], _comma, _cache, acc, _n), do: {:ok, :lists.reverse(acc)}

  defp lines([line | rest], comma, cache, acc, n) do
    case line(line, comma, cache, n) do
      {:error, _} = error -> error
      {price, cache} -> lines(rest, comma, cache, [price | acc], n + 1)
      :empty -> lines(rest, comma, cache, acc, n + 1)
    end
  end

  # One line: `{price, cache}`, `:empty` or an error (the rescue is per line,
  # so the loop above stays a tail call).
  defp line(line, comma, cache, n) do
    case :binary.split(line, comma, [:global]) do
      [""] ->
        :empty

      [idx, offering, group, spec, chars, values, value, default, currency] ->
        head_at = byte_size(idx) + 1
        head_len = byte_size(offering) + byte_size(group) + byte_size(spec) + 2
        head = binary_part(line, head_at, head_len)
        {{offering, group, spec}, cache} = intern_head(head, offering, group, spec, cache)
        span = binary_part(line, head_at + head_len + 1, byte_size(chars) + 1 + byte_size(values))
        {chars, cache} = intern_chars(span, chars, values, cache)
        {currency, cache} = if currency == "", do: {"", cache}, else: intern(currency, cache)

        {Columns.decode!([idx, offering, group, spec, chars, value, default, currency]), cache}

      fields ->
        {:error,
         "line #{n} has #{length(fields)} fields, not 9: #{inspect(line, printable_limit: 200)}"}
    end
  rescue
    error in ArgumentError -> {:error, "line #{n}: #{Exception.message(error)}"}
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
        # Checked once, when first met. A copy, so the price does not keep
        # the whole text alive.
        shared = binary |> Columns.text!("a field") |> :binary.copy()
        {shared, Map.put(cache, shared, shared)}
    end
  end

  # The characteristics list, shared by every price with the same names and
  # values.
  defp intern_chars(span, chars, values, cache) do
    case cache do
      %{^span => shared} ->
        {shared, cache}

      _ ->
        {list, cache} =
          chars
          |> Columns.chars!(values)
          |> Enum.map_reduce(cache, fn %{char: c, value: v}, cache ->
            {c, cache} = intern(c, cache)
            {v, cache} = intern(v, cache)
            {%{char: c, value: v}, cache}
          end)

        {list, Map.put(cache, :binary.copy(span), list)}
    end
  end
end
