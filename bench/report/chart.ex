# Draws one benchmark table as an SVG chart with gnuplot (Debian's
# gnuplot-nox): one panel per row, one horizontal bar per contender at its
# median, an error bar for its spread, the anchor in grey and marked, and
# the ratio to the anchor written at the end of each bar (or, for a figure
# quoted from another run, its note, such as "not same run").
defmodule Larder.Report.Chart do
  @moduledoc false

  @colors ~w(#4e79a7 #f28e2b #59a14f #e15759 #76b7b2 #edc948 #b07aa1 #ff9da7 #9c755f)
  @anchor_color "#9e9e9e"
  # Above this ratio between the largest and smallest figure of a panel, its
  # axis is logarithmic.
  @log_span 30

  @doc "Writes `table` as an SVG at `svg_path`; `:ok` or `{:error, message}`."
  @spec render(Larder.Report.Results.table(), Path.t()) :: :ok | {:error, String.t()}
  def render(table, svg_path) do
    script = script(table, svg_path)
    gp = svg_path <> ".gp"
    File.write!(gp, script)

    try do
      case System.cmd(gnuplot(), [gp], stderr_to_stdout: true) do
        {_out, 0} -> :ok
        {out, status} -> {:error, "gnuplot exited with #{status}: #{String.slice(out, 0, 2000)}"}
      end
    after
      File.rm(gp)
    end
  end

  defp gnuplot do
    System.find_executable("gnuplot") ||
      raise "gnuplot not found: install gnuplot-nox (scripts/setup does)"
  end

  @doc false
  def script(table, svg_path) do
    columns = Enum.filter(table.columns, fn c -> Enum.any?(table.rows, &cell(&1, c)) end)
    n = length(columns)
    panel_h = 56 + 26 * n
    height = 50 + panel_h * length(table.rows)
    names = Enum.map(columns, &if(&1 == table.anchor, do: &1 <> " (anchor)", else: &1))

    lmargin =
      names |> Enum.map(&String.length/1) |> Enum.max(fn -> 10 end) |> min(48) |> Kernel.+(2)

    header = """
    set terminal svg size 900,#{height} dynamic font "sans,11" background rgb "white"
    set output #{q(svg_path)}
    set termoption noenhanced
    set multiplot layout #{length(table.rows)},1 title #{q(table.title)} font ",13"
    set lmargin #{lmargin}
    set rmargin 3
    set border 3
    set xtics nomirror
    set grid xtics lc rgb "#dddddd"
    set key off
    set style fill solid 0.85 border lc rgb "#555555"
    set yrange [#{n - 0.4}:-0.6]
    set ytics nomirror (#{names |> Enum.with_index() |> Enum.map_join(", ", fn {nm, i} -> "#{q(nm)} #{i}" end)})
    """

    panels = Enum.with_index(table.rows, fn row, i -> panel(row, columns, table.anchor, i) end)
    header <> Enum.join(panels, "\n") <> "\nunset multiplot\n"
  end

  defp panel(row, columns, anchor, i) do
    cells = Enum.map(columns, &cell(row, &1))
    present = Enum.reject(cells, &is_nil/1)
    unit = hd(present).unit
    {scale, unit_name} = scale(present, unit)

    highs = Enum.map(present, &((&1.high || &1.central) / scale))
    lows = present |> Enum.map(&((&1.low || &1.central) / scale)) |> Enum.filter(&(&1 > 0))
    max_high = Enum.max(highs)
    min_low = Enum.min(lows, fn -> 0 end)
    log? = min_low > 0 and max_high / min_low > @log_span

    {base, xrange} =
      if log? do
        base = min_low / 2
        span = :math.log10(max_high / base)
        {base, "[#{g(base)}:#{g(max_high * :math.pow(10, span * 0.3))}]"}
      else
        {0, "[0:#{g(max(max_high, 1.0e-9) * 1.5)}]"}
      end

    spreads = present |> Enum.map(& &1.spread) |> Enum.reject(&is_nil/1) |> Enum.uniq()
    spread_note = if spreads == [], do: "", else: "; bars: #{Enum.join(spreads, ", ")}"

    data =
      for {c, y} <- Enum.with_index(cells), c do
        color =
          if c.column == anchor,
            do: @anchor_color,
            else: Enum.at(@colors, rem(y, length(@colors)))

        med = c.central / scale
        low = (c.low || c.central) / scale
        high = (c.high || c.central) / scale

        ratio =
          cond do
            c.column == anchor -> "anchor"
            c.reference -> c.reference
            true -> ratio_text(c.ratio)
          end

        label = "#{ratio}  #{figure(c)}"
        "#{y} #{g(med)} #{g(low)} #{g(high)} #{rgb(color)} \"#{label}\""
      end

    """
    $d#{i} << EOD
    #{Enum.join(data, "\n")}
    EOD
    set title #{q("#{row.label} (median, #{unit_name}#{spread_note})")}
    #{if log?, do: "set logscale x", else: "unset logscale x"}
    set xrange #{xrange}
    plot $d#{i} using (#{g(base)}):1:(#{g(base)}):2:($1-0.35):($1+0.35):5 with boxxyerror lc rgb variable, \\
         $d#{i} using 2:1:3:4 with xerrorbars lc rgb "#222222" pt 7 ps 0.3, \\
         $d#{i} using 4:1:6 with labels left offset 0.8,0
    """
  end

  defp cell(row, column), do: Enum.find(row.cells, &(&1.column == column))

  # Times are in microseconds; shown in the unit that fits the largest.
  defp scale(cells, :time) do
    top = cells |> Enum.map(&(&1.high || &1.central)) |> Enum.max()

    cond do
      top >= 1_000_000 -> {1_000_000, "s"}
      top >= 1_000 -> {1_000, "ms"}
      top >= 1 -> {1, "us"}
      true -> {0.001, "ns"}
    end
  end

  defp scale(_cells, unit), do: {1, unit}

  # The bar's own figure, in the unit that fits it (the axis may use another).
  defp figure(%{unit: :time, central: us}) do
    cond do
      us >= 1_000_000 -> fmt(us / 1_000_000) <> " s"
      us >= 1_000 -> fmt(us / 1_000) <> " ms"
      us >= 1 -> fmt(us) <> " us"
      true -> fmt(us * 1_000) <> " ns"
    end
  end

  defp figure(%{unit: unit, central: v}) when is_integer(v), do: "#{v} #{unit}"
  defp figure(%{unit: unit, central: v}), do: "#{fmt(v)} #{unit}"

  defp ratio_text(nil), do: ""
  defp ratio_text(r) when r >= 100, do: "x" <> :erlang.float_to_binary(r / 1, decimals: 0)
  defp ratio_text(r) when r >= 10, do: "x" <> :erlang.float_to_binary(r / 1, decimals: 1)

  defp ratio_text(r) when r >= 0.1 or r == 0,
    do: "x" <> :erlang.float_to_binary(r / 1, decimals: 2)

  defp ratio_text(r),
    do: "x" <> :erlang.float_to_binary(r / 1, decimals: 1 - floor(:math.log10(r)))

  defp fmt(v) when v == 0, do: "0"
  defp fmt(v) when v >= 100, do: :erlang.float_to_binary(v / 1, decimals: 0)
  defp fmt(v) when v >= 10, do: :erlang.float_to_binary(v / 1, decimals: 1)
  defp fmt(v), do: :erlang.float_to_binary(v / 1, decimals: 2)

  defp g(v), do: :erlang.float_to_binary(v / 1, [{:scientific, 6}])

  defp rgb("#" <> hex), do: Integer.to_string(String.to_integer(hex, 16))

  # A gnuplot single-quoted string: no escapes but '' for a quote.
  defp q(s), do: "'" <> String.replace(to_string(s), "'", "''") <> "'"
end
