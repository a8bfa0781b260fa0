# How a record becomes what the table keeps: its stored row (the `:store`
# fields) and its index terms. Used by callers (for new records) and by the
# writer (for updates and replaced records).
defmodule Larder.Table.Records do
  @moduledoc false

  @doc "The index terms of `record`, one `{name, value}` per term, in index order."
  def terms(%{entries: entries}, record), do: Enum.flat_map(entries, &entry_terms(&1, record))

  @doc "The terms of one index entry for `record`."
  def entry_terms({name, {:field, field}}, record) do
    case record do
      %{^field => value} -> [{name, value}]
      _ -> []
    end
  end

  def entry_terms({name, fun}, record) do
    case fun.(record) do
      # Duplicates are harmless to an add; diffs (replace, update) dedupe first.
      values when is_list(values) -> tag(name, values, values)
      value -> [{name, value}]
    end
  end

  defp tag(name, [value | rest], all), do: [{name, value} | tag(name, rest, all)]
  defp tag(_name, [], _all), do: []

  defp tag(name, _improper, all) do
    raise ArgumentError,
          "the index function of #{inspect(name)} returned an improper list: " <>
            inspect(all, limit: 10)
  end

  @doc "What ETS keeps of `record`."
  def stored(%{store: nil}, record), do: record
  def stored(%{store: fields}, record), do: Map.take(record, fields)
end
