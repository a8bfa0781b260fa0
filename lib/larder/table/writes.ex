# Applies one write to a Larder.Table, in its writer process: row ids for
# non-integer keys, the index diff of the records it replaces, the index
# batch, the ETS rows.
defmodule Larder.Table.Writes do
  @moduledoc false

  alias Larder.Index
  alias Larder.Table.Dump
  alias Larder.Table.Records

  @direct_limit 0x80000000
  @max_id 0xFFFFFFFF

  @typedoc """
  What a writer holds besides its table: the next row id never given to a
  non-integer key, the ids freed by deletes (taken first), and `top`, above
  every id below `@direct_limit` that holds a row.
  """
  @type state :: %{
          :table => Larder.Table.t(),
          :next => non_neg_integer(),
          :free => [non_neg_integer()],
          :top => non_neg_integer(),
          :dumps => [Dump.t()],
          optional(atom()) => term()
        }

  @doc """
  Applies `request` to the writer's tables, whole: everything is computed
  first (ids, terms, ops), then the index changes in one batch (atomic, the
  only step that can still fail), then the ETS tables (which cannot fail),
  then the id state. Returns the caller's reply and the new state; raises,
  with nothing changed, when a step before the batch or the batch raises.
  """
  @spec run(tuple(), state) :: {term(), state} when state: state()
  def run(request, state)

  # `rows` and `ops` come ready from the caller (Records.write/2) for keys
  # that are row ids: when none of those ids holds a row (all are at or
  # above `top`, as in a build, or else checked one by one) the writer only
  # applies them. `keyed` records get their ids here.
  def run({:insert, rows, ops, keyed, span}, state) do
    t = state.table

    {ops, top} =
      case span do
        nil -> {ops, state.top}
        {low, high} when low >= state.top -> {ops, high + 1}
        {_low, high} -> {replace_ops(t, rows, ops), max(state.top, high + 1)}
      end

    {rows, keys, ops, next, free} =
      Enum.reduce(keyed, {rows, [], ops, state.next, state.free}, fn
        {key, stored, terms}, {rows, keys, ops, next, free} ->
          {id, keys, next, free} = id_for(state, key, keys, next, free)
          {[{id, stored} | rows], keys, set_terms(t, id, terms, ops), next, free}
      end)

    Index.batch(t.index, ops)
    save(state, rows, keys)
    :ets.insert(t.keys, keys)
    :ets.insert(t.rows, rows)
    {:ok, top(%{state | next: next, free: free}, top)}
  end

  def run({:delete, key}, state) do
    t = state.table

    case id_of(t, key) do
      nil ->
        {:ok, state}

      id ->
        Index.batch(t.index, set_terms(t, id, [], []))
        Dump.save_rows(state.dumps, t.rows, [id])
        :ets.delete(t.rows, id)

        if direct?(key) do
          {:ok, state}
        else
          Dump.save_keys(state.dumps, t.keys, [key])
          :ets.delete(t.keys, key)
          {:ok, %{state | free: [id | state.free]}}
        end
    end
  end

  def run({:merge, key, changes}, state) do
    t = state.table

    with id when id != nil <- id_of(t, key),
         [{^id, old}] <- :ets.lookup(t.rows, id) do
      new = Map.merge(old, changes)
      before = old_terms(t, id)

      now =
        if t.store do
          # The stored record may lack what a function index reads: only
          # field indexes whose field changed get new terms.
          Enum.flat_map(t.entries, fn
            {_name, {:field, field}} = entry when is_map_key(changes, field) ->
              Records.entry_terms(entry, new, t.key)

            {name, _} ->
              for {^name, _} = term <- before, do: term
          end)
        else
          Records.terms(t, new)
        end

      stored = Records.stored(t, new)
      Index.batch(t.index, diff(before, now, id, []))
      Dump.save_rows(state.dumps, t.rows, [id])
      :ets.insert(t.rows, {id, stored})
      {{:ok, stored}, state}
    else
      _ -> {:error, state}
    end
  end

  # `default` was checked by the caller (Larder.Table.update/4).
  def run({:update, key, default, fun}, state) do
    t = state.table

    with id when id != nil <- id_of(t, key),
         [{_, record}] <- :ets.lookup(t.rows, id) do
      case fun.(record) do
        %{} = new when is_map_key(new, t.key) and :erlang.map_get(t.key, new) === key ->
          put(t, new, state)

        new ->
          raise ArgumentError,
                "the function given to update/4 must return a map whose key field " <>
                  "#{inspect(t.key)} is #{inspect(key)}, got: #{inspect(new, limit: 10)}"
      end
    else
      _ -> put(t, default, state)
    end
  end

  # One record, written as insert/2 writes it.
  defp put(t, record, state) do
    {rows, ops, keyed, span} = Records.write(t, [record])
    {:ok, _state} = run({:insert, rows, ops, keyed, span}, state)
  end

  @doc """
  Sets the writer's `top`, and publishes it in the table's `top` atomics:
  callers read it (Larder.Table.Records.write/2) to tell a record that may
  replace a row from one that cannot. `top` only grows, so a caller that
  read it before a write sees a lower one, and takes a replaced record for
  a new one at worst: the writer then finds it (replace_ops/3).
  """
  @spec top(state, non_neg_integer()) :: state when state: state()
  def top(state, top) do
    if top != state.top, do: :atomics.put(state.table.top, 1, top)
    %{state | top: top}
  end

  # While a dump runs, the rows and keys about to change as they are (see
  # Larder.Table.Dump).
  defp save(%{dumps: []}, _rows, _keys), do: :ok

  defp save(state, rows, keys) do
    t = state.table
    Dump.save_rows(state.dumps, t.rows, for({id, _} <- rows, do: id))
    Dump.save_keys(state.dumps, t.keys, for({key, _} <- keys, do: key))
  end

  # The ops of Records.write/2, with each id that holds a row taken out of
  # them and given a diff from its old terms instead. A {:set_terms, ...}
  # is right whatever its id holds: its ids are left as they are.
  defp replace_ops(_t, _rows, [{:set_terms, _terms, _id}] = ops), do: ops

  defp replace_ops(t, _rows, [{:add_terms, terms, id}] = ops),
    do: if(:ets.member(t.rows, id), do: set_terms(t, id, terms, []), else: ops)

  defp replace_ops(t, rows, ops) do
    {sets, grouped} = Enum.split_with(ops, &(elem(&1, 0) == :set_terms))
    set = Map.new(sets, fn {:set_terms, _terms, id} -> {id, []} end)

    case for {id, _} <- rows,
             not is_map_key(set, id),
             :ets.member(t.rows, id),
             into: %{},
             do: {id, []} do
      replaced when replaced == %{} ->
        ops

      replaced ->
        {grouped, now} =
          Enum.reduce(grouped, {[], replaced}, fn {:add, term, ids}, {ops, now} ->
            {fresh, now} =
              Enum.reduce(id_list(ids), {[], now}, fn id, {fresh, now} ->
                case now do
                  %{^id => terms} -> {fresh, %{now | id => [term | terms]}}
                  _ -> {[id | fresh], now}
                end
              end)

            {[{:add, term, fresh} | ops], now}
          end)

        sets ++ Enum.reduce(now, grouped, fn {id, terms}, ops -> set_terms(t, id, terms, ops) end)
    end
  end

  # Ops that give `id` exactly `terms`, prepended to `ops`: with :store the
  # index diffs them against the id's terms itself (its id-to-terms map);
  # else against the terms of the record in ETS.
  defp set_terms(t, id, terms, ops) do
    if Records.set_terms?(t),
      do: [{:set_terms, terms, id} | ops],
      else: diff(old_terms(t, id), terms, id, ops)
  end

  # The ids of an op from Records.write/2: a binary of little-endian u32s.
  defp id_list(ids) when is_binary(ids), do: for(<<id::32-little <- ids>>, do: id)
  defp id_list(ids), do: ids

  # Ops that turn `before` into `now` for `id`, prepended to `ops` (the
  # order of ops does not matter: each id appears once, and its adds and
  # removes are disjoint).
  defp diff([], now, id, ops), do: [{:add_terms, now, id} | ops]

  defp diff(before, now, id, ops) do
    # A record whose terms did not change (a new price, say) needs no op;
    # sorted lists that are identical (===) hold the same terms.
    if :lists.sort(before) === :lists.sort(now) do
      ops
    else
      {before, now} = {Enum.uniq(before), Enum.uniq(now)}
      [{:add_terms, now -- before, id}, {:remove_terms, before -- now, id} | ops]
    end
  end

  # The terms the index holds for `id`. With `:store` the row may lack what
  # the index functions read, so the index's id-to-terms map is asked
  # (O(terms of id)); else they are the terms of the record in ETS. Index
  # functions are meant to be pure: one that raises on a record it accepted
  # before costs a scan of every term.
  defp old_terms(t, id) do
    case :ets.lookup(t.rows, id) do
      [] -> []
      [_] when t.store != nil -> Index.terms_of(t.index, id)
      [{_, old}] -> old_record_terms(t, old, id)
    end
  end

  defp old_record_terms(t, old, id) do
    Records.terms(t, old)
  catch
    _, _ -> Index.terms_of(t.index, id)
  end

  defp direct?(key), do: is_integer(key) and key >= 0 and key < @direct_limit

  defp id_of(_t, key) when is_integer(key) and key >= 0 and key < @direct_limit, do: key

  defp id_of(t, key) do
    case :ets.lookup(t.keys, key) do
      [{_, id}] -> id
      [] -> nil
    end
  end

  # A new key takes a freed id first, so ids stay below the live count plus
  # the ids freed and not yet taken.
  defp id_for(state, key, keys, next, free) do
    case id_of(state.table, key) do
      nil ->
        case free do
          [id | free] ->
            {id, [{key, id} | keys], next, free}

          [] when next > @max_id ->
            raise ArgumentError,
                  "Larder.Table is out of row ids: #{@max_id - @direct_limit + 1} " <>
                    "records with non-integer keys are live"

          [] ->
            {next, [{key, next} | keys], next + 1, free}
        end

      id ->
        {id, keys, next, free}
    end
  end
end
