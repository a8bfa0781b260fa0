defmodule PriceCatalogue.CSVTest do
  use ExUnit.Case, async: true

  alias Larder.Test.PropEr
  alias PriceCatalogue.CSV
  alias PriceCatalogue.Test.Gen

  @header "idx,offeringId,groupId,spec,chars,values,value,isDefault,currency"

  test "decode reads the reference's lines; encode writes them back" do
    text = """
    #{@header}
    0,off-1,group3,MRC,Term|Router,12|Included,0,false,
    1,off-1,group2,NRC,Term|Router,12|Not Included,1,true,EUR
    """

    assert {:ok, [first, second]} = CSV.decode(text)

    assert first == %{
             idx: 0,
             offering_id: "off-1",
             group_id: "group3",
             spec: "MRC",
             chars: [%{char: "Term", value: "12"}, %{char: "Router", value: "Included"}],
             value: 0,
             is_default: false,
             currency: ""
           }

    assert %{is_default: true, currency: "EUR", idx: 1} = second
    assert IO.iodata_to_binary(CSV.encode([first, second])) == text
  end

  test "a header alone, or with empty lines, is no prices" do
    assert CSV.decode(@header) == {:ok, []}
    assert CSV.decode(@header <> "\n\n\n") == {:ok, []}
    assert CSV.decode(IO.iodata_to_binary(CSV.encode([]))) == {:ok, []}
  end

  test "a price without characteristics reads back without any" do
    price = %{price() | chars: []}
    assert CSV.decode(IO.iodata_to_binary(CSV.encode([price]))) == {:ok, [price]}
  end

  test "each kind of bad line is an error naming the line" do
    good = "0,o,group1,MRC,Term,12,0,false,"

    for {line, why} <- [
          {"1,2,3", ~r/line 3 has 3 fields, not 9/},
          {"x,o,group1,MRC,Term,12,0,false,", ~r/line 3: idx is not a non-negative integer/},
          {"-1,o,group1,MRC,Term,12,0,false,", ~r/line 3: idx/},
          {"0,o,group1,MRC,Term,12,1.5,false,", ~r/line 3: value/},
          {"0,o,group1,MRC,Term,12,0,yes,", ~r/line 3: isDefault is not true or false/},
          {"0,o,group1,MRC,Term|Router,12,0,false,", ~r/line 3: .*differ in number/},
          {"0,o,group1,MRC,|Router,1|2,0,false,", ~r/line 3: .*empty name/},
          {"0,o,group1,MRC,Term,12,0,false,,extra", ~r/line 3 has 10 fields/}
        ] do
      assert {:error, message} = CSV.decode("#{@header}\n#{good}\n#{line}\n")
      assert message =~ why, "#{inspect(line)}: #{message}"
    end

    assert {:error, "line 1 is not the header" <> _} = CSV.decode("idx,offering\n" <> good)
    assert {:error, "line 1 is not the header" <> _} = CSV.decode("")
  end

  test "repeated strings and characteristics lists are one term, none a slice of the text" do
    text = """
    #{@header}
    0,off-1,group3,MRC,Term|Router,12|Included,0,false,EUR
    1,off-1,group3,MRC,Term|Router,12|Included,1,true,EUR
    2,off-2,group3,NRC,Term|Router,24|Included,2,false,EUR
    """

    assert {:ok, [a, b, c]} = CSV.decode(text)
    assert :erts_debug.same(a.chars, b.chars)
    assert :erts_debug.same(a.offering_id, b.offering_id)
    assert :erts_debug.same(a.group_id, c.group_id)
    assert :erts_debug.same(a.currency, c.currency)
    # "Router" and "Included" shared across different lists
    assert :erts_debug.same(Enum.at(a.chars, 1).char, Enum.at(c.chars, 1).char)
    assert :erts_debug.same(Enum.at(a.chars, 1).value, Enum.at(c.chars, 1).value)
    # Copies: no string is a sub-binary that keeps the text alive.
    for string <- [a.offering_id, a.group_id, a.spec, a.currency, hd(a.chars).value] do
      assert :binary.referenced_byte_size(string) == byte_size(string)
    end
  end

  test "encode refuses a price it could not read back, naming the field" do
    for {field, price} <- [
          {":spec", %{price() | spec: "a,b"}},
          {":currency", %{price() | currency: "a\nb"}},
          {":chars", %{price() | chars: [%{char: "a|b", value: "1"}]}},
          {":chars", %{price() | chars: [%{char: "a", value: "1\t"}]}},
          {":idx", %{price() | idx: -1}},
          {":value", %{price() | value: 1.5}},
          {":is_default", %{price() | is_default: nil}},
          {":offering_id", %{price() | offering_id: :atom}},
          {"characteristic", %{price() | chars: [%{char: "", value: "1"}]}},
          {"characteristic", %{price() | chars: [{"a", "1"}]}}
        ] do
      error = assert_raise ArgumentError, fn -> CSV.encode([price]) end
      assert error.message =~ field
    end

    assert_raise ArgumentError, ~r/not a price/, fn -> CSV.encode([%{idx: 1}]) end
  end

  test "property: decode of encode is the same prices" do
    PropEr.check(
      PropEr.forall(:proper_types.list(Gen.price()), fn prices ->
        :proper.equals(CSV.decode(IO.iodata_to_binary(CSV.encode(prices))), {:ok, prices})
      end),
      numtests: 200,
      max_size: 20
    )
  end

  test "property: any text decodes to prices or an error, never a raise" do
    PropEr.check(
      PropEr.forall(Gen.hostile_text(), fn text ->
        result = CSV.decode(@header <> "\n" <> text)
        # Accepted prices are well formed: they encode (they would raise otherwise).
        with {:ok, prices} <- result, do: CSV.encode(prices)
        match?({:ok, _}, result) or match?({:error, message} when is_binary(message), result)
      end),
      numtests: 300,
      max_size: 20
    )
  end

  defp price do
    %{
      idx: 7,
      offering_id: "o",
      group_id: "g",
      spec: "MRC",
      chars: [%{char: "Term", value: "12"}],
      value: 70,
      is_default: false,
      currency: ""
    }
  end
end
