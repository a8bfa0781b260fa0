defmodule PriceSearch.JSON do
  # Response bodies as iodata, fields in the Go service's order; strings
  # without characters to escape are written as they are, others by jiffy.
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
  @spec bulk_line(non_neg_integer(), {:ok, map()} | {:error, String.t()}) :: iodata()
  def bulk_line(id, {:ok, price}),
    do: ["{\"price\":", price(price), ",\"id\":", Integer.to_string(id), "}\n"]

  def bulk_line(id, {:error, message}),
    do: ["{\"error\":{\"message\":", string(message), "},\"id\":", Integer.to_string(id), "}\n"]

  @doc false
  @spec string(String.t()) :: iodata()
  def string(bin) do
    if plain?(bin), do: [?", bin, ?"], else: :jiffy.encode(bin)
  end

  defp plain?(<<c, rest::binary>>) when c >= 0x20 and c != ?" and c != ?\\ and c < 0x7F,
    do: plain?(rest)

  defp plain?(<<>>), do: true
  defp plain?(_), do: false

  defp number(n) when is_integer(n), do: Integer.to_string(n)
  defp number(n), do: :jiffy.encode(n)
end
