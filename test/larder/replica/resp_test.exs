defmodule Larder.Replica.RESPTest do
  # The Redis Stream source's RESP reader: replies split anywhere read the
  # same as whole, and bytes that are not RESP are an error, not a raise.
  use ExUnit.Case, async: true

  alias Larder.Replica.RESP

  @replies "*2\r\n$3\r\nabc\r\n*2\r\n:5\r\n*0\r\n+OK\r\n-ERR x\r\n$-1\r\n*-1\r\n$0\r\n\r\n"
  @expected [
    {:ok, ["abc", [5, []]]},
    {:ok, "OK"},
    {:error, "ERR x"},
    {:ok, :undefined},
    {:ok, :undefined},
    {:ok, ""}
  ]

  defp feed_all(chunks) do
    Enum.reduce(chunks, {RESP.new(), []}, fn chunk, {reader, acc} ->
      {:ok, out, reader} = RESP.feed(reader, chunk)
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
    for bad <- ["x", "$abc\r\n", "*-2\r\n", ":1.5\r\n", "$3\r\nabcd\r\n", "$99999999999\r\n"] do
      assert RESP.feed(RESP.new(), bad) == :error
    end

    # a line that never ends
    assert RESP.feed(RESP.new(), "+" <> String.duplicate("x", 70_000)) == :error
  end

  test "a long bulk string is joined once its bytes are all there" do
    {:ok, [], reader} = RESP.feed(RESP.new(), "$100000\r\n")

    reader =
      Enum.reduce(1..99, reader, fn _, reader ->
        {:ok, [], reader} = RESP.feed(reader, String.duplicate("y", 1_000))
        # held as packets, not joined
        assert match?(%RESP{parts: [_, _ | _]}, reader)
        reader
      end)

    {:ok, [{:ok, value}], _} = RESP.feed(reader, String.duplicate("y", 1_000) <> "\r\n")
    assert byte_size(value) == 100_000
  end
end
