# A small JSON decoder for benchmark result files (no Jason: Hex is
# unreachable). Objects become maps with string keys; a file that is not JSON
# gives {:error, reason}, never an exception.
defmodule Larder.Report.JSON do
  @moduledoc false

  # Deeper nesting than this is refused: result files are a few levels deep.
  @max_depth 64

  @spec decode(binary()) :: {:ok, term()} | {:error, String.t()}
  def decode(bin) when is_binary(bin) do
    case value(skip_ws(bin), 0) do
      {:ok, v, rest} ->
        if skip_ws(rest) == "", do: {:ok, v}, else: {:error, "trailing bytes"}

      {:error, _} = error ->
        error
    end
  end

  defp value(_bin, depth) when depth > @max_depth, do: {:error, "nested too deep"}
  defp value("{" <> rest, depth), do: object(skip_ws(rest), %{}, depth + 1)
  defp value("[" <> rest, depth), do: array(skip_ws(rest), [], depth + 1)
  defp value("\"" <> rest, _depth), do: string(rest, [])
  defp value("true" <> rest, _depth), do: {:ok, true, rest}
  defp value("false" <> rest, _depth), do: {:ok, false, rest}
  defp value("null" <> rest, _depth), do: {:ok, nil, rest}
  defp value(<<c, _::binary>> = bin, _depth) when c in ~c"-0123456789", do: number(bin)
  defp value(_bin, _depth), do: {:error, "unexpected byte"}

  defp object("}" <> rest, acc, _depth), do: {:ok, acc, rest}
  defp object(bin, acc, depth), do: members(bin, acc, depth)

  # After "{" or ",": a member must follow (no trailing comma).
  defp members("\"" <> rest, acc, depth) do
    with {:ok, key, rest} <- string(rest, []),
         ":" <> rest <- skip_ws(rest),
         {:ok, v, rest} <- value(skip_ws(rest), depth) do
      case skip_ws(rest) do
        "," <> rest -> members(skip_ws(rest), Map.put(acc, key, v), depth)
        "}" <> rest -> {:ok, Map.put(acc, key, v), rest}
        _ -> {:error, "expected , or } in an object"}
      end
    else
      {:error, _} = error -> error
      _ -> {:error, "expected : in an object"}
    end
  end

  defp members(_bin, _acc, _depth), do: {:error, "expected a key in an object"}

  defp array("]" <> rest, acc, _depth), do: {:ok, Enum.reverse(acc), rest}
  defp array(bin, acc, depth), do: elements(bin, acc, depth)

  # After "[" or ",": a value must follow (no trailing comma).
  defp elements(bin, acc, depth) do
    with {:ok, v, rest} <- value(bin, depth) do
      case skip_ws(rest) do
        "," <> rest -> elements(skip_ws(rest), [v | acc], depth)
        "]" <> rest -> {:ok, Enum.reverse([v | acc]), rest}
        _ -> {:error, "expected , or ] in an array"}
      end
    end
  end

  defp string("\"" <> rest, acc), do: {:ok, IO.iodata_to_binary(Enum.reverse(acc)), rest}

  defp string("\\" <> <<c, rest::binary>>, acc) when c in ~c"\"\\/bfnrt" do
    char = %{
      ?" => ?",
      ?\\ => ?\\,
      ?/ => ?/,
      ?b => ?\b,
      ?f => ?\f,
      ?n => ?\n,
      ?r => ?\r,
      ?t => ?\t
    }

    string(rest, [char[c] | acc])
  end

  defp string("\\u" <> <<hex::binary-size(4), rest::binary>>, acc) do
    case Integer.parse(hex, 16) do
      # surrogate halves are kept as U+FFFD: result files are ASCII
      {cp, ""} when cp in 0xD800..0xDFFF -> string(rest, [<<0xFFFD::utf8>> | acc])
      {cp, ""} -> string(rest, [<<cp::utf8>> | acc])
      _ -> {:error, "bad \\u escape"}
    end
  end

  defp string(<<c, rest::binary>>, acc) when c >= 0x20 and c != ?\\, do: string(rest, [c | acc])
  defp string(_bin, _acc), do: {:error, "bad string"}

  defp number(bin) do
    {num, rest} = take_number(bin, [])

    parsed =
      if String.contains?(num, [".", "e", "E"]) do
        # "1e5" and "1.5" both parse as floats once a fraction is present
        num |> String.replace(~r/^(-?\d+)([eE])/, "\\1.0\\2") |> Float.parse()
      else
        Integer.parse(num)
      end

    case parsed do
      {n, ""} -> {:ok, n, rest}
      _ -> {:error, "bad number"}
    end
  end

  defp take_number(<<c, rest::binary>>, acc) when c in ~c"-+.eE0123456789",
    do: take_number(rest, [c | acc])

  defp take_number(rest, acc), do: {acc |> Enum.reverse() |> List.to_string(), rest}

  defp skip_ws(<<c, rest::binary>>) when c in ~c" \t\r\n", do: skip_ws(rest)
  defp skip_ws(bin), do: bin
end
