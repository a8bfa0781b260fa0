# The RESP2 wire format for every connection of Larder.Cache.Redis:
# encoding a command, and an incremental, bounded reply parser.
defmodule Larder.Cache.Redis.RESP do
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
  #
  # Bounded: a reply's size (its lines, plus each bulk string's declared
  # length, counted when its header is read, before any of it is buffered)
  # above the parser's `max_bytes`, an array of more than @max_count
  # elements, more than @max_depth nested arrays, or a line (header, simple
  # string, error, integer) longer than @max_line bytes is
  # `{:error, :too_large}`; bytes that are not RESP are
  # `{:error, :not_resp}`. Nothing raises. The parser loops over its
  # stack of open arrays (at most @max_depth): no recursion over nesting.
  #
  # Cost: a bulk string that arrives in one read is a sub-binary of it; one
  # that spans reads is kept as a list of the reads, joined once complete.

  @max_line 65_536
  @max_count 16_777_216
  @max_depth 16

  # {bytes left over (an unfinished line), open arrays [{left, items}],
  #  an unfinished bulk string {bytes needed with CRLF, reads, bytes held}
  #  or nil, size of the reply so far, max_bytes}
  @opaque t ::
            {binary(), [{pos_integer(), list()}], nil | tuple(), non_neg_integer(), pos_integer()}

  @type reply :: {:ok, term()} | {:error, binary()}

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
  def new(max_bytes) when is_integer(max_bytes) and max_bytes > 0, do: {"", [], nil, 0, max_bytes}

  @doc """
  Reads the replies that `data` completes, after what `parser` holds:
  `{:ok, replies, parser}`, or `{:error, :not_resp}` for bytes that are
  not RESP and `{:error, :too_large}` for a reply above a bound (the parser
  is then unusable: close the connection).
  """
  @spec parse(t(), binary()) :: {:ok, [reply()], t()} | {:error, :not_resp | :too_large}
  def parse({rest, stack, nil, size, max}, data) when is_binary(data) do
    buf = if rest == "", do: data, else: rest <> data
    loop(buf, stack, size, max, [])
  end

  def parse({"", stack, {need, reads, have}, size, max}, data) when is_binary(data) do
    have = have + byte_size(data)

    if have < need do
      {:ok, [], {"", stack, {need, [data | reads], have}, size, max}}
    else
      case IO.iodata_to_binary(:lists.reverse(reads, [data])) do
        <<value::binary-size(need - 2), "\r\n", rest::binary>> ->
          element(value, rest, stack, size, max, [])

        _ ->
          {:error, :not_resp}
      end
    end
  end

  @doc "Whether `parser` holds part of a reply."
  @spec pending?(t()) :: boolean()
  def pending?({"", [], nil, _size, _max}), do: false
  def pending?(_parser), do: true

  defp loop(<<>>, stack, size, max, acc),
    do: {:ok, :lists.reverse(acc), {"", stack, nil, size, max}}

  # (a byte that starts no RESP type is refused at once, not when its
  # line ends)
  defp loop(<<type, _::binary>>, _stack, _size, _max, _acc) when type not in ~c"$+-:*",
    do: {:error, :not_resp}

  defp loop(<<type, _::binary>> = buf, stack, size, max, acc) do
    case :binary.match(buf, "\r\n") do
      {pos, 2} ->
        size = size + pos + 2
        line = binary_part(buf, 1, pos - 1)
        rest = binary_part(buf, pos + 2, byte_size(buf) - pos - 2)

        cond do
          pos > @max_line or size > max -> {:error, :too_large}
          true -> line(type, line, rest, stack, size, max, acc)
        end

      :nomatch when byte_size(buf) > @max_line ->
        {:error, :too_large}

      :nomatch ->
        {:ok, :lists.reverse(acc), {buf, stack, nil, size, max}}
    end
  end

  defp line(?$, line, rest, stack, size, max, acc) do
    case integer(line) do
      -1 ->
        element(:undefined, rest, stack, size, max, acc)

      len when is_integer(len) and len >= 0 ->
        size = size + len + 2

        cond do
          size > max ->
            {:error, :too_large}

          byte_size(rest) >= len + 2 ->
            case rest do
              <<value::binary-size(len), "\r\n", rest::binary>> ->
                element(value, rest, stack, size, max, acc)

              _ ->
                {:error, :not_resp}
            end

          true ->
            {:ok, :lists.reverse(acc), {"", stack, {len + 2, [rest], byte_size(rest)}, size, max}}
        end

      _ ->
        {:error, :not_resp}
    end
  end

  defp line(?+, line, rest, stack, size, max, acc), do: element(line, rest, stack, size, max, acc)

  defp line(?-, line, rest, stack, size, max, acc),
    do: element({:error, line}, rest, stack, size, max, acc)

  defp line(?:, line, rest, stack, size, max, acc) do
    if is_integer(integer(line)),
      do: element(line, rest, stack, size, max, acc),
      else: {:error, :not_resp}
  end

  defp line(?*, line, rest, stack, size, max, acc) do
    case integer(line) do
      -1 ->
        element(:undefined, rest, stack, size, max, acc)

      0 ->
        element([], rest, stack, size, max, acc)

      n when is_integer(n) and n > @max_count ->
        {:error, :too_large}

      n when is_integer(n) and n > 0 ->
        if length(stack) < @max_depth,
          do: loop(rest, [{n, []} | stack], size, max, acc),
          else: {:error, :too_large}

      _ ->
        {:error, :not_resp}
    end
  end

  defp line(_type, _line, _rest, _stack, _size, _max, _acc), do: {:error, :not_resp}

  # A complete value: a reply, or an element of the innermost open array,
  # which closes it (and maybe its parents) when it was the last one.
  defp element({:error, _} = error, rest, [], _size, max, acc),
    do: loop(rest, [], 0, max, [error | acc])

  defp element(value, rest, [], _size, max, acc),
    do: loop(rest, [], 0, max, [{:ok, value} | acc])

  defp element(value, rest, [{1, items} | stack], size, max, acc),
    do: element(:lists.reverse(items, [value]), rest, stack, size, max, acc)

  defp element(value, rest, [{left, items} | stack], size, max, acc),
    do: loop(rest, [{left - 1, [value | items]} | stack], size, max, acc)

  # A header's or an integer reply's number: an optional minus and at most
  # 19 digits (an integer reply is a signed 64-bit number).
  defp integer(<<?-, digits::binary>>) when byte_size(digits) in 1..19 do
    if digits?(digits), do: -String.to_integer(digits), else: :error
  end

  defp integer(digits) when byte_size(digits) in 1..19 do
    if digits?(digits), do: String.to_integer(digits), else: :error
  end

  defp integer(_), do: :error

  defp digits?(<<d, rest::binary>>) when d in ?0..?9, do: rest == "" or digits?(rest)
  defp digits?(_), do: false
end
