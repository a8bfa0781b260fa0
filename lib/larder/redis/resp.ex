# The RESP2 wire format for every Redis connection of Larder (the cache's
# connections and the replica's stream source): encoding a command, and an
# incremental, bounded reply parser.
defmodule Larder.Redis.RESP do
  @moduledoc false

  # Contract (internal).
  #
  # Replies: a simple string or an integer is a binary (the integer's
  # digits, as the callers parse and check them), a bulk string a binary,
  # an array a list, a null bulk string or array `:undefined`; an error is
  # `{:error, text}`, at the top (a reply) or inside an array (an element).
  # A whole reply is `{:ok, value}` or `{:error, text}`.
  #
  # Incremental: `parse/2` takes the bytes of any read, whatever their
  # boundaries, and returns the replies they complete; a reply split over
  # reads parses exactly as it does unsplit (an error stays an error).
  # Between reads the parser keeps the arrays left open (with their
  # finished elements) and the bytes of the one unfinished element (a list
  # of reads, joined once the bytes it needs are there, so a long bulk
  # string is joined once): no finished element is read again.
  #
  # Bounded: a reply's size (its lines, plus each bulk string's declared
  # length, counted when its header is read, before any of it is buffered)
  # above the parser's `max_bytes`, an array of more than @max_count
  # elements, more than @max_depth nested arrays, or a line (header, simple
  # string, error, integer) longer than @max_line bytes is
  # `{:error, :too_large}`; bytes that are not RESP are
  # `{:error, :not_resp}`. Nothing raises. No recursion over nesting.
  #
  # Cost: one tail-recursive pass of binary matches over each read (a
  # header's digits matched byte by byte in the match context, a bulk string
  # one `binary-size(n)` match, a simple line found with :binary.match/2),
  # each finished value pushed into the innermost open array held in
  # arguments, not in a tuple per value. Values are binaries of their own:
  # up to 64 bytes a match makes a heap binary (OTP 25); a longer one is
  # copied out of the read, so that a value kept (an L1 entry, a table
  # record) does not pin the read's 64 KB to 1 MB.

  defstruct parts: [], have: 0, need: 0, stack: [], size: 0, max: 1

  @opaque t :: %__MODULE__{}

  @type reply :: {:ok, term()} | {:error, binary()}

  @max_line 65_536
  @max_count 16_777_216
  @max_depth 16
  # A header's number: at most 19 digits (as an integer reply's).
  @max_digits 19

  @doc "A command as RESP iodata (an array of bulk strings)."
  @spec command([binary()]) :: iodata()
  def command(args) do
    ["*", Integer.to_string(length(args)), "\r\n" | bulks(args)]
  end

  defp bulks([]), do: []

  defp bulks([arg | args]),
    do: ["$", Integer.to_string(byte_size(arg)), "\r\n", arg, "\r\n" | bulks(args)]

  @doc "A parser for replies of at most `max_bytes` each."
  @spec new(pos_integer()) :: t()
  def new(max_bytes) when is_integer(max_bytes) and max_bytes > 0,
    do: %__MODULE__{max: max_bytes}

  @doc """
  Reads the replies that `data` completes, after what `parser` holds:
  `{:ok, replies, parser}`, or `{:error, :not_resp}` for bytes that are
  not RESP and `{:error, :too_large}` for a reply above a bound (the parser
  is then unusable: close the connection).
  """
  @spec parse(t(), binary()) :: {:ok, [reply()], t()} | {:error, :not_resp | :too_large}
  def parse(%__MODULE__{parts: parts, have: have, need: need} = parser, data)
      when is_binary(data) do
    have = have + byte_size(data)

    if have < need do
      {:ok, [], %{parser | parts: [data | parts], have: have}}
    else
      buf = if parts == [], do: data, else: IO.iodata_to_binary(:lists.reverse(parts, [data]))
      %{stack: stack, size: size, max: max} = parser

      case stack do
        [] -> parse(buf, :top, [], [], [], size, max)
        [{left, acc} | stack] -> parse(buf, left, acc, stack, [], size, max)
      end
    end
  end

  @doc "Whether `parser` holds part of a reply."
  @spec pending?(t()) :: boolean()
  def pending?(%__MODULE__{parts: [], stack: []}), do: false
  def pending?(%__MODULE__{}), do: true

  # parse(rest, left, acc, stack, out, size, max): `left` elements of the
  # innermost open array to go (:top outside any; 0 when it is finished),
  # `acc` its elements so far (reversed), `stack` the enclosing arrays as
  # {left, acc}, `out` the finished replies (reversed), `size` the bytes of
  # the current reply so far. Every function here starts with a match of
  # `rest`, so a read is walked through one match context.

  defp parse(<<rest::binary>>, 0, acc, [{:top, _} | stack], out, _size, max),
    do: parse(rest, :top, [], stack, [{:ok, :lists.reverse(acc)} | out], 0, max)

  defp parse(<<rest::binary>>, 0, acc, [{left, outer} | stack], out, size, max),
    do: parse(rest, left - 1, [:lists.reverse(acc) | outer], stack, out, size, max)

  defp parse(<<?$, rest::binary>>, left, acc, stack, out, size, max),
    do: bulk(rest, 0, 0, left, acc, stack, out, size, max)

  defp parse(<<?*, rest::binary>>, left, acc, stack, out, size, max),
    do: array(rest, 0, 0, left, acc, stack, out, size, max)

  defp parse(<<type, rest::binary>>, left, acc, stack, out, size, max)
       when type == ?+ or type == ?- or type == ?:,
       do: line(rest, type, left, acc, stack, out, size, max)

  defp parse(<<>>, left, acc, stack, out, size, max),
    do: done([], 0, left, acc, stack, out, size, max)

  # (a byte that starts no RESP type is refused at once)
  defp parse(<<_::binary>>, _left, _acc, _stack, _out, _size, _max), do: {:error, :not_resp}

  # A simple string, an error or an integer: one line.
  defp line(<<rest::binary>>, type, left, acc, stack, out, size, max) do
    case :binary.match(rest, "\r\n", scope: {0, min(byte_size(rest), @max_line + 2)}) do
      {at, 2} when at < @max_line ->
        <<text::binary-size(at), "\r\n", rest::binary>> = rest
        size = size + at + 3

        cond do
          size > max -> {:error, :too_large}
          type == ?+ -> value(rest, own(text, at), left, acc, stack, out, size, max)
          type == ?- -> value(rest, {:error, own(text, at)}, left, acc, stack, out, size, max)
          integer?(text) -> value(rest, text, left, acc, stack, out, size, max)
          true -> {:error, :not_resp}
        end

      :nomatch when byte_size(rest) < @max_line ->
        # the line ends in a later read
        done([type, rest], byte_size(rest) + 2, left, acc, stack, out, size, max)

      _ ->
        {:error, :too_large}
    end
  end

  # An integer reply: an optional minus and 1 to 19 digits.
  defp integer?(<<?-, digits::binary>>), do: digits?(digits, 0)
  defp integer?(digits), do: digits?(digits, 0)

  defp digits?(<<d, rest::binary>>, n) when d >= ?0 and d <= ?9 and n < @max_digits,
    do: digits?(rest, n + 1)

  defp digits?(<<>>, n), do: n > 0
  defp digits?(_rest, _n), do: false

  # A bulk string's header: digits and CRLF, or -1 (a null).
  defp bulk(<<d, rest::binary>>, n, len, left, acc, stack, out, size, max)
       when d >= ?0 and d <= ?9 and len < @max_digits,
       do: bulk(rest, n * 10 + (d - ?0), len + 1, left, acc, stack, out, size, max)

  defp bulk(<<"\r\n", rest::binary>>, n, len, left, acc, stack, out, size, max) when len > 0 do
    element = len + 3 + n + 2

    case rest do
      _ when size + element > max ->
        {:error, :too_large}

      <<value::binary-size(n), "\r\n", rest::binary>> ->
        value(rest, own(value, n), left, acc, stack, out, size + element, max)

      <<rest::binary>> when byte_size(rest) < n + 2 ->
        done([?$, digits(n, len), "\r\n", rest], element, left, acc, stack, out, size, max)

      _ ->
        {:error, :not_resp}
    end
  end

  defp bulk(<<"-1\r\n", rest::binary>>, 0, 0, left, acc, stack, out, size, max),
    do: value(rest, :undefined, left, acc, stack, out, size + 5, max)

  defp bulk(<<rest::binary>>, n, len, left, acc, stack, out, size, max),
    do: header_end(rest, ?$, n, len, left, acc, stack, out, size, max)

  # An array's header: digits and CRLF, or -1 (a null).
  defp array(<<d, rest::binary>>, n, len, left, acc, stack, out, size, max)
       when d >= ?0 and d <= ?9 and len < @max_digits,
       do: array(rest, n * 10 + (d - ?0), len + 1, left, acc, stack, out, size, max)

  defp array(<<"\r\n", rest::binary>>, n, len, left, acc, stack, out, size, max) when len > 0 do
    size = size + len + 3

    cond do
      size > max or n > @max_count -> {:error, :too_large}
      n == 0 -> value(rest, [], left, acc, stack, out, size, max)
      length(stack) >= @max_depth -> {:error, :too_large}
      true -> parse(rest, n, [], [{left, acc} | stack], out, size, max)
    end
  end

  defp array(<<"-1\r\n", rest::binary>>, 0, 0, left, acc, stack, out, size, max),
    do: value(rest, :undefined, left, acc, stack, out, size + 5, max)

  defp array(<<rest::binary>>, n, len, left, acc, stack, out, size, max),
    do: header_end(rest, ?*, n, len, left, acc, stack, out, size, max)

  # A header cut short by the end of the read waits for more bytes (kept
  # as read: `len` digits of `n`); any other byte is not RESP.
  defp header_end(<<rest::binary>>, type, n, len, left, acc, stack, out, size, max) do
    cut? =
      case rest do
        <<>> -> true
        "\r" -> len > 0
        "-" -> len == 0
        "-1" -> len == 0
        "-1\r" -> len == 0
        _ -> false
      end

    if cut? do
      need = 1 + len + byte_size(rest) + 1
      done([type, digits(n, len), rest], need, left, acc, stack, out, size, max)
    else
      {:error, :not_resp}
    end
  end

  defp digits(_n, 0), do: ""
  defp digits(n, len), do: n |> Integer.to_string() |> String.pad_leading(len, "0")

  defp own(value, n) when n <= 64, do: value
  defp own(value, _n), do: :binary.copy(value)

  # A finished value goes into the innermost open array, or out as a reply.
  defp value(<<rest::binary>>, {:error, _} = error, :top, _acc, stack, out, _size, max),
    do: parse(rest, :top, [], stack, [error | out], 0, max)

  defp value(<<rest::binary>>, value, :top, _acc, stack, out, _size, max),
    do: parse(rest, :top, [], stack, [{:ok, value} | out], 0, max)

  defp value(<<rest::binary>>, value, left, acc, stack, out, size, max),
    do: parse(rest, left - 1, [value | acc], stack, out, size, max)

  # Out of bytes: `element` the bytes of the unfinished element (iodata, []
  # when none), `need` the bytes it needs at least before it is read again.
  defp done(element, need, left, acc, stack, out, size, max) do
    stack = if left == :top, do: stack, else: [{left, acc} | stack]
    element = IO.iodata_to_binary(element)
    parts = if element == <<>>, do: [], else: [element]

    {:ok, :lists.reverse(out),
     %__MODULE__{
       parts: parts,
       have: byte_size(element),
       need: need,
       stack: stack,
       size: size,
       max: max
     }}
  end
end
