defmodule PriceSearch.JSON do
  # Response bodies as iodata, as the Go service writes them (json.Encoder:
  # fields in its order, a newline after each value); strings without
  # characters to escape are written as they are, others by jiffy.
  @moduledoc false

  @doc false
  @spec price(map()) :: iodata()
  def price(%{idx: idx, spec: spec, value: value, currency: currency}) do
    [
      "{\"id\":\"",
      Integer.to_string(idx),
      "\",\"spec\":",
      string(spec),
      ",\"value\":",
      number(value),
      ",\"currency\":",
      string(currency),
      "}"
    ]
  end

  @doc false
  @spec price_line(map()) :: iodata()
  def price_line(price), do: [price(price), ?\n]

  # Go's bulk answer struct has "error" without omitempty effect (a struct),
  # so a found price carries an empty error object.
  @doc false
  @spec bulk_line(non_neg_integer(), {:ok, map()} | {:error, String.t()}) :: iodata()
  def bulk_line(id, {:ok, price}),
    do: ["{\"price\":", price(price), ",\"error\":{},\"id\":", Integer.to_string(id), "}\n"]

  def bulk_line(id, {:error, message}),
    do: ["{\"error\":{\"message\":", string(message), "},\"id\":", Integer.to_string(id), "}\n"]

  @doc "The last line of a bulk body that stopped at a value it could not read."
  @spec bulk_stopped() :: binary()
  def bulk_stopped, do: "Unable decode body\n"

  @doc false
  @spec string(String.t()) :: iodata()
  def string(bin) do
    if plain?(bin), do: [?", bin, ?"], else: [?", escape(bin, []), ?"]
  end

  defp plain?(<<c, rest::binary>>)
       when c >= 0x20 and c < 0x7F and c not in [?", ?\\, ?<, ?>, ?&],
       do: plain?(rest)

  defp plain?(<<>>), do: true
  defp plain?(_), do: false

  # Go's encoding/json string escaping: HTML-safe (<, >, & as \u003c...),
  # U+2028 and U+2029 escaped, invalid UTF-8 as \ufffd.
  defp escape(<<>>, acc), do: :lists.reverse(acc)
  defp escape(<<?", rest::binary>>, acc), do: escape(rest, ["\\\"" | acc])
  defp escape(<<?\\, rest::binary>>, acc), do: escape(rest, ["\\\\" | acc])
  defp escape(<<?\b, rest::binary>>, acc), do: escape(rest, ["\\b" | acc])
  defp escape(<<?\f, rest::binary>>, acc), do: escape(rest, ["\\f" | acc])
  defp escape(<<?\n, rest::binary>>, acc), do: escape(rest, ["\\n" | acc])
  defp escape(<<?\r, rest::binary>>, acc), do: escape(rest, ["\\r" | acc])
  defp escape(<<?\t, rest::binary>>, acc), do: escape(rest, ["\\t" | acc])

  defp escape(<<c, rest::binary>>, acc) when c < 0x20 or c in [?<, ?>, ?&],
    do: escape(rest, [u_escape(c) | acc])

  defp escape(<<c::utf8, rest::binary>>, acc) when c in [0x2028, 0x2029],
    do: escape(rest, [u_escape(c) | acc])

  defp escape(<<c::utf8, rest::binary>>, acc), do: escape(rest, [<<c::utf8>> | acc])
  defp escape(<<_, rest::binary>>, acc), do: escape(rest, ["\\ufffd" | acc])

  defp u_escape(c),
    do: ["\\u", c |> Integer.to_string(16) |> String.downcase() |> String.pad_leading(4, "0")]

  defp number(n) when is_integer(n), do: Integer.to_string(n)
  defp number(n), do: :jiffy.encode(n)
end
