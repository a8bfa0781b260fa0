# How a record becomes what the table keeps: its stored row (the `:store`
# fields) and its index terms. Used by callers (for new records) and by the
# writer (for updates and replaced records).
defmodule Larder.Table.Records do
  @moduledoc false

  @doc "The index terms of `record`, one `{name, value}` per term, in index order."
  def terms(%{entries: entries}, record), do: Enum.flat_map(entries, &entry_terms(&1, record))

  @doc """
  The index entries whose terms a writer cannot read from the stored row:
  function indexes, and field indexes on fields that `:store` leaves out.
  Callers send only these terms, which keeps the write messages small.
  """
  def sent_entries(entries, store) do
    Enum.reject(entries, fn
      {_name, {:field, field}} -> store == nil or field in store
      {_name, _fun} -> false
    end)
  end

  @doc "The terms of `record` for the entries in `sent_entries/2`."
  def sent_terms(%{sent: sent}, record), do: Enum.flat_map(sent, &entry_terms(&1, record))

  @doc """
  All the terms of a stored row, given its `sent_terms/2`: those of the field
  indexes whose field the row holds (a field `:store` leaves out is not in
  the row; its terms are among the sent ones).
  """
  def derived_terms(%{entries: entries}, stored, sent_terms) do
    Enum.reduce(entries, sent_terms, fn
      {name, {:field, field}}, acc ->
        case stored do
          %{^field => value} -> [{name, value} | acc]
          _ -> acc
        end

      _fun_entry, acc ->
        acc
    end)
  end

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
