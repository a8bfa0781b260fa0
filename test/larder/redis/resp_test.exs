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

  # The cases of the cache connections' parser (s2-conn), on the one parser.

  defp parse_chunks(chunks, max \\ @max) do
    Enum.reduce_while(chunks, {[], RESP.new(max)}, fn chunk, {acc, parser} ->
      case RESP.parse(parser, chunk) do
        {:ok, replies, parser} -> {:cont, {acc ++ replies, parser}}
        {:error, reason} -> {:halt, {:error, reason}}
      end
    end)
    |> case do
      {:error, reason} -> {:error, reason}
      {replies, parser} -> {replies, RESP.pending?(parser)}
    end
  end

  defp bytes(bin), do: for(<<b <- bin>>, do: <<b>>)

  test "an error reply split over two reads (at every byte) is an error, not a value" do
    wire = "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n"
    text = "WRONGTYPE Operation against a key holding the wrong kind of value"

    for at <- 1..(byte_size(wire) - 1) do
      <<a::binary-size(at), b::binary>> = wire
      assert parse_chunks([a, b]) == {[{:error, text}], false}, "split at #{at}"
    end

    moved = "-MOVED 3999 127.0.0.1:6381\r\n"

    assert parse_chunks(["-MOV", "ED 3999 127.0.0.1:6381\r\n", "+OK\r\n"]) ==
             {[{:error, "MOVED 3999 127.0.0.1:6381"}, {:ok, "OK"}], false}

    assert parse_chunks(bytes(moved)) == {[{:error, "MOVED 3999 127.0.0.1:6381"}], false}
  end

  test "the reply shapes callers read" do
    wire =
      "+OK\r\n:42\r\n:-7\r\n$3\r\nabc\r\n$0\r\n\r\n$-1\r\n*-1\r\n*0\r\n" <>
        "*3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$2\r\nhi\r\n*2\r\n-ERR in\r\n*1\r\n:1\r\n"

    assert parse_chunks([wire]) ==
             {[
                {:ok, "OK"},
                {:ok, "42"},
                {:ok, "-7"},
                {:ok, "abc"},
                {:ok, ""},
                {:ok, :undefined},
                {:ok, :undefined},
                {:ok, []},
                {:ok, ["message", "c", "hi"]},
                {:ok, [{:error, "ERR in"}, ["1"]]}
              ], false}

    # a reply not yet complete is held
    assert parse_chunks(["*2\r\n$3\r\nab"]) == {[], true}
    # a bulk string may hold CRLF and any byte
    assert parse_chunks(["$4\r\n\r\n\r\n\r\n"]) == {[{:ok, "\r\n\r\n"}], false}
  end

  test "sizes above the bounds are errors when declared, before any byte of the body" do
    # declared bulk length above max_bytes: the header alone is refused
    assert {:error, :too_large} = parse_chunks(["$2000\r\n"], 1024)

    assert parse_chunks(["*2\r\n$600\r\n", :binary.copy("x", 600), "\r\n$600\r\n"], 1024) ==
             {:error, :too_large}

    assert {[{:ok, _}], false} =
             parse_chunks(["$1000\r\n", :binary.copy("x", 1000), "\r\n"], 1024)

    # array count, nesting depth, line length, numbers
    assert {:error, :too_large} = parse_chunks(["*99999999999\r\n"])
    assert {:error, :too_large} = parse_chunks(["*16777217\r\n"])
    assert {:error, :too_large} = parse_chunks([String.duplicate("*1\r\n", 17) <> ":1\r\n"])
    assert {[{:ok, _}], false} = parse_chunks([String.duplicate("*1\r\n", 16) <> ":1\r\n"])
    assert {:error, :too_large} = parse_chunks(["+" <> :binary.copy("x", 70_000)])
    assert {:error, :not_resp} = parse_chunks([":12345678901234567890123\r\n"])
    assert {:error, :not_resp} = parse_chunks(["$-2\r\n"])
    assert {:error, :not_resp} = parse_chunks(["$3\r\nabcd\r\n"])
    assert {:error, :not_resp} = parse_chunks(["$3\r\nab", "cd\r\n"])
    assert {:error, :not_resp} = parse_chunks([":1x\r\n"])
    assert {:error, :not_resp} = parse_chunks(["hello\r\n"])
    # (refused at its first byte, without waiting for a line end)
    assert {:error, :not_resp} = parse_chunks(["hello"])
  end

  describe "PropEr" do
    test "replies split at random boundaries, or byte by byte, parse as they do whole" do
      PropEr.check(
        :proper.forall(
          {:proper_types.non_empty(:proper_types.list(reply_gen())),
           :proper_types.list(:proper_types.non_neg_integer())},
          fn {replies, cuts} ->
            wire = IO.iodata_to_binary(Enum.map(replies, &elem(&1, 0)))
            expected = {Enum.map(replies, &elem(&1, 1)), false}

            parse_chunks([wire]) == expected and parse_chunks(split(wire, cuts)) == expected and
              parse_chunks(bytes(wire)) == expected
          end
        ),
        numtests: 500
      )
    end

    test "hostile bytes, in any chunks, are replies or :error, never a crash" do
      # random bytes, and valid replies with bytes flipped or cut
      hostile =
        :proper_types.oneof([
          :proper_types.list(:proper_types.binary()),
          :proper_types.bind(
            {:proper_types.list(reply_gen()), :proper_types.non_neg_integer(),
             :proper_types.byte()},
            fn {replies, at, byte} ->
              wire = IO.iodata_to_binary(Enum.map(replies, &elem(&1, 0)))
              at = if wire == "", do: 0, else: rem(at, byte_size(wire))
              a = binary_part(wire, 0, at)

              b =
                binary_part(wire, min(at + 1, byte_size(wire)), max(byte_size(wire) - at - 1, 0))

              :proper_types.exactly([a <> <<byte>> <> b])
            end,
            false
          )
        ])

      PropEr.check(
        :proper.forall(hostile, fn chunks ->
          case parse_chunks(chunks, 4096) do
            {:error, reason} -> reason in [:not_resp, :too_large]
            {replies, pending?} -> is_list(replies) and is_boolean(pending?)
          end
        end),
        numtests: 2_000
      )
    end
  end

  defp split(wire, cuts) do
    cuts = cuts |> Enum.map(&rem(&1, byte_size(wire) + 1)) |> Enum.sort() |> Enum.uniq()

    {chunks, last} =
      Enum.reduce(cuts, {[], 0}, fn cut, {acc, from} ->
        {[binary_part(wire, from, cut - from) | acc], cut}
      end)

    Enum.reverse([binary_part(wire, last, byte_size(wire) - last) | chunks])
  end

  # {wire bytes, the reply parse/2 gives}
  defp reply_gen do
    :proper_types.bind(
      value_gen(3),
      fn {wire, value} ->
        reply = if match?({:error, _}, value), do: value, else: {:ok, value}
        :proper_types.exactly({wire, reply})
      end,
      false
    )
  end

  defp value_gen(0), do: leaf_gen()

  defp value_gen(depth) do
    :proper_types.frequency([
      {4, leaf_gen()},
      {1,
       :proper_types.lazy(fn ->
         :proper_types.bind(
           :proper_types.list(value_gen(depth - 1)),
           fn items ->
             wire = ["*#{length(items)}\r\n" | Enum.map(items, &elem(&1, 0))]
             :proper_types.exactly({wire, Enum.map(items, &elem(&1, 1))})
           end,
           false
         )
       end)}
    ])
  end

  defp leaf_gen do
    line =
      :proper_types.list(
        :proper_types.oneof([:proper_types.range(32, 126), :proper_types.exactly(?\t)])
      )

    :proper_types.oneof([
      :proper_types.bind(line, fn l -> :proper_types.exactly({"+#{l}\r\n", "#{l}"}) end, false),
      :proper_types.bind(
        line,
        fn l -> :proper_types.exactly({"-#{l}\r\n", {:error, "#{l}"}}) end,
        false
      ),
      :proper_types.bind(
        :proper_types.integer(-(2 ** 63), 2 ** 63 - 1),
        fn n ->
          :proper_types.exactly({":#{n}\r\n", "#{n}"})
        end,
        false
      ),
      :proper_types.bind(
        :proper_types.binary(),
        fn b ->
          :proper_types.exactly({"$#{byte_size(b)}\r\n#{b}\r\n", b})
        end,
        false
      ),
      :proper_types.exactly({"$-1\r\n", :undefined}),
      :proper_types.exactly({"*-1\r\n", :undefined})
    ])
  end
end
