defmodule PriceCatalogue.Entry do
  @moduledoc """
  A price change as the fields of a log entry (a Redis Stream entry, or a
  Kafka message's value): what a producer of the `prices` stream writes and
  what a replica of it reads.

  An entry carries one field, as a Kafka message carries one value: a price
  is `price` => its CSV columns (see `PriceCatalogue.CSV`) joined by tabs,

      idx offeringId groupId spec chars values value isDefault currency

  and a deletion is `del` => the idx. One payload field rather than a field
  per column: a Redis Stream reply then holds 5 values per entry instead of
  21, which is what a replica's catch-up spends most of its time reading.

  `decode/1` of `fields/1` (as a map) is `{:insert, price}`, the same
  price; of `delete_fields/1`, `{:delete, idx}`: the operations a
  `Larder.Replica`'s `:apply` returns, so `&PriceCatalogue.Entry.decode/1`
  can be one.
  """

  alias PriceCatalogue.Columns

  @columns 9

  @doc """
  The fields of an entry that sets `price`: `["price", payload]`. Raises
  `ArgumentError` naming the field for a price that is not a
  `t:PriceCatalogue.price/0` or whose text holds a separator (`,`, `|`, a
  tab or a line break: it would not read back).
  """
  @spec fields(PriceCatalogue.price()) :: [binary()]
  def fields(price), do: ["price", Enum.join(Columns.encode!(price), "\t")]

  @doc "The fields of an entry that deletes the price `idx`: `[\"del\", idx]`."
  @spec delete_fields(non_neg_integer()) :: [binary()]
  def delete_fields(idx) when is_integer(idx) and idx >= 0, do: ["del", Integer.to_string(idx)]

  def delete_fields(idx),
    do: raise(ArgumentError, "idx: expected a non-negative integer, got: #{inspect(idx)}")

  @doc """
  The operation of an entry's fields (a map of field name to value):
  `{:insert, price}` or `{:delete, idx}`.

  Raises `ArgumentError`, saying what is wrong, for anything else: not a
  map with exactly one field, `price` or `del`, a payload of another
  number of columns, an integer or boolean column that is not one,
  characteristics and values that differ in number, or an empty
  characteristic name. (A replica that meets such an entry stops or skips
  it, by its `:on_error`.) The text columns are taken as they are: a text
  that `fields/1` would refuse (one holding a `,` or a line break) is
  not looked for, as that scan of every entry would cost a replica's
  catch-up about half as much again as the decoding.

  Each entry's strings are its own: a cache of shared strings (as
  `PriceCatalogue.CSV.decode/1` keeps) would sit in the decoding process
  for its life, and a replica copies each price to its own process anyway.
  """
  @spec decode(%{optional(binary()) => binary()}) ::
          {:insert, PriceCatalogue.price()} | {:delete, non_neg_integer()}
  def decode(%{"del" => idx} = fields) when map_size(fields) == 1 and is_binary(idx),
    do: {:delete, Columns.count!(idx, "del")}

  def decode(%{"price" => payload} = fields) when map_size(fields) == 1 and is_binary(payload) do
    case :binary.split(payload, "\t", [:global]) do
      [idx, offering, group, spec, chars, values, value, default, currency] ->
        chars = Columns.chars!(chars, values)
        {:insert, Columns.decode!([idx, offering, group, spec, chars, value, default, currency])}

      parts ->
        raise ArgumentError,
              "price: #{length(parts)} tab-separated columns, not #{@columns}: #{inspect(payload, printable_limit: 200)}"
    end
  end

  def decode(fields) do
    raise ArgumentError,
          "not a price entry (one field, price or del, with a binary value): #{inspect(fields, limit: 20, printable_limit: 200)}"
  end
end
