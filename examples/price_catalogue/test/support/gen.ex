# PropEr generators of prices and of hostile text, for the properties of
# the CSV, the entry encoding and the map index.
defmodule PriceCatalogue.Test.Gen do
  @moduledoc false

  @doc "`:proper_types.bind/3` without shrinking through the function."
  def let(type, fun), do: :proper_types.bind(type, fun, false)

  @doc """
  A text a column may hold: any bytes but the separators (`,`, `|`, tab,
  line breaks), empty included; drawn from a few letters, so that prices
  share strings, and from any byte (invalid UTF-8 too).
  """
  def text, do: let(:proper_types.list(byte()), &:erlang.list_to_binary/1)

  @doc "A characteristic's name: a text that is not empty."
  def name,
    do: let(:proper_types.non_empty(:proper_types.list(byte())), &:erlang.list_to_binary/1)

  defp byte do
    :proper_types.frequency([
      {4, :proper_types.elements(~c"abcAB12 -.")},
      {1, :proper_types.elements(Enum.to_list(0..255) -- ~c",|\t\n\r")}
    ])
  end

  @doc "A price (`t:PriceCatalogue.price/0`)."
  def price do
    let(
      {:proper_types.non_neg_integer(), text(), text(), text(),
       :proper_types.list({name(), text()}), :proper_types.non_neg_integer(),
       :proper_types.boolean(), text()},
      fn {idx, offering, group, spec, chars, value, default, currency} ->
        %{
          idx: idx,
          offering_id: offering,
          group_id: group,
          spec: spec,
          chars: for({c, v} <- chars, do: %{char: c, value: v}),
          value: value,
          is_default: default,
          currency: currency
        }
      end
    )
  end

  @doc """
  Hostile text for a decoder: fragments of a valid line (fields, the
  separators, integers out of range, booleans) and arbitrary bytes, joined.
  """
  def hostile_text do
    fragment =
      :proper_types.oneof([
        :proper_types.binary(),
        :proper_types.oneof(
          [",", "|", "\t", "\n", "\r", "0", "-1", "+7", "1e3", "true", "false", "TRUE"] ++
            ["idx", "Term", "12", "99999999999999999999999", PriceCatalogue.CSV.header()]
        ),
        let(price(), &Enum.join(PriceCatalogue.Columns.encode!(&1), ","))
      ])

    let(:proper_types.list(fragment), &IO.iodata_to_binary/1)
  end
end
