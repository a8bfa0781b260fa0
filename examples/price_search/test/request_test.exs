defmodule PriceSearch.RequestTest do
  use ExUnit.Case, async: true

  alias PriceSearch.Request

  # The fast path (jiffy, then a check that its answer is surely Go's) must
  # answer exactly what the exact reader answers, on every body: seeded
  # mutations of good requests (bytes cut, replaced, inserted; keys in other
  # cases; values of other types; non-ASCII and invalid UTF-8) and
  # concatenations of them as bulk bodies.
  test "the jiffy path and the exact reader agree on every body" do
    rand = :rand.seed_s(:exsss, 18)

    Enum.reduce(1..6_000, rand, fn i, rand ->
      {bodies, rand} = Enum.map_reduce(1..3, rand, fn _, rand -> body(rand) end)
      [body | _] = bodies

      assert Request.single(body) == Request.single(body, :exact),
             "single #{i}: #{inspect(body, limit: :infinity)}"

      bulk = Enum.join(bodies, Enum.at(["", "\n", " \r\n"], rem(i, 3)))

      assert Request.bulk(bulk) == Request.bulk(bulk, 65_536, :exact),
             "bulk #{i}: #{inspect(bulk, limit: :infinity)}"

      rand
    end)
  end

  test "Go's rules, one by one" do
    ok = fn body ->
      {:ok, request} = Request.single(body)
      request
    end

    # Case-insensitive keys, with Go's two non-ASCII folds (Kelvin sign, long s).
    assert %{offering: "a", spec: "b"} = ok.(~s({"OFFERINGID":"a","price\u017FpecId":"b"}))
    assert %{chars: [{"c", "v"}]} = ok.(~s({"charValues":[{"CHAR":"c","Value":"v"}]}))
    assert %{chars: [{"c", ""}]} = ok.(~s({"charValues":[{"char":"c","\u212Aey":"v"}]}))
    # The last duplicate wins; null leaves the value; null charValues empties.
    assert %{offering: "b"} = ok.(~s({"offeringId":"a","OfferingId":"b"}))
    assert %{offering: "a"} = ok.(~s({"offeringId":"a","offeringId":null}))
    assert %{chars: []} = ok.(~s({"charValues":[{}],"charValues":null}))
    # Invalid UTF-8 and lone surrogates become U+FFFD; pairs are joined.
    assert %{offering: "a\uFFFDb"} = ok.(<<"{\"offeringId\":\"a", 0xFF, "b\"}">>)
    assert %{offering: "\uFFFD\uFFFD"} = ok.(~S({"offeringId":"\udc00\ud800"}))
    assert %{offering: "😀"} = ok.(~S({"offeringId":"\ud83d\ude00"}))
    # Whatever follows the first value is ignored.
    assert %{offering: "a"} = ok.(~s({"offeringId":"a"}{ garbage))
    # A single body has no id; a bulk one does, and stops at a bad one.
    assert %{id: 0} = ok.(~s({"id":5}))
    assert {:ok, [%{id: 5}, %{id: 0}]} = Request.bulk(~s({"id":5}null))
    assert {:error, [%{id: 5}]} = Request.bulk(~s({"id":5}{"id":-0}{"id":6}))
    assert {:error, [%{id: 5}]} = Request.bulk(~s({"id":5}{"id":65536}{"id":6}))
    assert {:ok, [%{id: 5}]} = Request.bulk(~s({"id":5}]{"id":6}))
    assert {:too_many, 2} = Request.bulk("{}{}{}", 2)

    # Go's nesting limit: 10,000 levels, the object one of them; the error is
    # at the first bracket too many (byte 10,005).
    deep = fn n -> String.duplicate("[", n) <> String.duplicate("]", n) end
    assert {:ok, _} = Request.single(~s({"x":#{deep.(9_999)}}))

    assert Request.single(~s({"x":#{deep.(10_000)}})) ==
             {:error, "Request body contains badly-formed JSON (at position 10005)"}
  end

  @keys [
    "offeringId",
    "OFFERINGID",
    "groupId",
    "groupid",
    "priceSpecId",
    "charValues",
    "CharValues",
    "char",
    "VALUE",
    "value",
    "id",
    "ID",
    "x",
    "price\u017FpecId"
  ]

  defp body(rand) do
    {request, rand} = request(rand)
    {n, rand} = :rand.uniform_s(4, rand)
    Enum.reduce(1..n, {request, rand}, fn _, {body, rand} -> mutate(body, rand) end)
  end

  defp request(rand) do
    {id, rand} = :rand.uniform_s(70_000, rand)

    {IO.iodata_to_binary(
       :jiffy.encode(%{
         "offeringId" => "a38e432c",
         "groupId" => "group5",
         "priceSpecId" => "MRC",
         "charValues" => [
           %{"char" => "Term", "value" => "18"},
           %{"char" => "VPN", "value" => "ad"}
         ],
         "id" => id - 2
       })
     ), rand}
  end

  @pieces [
    "null",
    "1",
    "-0",
    "1.5",
    "1e400",
    "true",
    "[]",
    "{}",
    "[1,{}]",
    "\"s\"",
    "\"\\ud800\"",
    "\"\\u00e9\"",
    <<0xFF>>,
    <<0xC3, 0xA9>>,
    "\u212A",
    "\\",
    "\"",
    ",",
    ":",
    "{",
    "}",
    "[",
    "]",
    " ",
    "\n",
    "\t",
    "\f",
    "\u0000",
    "0",
    "-",
    "e",
    "01"
  ]

  defp mutate(body, rand) do
    {kind, rand} = :rand.uniform_s(5, rand)
    {pos, rand} = :rand.uniform_s(byte_size(body) + 1, rand)
    pos = pos - 1
    <<head::binary-size(pos), tail::binary>> = body

    case kind do
      1 ->
        {cut, rand} = :rand.uniform_s(4, rand)

        {head <>
           binary_part(
             tail,
             min(cut, byte_size(tail)),
             byte_size(tail) - min(cut, byte_size(tail))
           ), rand}

      2 ->
        {i, rand} = :rand.uniform_s(length(@pieces), rand)
        {head <> Enum.at(@pieces, i - 1) <> tail, rand}

      3 ->
        {from, rand} = :rand.uniform_s(length(@keys), rand)
        {to, rand} = :rand.uniform_s(length(@keys), rand)

        {String.replace(body, Enum.at(@keys, from - 1), Enum.at(@keys, to - 1), global: false),
         rand}

      4 ->
        {i, rand} = :rand.uniform_s(length(@pieces), rand)

        replaced =
          Regex.replace(~r/"(?:[^"\\]|\\.)*"/, body, Enum.at(@pieces, i - 1), global: false)

        {if(pos > byte_size(body) / 2, do: replaced, else: body), rand}

      5 ->
        {byte, rand} = :rand.uniform_s(256, rand)

        {head <>
           <<byte - 1>> <> binary_part(tail, min(1, byte_size(tail)), max(byte_size(tail) - 1, 0)),
         rand}
    end
  end
end
