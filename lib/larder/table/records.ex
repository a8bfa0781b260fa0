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
  One record whose key is its row id gives `{:add_terms, terms, id}`.
  A record whose key is its row id gives its ETS row `{id, stored}`, and
  its terms go into `ops`, one `{:add, term, ids}` per distinct term (a
  term shared by many records is copied and indexed once), which index
  these rows as fresh ones; `span` is `{lowest, highest}` of those ids
  (`nil` when there are none). Any other record gives `{key, stored,
  terms}`, to which the writer gives a row id.
  """
  def write(%{key: field} = table, [record]) do
    # One record (insert/2, upsert/3): `{:add_terms, terms, id}` needs no
    # gathering.
    key = :erlang.map_get(field, record)
    stored = stored(table, record)

    if is_integer(key) and key >= 0 and key < @direct_limit,
      do: {[{key, stored}], [{:add_terms, terms(table, record), key}], [], {key, key}},
      else: {[], [], [{key, stored, terms(table, record)}], nil}
  end

  def write(%{key: field} = table, records) do
    # The ids of each term gather in the process dictionary, under keys
    # that no other call uses, erased before returning (or raising).
    tag = make_ref()

    {rows, terms, keyed, span} =
      try do
        Enum.reduce(records, {[], [], [], nil}, fn record, {rows, terms, keyed, span} ->
          key = :erlang.map_get(field, record)
          stored = stored(table, record)

          if is_integer(key) and key >= 0 and key < @direct_limit do
            terms = gather_entries(table.entries, record, key, tag, terms)
            {[{key, stored} | rows], terms, keyed, widen(span, key)}
          else
            {rows, terms, [{key, stored, terms(table, record)} | keyed], span}
          end
        end)
      catch
        kind, reason ->
          for {{^tag, _} = gathered, _} <- :erlang.get(), do: :erlang.erase(gathered)
          :erlang.raise(kind, reason, __STACKTRACE__)
      end

    ops = for term <- terms, do: {:add, term, :erlang.erase({tag, term})}
    {rows, ops, keyed, span}
  end

  defp gather_entries([{name, {:field, field}} | rest], record, id, tag, seen) do
    case record do
      %{^field => value} ->
        gather_entries(rest, record, id, tag, gather_one({name, value}, id, tag, seen))

      _ ->
        gather_entries(rest, record, id, tag, seen)
    end
  end

  defp gather_entries([entry | rest], record, id, tag, seen),
    do: gather_entries(rest, record, id, tag, gather(entry_terms(entry, record), id, tag, seen))

  defp gather_entries([], _record, _id, _tag, seen), do: seen

  # Adds `id` to the ids of each of `terms`; returns `seen` with the terms
  # not seen before.
  defp gather([term | rest], id, tag, seen),
    do: gather(rest, id, tag, gather_one(term, id, tag, seen))

  defp gather([], _id, _tag, seen), do: seen

  defp gather_one(term, id, tag, seen) do
    key = {tag, term}

    case :erlang.get(key) do
      :undefined ->
        :erlang.put(key, [id])
        [term | seen]

      ids ->
        :erlang.put(key, [id | ids])
        seen
    end
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
