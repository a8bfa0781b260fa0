# Reads benchmark result files (the --json output of bench/support/bench.ex,
# or any file with the same tables/rows/results shape, such as the HTTP load
# results) into plain chart tables: per row, each contender's median, spread
# and ratio. Files and cells that do not have that shape are skipped, never
# fatal: the report shows what it understands.
defmodule Larder.Report.Results do
  @moduledoc false

  alias Larder.Report.JSON

  @typedoc """
  A contender's figure in one row: `central` (the median), `low`..`high`
  (the spread, or nil), `spread` naming it (`"p25-p75"`, `"min-max"`,
  `"p50-p99"`), `ratio` (median / the anchor's median), `unit` (`:time`, in
  microseconds, or the value's unit string), `reference` (nil, or a note
  such as `"not same run"` for a figure quoted from elsewhere: it gets no
  ratio, as a ratio is only meaningful within one run).
  """
  @type cell :: %{
          column: String.t(),
          central: number(),
          low: number() | nil,
          high: number() | nil,
          spread: String.t() | nil,
          ratio: number() | nil,
          unit: :time | String.t(),
          reference: String.t() | nil
        }

  @type row :: %{label: String.t(), cells: [cell()]}
  @type table :: %{
          title: String.t(),
          anchor: String.t() | nil,
          per_op?: boolean(),
          columns: [String.t()],
          rows: [row()]
        }
  @typedoc """
  Where a run took place: each field as the file gives it, or nil when it
  does not (older files have none of them). `machine` is either the
  harness's object (`cpu`, `cores_online`, `memory_bytes`, `os`) or a
  description another writer gives as a string.
  """
  @type machine :: %{
          cpu: String.t() | nil,
          cores_online: pos_integer() | nil,
          memory_bytes: pos_integer() | nil,
          os: String.t() | nil
        }

  @type target :: %{
          what: String.t(),
          measured: number() | nil,
          op: String.t(),
          limit: number(),
          status: String.t()
        }

  @type file :: %{
          path: String.t(),
          title: String.t(),
          quick?: boolean(),
          system: String.t() | nil,
          date: DateTime.t() | nil,
          command: String.t() | nil,
          machine: machine() | String.t() | nil,
          tables: [table()],
          targets: [target()]
        }

  # Below this many samples the spread shown is min-max, above it p25-p75.
  @quartile_samples 20

  @doc "Reads and normalizes one file: `{:ok, file}` or `{:skip, why}`."
  @spec load(Path.t()) :: {:ok, file()} | {:skip, String.t()}
  def load(path) do
    with {:ok, bin} <- read(path),
         {:ok, json} <- decode(bin),
         {:ok, tables} <- tables(json) do
      {:ok,
       %{
         path: path,
         title: str(json["title"]) || Path.basename(path, ".json"),
         quick?: json["quick"] == true,
         system: str(json["system"]),
         date: date(json["date"]),
         command: str(json["command"]),
         machine: machine(json["machine"]),
         tables: tables,
         targets: targets(json["targets"])
       }}
    end
  end

  defp read(path) do
    case File.read(path) do
      {:ok, bin} -> {:ok, bin}
      {:error, reason} -> {:skip, "cannot read: #{:file.format_error(reason)}"}
    end
  end

  defp decode(bin) do
    case JSON.decode(bin) do
      {:ok, json} when is_map(json) -> {:ok, json}
      {:ok, _} -> {:skip, "not a JSON object"}
      {:error, reason} -> {:skip, "not JSON (#{reason})"}
    end
  end

  # An ISO 8601 date and time with an offset (the harness writes UTC);
  # anything else is not a date.
  defp date(s) when is_binary(s) do
    case DateTime.from_iso8601(s) do
      {:ok, dt, _offset} -> dt
      {:error, _} -> nil
    end
  end

  defp date(_), do: nil

  defp machine(%{} = m) do
    machine = %{
      cpu: str(m["cpu"]),
      cores_online: pos_int(m["cores_online"]),
      memory_bytes: pos_int(m["memory_bytes"]),
      os: str(m["os"])
    }

    if Enum.all?(Map.values(machine), &is_nil/1), do: nil, else: machine
  end

  defp machine(s), do: str(s)

  defp pos_int(n) when is_integer(n) and n > 0, do: n
  defp pos_int(_), do: nil

  defp tables(%{"tables" => tables}) when is_list(tables) do
    case tables |> Enum.map(&table/1) |> Enum.reject(&is_nil/1) do
      [] -> {:skip, "no table with rows of results"}
      good -> {:ok, good}
    end
  end

  defp tables(_json), do: {:skip, "no \"tables\" list"}

  # The harness's target checks; entries of another shape are left out.
  defp targets(list) when is_list(list) do
    for %{"what" => what, "op" => op, "limit" => limit, "status" => status} = t <- list,
        is_binary(what) and op in ["<=", ">=", "<", ">"] and is_number(limit) and
          is_binary(status) do
      %{
        what: what,
        measured: if(is_number(t["measured"]), do: t["measured"]),
        op: op,
        limit: limit,
        status: status
      }
    end
  end

  defp targets(_), do: []

  defp table(%{"title" => title, "rows" => rows} = t) when is_binary(title) and is_list(rows) do
    raw_rows = Enum.filter(rows, &match?(%{"label" => l, "results" => %{}} when is_binary(l), &1))

    columns =
      case t["columns"] do
        cols when is_list(cols) -> Enum.filter(cols, &is_binary/1)
        _ -> raw_rows |> Enum.flat_map(&Map.keys(&1["results"])) |> Enum.uniq()
      end

    anchor = if str(t["anchor"]) in columns, do: t["anchor"], else: List.first(columns)
    per_op? = per_op?(t, raw_rows)

    rows =
      for row <- raw_rows,
          cells = row_cells(row["results"], columns, anchor, per_op?),
          cells != [],
          do: %{label: row["label"], cells: cells}

    if rows == [],
      do: nil,
      else: %{title: title, anchor: anchor, per_op?: per_op?, columns: columns, rows: rows}
  end

  defp table(_), do: nil

  # Files from before the "per_op" field: per operation when every time
  # result has per-operation figures.
  defp per_op?(%{"per_op" => p}, _rows) when is_boolean(p), do: p

  defp per_op?(_table, rows) do
    times = for r <- rows, {_, res} <- r["results"], is_map(res), res["kind"] != "value", do: res

    times != [] and Enum.all?(times, &num?(&1["per_op_median_us"]))
  end

  defp row_cells(results, columns, anchor, per_op?) do
    cells =
      for col <- columns,
          %{} = res <- [results[col]],
          %{} = cell <- [cell(res, per_op?)],
          do: Map.put(cell, :column, col)

    anchor_cell = Enum.find(cells, &(&1.column == anchor and &1.reference == nil))
    # A row compares like with like: the anchor's unit, or the first cell's.
    unit = (anchor_cell || List.first(cells) || %{unit: nil}).unit

    for c <- cells, c.unit == unit do
      ratio =
        cond do
          c.reference -> nil
          num?(c.raw_ratio) -> c.raw_ratio
          anchor_cell && anchor_cell.central > 0 -> c.central / anchor_cell.central
          true -> nil
        end

      c |> Map.delete(:raw_ratio) |> Map.put(:ratio, ratio)
    end
  end

  defp cell(%{"kind" => "value", "value" => v} = res, _per_op?) do
    if num?(v),
      do: %{
        central: v,
        low: nil,
        high: nil,
        spread: nil,
        unit: str(res["unit"]) || "",
        raw_ratio: res["ratio"],
        reference: str(res["reference"])
      }
  end

  defp cell(res, per_op?) do
    ops = if per_op? and num?(res["ops"]) and res["ops"] > 0, do: res["ops"], else: nil

    central =
      first_num([
        per_op? && res["per_op_median_us"],
        num?(res["median_us"]) && ops && res["median_us"] / ops,
        res["median_us"],
        res["p50_us"]
      ])

    if central do
      {low, high, spread} = spread(res, ops)

      %{
        central: central,
        low: low,
        high: high,
        spread: spread,
        unit: :time,
        raw_ratio: res["ratio"],
        reference: str(res["reference"])
      }
    end
  end

  defp spread(res, ops) do
    div = fn v -> if num?(v), do: v / (ops || 1) end
    n = if num?(res["runs"]), do: res["runs"], else: 0

    cond do
      n >= @quartile_samples and num?(res["p25_us"]) and num?(res["p75_us"]) ->
        {div.(res["p25_us"]), div.(res["p75_us"]), "p25-p75"}

      num?(res["min_us"]) and num?(res["max_us"]) ->
        {div.(res["min_us"]), div.(res["max_us"]), "min-max"}

      num?(res["p50_us"]) and num?(res["p99_us"]) ->
        {res["p50_us"], res["p99_us"], "p50-p99"}

      true ->
        {nil, nil, nil}
    end
  end

  defp first_num(list), do: Enum.find(list, &num?/1)

  defp num?(v), do: is_number(v) and v >= 0
  defp str(s) when is_binary(s) and s != "", do: s
  defp str(_), do: nil
end
