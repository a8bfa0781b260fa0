# Writes the report's index.html: per results file, each table's chart and
# its figures as an HTML table.
defmodule Larder.Report.HTML do
  @moduledoc false

  @doc "The page for `files` (each with its tables' chart paths, relative to the page)."
  @spec page([{Larder.Report.Results.file(), [{map(), String.t() | nil}]}], [String.t()]) ::
          iodata()
  def page(files, skipped) do
    [
      """
      <!doctype html>
      <html lang="en"><head><meta charset="utf-8">
      <title>Larder benchmark report</title>
      <style>
      body { font-family: sans-serif; max-width: 960px; margin: 2em auto; color: #222; }
      table { border-collapse: collapse; margin: 0.5em 0 2em; font-size: 0.9em; }
      th, td { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: right; }
      th:first-child, td:first-child { text-align: left; }
      img { max-width: 100%; }
      .meta { color: #666; font-size: 0.9em; }
      </style></head><body>
      <h1>Larder benchmark report</h1>
      <p>Each chart is one benchmark table: one panel per row, one bar per contender at
      its median, with its spread (p25-p75 over 20 samples or more, else min-max) and
      its ratio to the anchor (grey) of the same run: xN is its median over the anchor's.</p>
      """,
      Enum.map(files, &file_section/1),
      if(skipped == [],
        do: "",
        else: [
          "<h2>Skipped files</h2><ul>",
          Enum.map(skipped, &["<li>", esc(&1), "</li>"]),
          "</ul>"
        ]
      ),
      "</body></html>\n"
    ]
  end

  defp file_section({file, tables}) do
    [
      "<h2>",
      esc(file.title),
      if(file.quick?, do: " (quick run)", else: ""),
      "</h2>\n<p class=\"meta\">",
      esc(Path.basename(file.path)),
      if(file.system, do: [" &middot; ", esc(file.system)], else: ""),
      "</p>\n",
      targets(Map.get(file, :targets, [])),
      Enum.map(tables, &table_section/1)
    ]
  end

  defp targets([]), do: ""

  defp targets(targets) do
    [
      "<table><tr><th>target</th><th>measured</th><th>wanted</th><th></th></tr>\n",
      Enum.map(targets, fn t ->
        measured = if t.measured, do: fmt(t.measured), else: "-"
        want = "#{t.op} #{fmt(t.limit)}"

        [
          "<tr><td>",
          esc(t.what),
          "</td><td>",
          measured,
          "</td><td>",
          esc(want),
          "</td><td>",
          esc(t.status),
          "</td></tr>\n"
        ]
      end),
      "</table>\n"
    ]
  end

  defp table_section({table, svg}) do
    columns = table.columns

    [
      "<h3>",
      esc(table.title),
      "</h3>\n",
      if(svg, do: ["<img src=\"", esc(svg), "\" alt=\"", esc(table.title), "\">\n"], else: ""),
      "<table><tr><th></th>",
      Enum.map(columns, fn c ->
        ["<th>", esc(c), if(c == table.anchor, do: " (anchor)", else: ""), "</th>"]
      end),
      "</tr>\n",
      Enum.map(table.rows, fn row ->
        [
          "<tr><td>",
          esc(row.label),
          "</td>",
          Enum.map(columns, fn c ->
            ["<td>", cell(Enum.find(row.cells, &(&1.column == c))), "</td>"]
          end),
          "</tr>\n"
        ]
      end),
      "</table>\n"
    ]
  end

  defp cell(nil), do: "-"

  defp cell(c) do
    value = if c.unit == :time, do: fmt_us(c.central), else: "#{fmt(c.central)} #{esc(c.unit)}"

    ratio =
      cond do
        c.reference -> " (#{esc(c.reference)})"
        c.ratio -> " (x#{fmt(c.ratio)})"
        true -> ""
      end

    [value, ratio]
  end

  defp fmt_us(us) when us >= 1_000_000, do: fmt(us / 1_000_000) <> " s"
  defp fmt_us(us) when us >= 1_000, do: fmt(us / 1_000) <> " ms"
  defp fmt_us(us) when us >= 1, do: fmt(us) <> " us"
  defp fmt_us(us), do: fmt(us * 1_000) <> " ns"

  defp fmt(v) when is_integer(v), do: Integer.to_string(v)
  defp fmt(v) when v >= 100, do: :erlang.float_to_binary(v / 1, decimals: 0)
  defp fmt(v) when v >= 10, do: :erlang.float_to_binary(v / 1, decimals: 1)
  defp fmt(v) when v >= 0.01 or v == 0, do: :erlang.float_to_binary(v / 1, decimals: 2)
  defp fmt(v), do: :erlang.float_to_binary(v / 1, [{:scientific, 1}])

  defp esc(s) do
    s
    |> to_string()
    |> String.replace("&", "&amp;")
    |> String.replace("<", "&lt;")
    |> String.replace(">", "&gt;")
    |> String.replace("\"", "&quot;")
  end
end
