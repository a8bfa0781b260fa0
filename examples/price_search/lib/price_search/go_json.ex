defmodule PriceSearch.GoJSON do
  # Reads one JSON value as Go's encoding/json.Decoder does: the same syntax
  # errors at the same byte, invalid UTF-8 and lone surrogates replaced by
  # U+FFFD, nesting limited to 10,000 levels, a top-level number or literal
  # ended by whatever follows it. The slow, exact path of PriceSearch.Request.
  @moduledoc false

  # Go's maxNestingDepth.
  @max_depth 10_000

  @typedoc """
  A value with the positions Go's type errors report: `end` is the byte after
  a scalar, `open` the byte of an array's `[` or an object's `{`.
  """
  @type tree ::
          {:str, non_neg_integer(), String.t()}
          | {:num, non_neg_integer(), binary()}
          | {:bool, non_neg_integer()}
          | {:null, non_neg_integer()}
          | {:arr, non_neg_integer(), [tree()]}
          | {:obj, non_neg_integer(), [{String.t(), tree()}]}

  @typedoc """
  `{:syntax, offset}` is Go's `SyntaxError.Offset` when the value began at
  byte 0: the 1-based position of the byte that broke the syntax.
  """
  @type error :: :empty | :unexpected_eof | {:syntax, pos_integer()}

  @doc """
  Reads the first value of `rest`, whose first byte is byte `pos` of the
  body. Answers the value and what follows it, or why there is none.
  """
  @spec value(binary(), non_neg_integer()) ::
          {:ok, tree(), binary(), non_neg_integer()} | {:error, error()}
  def value(rest, pos) do
    {rest, pos} = skip_ws(rest, pos)

    if rest == "" do
      {:error, :empty}
    else
      case value(rest, pos, 0) do
        {:ok, tree, rest, pos} -> {:ok, tree, rest, pos}
        {:error, :eof} -> {:error, :unexpected_eof}
        {:error, at} -> {:error, {:syntax, at + 1}}
      end
    end
  end

  @doc "Skips Go's JSON whitespace (space, tab, CR, LF)."
  @spec skip_ws(binary(), non_neg_integer()) :: {binary(), non_neg_integer()}
  def skip_ws(<<c, rest::binary>>, pos) when c in ~c" \t\r\n", do: skip_ws(rest, pos + 1)
  def skip_ws(rest, pos), do: {rest, pos}

  # Errors inside: {:error, :eof} or {:error, position of the bad byte}.
  defp value(<<?{, rest::binary>>, pos, depth) do
    if depth == @max_depth, do: {:error, pos}, else: object(rest, pos + 1, pos, depth + 1)
  end

  defp value(<<?[, rest::binary>>, pos, depth) do
    if depth == @max_depth, do: {:error, pos}, else: array(rest, pos + 1, pos, depth + 1)
  end

  defp value(<<?", rest::binary>>, pos, _depth) do
    with {:ok, string, rest, pos} <- string(rest, pos + 1, pos + 1),
         do: {:ok, {:str, pos, string}, rest, pos}
  end

  defp value(<<c, _::binary>> = bin, pos, _depth) when c == ?- or c in ?0..?9 do
    with {:ok, rest, end_pos} <- number(bin, pos),
         do: {:ok, {:num, end_pos, binary_part(bin, 0, end_pos - pos)}, rest, end_pos}
  end

  defp value(<<?t, rest::binary>>, pos, _), do: literal(rest, pos + 1, "rue", {:bool, pos + 4})
  defp value(<<?f, rest::binary>>, pos, _), do: literal(rest, pos + 1, "alse", {:bool, pos + 5})
  defp value(<<?n, rest::binary>>, pos, _), do: literal(rest, pos + 1, "ull", {:null, pos + 4})
  defp value(<<_, _::binary>>, pos, _depth), do: {:error, pos}
  defp value(<<>>, _pos, _depth), do: {:error, :eof}

  defp literal(rest, pos, <<>>, tree), do: {:ok, tree, rest, pos}

  defp literal(<<c, rest::binary>>, pos, <<c, more::binary>>, tree),
    do: literal(rest, pos + 1, more, tree)

  defp literal(<<>>, _pos, _more, _tree), do: {:error, :eof}
  defp literal(_rest, pos, _more, _tree), do: {:error, pos}

  ## Objects and arrays

  defp object(rest, pos, open, depth) do
    case skip_ws(rest, pos) do
      {<<?}, rest::binary>>, pos} -> {:ok, {:obj, open, []}, rest, pos + 1}
      {rest, pos} -> members(rest, pos, open, depth, [])
    end
  end

  defp members(<<?", rest::binary>>, pos, open, depth, acc) do
    with {:ok, key, rest, pos} <- string(rest, pos + 1, pos + 1),
         {<<?:, rest::binary>>, pos} <- skip_ws(rest, pos),
         {rest, pos} = skip_ws(rest, pos + 1),
         {:ok, value, rest, pos} <- value(rest, pos, depth) do
      case skip_ws(rest, pos) do
        {<<?,, rest::binary>>, pos} ->
          {rest, pos} = skip_ws(rest, pos + 1)
          members(rest, pos, open, depth, [{key, value} | acc])

        {<<?}, rest::binary>>, pos} ->
          {:ok, {:obj, open, :lists.reverse(acc, [{key, value}])}, rest, pos + 1}

        {rest, pos} ->
          bad(rest, pos)
      end
    else
      {rest, pos} when is_binary(rest) -> bad(rest, pos)
      error -> error
    end
  end

  defp members(rest, pos, _open, _depth, _acc), do: bad(rest, pos)

  defp array(rest, pos, open, depth) do
    case skip_ws(rest, pos) do
      {<<?], rest::binary>>, pos} -> {:ok, {:arr, open, []}, rest, pos + 1}
      {rest, pos} -> elements(rest, pos, open, depth, [])
    end
  end

  defp elements(rest, pos, open, depth, acc) do
    with {:ok, value, rest, pos} <- value(rest, pos, depth) do
      case skip_ws(rest, pos) do
        {<<?,, rest::binary>>, pos} ->
          {rest, pos} = skip_ws(rest, pos + 1)
          elements(rest, pos, open, depth, [value | acc])

        {<<?], rest::binary>>, pos} ->
          {:ok, {:arr, open, :lists.reverse(acc, [value])}, rest, pos + 1}

        {rest, pos} ->
          bad(rest, pos)
      end
    end
  end

  defp bad(<<>>, _pos), do: {:error, :eof}
  defp bad(_rest, pos), do: {:error, pos}

  ## Numbers: -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?

  defp number(<<?-, rest::binary>>, pos), do: int(rest, pos + 1)
  defp number(bin, pos), do: int(bin, pos)

  defp int(<<?0, rest::binary>>, pos), do: frac(rest, pos + 1)
  defp int(<<c, rest::binary>>, pos) when c in ?1..?9, do: frac(digits(rest, pos + 1))
  defp int(rest, pos), do: bad(rest, pos)

  defp frac({rest, pos}), do: frac(rest, pos)
  defp frac(<<?., c, rest::binary>>, pos) when c in ?0..?9, do: exp(digits(rest, pos + 2))
  defp frac(<<?.>>, _pos), do: {:error, :eof}
  defp frac(<<?., _, _::binary>>, pos), do: {:error, pos + 1}
  defp frac(rest, pos), do: exp(rest, pos)

  defp exp({rest, pos}), do: exp(rest, pos)
  defp exp(<<e, rest::binary>>, pos) when e in ~c"eE", do: exp_sign(rest, pos + 1)
  defp exp(rest, pos), do: {:ok, rest, pos}

  defp exp_sign(<<s, rest::binary>>, pos) when s in ~c"+-", do: exp_digits(rest, pos + 1)
  defp exp_sign(rest, pos), do: exp_digits(rest, pos)

  defp exp_digits(<<c, rest::binary>>, pos) when c in ?0..?9 do
    {rest, pos} = digits(rest, pos + 1)
    {:ok, rest, pos}
  end

  defp exp_digits(rest, pos), do: bad(rest, pos)

  defp digits(<<c, rest::binary>>, pos) when c in ?0..?9, do: digits(rest, pos + 1)
  defp digits(rest, pos), do: {rest, pos}

  ## Strings: checked as Go's scanner does, then unquoted as Go does

  # `start` is the position of the string's first byte (after the quote).
  defp string(bin, pos, start), do: scan_string(bin, pos, start, bin)

  defp scan_string(<<?", rest::binary>>, pos, start, whole),
    do: {:ok, unquote(binary_part(whole, 0, pos - start), []), rest, pos + 1}

  defp scan_string(<<?\\, c, rest::binary>>, pos, start, whole) when c in ~c"\"\\/bfnrt",
    do: scan_string(rest, pos + 2, start, whole)

  defp scan_string(<<?\\, ?u, rest::binary>>, pos, start, whole) do
    case hex4(rest, pos + 2) do
      {:ok, rest, pos} -> scan_string(rest, pos, start, whole)
      error -> error
    end
  end

  defp scan_string(<<?\\>>, _pos, _start, _whole), do: {:error, :eof}
  defp scan_string(<<?\\, _, _::binary>>, pos, _start, _whole), do: {:error, pos + 1}
  defp scan_string(<<c, _::binary>>, pos, _start, _whole) when c < 0x20, do: {:error, pos}

  defp scan_string(<<_, rest::binary>>, pos, start, whole),
    do: scan_string(rest, pos + 1, start, whole)

  defp scan_string(<<>>, _pos, _start, _whole), do: {:error, :eof}

  defp hex4(<<a, b, c, d, rest::binary>>, pos) do
    case Enum.find_index([a, b, c, d], &(not hex?(&1))) do
      nil -> {:ok, rest, pos + 4}
      i -> {:error, pos + i}
    end
  end

  defp hex4(rest, pos) do
    case Enum.find_index(:binary.bin_to_list(rest), &(not hex?(&1))) do
      nil -> {:error, :eof}
      i -> {:error, pos + i}
    end
  end

  defp hex?(c), do: c in ?0..?9 or c in ?a..?f or c in ?A..?F

  @replacement "\uFFFD"

  # The raw string is well-formed here; escapes are valid.
  defp unquote(<<>>, acc), do: IO.iodata_to_binary(:lists.reverse(acc))

  defp unquote(
         <<?\\, ?u, a::binary-size(4), ?\\, ?u, b::binary-size(4), rest::binary>> = bin,
         acc
       ) do
    hi = String.to_integer(a, 16)
    lo = String.to_integer(b, 16)

    if hi in 0xD800..0xDBFF and lo in 0xDC00..0xDFFF do
      cp = 0x10000 + Bitwise.bsl(hi - 0xD800, 10) + (lo - 0xDC00)
      unquote(rest, [<<cp::utf8>> | acc])
    else
      unquote_u(bin, acc)
    end
  end

  defp unquote(<<?\\, ?u, _::binary>> = bin, acc), do: unquote_u(bin, acc)

  defp unquote(<<?\\, c, rest::binary>>, acc) do
    char =
      case c do
        ?b -> ?\b
        ?f -> ?\f
        ?n -> ?\n
        ?r -> ?\r
        ?t -> ?\t
        c -> c
      end

    unquote(rest, [char | acc])
  end

  defp unquote(<<c::utf8, rest::binary>>, acc), do: unquote(rest, [<<c::utf8>> | acc])
  defp unquote(<<_, rest::binary>>, acc), do: unquote(rest, [@replacement | acc])

  # One \uXXXX that is not the first half of a valid surrogate pair.
  defp unquote_u(<<?\\, ?u, a::binary-size(4), rest::binary>>, acc) do
    case String.to_integer(a, 16) do
      cp when cp in 0xD800..0xDFFF -> unquote(rest, [@replacement | acc])
      cp -> unquote(rest, [<<cp::utf8>> | acc])
    end
  end
end
