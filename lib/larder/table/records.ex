# How a record becomes what the table keeps: its stored row (the `:store`
# fields) and its index terms. Used by callers (for new records) and by the
# writer (for updates and replaced records).
defmodule Larder.Table.Records do
  @moduledoc false

  @direct_limit 0x80000000

  @doc "The index terms of `record`, one `{name, value}` per term, in index order."
  def terms(%{entries: entries}, record), do: Enum.flat_map(entries, &entry_terms(&1, record))

  @doc """
  A chunk of records (distinct keys) as a write: `{rows, ops, keyed, span}`.
  A record whose key is its row id gives its ETS row `{id, stored}` and the
  op `{:add_terms, terms, id}` that indexes it as a fresh row, and `span` is
  `{lowest, highest}` of those ids (`nil` when there are none); any other
  record gives `{key, stored, terms}`, to which the writer gives a row id.
  """
  def write(%{key: field} = table, records) do
    Enum.reduce(records, {[], [], [], nil}, fn record, {rows, ops, keyed, span} ->
      key = :erlang.map_get(field, record)
      stored = stored(table, record)
      terms = terms(table, record)

      if is_integer(key) and key >= 0 and key < @direct_limit,
        do: {[{key, stored} | rows], [{:add_terms, terms, key} | ops], keyed, widen(span, key)},
        else: {rows, ops, [{key, stored, terms} | keyed], span}
    end)
  end

  defp widen(nil, id), do: {id, id}
  defp widen({low, high}, id) when id < low, do: {id, high}
  defp widen({low, high}, id) when id > high, do: {low, id}
  defp widen(span, _id), do: span

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
