# An incremental RESP2 reader for the Redis Stream source: bytes in, whole
# replies out, each byte looked at once (eredis's parser re-reads an
# unfinished nested reply from its start on every packet, which makes a
# 1 MB XREAD reply quadratic), no recursion, the unfinished tail bounded.
defmodule Larder.Replica.RESP do
  @moduledoc false

  # Values: a simple or bulk string is a binary (a bulk string copied out of
  # the packet, so a value kept in a table does not pin the packet), an
  # integer an integer, a null :undefined, an error {:error, message}, an
  # array a list. Top-level replies come as {:ok, value} or {:error, message}.
  #
  # State: the unread bytes (the start of an unfinished element, kept as a
  # list of packets until `need` bytes are there, so a long bulk string is
  # joined once, not once per packet) and a stack of unfinished arrays
  # {elements left, elements so far (reversed)}.

  defstruct parts: [], size: 0, need: 0, stack: []

  @type t :: %__MODULE__{}

  # A line (a header or a simple string) longer than this is not Redis.
  @max_line 65_536

  @doc "A reader with nothing read."
  @spec new() :: t()
  def new, do: %__MODULE__{}

  @doc """
  Reads `data` after what `reader` holds: `{:ok, replies, reader}` (the
  replies finished by these bytes) or `:error` for bytes that are not RESP.
  """
  @spec feed(t(), binary()) :: {:ok, [{:ok, term()} | {:error, binary()}], t()} | :error
  def feed(%__MODULE__{parts: parts, size: size, need: need, stack: stack} = reader, data) do
    size = size + byte_size(data)

    if size < need do
      {:ok, [], %{reader | parts: [data | parts], size: size}}
    else
      read(IO.iodata_to_binary(Enum.reverse([data | parts])), stack, [])
    end
  end

  defp read(<<>>, stack, out), do: {:ok, Enum.reverse(out), %__MODULE__{stack: stack}}

  defp read(buf, stack, out) do
    case element(buf) do
      {:value, value, rest} ->
        push(value, rest, stack, out)

      {:array, 0, rest} ->
        push([], rest, stack, out)

      {:array, n, rest} ->
        read(rest, [{n, []} | stack], out)

      {:incomplete, need} ->
        reader = %__MODULE__{parts: [buf], size: byte_size(buf), need: need, stack: stack}
        {:ok, Enum.reverse(out), reader}

      :error ->
        :error
    end
  end

  # A finished value goes into the innermost unfinished array, or out.
  defp push(value, rest, [], out), do: read(rest, [], [top(value) | out])

  defp push(value, rest, [{1, acc} | stack], out),
    do: push(Enum.reverse([value | acc]), rest, stack, out)

  defp push(value, rest, [{n, acc} | stack], out),
    do: read(rest, [{n - 1, [value | acc]} | stack], out)

  defp top({:error, message}), do: {:error, message}
  defp top(value), do: {:ok, value}

  defp element(<<"$", rest::binary>> = buf) do
    case header(rest, 0, 0) do
      {:ok, n, rest} ->
        case rest do
          <<bulk::binary-size(n), "\r\n", rest::binary>> ->
            {:value, :binary.copy(bulk), rest}

          _ when byte_size(rest) < n + 2 ->
            {:incomplete, byte_size(buf) - byte_size(rest) + n + 2}

          _ ->
            :error
        end

      :slow ->
        bulk_slow(rest)
    end
  end

  defp element(<<"*", rest::binary>>) do
    case header(rest, 0, 0) do
      {:ok, n, rest} -> {:array, n, rest}
      :slow -> array_slow(rest)
    end
  end

  defp element(other), do: simple(other)

  # The common header: 1 to 10 digits and CRLF, all in this packet.
  defp header(<<d, rest::binary>>, n, len) when d in ?0..?9 and len < 10,
    do: header(rest, n * 10 + d - ?0, len + 1)

  defp header(<<"\r\n", rest::binary>>, n, len) when len > 0 and n <= 4_294_967_296,
    do: {:ok, n, rest}

  defp header(_other, _n, _len), do: :slow

  defp bulk_slow(rest) do
    case line(rest) do
      {:line, "-1", rest} ->
        {:value, :undefined, rest}

      {:line, digits, rest} ->
        case count(digits) do
          {:ok, n} ->
            case rest do
              <<bulk::binary-size(n), "\r\n", rest::binary>> ->
                {:value, :binary.copy(bulk), rest}

              _ when byte_size(rest) < n + 2 ->
                {:incomplete, byte_size(digits) + 3 + n + 2}

              _ ->
                :error
            end

          :error ->
            :error
        end

      other ->
        other
    end
  end

  defp array_slow(rest) do
    case line(rest) do
      {:line, "-1", rest} ->
        {:value, :undefined, rest}

      {:line, digits, rest} ->
        case count(digits) do
          {:ok, n} -> {:array, n, rest}
          :error -> :error
        end

      other ->
        other
    end
  end

  defp simple(<<"+", rest::binary>>) do
    case line(rest) do
      {:line, text, rest} -> {:value, :binary.copy(text), rest}
      other -> other
    end
  end

  defp simple(<<"-", rest::binary>>) do
    case line(rest) do
      {:line, text, rest} -> {:value, {:error, :binary.copy(text)}, rest}
      other -> other
    end
  end

  defp simple(<<":", rest::binary>>) do
    case line(rest) do
      {:line, text, rest} ->
        case Integer.parse(text) do
          {n, ""} -> {:value, n, rest}
          _ -> :error
        end

      other ->
        other
    end
  end

  defp simple(_other), do: :error

  defp line(buf) do
    case :binary.match(buf, "\r\n") do
      {at, 2} when at <= @max_line ->
        <<text::binary-size(at), "\r\n", rest::binary>> = buf
        {:line, text, rest}

      {_at, 2} ->
        :error

      :nomatch when byte_size(buf) > @max_line ->
        :error

      :nomatch ->
        # a line ends in a later packet
        {:incomplete, byte_size(buf) + 2}
    end
  end

  # A length or element count: digits only, at most 2^32.
  defp count(digits) when byte_size(digits) in 1..10 do
    case Integer.parse(digits) do
      {n, ""} when n >= 0 and n <= 4_294_967_296 -> {:ok, n}
      _ -> :error
    end
  end

  defp count(_digits), do: :error
end
