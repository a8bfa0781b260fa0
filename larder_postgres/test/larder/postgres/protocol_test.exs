defmodule Larder.Postgres.ProtocolTest do
  use ExUnit.Case, async: true

  alias Larder.Postgres.Protocol
  alias Larder.Test.PropEr

  @max 65_536

  # A backend message as the server writes it.
  defp msg(type, body), do: <<type, byte_size(body) + 4::32, body::binary>>

  describe "decode/2" do
    test "decodes the messages of a session" do
      stream =
        msg(?R, <<0::32>>) <>
          msg(?S, "client_encoding\0UTF8\0") <>
          msg(?K, <<42::32, 7::32>>) <>
          msg(?Z, "I") <>
          msg(
            ?T,
            <<2::16>> <>
              "a\0" <>
              <<0::32, 0::16, 23::32, 4::16, -1::32, 0::16>> <>
              "b\0" <> <<0::32, 0::16, 25::32, -1::16, -1::32, 0::16>>
          ) <>
          msg(?D, <<2::16, 1::32, "1", -1::32>>) <>
          msg(?C, "SELECT 1\0") <>
          msg(?E, "SERROR\0C42P01\0Mno such table\0Dit is gone\0Zsome future field\0\0") <>
          msg(?H, <<0, 2::16, 0::16, 0::16>>) <>
          msg(?d, "1\tx\n") <>
          msg(?c, "") <>
          msg(?R, <<10::32, "SCRAM-SHA-256-PLUS\0SCRAM-SHA-256\0\0">>) <>
          msg(?R, <<5::32, "salt">>)

      assert decode_all(stream) == [
               {:auth, :ok},
               {:parameter_status, "client_encoding", "UTF8"},
               {:backend_key_data, 42, 7},
               {:ready_for_query, :idle},
               {:row_description, [{"a", 23}, {"b", 25}]},
               {:data_row, ["1", nil]},
               {:command_complete, "SELECT 1"},
               {:error_response,
                %{
                  severity: "ERROR",
                  code: "42P01",
                  message: "no such table",
                  detail: "it is gone"
                }},
               {:copy_out_response, 0, [0, 0]},
               {:copy_data, "1\tx\n"},
               :copy_done,
               {:auth, {:sasl, ["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"]}},
               {:auth, {:md5, "salt"}}
             ]
    end

    test "a length above the bound is refused from the header, before the body arrives" do
      assert Protocol.decode(<<?D, 0x7FFFFFFF::32>>, @max) ==
               {:error, {:too_large, ?D, 0x7FFFFFFF - 4}}

      assert Protocol.decode(<<?D, @max + 5::32>>, @max) == {:error, {:too_large, ?D, @max + 1}}
      assert Protocol.decode(<<?D, @max + 4::32>>, @max) == :more
    end

    test "lengths below 4, unknown types and bodies of the wrong shape are errors" do
      assert Protocol.decode(<<?Z, 3::32>>, @max) == {:error, {:bad_length, ?Z, 3}}
      assert Protocol.decode(<<?Z, -1::32>>, @max) == {:error, {:bad_length, ?Z, -1}}
      assert Protocol.decode(msg(?Q, ""), @max) == {:error, {:unknown_message, ?Q}}
      assert Protocol.decode(msg(?Z, "X"), @max) == {:error, {:malformed, ?Z}}
      # a row that declares more columns than it holds, or bytes after them
      assert Protocol.decode(msg(?D, <<3::16, 1::32, "1">>), @max) == {:error, {:malformed, ?D}}

      assert Protocol.decode(msg(?D, <<1::16, 1::32, "12">>), @max) ==
               {:error, {:malformed, ?D}}

      # a value longer than the message, a negative one other than -1
      assert Protocol.decode(msg(?D, <<1::16, 100::32, "1">>), @max) ==
               {:error, {:malformed, ?D}}

      assert Protocol.decode(msg(?D, <<1::16, -2::32>>), @max) == {:error, {:malformed, ?D}}
      # a string without its terminator
      assert Protocol.decode(msg(?C, "SELECT 1"), @max) == {:error, {:malformed, ?C}}
      assert Protocol.decode(msg(?E, "SERROR\0"), @max) == {:error, {:malformed, ?E}}
      assert Protocol.decode(msg(?R, <<10::32, 0>>), @max) == {:error, {:malformed, ?R}}
      assert Protocol.decode(msg(?R, <<5::32, "sal">>), @max) == {:error, {:malformed, ?R}}
      assert Protocol.decode(msg(?H, <<0, 2::16, 0::16>>), @max) == {:error, {:malformed, ?H}}
      assert Protocol.decode(msg(?H, <<2, 0::16>>), @max) == {:error, {:malformed, ?H}}
    end

    test "a partial message is :more, whatever the split" do
      message = msg(?D, <<2::16, 1::32, "1", -1::32>>)

      for n <- 0..(byte_size(message) - 1) do
        assert Protocol.decode(binary_part(message, 0, n), @max) == :more
      end
    end

    test "never raises on random bytes, and what it accepts is a prefix of them" do
      PropEr.check(
        PropEr.forall(:proper_types.binary(), fn bytes ->
          case Protocol.decode(bytes, 256) do
            {:ok, _message, rest} ->
              byte_size(rest) < byte_size(bytes) and
                binary_part(bytes, byte_size(bytes) - byte_size(rest), byte_size(rest)) == rest

            :more ->
              true

            {:error, _reason} ->
              true
          end
        end),
        numtests: 2_000
      )
    end

    test "never raises on a well-framed message of any type with a random body" do
      gen = {:proper_types.byte(), :proper_types.binary()}

      PropEr.check(
        PropEr.forall(gen, fn {type, body} ->
          case Protocol.decode(msg(type, body), @max) do
            {:ok, _message, ""} -> true
            {:error, {kind, ^type}} when kind in [:malformed, :unknown_message] -> true
            other -> other
          end
        end),
        numtests: 3_000
      )
    end

    test "a stream of messages cut anywhere decodes to the same messages" do
      gen = {:proper_types.list(message_gen()), :proper_types.list(:proper_types.pos_integer())}

      PropEr.check(
        PropEr.forall(gen, fn {messages, cuts} ->
          bytes = Enum.map_join(messages, fn {type, body, _} -> msg(type, body) end)
          expected = Enum.map(messages, fn {_, _, decoded} -> decoded end)
          incremental(bytes, cuts, "", []) == expected
        end),
        numtests: 500
      )
    end
  end

  # Feeds `bytes` to the decoder in pieces of the sizes in `cuts` (then
  # the rest), as a socket would deliver them.
  defp incremental("", _cuts, "", acc), do: Enum.reverse(acc)

  defp incremental(bytes, cuts, buffer, acc) do
    {size, cuts} =
      case cuts do
        [n | rest] -> {min(n, byte_size(bytes)), rest}
        [] -> {byte_size(bytes), []}
      end

    <<piece::binary-size(size), bytes::binary>> = bytes
    {buffer, acc} = drain(buffer <> piece, acc)
    if bytes == "" and buffer != "", do: :left_over, else: incremental(bytes, cuts, buffer, acc)
  end

  defp drain(buffer, acc) do
    case Protocol.decode(buffer, @max) do
      {:ok, message, rest} -> drain(rest, [message | acc])
      :more -> {buffer, acc}
    end
  end

  # {type, body, decoded} of valid messages.
  defp message_gen do
    text = :proper_types.non_empty(:proper_types.list(:proper_types.integer(1, 255)))
    value = :proper_types.oneof([:proper_types.binary(), nil])

    :proper_types.oneof([
      let(:proper_types.binary(), fn data ->
        {?d, data, {:copy_data, data}}
      end),
      let({text, text}, fn {k, v} ->
        k = :erlang.list_to_binary(k)
        v = :erlang.list_to_binary(v)
        {?S, k <> <<0>> <> v <> <<0>>, {:parameter_status, k, v}}
      end),
      let(:proper_types.list(value), fn values ->
        body =
          for v <- values, into: <<length(values)::16>> do
            if v == nil, do: <<-1::32>>, else: <<byte_size(v)::32, v::binary>>
          end

        {?D, body, {:data_row, values}}
      end),
      let(:proper_types.oneof([?I, ?T, ?E]), fn s ->
        status = %{?I => :idle, ?T => :transaction, ?E => :failed}[s]
        {?Z, <<s>>, {:ready_for_query, status}}
      end)
    ])
  end

  # PropEr's ?LET.
  defp let(gen, fun), do: :proper_types.bind(gen, fun, false)

  defp decode_all(bytes), do: drain(bytes, []) |> then(fn {"", acc} -> Enum.reverse(acc) end)

  describe "the replication sub-protocol" do
    test "XLogData, keepalives and the standby status update" do
      assert Protocol.decode_replication(<<?w, 1::64, 2::64, 3::64, "data">>) ==
               {:ok, {:xlog_data, 1, 2, 3, "data"}}

      assert Protocol.decode_replication(<<?k, 10::64, 3::64, 1>>) ==
               {:ok, {:keepalive, 10, 3, true}}

      assert Protocol.decode_replication(<<?k, 10::64, 3::64, 2>>) == {:error, {:malformed, ?k}}
      assert Protocol.decode_replication(<<?k, 10::64>>) == {:error, {:malformed, ?k}}
      assert Protocol.decode_replication(<<?w, 1::64>>) == {:error, {:malformed, ?w}}
      assert Protocol.decode_replication(<<?z>>) == {:error, {:unknown_message, ?z}}
      assert Protocol.decode_replication("") == {:error, {:malformed, ?d}}

      status = IO.iodata_to_binary(Protocol.standby_status(30, 20, 20, 5, false))
      assert status == msg(?d, <<?r, 30::64, 20::64, 20::64, 5::64, 0>>)
    end
  end

  describe "LSNs" do
    test "are written and read as Postgres does" do
      assert Protocol.format_lsn(0x16_B374D848) == "16/B374D848"
      assert Protocol.format_lsn(0) == "0/0"
      assert Protocol.parse_lsn("16/B374D848") == {:ok, 0x16_B374D848}
      assert Protocol.parse_lsn("0/0") == {:ok, 0}
      assert Protocol.parse_lsn("FFFFFFFF/FFFFFFFF") == {:ok, 0xFFFFFFFF_FFFFFFFF}

      for bad <- ["", "/", "1/", "/1", "1/2/3", "G/1", "1/123456789", "-1/0", " 1/0", nil, 5] do
        assert Protocol.parse_lsn(bad) == :error
      end
    end
  end
end
