defmodule Larder.Redis.RESPTest do
  # The RESP2 parser of every Redis connection (the cache's, the replica's
  # stream source): replies split anywhere read the same as whole, bytes
  # that are not RESP or sizes above the bounds are an error, not a raise,
  # and values do not pin the reads they came in.
  use ExUnit.Case, async: true

  import :proper_types,
    only: [oneof: 1, frequency: 1, list: 1, integer: 2, integer: 0, binary: 0, resize: 2]

  alias Larder.Redis.RESP
  alias Larder.Test.PropEr

  @max 1_048_576

  @replies "*2\r\n$3\r\nabc\r\n*2\r\n:5\r\n*0\r\n+OK\r\n-ERR x\r\n$-1\r\n*-1\r\n$0\r\n\r\n"
  @expected [
    {:ok, ["abc", ["5", []]]},
    {:ok, "OK"},
    {:error, "ERR x"},
    {:ok, :undefined},
    {:ok, :undefined},
    {:ok, ""}
  ]

  defp feed_all(chunks) do
    Enum.reduce(chunks, {RESP.new(@max), []}, fn chunk, {reader, acc} ->
      {:ok, out, reader} = RESP.parse(reader, chunk)
      {reader, acc ++ out}
    end)
  end

  test "whole, byte by byte, and split at every point" do
    assert {_, @expected} = feed_all([@replies])
    assert {_, @expected} = feed_all(for <<b <- @replies>>, do: <<b>>)

    for at <- 0..byte_size(@replies) do
      <<a::binary-size(at), b::binary>> = @replies
      assert {_, @expected} = feed_all([a, b])
    end
  end

  test "bytes that are not RESP" do
    for bad <- [
          "x",
          "$abc\r\n",
          "*-2\r\n",
          ":1.5\r\n",
          "$3\r\nabcd\r\n",
          "$99999999999999999999\r\n"
        ] do
      assert RESP.parse(RESP.new(@max), bad) == {:error, :not_resp}, inspect(bad)
    end

    # a line that never ends
    assert RESP.parse(RESP.new(@max), "+" <> String.duplicate("x", 70_000)) ==
             {:error, :too_large}
  end

  test "a long bulk string is joined once its bytes are all there" do
    {:ok, [], reader} = RESP.parse(RESP.new(@max), "$100000\r\n")

    reader =
      Enum.reduce(1..99, reader, fn _, reader ->
        {:ok, [], reader} = RESP.parse(reader, String.duplicate("y", 1_000))
        # held as packets, not joined
        assert match?(%RESP{parts: [_, _ | _]}, reader)
        reader
      end)

    {:ok, [{:ok, value}], _} = RESP.parse(reader, String.duplicate("y", 1_000) <> "\r\n")
    assert byte_size(value) == 100_000
  end

  test "a reply above the parser's bound is refused at the header that declares it" do
    assert RESP.parse(RESP.new(1_000), "$1001\r\n") == {:error, :too_large}
    assert RESP.parse(RESP.new(@max), "*16777217\r\n") == {:error, :too_large}
    {:ok, [], reader} = RESP.parse(RESP.new(1_000), "*1\r\n$10")
    assert RESP.parse(reader, "01\r\n") == {:error, :too_large}
    assert {:ok, [{:ok, ["x"]}], _} = RESP.parse(RESP.new(1_000), "*1\r\n$1\r\nx\r\n")
  end

  test "values hold no reference to the packet they came in" do
    long = String.duplicate("v", 1_000)
    packet = "*3\r\n$2\r\nab\r\n$64\r\n#{String.duplicate("s", 64)}\r\n$1000\r\n#{long}\r\n"
    {:ok, [{:ok, values}], _} = RESP.parse(RESP.new(@max), packet)
    assert [_, _, ^long] = values
    for v <- values, do: assert(:binary.referenced_byte_size(v) == byte_size(v))
  end

  # Replies as generated terms: {bytes, what the reader gives}.
  defp reply, do: let(value(3), &top/1)

  defp top({bytes, {:error, _} = error}), do: {bytes, error}
  defp top({bytes, value}), do: {bytes, {:ok, value}}

  defp value(0) do
    oneof([
      let(resize(150, binary()), &{"$#{byte_size(&1)}\r\n#{&1}\r\n", &1}),
      let(line(), &{"+#{&1}\r\n", &1}),
      let(line(), &{"-#{&1}\r\n", {:error, &1}}),
      let(integer(), &{":#{&1}\r\n", "#{&1}"}),
      :proper_types.exactly({"$-1\r\n", :undefined}),
      :proper_types.exactly({"*-1\r\n", :undefined})
    ])
  end

  defp value(depth) do
    frequency([
      {3, value(0)},
      {1,
       let(list(value(depth - 1)), fn elements ->
         {["*#{length(elements)}\r\n" | Enum.map(elements, &elem(&1, 0))],
          Enum.map(elements, &elem(&1, 1))}
       end)}
    ])
  end

  defp let(type, fun), do: :proper_types.bind(type, fun, false)

  defp line, do: let(list(integer(32, 126)), &List.to_string/1)

  defp cut(<<>>, _sizes), do: []
  defp cut(bytes, []), do: [bytes]

  defp cut(bytes, [size | sizes]) do
    size = min(size, byte_size(bytes))
    <<chunk::binary-size(size), rest::binary>> = bytes
    [chunk | cut(rest, sizes ++ [size])]
  end

  test "property: a stream of replies cut anywhere reads as the same replies" do
    property =
      :proper.forall({list(reply()), list(integer(1, 40))}, fn {replies, sizes} ->
        bytes = replies |> Enum.map(&elem(&1, 0)) |> IO.iodata_to_binary()
        expected = Enum.map(replies, &elem(&1, 1))
        {reader, whole} = feed_all([bytes])
        {_, cut} = feed_all(cut(bytes, sizes))
        whole == expected and cut == expected and not RESP.pending?(reader)
      end)

    PropEr.check(property, numtests: 500)
  end
end
