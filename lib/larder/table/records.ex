# How a record becomes what the table keeps: its stored row (the `:store`
# fields) and its index terms. Used by callers (for new records) and by the
# writer (for updates and replaced records).
defmodule Larder.Table.Records do
  @moduledoc false

  alias Larder.Native
  alias Larder.Table.IndexFailure

  @direct_limit 0x80000000
  # Records whose terms a normal-scheduler call groups within its budget
  # (about 20 terms each); a larger chunk is grouped on a dirty scheduler.
  @normal_records 256

  @doc """
  The index terms of `record`, one `{name, value}` per term, in index order.
  An index function that fails raises `Larder.Table.IndexFailure`.
  """
  def terms(%{entries: entries, key: field}, record),
    do: Enum.flat_map(entries, &entry_terms(&1, record, field))

  @doc """
  A chunk of records (distinct keys) as a write: `{rows, ops, keyed, span}`.
  An index function that fails raises `Larder.Table.IndexFailure` (nothing
  is sent to the writer then).
  One record whose key is its row id gives `{:add_terms, terms, id}`
  (`{:set_terms, terms, id}` with `:store`, see set_terms?/1).
  A record whose key is its row id gives its ETS row `{id, stored}`, and
  its terms go into `ops`, one `{:add, term, ids}` per distinct term (a
  term shared by many records is copied and indexed once; `ids` packed in
  a binary, which is sent to the writer without a copy), which index
  these rows as fresh ones; with `:store`, a record whose row is in ETS
  when this runs gives `{:set_terms, terms, id}` instead (rows are looked
  up only below the writer's top, and only in a chunk whose first records
  replace some: see replacing_below/2). `span` is
  `{lowest, highest}` of those ids (`nil` when there are none). Any other
  record gives `{key, stored, terms}`, to which the writer gives a row id.
  """
  def write(%{key: field} = table, [record]) do
    # One record (insert/2, update/4): its terms need no gathering.
    key = :erlang.map_get(field, record)
    stored = stored(table, record)
    kind = if set_terms?(table), do: :set_terms, else: :add_terms

    if is_integer(key) and key >= 0 and key < @direct_limit,
      do: {[{key, stored}], [{kind, terms(table, record), key}], [], {key, key}},
      else: {[], [], [{key, stored, terms(table, record)}], nil}
  end

  def write(%{key: field} = table, records) do
    # Each new record's terms follow its row id in one flat list, which the
    # NIF groups by term (see group/1). With :store, a record that replaces
    # one gets its own {:set_terms, terms, id}: the index diffs it against
    # the id's terms itself, so the writer neither ungroups its terms nor
    # reads the old ones back (see Larder.Table.Writes).
    top = replacing_below(table, records)

    {rows, flat, fresh, sets, keyed, span} =
      Enum.reduce(records, {[], [], 0, [], [], nil}, fn record,
                                                        {rows, flat, fresh, sets, keyed, span} ->
        key = :erlang.map_get(field, record)
        stored = stored(table, record)

        cond do
          not (is_integer(key) and key >= 0 and key < @direct_limit) ->
            {rows, flat, fresh, sets, [{key, stored, terms(table, record)} | keyed], span}

          key < top and held?(table, key) ->
            sets = [{:set_terms, terms(table, record), key} | sets]
            {[{key, stored} | rows], flat, fresh, sets, keyed, widen(span, key)}

          true ->
            flat = [key | push_entries(table.entries, record, flat, field)]
            {[{key, stored} | rows], flat, fresh + 1, sets, keyed, widen(span, key)}
        end
      end)

    {rows, sets ++ group(flat, fresh), keyed, span}
  end

  @doc """
  Whether the table's writes give a replaced record's terms as
  `{:set_terms, terms, id}`: with `:store`, whose index keeps each id's
  terms (`reverse: true`), as the stored record no longer does.
  """
  def set_terms?(%{store: store}), do: store != nil

  # Ids below this may hold rows and are looked up (held?/2); 0 looks up
  # none. Only an id below the writer's top can hold a row, so a build's
  # ids (at or above it) are not looked up. Below it, a chunk of new
  # records whose ids interleave with the table's (a catch-up from several
  # Kafka partitions) would pay a lookup per record for nothing, about
  # 0.5-0.8 us each on a large table: the first @probe records tell a
  # chunk that replaces from one that does not.
  @probe 16

  defp replacing_below(table, records) do
    top = if set_terms?(table), do: :atomics.get(table.top, 1), else: 0

    if top > 0 and Enum.any?(Enum.take(records, @probe), &below_and_held?(table, &1, top)),
      do: top,
      else: 0
  end

  defp below_and_held?(%{key: field} = table, record, top) do
    key = :erlang.map_get(field, record)
    is_integer(key) and key >= 0 and key < top and held?(table, key)
  end

  # Whether a row holds `id` now. Only a hint, which a write racing this one
  # can make stale: {:set_terms, ...} is right whatever the id holds, and
  # the writer checks the fresh ones again (Writes). A table dropped
  # meanwhile answers false; the write then meets its writer gone.
  defp held?(table, id) do
    :ets.member(table.rows, id)
  rescue
    ArgumentError -> false
  end

  # `[id, term, ..., id, term, ...]` to one `{:add, term, ids}` per distinct
  # term, grouped in the NIF: on a dirty scheduler past about a millisecond,
  # at once past @normal_records records (a normal-scheduler call would
  # spend its budget before answering :dirty).
  defp group([], _records), do: []

  defp group(flat, records) do
    if records > @normal_records do
      Native.index_group_dirty(flat)
    else
      case Native.index_group(flat) do
        :dirty -> Native.index_group_dirty(flat)
        ops -> ops
      end
    end
    |> case do
      ops when is_list(ops) -> ops
      {:error, reason} -> raise "Larder.Table: the NIF refused a build's terms (#{reason})"
    end
  end

  # Prepends the terms of `record` (whose key is its field `key`) to `flat`.
  defp push_entries([{name, {:field, field}} | rest], record, flat, key) do
    case record do
      %{^field => value} -> push_entries(rest, record, [{name, value} | flat], key)
      _ -> push_entries(rest, record, flat, key)
    end
  end

  defp push_entries([{name, fun} | rest], record, flat, key) do
    flat =
      case run(name, fun, record, key) do
        values when is_list(values) -> push_values(name, values, values, flat)
        value -> [{name, value} | flat]
      end

    push_entries(rest, record, flat, key)
  end

  defp push_entries([], _record, flat, _key), do: flat

  defp push_values(name, [value | rest], all, flat),
    do: push_values(name, rest, all, [{name, value} | flat])

  defp push_values(_name, [], _all, flat), do: flat
  defp push_values(name, _improper, all, _flat), do: improper!(name, all)

  defp widen(nil, id), do: {id, id}
  defp widen({low, high}, id) when id < low, do: {id, high}
  defp widen({low, high}, id) when id > high, do: {low, id}
  defp widen(span, _id), do: span

  @doc """
  The terms of one index entry for `record`, whose key is its field `key`
  (which an `IndexFailure` names).
  """
  def entry_terms({name, {:field, field}}, record, _key) do
    case record do
      %{^field => value} -> [{name, value}]
      _ -> []
    end
  end

  def entry_terms({name, fun}, record, key) do
    case run(name, fun, record, key) do
      # Duplicates are harmless to an add; diffs (replace, update) dedupe first.
      values when is_list(values) -> tag(name, values, values)
      value -> [{name, value}]
    end
  end

  defp tag(name, [value | rest], all), do: [{name, value} | tag(name, rest, all)]
  defp tag(_name, [], _all), do: []

  defp tag(name, _improper, all), do: improper!(name, all)

  # Runs the index function of `name` on `record`; whatever it raises,
  # throws or exits with becomes an IndexFailure naming the index and the
  # record's key (its field `key`), which Larder.Table reports.
  defp run(name, fun, record, key) do
    fun.(record)
  catch
    kind, reason ->
      raise IndexFailure,
        index: name,
        key: Map.get(record, key),
        kind: kind,
        reason: reason,
        stacktrace: __STACKTRACE__
  end

  defp improper!(name, all) do
    raise ArgumentError,
          "the index function of #{inspect(name)} returned an improper list: " <>
            inspect(all, limit: 10)
  end

  @doc "What ETS keeps of `record`."
  def stored(%{store: nil}, record), do: record
  def stored(%{store: fields}, record), do: Map.take(record, fields)
end
