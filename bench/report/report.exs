# `make report`: turns bench/results/*.json into bench/report/index.html with
# one SVG chart per benchmark table (drawn by gnuplot), writes the charts the
# docs show to docs/charts/, and writes docs/benchmarks.md: per results file
# its command, machine, date and targets, and each table's medians and
# ratios to the anchor, with a link to its chart in docs/charts/.
#
#     elixir bench/report/report.exs [--results DIR] [--out DIR] [--charts DIR]
#                                    [--markdown PATH]
#
# Any file with the tables/rows/results shape of bench/support/bench.ex's
# --json output is charted and tabled (the HTTP load results too); others are
# listed as skipped. Runs without Mix: it needs Elixir and gnuplot only.
for file <- ~w(json.ex results.ex chart.ex html.ex markdown.ex),
    do: Code.require_file(file, __DIR__)

defmodule Larder.Report do
  @moduledoc false

  alias Larder.Report.{Chart, HTML, Markdown, Results}

  # The charts the docs show: {name, results file, table title, row label
  # (nil: every row)}. Titles and labels are matched by regex, so a bench
  # that renames a table only loses its chart (with a warning).
  @story [
    {"bag-fill", "bag_bench.json", ~r/^fill/, nil},
    {"register-hot-key", "register_bench.json", ~r/runners/, ~r/hot key/},
    {"cache-large-term", "cache_bench.json", ~r/^large term/i, nil},
    {"table-search", "index_bench.json", ~r/^search/, nil}
  ]

  def main(argv) do
    {opts, _rest, invalid} =
      OptionParser.parse(argv,
        strict: [results: :string, out: :string, charts: :string, markdown: :string]
      )

    if invalid != [], do: fail("unknown arguments: #{inspect(invalid)}")

    results = Keyword.get(opts, :results, "bench/results")
    out = Keyword.get(opts, :out, "bench/report")
    charts = Keyword.get(opts, :charts, "docs/charts")
    markdown = Keyword.get(opts, :markdown, "docs/benchmarks.md")

    paths = results |> Path.join("*.json") |> Path.wildcard() |> Enum.sort()
    if paths == [], do: fail("no results in #{results}: run make bench (or bench-quick) first")

    {loaded, skipped} =
      Enum.reduce(paths, {[], []}, fn path, {ok, skip} ->
        case Results.load(path) do
          {:ok, file} ->
            {[file | ok], skip}

          {:skip, why} ->
            IO.puts("report: skipped #{path}: #{why}")
            {ok, ["#{Path.basename(path)}: #{why}" | skip]}
        end
      end)

    loaded = Enum.reverse(loaded)
    svg_dir = Path.join(out, "svg")
    File.mkdir_p!(svg_dir)
    Enum.each(Path.wildcard(Path.join(svg_dir, "*.svg")), &File.rm!/1)

    sections =
      for file <- loaded do
        base = Path.basename(file.path, ".json")

        tables =
          for table <- file.tables do
            name = "#{base}-#{slug(table.title)}.svg"
            svg = render(titled(table, file), Path.join(svg_dir, name))
            {table, svg && "svg/" <> name}
          end

        {file, tables}
      end

    index = Path.join(out, "index.html")
    File.write!(index, HTML.page(sections, Enum.reverse(skipped)))
    n = sections |> Enum.map(fn {_, t} -> length(t) end) |> Enum.sum()
    IO.puts("report: #{n} charts from #{length(loaded)} files in #{index}")

    written = story(loaded, charts)

    # Each table's charts in docs/charts/, drawn in this run, as links
    # relative to the page.
    links =
      Enum.group_by(
        written,
        fn {file, table, _path} -> {file.path, table.title} end,
        fn {_file, _table, path} -> relative(path, Path.dirname(markdown)) end
      )

    write_atomically(markdown, Markdown.page(loaded, Enum.reverse(skipped), links))
    IO.puts("report: wrote #{markdown} from #{length(loaded)} files")
  end

  # Draws the charts the docs show; returns those written as
  # {file, table, path}.
  defp story(loaded, dir) do
    File.mkdir_p!(dir)

    for {name, file_name, table_re, row_re} <- @story,
        written = story_chart(loaded, dir, name, file_name, table_re, row_re),
        do: written
  end

  defp story_chart(loaded, dir, name, file_name, table_re, row_re) do
    with %{} = file <- Enum.find(loaded, &(Path.basename(&1.path) == file_name)),
         %{} = table <- Enum.find(file.tables, &Regex.match?(table_re, &1.title)),
         rows = Enum.filter(table.rows, &(row_re == nil or Regex.match?(row_re, &1.label))),
         [_ | _] <- rows,
         path = Path.join(dir, name <> ".svg"),
         ^path <- render(titled(%{table | rows: rows}, file), path) do
      IO.puts("report: wrote #{path}")
      {file, table, path}
    else
      _ ->
        IO.puts("report: no chart #{name} from #{file_name} in this run; left as it was")
        nil
    end
  end

  # `path` relative to the folder `from`, with `..` where needed.
  defp relative(path, from) do
    to = path |> Path.expand() |> Path.split()
    base = from |> Path.expand() |> Path.split()
    common = Enum.zip(to, base) |> Enum.take_while(fn {a, b} -> a == b end) |> length()
    ups = List.duplicate("..", length(base) - common)
    Path.join(ups ++ Enum.drop(to, common))
  end

  # A reader (or git) never sees half a page.
  defp write_atomically(path, iodata) do
    File.mkdir_p!(Path.dirname(path))
    tmp = "#{path}.#{System.unique_integer([:positive])}.tmp"
    File.write!(tmp, iodata)
    File.rename!(tmp, path)
  end

  defp titled(table, %{quick?: true}), do: %{table | title: table.title <> " (quick run)"}
  defp titled(table, _file), do: table

  defp render(table, path) do
    case Chart.render(table, path) do
      :ok ->
        path

      {:error, message} ->
        IO.puts(:stderr, "report: no chart for #{inspect(table.title)}: #{message}")
        nil
    end
  end

  defp slug(title) do
    title
    |> String.downcase()
    |> String.replace(~r/[^a-z0-9]+/, "-")
    |> String.trim("-")
    |> String.slice(0, 60)
  end

  defp fail(message) do
    IO.puts(:stderr, "report: " <> message)
    System.halt(1)
  end
end

Larder.Report.main(System.argv())
