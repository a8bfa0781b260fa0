defmodule PriceCatalogue.Columns do
  @moduledoc false
  # A price as its nine text columns, the CSV's and a stream entry's:
  #
  #     idx offeringId groupId spec chars values value isDefault currency
  #
  # `chars` and `values` are the characteristics' names and values joined
  # by `|`; a price without characteristics has both empty. So that the
  # columns read back as the same price whatever joins them (a comma in
  # the CSV, a tab in a stream entry), no text holds `,`, `|`, a tab or a
  # line break, and no characteristic's name is empty.

  @separators [",", "|", "\t", "\n", "\r"]

  @doc """
  The columns of `price`. Raises `ArgumentError` naming the field for a
  price of another shape or whose text cannot be written.
  """
  @spec encode!(term()) :: [binary()]
  def encode!(
        %{
          idx: idx,
          offering_id: offering,
          group_id: group,
          spec: spec,
          chars: chars,
          value: value,
          is_default: default,
          currency: currency
        } = price
      ) do
    count!(idx, :idx, price)
    count!(value, :value, price)
    unless is_boolean(default), do: bad!(price, ":is_default is not a boolean")

    Enum.each(
      [offering_id: offering, group_id: group, spec: spec, currency: currency],
      &field_text!(&1, price)
    )

    unless is_list(chars), do: bad!(price, ":chars is not a list")

    {names, values} =
      chars
      |> Enum.map(fn
        %{char: c, value: v} when is_binary(c) and c != "" and is_binary(v) ->
          field_text!({:chars, c}, price)
          field_text!({:chars, v}, price)
          {c, v}

        other ->
          bad!(
            price,
            "a characteristic is not %{char: name, value: value} with a name: #{inspect(other)}"
          )
      end)
      |> Enum.unzip()

    [
      Integer.to_string(idx),
      offering,
      group,
      spec,
      Enum.join(names, "|"),
      Enum.join(values, "|"),
      Integer.to_string(value),
      Atom.to_string(default),
      currency
    ]
  end

  def encode!(other),
    do: raise(ArgumentError, "not a price (a map of its eight fields): #{inspect(other)}")

  defp count!(n, _field, _price) when is_integer(n) and n >= 0, do: :ok

  defp count!(_n, field, price),
    do: bad!(price, "#{inspect(field)} is not a non-negative integer")

  defp field_text!({field, text}, price) when is_binary(text) do
    if String.contains?(text, @separators),
      do: bad!(price, "#{inspect(field)} holds a separator (, | tab or a line break)")

    :ok
  end

  defp field_text!({field, _}, price), do: bad!(price, "#{inspect(field)} is not a string")

  defp bad!(price, why), do: raise(ArgumentError, "price: #{why}: #{inspect(price)}")

  @doc """
  The price of its columns, the characteristics already read (by
  `chars!/2`, or shared by the caller): idx, offering, group, spec,
  characteristics, value, isDefault, currency. Raises `ArgumentError`
  naming the column for an integer or boolean that is not one.
  """
  @spec decode!([binary() | [map()]]) :: PriceCatalogue.price()
  def decode!([idx, offering, group, spec, chars, value, default, currency]) do
    %{
      idx: count!(idx, "idx"),
      offering_id: offering,
      group_id: group,
      spec: spec,
      chars: chars,
      value: count!(value, "value"),
      is_default: boolean!(default),
      currency: currency
    }
  end

  @doc """
  `text`, a text column; raises `ArgumentError` naming `column` when it
  holds a separator (which `encode!/1` would refuse to write).
  """
  @spec text!(binary(), String.t()) :: binary()
  def text!(text, column) do
    if String.contains?(text, @separators),
      do:
        raise(
          ArgumentError,
          "#{column} holds a separator (, | tab or a line break): #{inspect(text)}"
        )

    text
  end

  @doc "A non-negative integer column; raises `ArgumentError` naming `column`."
  @spec count!(binary(), String.t()) :: non_neg_integer()
  def count!(text, column) do
    case :erlang.binary_to_integer(text) do
      n when n >= 0 -> n
      _ -> not_count!(text, column)
    end
  rescue
    ArgumentError -> not_count!(text, column)
  end

  defp not_count!(text, column),
    do: raise(ArgumentError, "#{column} is not a non-negative integer: #{inspect(text)}")

  @doc "The isDefault column; raises `ArgumentError` for anything but true or false."
  @spec boolean!(binary()) :: boolean()
  def boolean!("true"), do: true
  def boolean!("false"), do: false
  def boolean!(text), do: raise(ArgumentError, "isDefault is not true or false: #{inspect(text)}")

  @doc """
  The characteristics of the `chars` and `values` columns. Raises
  `ArgumentError` when they differ in number or a name is empty.
  """
  @spec chars!(binary(), binary()) :: [%{char: binary(), value: binary()}]
  def chars!("", ""), do: []

  def chars!(chars, values),
    do: zip(:binary.split(chars, "|", [:global]), :binary.split(values, "|", [:global]))

  defp zip([c | cs], [v | vs]) when c != "", do: [%{char: c, value: v} | zip(cs, vs)]
  defp zip([], []), do: []
  defp zip(["" | _], _values), do: raise(ArgumentError, "a characteristic has an empty name")

  defp zip(_chars, _values),
    do: raise(ArgumentError, "the characteristics and their values differ in number")
end
