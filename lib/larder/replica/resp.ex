# An incremental RESP2 reader for the Redis Stream source: bytes in, whole
# replies out, each finished element read once, no recursion, bounded.
defmodule Larder.Replica.RESP do
  @moduledoc false

  # Values: a simple or bulk string is a binary of its own (not a sub-binary
  # of the packet, so a value kept in a table does not pin a megabyte packet),
  # an integer an integer, a null :undefined, an error {:error, message}, an
  # array a list. Top-level replies come as {:ok, value} or {:error, message}.
  #
  # How it reads: one tail-recursive pass of binary pattern matches over the
  # packet (a header's digits are matched byte by byte in the match context,
  # a bulk string is one `binary-size(n)` match, a simple line is found with
  # :binary.match/2), every finished value pushed at once into the innermost
  # unfinished array, held as function arguments (elements left and the
  # reversed elements so far) and not as a tuple per value.
  #
  # State between packets: the arrays left unfinished (`stack`, their
  # finished elements kept) and the bytes of the one unfinished element
  # (`parts`, a list of packets joined once `need` bytes are there, so a long
  # bulk string is joined once, not once per packet). Only that element's
  # header is read again when its bytes are there; no finished element is.
  #
  # Bounds: a line (header or simple string) above @max_line bytes is an
  # error; a bulk string or array declared above `max` (given to new/1) is
  # :too_large as soon as its header is read, before its bytes are buffered.

  defstruct parts: [], size: 0, need: 0, stack: [], max: 4_294_967_296

  @type t :: %__MODULE__{}

  # A line (a header or a simple string) longer than this is not Redis.
  @max_line 65_536
  # The largest count or length a header may declare (10 digits).
  @max_count 4_294_967_296

  @doc "A reader with nothing read; `max` bounds every declared length and count."
  @spec new(pos_integer()) :: t()
  def new(max \\ @max_count), do: %__MODULE__{max: min(max, @max_count)}

  @doc """
  Reads `data` after what `reader` holds: `{:ok, replies, reader}` (the
  replies finished by these bytes), `:error` for bytes that are not RESP,
  or `:too_large` for a header that declares more than the reader's bound.
  """
  @spec feed(t(), binary()) ::
          {:ok, [{:ok, term()} | {:error, binary()}], t()} | :error | :too_large
  def feed(%__MODULE__{parts: parts, size: size, need: need} = reader, data) do
    size = size + byte_size(data)

    if size < need do
      {:ok, [], %{reader | parts: [data | parts], size: size}}
    else
      buf = if parts == [], do: data, else: IO.iodata_to_binary(:lists.reverse(parts, [data]))

      case reader.stack do
        [] -> parse(buf, :top, [], [], [], reader.max)
        [{left, acc} | stack] -> parse(buf, left, acc, stack, [], reader.max)
      end
    end
  end

  # parse(rest, left, acc, stack, out, max): `left` elements of the
  # innermost unfinished array to go (:top outside any; 0 when it is
  # finished), `acc` its elements so far (reversed), `stack` the enclosing
  # arrays as {left, acc}, `out` the finished replies (reversed). Every
  # function here starts with a match of `rest`, so the packet is read
  # through one match context and no sub-binary is made but the values.

  defp parse(<<rest::binary>>, 0, acc, [{:top, _} | stack], out, max),
    do: parse(rest, :top, [], stack, [{:ok, :lists.reverse(acc)} | out], max)

  defp parse(<<rest::binary>>, 0, acc, [{left, outer} | stack], out, max),
    do: parse(rest, left - 1, [:lists.reverse(acc) | outer], stack, out, max)

  defp parse(<<?$, rest::binary>>, left, acc, stack, out, max),
    do: bulk(rest, 0, 0, left, acc, stack, out, max)

  defp parse(<<?*, rest::binary>>, left, acc, stack, out, max),
    do: array(rest, 0, 0, left, acc, stack, out, max)

  defp parse(<<type, rest::binary>>, left, acc, stack, out, max) when type in [?+, ?-, ?:],
    do: line(rest, type, left, acc, stack, out, max)

  defp parse(<<>>, left, acc, stack, out, max), do: done([], 0, left, acc, stack, out, max)
  defp parse(<<_::binary>>, _left, _acc, _stack, _out, _max), do: :error

  # A simple string, an error or an integer: one line.
  defp line(<<rest::binary>>, type, left, acc, stack, out, max) do
    case :binary.match(rest, "\r\n", scope: {0, min(byte_size(rest), @max_line + 2)}) do
      {at, 2} ->
        <<text::binary-size(at), "\r\n", rest::binary>> = rest

        case simple(type, text) do
          :error -> :error
          value -> value(rest, value, left, acc, stack, out, max)
        end

      :nomatch when byte_size(rest) <= @max_line ->
        # the line ends in a later packet
        done([type, rest], byte_size(rest) + 2, left, acc, stack, out, max)

      :nomatch ->
        :error
    end
  end

  # A bulk string of up to 64 bytes matched out of the packet is already a
  # copy of its own (a heap binary, OTP 25); a longer one is a sub-binary of
  # the packet, copied so that a value kept for long does not pin it.
  defp own(bulk, n) when n <= 64, do: bulk
  defp own(bulk, _n), do: :binary.copy(bulk)

  defp simple(?+, text), do: :binary.copy(text)
  defp simple(?-, text), do: {:error, :binary.copy(text)}

  defp simple(?:, text) do
    case Integer.parse(text) do
      {n, ""} -> n
      _ -> :error
    end
  end

  # A bulk string's header: 1 to 10 digits and CRLF, or -1 (a null).
  defp bulk(<<d, rest::binary>>, n, len, left, acc, stack, out, max)
       when d >= ?0 and d <= ?9 and len < 10,
       do: bulk(rest, n * 10 + (d - ?0), len + 1, left, acc, stack, out, max)

  defp bulk(<<"\r\n", rest::binary>>, n, len, left, acc, stack, out, max)
       when len > 0 and n <= max do
    case rest do
      <<bulk::binary-size(n), "\r\n", rest::binary>> ->
        value(rest, own(bulk, n), left, acc, stack, out, max)

      <<rest::binary>> when byte_size(rest) < n + 2 ->
        done([?$, digits(n, len), "\r\n", rest], len + 3 + n + 2, left, acc, stack, out, max)

      _ ->
        :error
    end
  end

  defp bulk(<<"\r\n", _::binary>>, _n, len, _left, _acc, _stack, _out, _max) when len > 0,
    do: :too_large

  defp bulk(<<"-1\r\n", rest::binary>>, 0, 0, left, acc, stack, out, max),
    do: value(rest, :undefined, left, acc, stack, out, max)

  defp bulk(<<rest::binary>>, n, len, left, acc, stack, out, max),
    do: header_end(rest, ?$, n, len, left, acc, stack, out, max)

  # An array's header: 1 to 10 digits and CRLF, or -1 (a null).
  defp array(<<d, rest::binary>>, n, len, left, acc, stack, out, max)
       when d >= ?0 and d <= ?9 and len < 10,
       do: array(rest, n * 10 + (d - ?0), len + 1, left, acc, stack, out, max)

  defp array(<<"\r\n", rest::binary>>, 0, len, left, acc, stack, out, max) when len > 0,
    do: value(rest, [], left, acc, stack, out, max)

  defp array(<<"\r\n", rest::binary>>, n, len, left, acc, stack, out, max)
       when len > 0 and n <= max,
       do: parse(rest, n, [], [{left, acc} | stack], out, max)

  defp array(<<"\r\n", _::binary>>, _n, len, _left, _acc, _stack, _out, _max) when len > 0,
    do: :too_large

  defp array(<<"-1\r\n", rest::binary>>, 0, 0, left, acc, stack, out, max),
    do: value(rest, :undefined, left, acc, stack, out, max)

  defp array(<<rest::binary>>, n, len, left, acc, stack, out, max),
    do: header_end(rest, ?*, n, len, left, acc, stack, out, max)

  # A header cut short by the end of the packet waits for more bytes (the
  # header is kept as read: `len` digits of `n`); any other byte is not RESP.
  defp header_end(<<rest::binary>>, type, n, len, left, acc, stack, out, max) do
    cut? =
      case rest do
        <<>> -> true
        "\r" -> len > 0
        "-" -> len == 0
        "-1" -> len == 0
        "-1\r" -> len == 0
        _ -> false
      end

    if cut?,
      do:
        done(
          [type, digits(n, len), rest],
          len + 1 + byte_size(rest) + 1,
          left,
          acc,
          stack,
          out,
          max
        ),
      else: :error
  end

  defp digits(_n, 0), do: ""
  defp digits(n, len), do: n |> Integer.to_string() |> String.pad_leading(len, "0")

  # A finished value goes into the innermost unfinished array, or out.
  defp value(<<rest::binary>>, {:error, _} = error, :top, _acc, stack, out, max),
    do: parse(rest, :top, [], stack, [error | out], max)

  defp value(<<rest::binary>>, value, :top, _acc, stack, out, max),
    do: parse(rest, :top, [], stack, [{:ok, value} | out], max)

  defp value(<<rest::binary>>, value, left, acc, stack, out, max),
    do: parse(rest, left - 1, [value | acc], stack, out, max)

  # Out of bytes: `element` the bytes of the unfinished element (iodata, []
  # when none), `need` the bytes it needs at least before it is read again.
  defp done(element, need, left, acc, stack, out, max) do
    stack = if left == :top, do: stack, else: [{left, acc} | stack]
    element = IO.iodata_to_binary(element)
    parts = if element == <<>>, do: [], else: [element]

    {:ok, :lists.reverse(out),
     %__MODULE__{parts: parts, size: byte_size(element), need: need, stack: stack, max: max}}
  end
end
