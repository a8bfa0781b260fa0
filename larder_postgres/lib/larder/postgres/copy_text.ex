# COPY's text format, as a server writes it for COPY ... TO STDOUT: splits
# received bytes into rows and rows into fields, undoing the backslash
# escapes, with \N for NULL.
defmodule Larder.Postgres.CopyText do
  @moduledoc false

  alias Larder.Postgres.Protocol

  # Contract (internal).
  #
  # The format (PostgreSQL's "COPY", File Formats, Text Format): a row
  # ends with a newline; its fields are separated by tabs (the
  # delimiter); a field that is exactly \N is NULL. In a field, a
  # backslash starts an escape: \b \f \n \r \t \v (backspace, form feed,
  # newline, carriage return, tab, vertical tab), \\ (a backslash), \ and
  # 1 to 3 octal digits (a byte, modulo 256), \x and 1 or 2 hex digits (a
  # byte), and a backslash before any other byte stands for that byte. A
  # server writes a tab, a newline, a carriage return or a backslash of a
  # value escaped, so a raw tab always separates fields and a raw newline
  # always ends a row; a row of the wrong shape (a field ending in a lone
  # backslash, a raw carriage return) is an error, never a guess.
  #
  # split_rows/1 gives the whole rows of a buffer and the bytes after the
  # last newline; parse_row/2 gives a row's fields, checking their count.
  # Neither raises on any bytes. The values are binaries as the server
  # sent them (UTF-8, the client_encoding the client asks for), escapes
  # undone, each larger than 64 bytes a binary of its own
  # (Protocol.detach/1); nothing else is interpreted.

  @doc """
  The whole rows of `buffer` (without their newlines) and the bytes after
  the last one.
  """
  @spec split_rows(binary()) :: {[binary()], binary()}
  def split_rows(buffer) do
    last = byte_size(buffer) - 1

    # A server sends each row in a CopyData of its own: one match finds it.
    case :binary.match(buffer, "\n") do
      :nomatch -> {[], buffer}
      {^last, 1} -> {[binary_part(buffer, 0, last)], ""}
      _ -> split_all(:binary.split(buffer, "\n", [:global]), [])
    end
  end

  defp split_all([rest], rows), do: {:lists.reverse(rows), rest}
  defp split_all([row | parts], rows), do: split_all(parts, [row | rows])

  @doc """
  The fields of one row (without its newline): `{:ok, [binary | nil]}`
  when it has `count` of them (any count when `count` is nil), `:error`
  otherwise.
  """
  @spec parse_row(binary(), non_neg_integer() | nil) :: {:ok, [binary() | nil]} | :error
  def parse_row(row, count) do
    fields = :binary.split(row, "\t", [:global])

    cond do
      count != nil and length(fields) != count -> :error
      # most rows: no NULL and nothing escaped, so the fields are the values
      plain?(row) -> {:ok, Enum.map(fields, &Protocol.detach/1)}
      true -> fields(fields, [])
    end
  end

  # Whether `binary` holds no backslash and no carriage return: two
  # single-byte searches (a list of patterns is compiled at each call,
  # which costs more than the search).
  defp plain?(binary),
    do: :binary.match(binary, "\\") == :nomatch and :binary.match(binary, "\r") == :nomatch

  defp fields([], acc), do: {:ok, :lists.reverse(acc)}
  defp fields(["\\N" | rest], acc), do: fields(rest, [nil | acc])

  # A raw carriage return, alone or after a backslash, is refused.
  defp fields([field | rest], acc) do
    cond do
      plain?(field) ->
        fields(rest, [Protocol.detach(field) | acc])

      :binary.match(field, "\r") != :nomatch ->
        :error

      true ->
        case unescape(field, 0, []) do
          {:ok, value} -> fields(rest, [Protocol.detach(value) | acc])
          :error -> :error
        end
    end
  end

  # Walks `field` (without a raw carriage return) from `at`, collecting
  # the plain run since the last escape; `acc` is iodata in reverse.
  defp unescape(field, at, acc) when at == byte_size(field),
    do: {:ok, acc |> Enum.reverse() |> IO.iodata_to_binary()}

  defp unescape(field, start, acc) do
    case :binary.match(field, "\\", scope: {start, byte_size(field) - start}) do
      :nomatch ->
        unescape(field, byte_size(field), [
          binary_part(field, start, byte_size(field) - start) | acc
        ])

      {at, 1} ->
        plain = binary_part(field, start, at - start)
        "\\" <> escaped = binary_part(field, at, byte_size(field) - at)

        case escape(escaped) do
          {:ok, byte, used} -> unescape(field, at + 1 + used, [byte, plain | acc])
          :error -> :error
        end
    end
  end

  defp escape(<<?b, _::binary>>), do: {:ok, <<8>>, 1}
  defp escape(<<?f, _::binary>>), do: {:ok, <<12>>, 1}
  defp escape(<<?n, _::binary>>), do: {:ok, <<10>>, 1}
  defp escape(<<?r, _::binary>>), do: {:ok, <<13>>, 1}
  defp escape(<<?t, _::binary>>), do: {:ok, <<9>>, 1}
  defp escape(<<?v, _::binary>>), do: {:ok, <<11>>, 1}

  defp escape(<<d, _::binary>> = rest) when d in ?0..?7 do
    digits = take_while(rest, 3, &(&1 in ?0..?7))
    {:ok, <<rem(String.to_integer(digits, 8), 256)>>, byte_size(digits)}
  end

  defp escape(<<?x, h, _::binary>> = rest)
       when h in ?0..?9 or h in ?a..?f or h in ?A..?F do
    digits =
      take_while(binary_part(rest, 1, byte_size(rest) - 1), 2, fn c ->
        c in ?0..?9 or c in ?a..?f or c in ?A..?F
      end)

    {:ok, <<String.to_integer(digits, 16)>>, 1 + byte_size(digits)}
  end

  # A raw newline never reaches here (it ends a row), nor a raw carriage
  # return (refused before).
  defp escape(<<c, _::binary>>), do: {:ok, <<c>>, 1}
  defp escape(<<>>), do: :error

  defp take_while(binary, max, fun) do
    n =
      binary
      |> binary_part(0, min(max, byte_size(binary)))
      |> :binary.bin_to_list()
      |> Enum.take_while(fun)
      |> length()

    binary_part(binary, 0, n)
  end
end
