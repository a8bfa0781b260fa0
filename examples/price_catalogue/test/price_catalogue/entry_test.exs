defmodule PriceCatalogue.EntryTest do
  use ExUnit.Case, async: true

  alias Larder.Test.PropEr
  alias PriceCatalogue.Entry
  alias PriceCatalogue.Test.Gen

  defp as_map(fields), do: fields |> Enum.chunk_every(2) |> Map.new(fn [k, v] -> {k, v} end)

  test "a generated price as entry fields and back; a deletion" do
    for price <- Enum.take(PriceCatalogue.generate(offerings: 1), 50) do
      assert ["price", payload] = Entry.fields(price)
      assert length(String.split(payload, "\t")) == 9
      assert Entry.decode(as_map(Entry.fields(price))) == {:insert, price}
    end

    assert Entry.delete_fields(7) == ["del", "7"]
    assert Entry.decode(as_map(Entry.delete_fields(7))) == {:delete, 7}
    assert_raise ArgumentError, ~r/idx/, fn -> Entry.delete_fields(-1) end
  end

  test "the payload is the CSV's columns joined by tabs" do
    price = %{
      idx: 3,
      offering_id: "o",
      group_id: "g",
      spec: "NRC",
      chars: [%{char: "Term", value: "12"}, %{char: "Router", value: "Included"}],
      value: 30,
      is_default: true,
      currency: "EUR"
    }

    assert Entry.fields(price) == [
             "price",
             "3\to\tg\tNRC\tTerm|Router\t12|Included\t30\ttrue\tEUR"
           ]
  end

  test "an entry of another shape raises ArgumentError saying what is wrong" do
    good = "0\to\tg\tMRC\tTerm\t12\t0\tfalse\t"

    for {fields, why} <- [
          {%{"price" => "1\t2"}, ~r/2 tab-separated columns, not 9/},
          {%{"price" => String.replace(good, "0\to", "x\to")}, ~r/idx is not/},
          {%{"price" => good <> "\textra"}, ~r/10 tab-separated columns/},
          {%{"price" => String.replace(good, "false", "no")}, ~r/isDefault/},
          {%{"price" => String.replace(good, "Term", "Term|Router")}, ~r/differ in number/},
          {%{"price" => String.replace(good, "Term", "")}, ~r/empty name/},
          {%{"price" => good, "del" => "1"}, ~r/not a price entry/},
          {%{"del" => "-4"}, ~r/del is not a non-negative integer/},
          {%{"del" => 4}, ~r/not a price entry/},
          {%{"other" => "1"}, ~r/not a price entry/},
          {%{}, ~r/not a price entry/},
          {["price", good], ~r/not a price entry/}
        ] do
      error = assert_raise ArgumentError, fn -> Entry.decode(fields) end
      assert error.message =~ why, inspect(fields)
    end
  end

  test "fields refuses a price it could not read back" do
    [price] = PriceCatalogue.generate(offerings: 1) |> Enum.take(1)

    assert_raise ArgumentError, ~r/:spec holds a separator/, fn ->
      Entry.fields(%{price | spec: "a\tb"})
    end

    assert_raise ArgumentError, ~r/:chars/, fn ->
      Entry.fields(%{price | chars: [%{char: "a|b", value: "1"}]})
    end

    assert_raise ArgumentError, ~r/not a price/, fn -> Entry.fields(%{idx: 1}) end
  end

  test "property: decode of fields is the same price" do
    PropEr.check(
      PropEr.forall(Gen.price(), fn price ->
        :proper.equals(Entry.decode(as_map(Entry.fields(price))), {:insert, price})
      end),
      numtests: 300,
      max_size: 20
    )
  end

  test "property: any entry decodes to an operation or raises ArgumentError, nothing else" do
    entry =
      :proper_types.oneof([
        Gen.let(Gen.hostile_text(), &%{"price" => String.replace(&1, ",", "\t")}),
        Gen.let(Gen.hostile_text(), &%{"del" => &1}),
        :proper_types.any()
      ])

    PropEr.check(
      PropEr.forall(entry, fn fields ->
        try do
          case Entry.decode(fields) do
            {:insert, price} -> well_formed?(price)
            {:delete, idx} -> is_integer(idx) and idx >= 0
          end
        rescue
          ArgumentError -> true
        end
      end),
      numtests: 300,
      max_size: 20
    )
  end

  # A price's fields have their types: what a replica's table then holds.
  defp well_formed?(price) do
    match?(
      %{idx: i, value: v, is_default: d, offering_id: o, group_id: g, spec: s, currency: c}
      when is_integer(i) and i >= 0 and is_integer(v) and v >= 0 and is_boolean(d) and
             is_binary(o) and is_binary(g) and is_binary(s) and is_binary(c),
      price
    ) and map_size(price) == 8 and
      Enum.all?(
        price.chars,
        &match?(%{char: c, value: v} when is_binary(c) and c != "" and is_binary(v), &1)
      )
  end
end
