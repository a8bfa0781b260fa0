defmodule Larder.Postgres.CopyTextTest do
  use ExUnit.Case, async: true

  alias Larder.Postgres.CopyText
  alias Larder.Test.PropEr

  test "fields: tabs split, \\N is NULL, escapes are undone" do
    assert CopyText.parse_row("1\tabc\t\\N", 3) == {:ok, ["1", "abc", nil]}
    assert CopyText.parse_row("a\\tb\\nc\\\\d\\re", 1) == {:ok, ["a\tb\nc\\d\re"]}
    assert CopyText.parse_row("\\b\\f\\v", 1) == {:ok, [<<8, 12, 11>>]}
    # \N only as a whole field; an escaped backslash before N is text
    assert CopyText.parse_row("\\\\N\tx\\N", 2) == {:ok, ["\\N", "xN"]}
    # octal (1 to 3 digits) and hex (1 or 2 digits)
    assert CopyText.parse_row("\\101\\0\\7x\\1010", 1) == {:ok, ["A" <> <<0, 7>> <> "xA0"]}
    assert CopyText.parse_row("\\x41\\x4\\x414", 1) == {:ok, ["A" <> <<4>> <> "A4"]}
    # a backslash before any other byte stands for it
    assert CopyText.parse_row("\\q\\.\\é", 1) == {:ok, ["q.é"]}
    assert CopyText.parse_row("", 1) == {:ok, [""]}
    assert CopyText.parse_row("\t", 2) == {:ok, ["", ""]}
    assert CopyText.parse_row("ünï\tcødé 🎉", 2) == {:ok, ["ünï", "cødé 🎉"]}
  end

  # A row is part of a 64 KiB read: a value kept from it must not hold the
  # whole read in memory.
  test "a value over 64 bytes is a binary of its own; smaller ones may share the row" do
    long = String.duplicate("x", 100)
    escaped = String.duplicate("y", 99) <> "\\t"
    buffer = "1\t" <> long <> "\t" <> escaped <> "\t" <> String.duplicate("z", 65_536)
    row = binary_part(buffer, 0, 2 + 100 + 1 + byte_size(escaped))

    assert {:ok, ["1", ^long, value]} = CopyText.parse_row(row, 3)
    assert value == String.duplicate("y", 99) <> "\t"
    assert :binary.referenced_byte_size(long_of(CopyText.parse_row(row, 3))) == 100
    assert :binary.referenced_byte_size(value) == 100
  end

  defp long_of({:ok, [_, long, _]}), do: long

  test "rows of the wrong shape are errors" do
    assert CopyText.parse_row("a\tb", 3) == :error
    assert CopyText.parse_row("a\\", 1) == :error
    assert CopyText.parse_row("a\rb", 1) == :error
    assert CopyText.parse_row("a\\\rb", 1) == :error
  end

  test "split_rows/1 keeps the bytes after the last newline" do
    assert CopyText.split_rows("a\nb\nc") == {["a", "b"], "c"}
    assert CopyText.split_rows("a\n") == {["a"], ""}
    assert CopyText.split_rows("abc") == {[], "abc"}
    assert CopyText.split_rows("") == {[], ""}
  end

  test "parses what an encoder of the format writes, whatever the values" do
    value = :proper_types.oneof([nil, :proper_types.binary(), awkward()])
    row = :proper_types.non_empty(:proper_types.list(value))
    gen = {:proper_types.list(row), :proper_types.list(:proper_types.integer(0, 5))}

    PropEr.check(
      PropEr.forall(gen, fn {rows, styles} ->
        styles = Stream.cycle(if styles == [], do: [0], else: styles)

        text =
          rows
          |> Enum.zip(Stream.chunk_every(styles, 1))
          |> Enum.map_join(fn {row, [style]} -> encode_row(row, style) end)

        {lines, ""} = CopyText.split_rows(text)

        parsed =
          Enum.zip_with(lines, rows, fn line, row -> CopyText.parse_row(line, length(row)) end)

        parsed == Enum.map(rows, &{:ok, &1})
      end),
      numtests: 500
    )
  end

  test "never raises on random bytes" do
    PropEr.check(
      PropEr.forall(:proper_types.binary(), fn bytes ->
        {rows, _rest} = CopyText.split_rows(bytes)
        Enum.all?(rows, &(CopyText.parse_row(&1, nil) != nil))
      end),
      numtests: 2_000
    )
  end

  defp awkward do
    :proper_types.bind(
      :proper_types.list(
        :proper_types.oneof(["\t", "\n", "\r", "\\", "\\N", "N", "é", "🎉", <<0>>, <<8>>, "x"])
      ),
      &Enum.join/1,
      false
    )
  end

  # The model: COPY TO's text format, the way the server writes it (style
  # 0), or with the other escapes a writer may use for the same bytes
  # (octal, hex, a backslash before an ordinary byte).
  defp encode_row(row, style), do: Enum.map_join(row, "\t", &encode_value(&1, style)) <> "\n"

  defp encode_value(nil, _style), do: "\\N"

  defp encode_value(value, style) do
    for <<byte <- value>>, into: "", do: encode_byte(byte, style)
  end

  defp encode_byte(?\\, _), do: "\\\\"
  defp encode_byte(?\t, 0), do: "\\t"
  defp encode_byte(?\n, 0), do: "\\n"
  defp encode_byte(?\r, 0), do: "\\r"
  defp encode_byte(8, 0), do: "\\b"
  defp encode_byte(12, 0), do: "\\f"
  defp encode_byte(11, 0), do: "\\v"
  # three octal digits
  defp encode_byte(b, 1) when b in [?\t, ?\n, ?\r], do: "\\" <> pad(Integer.to_string(b, 8), 3)
  # two hex digits
  defp encode_byte(b, 2) when b in [?\t, ?\n, ?\r], do: "\\x" <> pad(Integer.to_string(b, 16), 2)
  # a byte that is not an escape, behind a backslash (not N: a field
  # that is exactly \N is NULL)
  defp encode_byte(b, 3) when b in [?q, ?z, ?., 233], do: <<?\\, b>>
  defp encode_byte(b, 3) when b in [?\t, ?\n, ?\r], do: encode_byte(b, 0)
  # NUL too, which a server never writes but the format can carry
  defp encode_byte(b, 4) when b in [?\t, ?\n, ?\r, 0], do: "\\" <> pad(Integer.to_string(b, 8), 3)

  defp encode_byte(b, 5) when b in [?\t, ?\n, ?\r, 0],
    do: "\\x" <> pad(Integer.to_string(b, 16), 2)

  defp encode_byte(b, _) when b in [?\t, ?\n, ?\r], do: encode_byte(b, 0)
  defp encode_byte(b, _), do: <<b>>

  defp pad(digits, n), do: String.pad_leading(digits, n, "0")
end
