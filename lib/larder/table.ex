defmodule Larder.Table do
  @moduledoc """
  Map records keyed by a primary key, stored in ETS, with declared secondary
  indexes held as Roaring bitmaps by `Larder.Index` (a Rust NIF).

      iex> table = Larder.Table.new(key: :id, index: [:color, {:tag, & &1.tags}])
      iex> :ok = Larder.Table.insert_many(table, [
      ...>   %{id: 1, color: :red, tags: [:new, :sale]},
      ...>   %{id: 2, color: :blue, tags: [:sale]},
      ...>   %{id: 3, color: :red, tags: []}
      ...> ])
      iex> Larder.Table.search(table, color: :red, tag: :sale)
      [%{id: 1, color: :red, tags: [:new, :sale]}]
      iex> Larder.Table.search_ids(table, tag: :sale, color: {:in, [:red, :blue]})
      [1, 2]
      iex> Larder.Table.count(table, %{color: :red})
      2

  ## Indexes

  Each entry of `:index` is a field name (the record's value for that field
  is its term; a record without the field is not in that index) or
  `{name, fun}`, where `fun` gets the record and returns its term, or a list
  of terms for a multi-valued index. A condition `{name, value}` holds when
  the record's term for `name` (one of them, for a multi-valued index) is
  `===` to `value`; `{name, {:in, values}}` holds when one of `values` does.
  A list of conditions may name the same multi-valued index several times:
  `[char: {"Term", "18"}, char: {"Router", "Included"}]`.

  ## Storage

  Each record is one ETS row under a `u32` row id, which is the key itself for
  integer keys in `0..2_147_483_647` and an id assigned on first insert (kept
  in a second ETS table) for any other key. With `store: fields`, only those
  fields (and the key) are kept in ETS; the others live only in the indexes,
  as in the Go bitmap service this is modelled on. `get/3` and `search/2`
  then return the stored fields.

  ## Complexity

  `get/3` is one ETS lookup. `search/2` is one bitmap query
  (see `Larder.Index`, smallest bitmap first) plus one ETS lookup per
  result. `insert/2` and `delete/2` update one bitmap per index term of the
  record; with `:store`, finding the old terms of a replaced or deleted record
  checks every term of the index (O(terms)), because the record in ETS no
  longer holds them. `size/1` is O(1); `count/2` is a bitmap count.

  ## Concurrency

  Reads (`get/3`, `search/2`, `count/2`, `stream/1`) never take a lock and
  run in the caller. Writes take a per-table writer lock, so writes from
  several processes are serialized and each record's change is whole: the
  ETS row and all its index terms. Within a write the ETS row is written
  before the index gains its terms, and the index loses them before the row
  is deleted. A search that runs during a write sees the index either before
  or after that write (never half of it) and returns each record as ETS holds
  it when looked up, so it can return a record in its new version or skip one
  deleted meanwhile. `insert_many/2` is atomic per chunk of 5,000 records, not
  as a whole. Once writers are done, a search returns exactly what a plain
  filter over the records returns (checked by a PropEr model test).

  The ETS tables belong to the process that called `new/1` and go away when it
  exits, like any ETS table.

  ## Failures

  Raises `ArgumentError` for a condition on a field that has no index (the
  message lists the indexed ones), a record without the key field, bad
  options, and a table that was dropped or whose owner exited ("unknown
  Larder.Table"). An index function that raises makes the write raise: the
  chunk it was in is not written (earlier chunks of an `insert_many/2` are).

  ## Performance

  From one full run of `mix run bench/index_bench.exs` on the 487,200-price
  catalogue (100 reference requests, every answer checked against a plain
  filter), on a 2-core machine shared with other work; the bench prints each
  figure as a ratio to the Go-style map index (offering -> its prices,
  scanned) measured in the same run:

  | | map index | `store: [:idx, :spec, :value, :currency]` | full records |
  |---|---|---|---|
  | search, median per request | 1.23 ms | 5.47 us | 5.99 us |
  | `search_many/2`, per search of 1,000 | 1.33 ms | 4.32 us (232k/s) | 4.56 us |
  | memory (ETS words x 8 + NIF bytes; map: process heap) | 59.4 MB | 101 MB | 508 MB |
  | `insert_many/2` of records already in memory | 83.6 ms | 1.64 s | 2.06 s |

  Targets: search median <= 5 us (missed; another full run of the same code
  gave 5.06 us), `search_many` >= 300k searches/s (missed), memory with
  `:store` <= 127 MB (met), build <= 2 s (met with `:store`, missed with full
  records). About 2 us of a search is the bitmap intersection itself; the
  harness's full GC of its catalogue-sized heap before each run leaves the
  caches cold, which a loop that repeats the same 100 searches does not
  (3.9 us there). An ETS match-spec `select` over the same records takes
  155 ms per search.
  """

  alias Larder.Index
  alias Larder.Table.Lock

  @enforce_keys [:rows, :keys, :meta, :index, :key, :entries, :names, :store, :counter]
  defstruct @enforce_keys

  @opaque t :: %__MODULE__{}

  @typedoc "A record: a map that holds the table's key field."
  @type record :: map()

  @typedoc "`{index_name, value}` or `{index_name, {:in, [value]}}`."
  @type condition :: {term(), term()}

  @typedoc "Conditions that must all hold: a map or a list of pairs."
  @type conditions :: %{optional(term()) => term()} | [condition()]

  @direct_limit 0x80000000
  @max_id 0xFFFFFFFF
  @chunk 5_000
  @reserved [:and, :or, :not, :term]

  @doc """
  Creates a table owned by the calling process.

  Options:

    * `:key` (required) - the field that holds each record's primary key.
    * `:index` - the indexes, a list of field names and `{name, fun}`
      entries (see "Indexes"). Default `[]`.
    * `:store` - the fields kept in ETS; the key is always kept. Default: all.
  """
  @spec new(keyword()) :: t()
  def new(opts) do
    opts = validate_opts!(opts)
    entries = Enum.map(opts[:index], &entry!/1)

    %__MODULE__{
      rows: :ets.new(__MODULE__, [:set, :public, read_concurrency: true]),
      keys: :ets.new(__MODULE__.Keys, [:set, :public, read_concurrency: true]),
      meta: :ets.new(__MODULE__.Meta, [:set, :public]),
      index: Index.new(),
      key: opts[:key],
      entries: entries,
      names: Map.new(entries, fn {name, _} -> {name, true} end),
      store: opts[:store] && Enum.uniq([opts[:key] | opts[:store]]),
      counter: :atomics.new(1, signed: false)
    }
  end

  @doc """
  Inserts `record`, replacing the record with the same key (and re-indexing
  it). Atomic for readers, see "Concurrency".
  """
  @spec insert(t(), record()) :: :ok
  def insert(table, record), do: insert_many(table, [record])

  @doc """
  Inserts `records` in chunks of 5,000; each chunk is one write (one ETS
  insert and one index batch). Every record is checked for the key field
  before anything is written.
  """
  @spec insert_many(t(), [record()]) :: :ok
  def insert_many(%__MODULE__{} = table, records) when is_list(records) do
    Enum.each(records, &key!(table, &1))

    records
    |> Stream.chunk_every(@chunk)
    |> Enum.each(fn chunk ->
      guard(table, fn -> Lock.with_lock(table.meta, fn -> insert_chunk(table, chunk) end) end)
    end)
  end

  def insert_many(table, records) do
    check!(table)
    raise ArgumentError, "records must be a list of maps, got: #{inspect(records, limit: 5)}"
  end

  defp insert_chunk(table, chunk) do
    {rows, ops} =
      table
      |> last_per_key(chunk)
      |> Enum.reduce({[], []}, fn record, {rows, ops} ->
        id = row_id!(table, Map.fetch!(record, table.key))
        new_terms = record_terms(table, record)

        ops =
          case old_terms(table, id) do
            [] ->
              [{:add_terms, new_terms, id} | ops]

            old ->
              {old, new_terms} = {Enum.uniq(old), Enum.uniq(new_terms)}
              [{:add_terms, new_terms -- old, id}, {:remove_terms, old -- new_terms, id} | ops]
          end

        {[{id, stored(table, record)} | rows], ops}
      end)

    :ets.insert(table.rows, rows)
    Index.batch(table.index, :lists.reverse(ops))
  end

  # Within one chunk the ETS rows are written together, so a key given twice
  # must be reduced to its last record first.
  defp last_per_key(table, chunk) do
    by_key = Map.new(chunk, &{Map.fetch!(&1, table.key), &1})
    if map_size(by_key) == length(chunk), do: chunk, else: Map.values(by_key)
  end

  @doc """
  Merges `changes` into the record under `key` and re-indexes only the
  indexes whose terms changed. Returns `{:ok, record}` (the stored record
  after the merge) or `:error` when there is no such record.

  With `:store`, the fields an index function reads may not be stored, so
  `update/3` re-indexes field indexes only and leaves `{name, fun}` indexes
  as they are; replace the whole record with `insert/2` to change those.

      iex> table = Larder.Table.new(key: :id, index: [:state])
      iex> :ok = Larder.Table.insert(table, %{id: 7, state: :new, n: 1})
      iex> Larder.Table.update(table, 7, %{state: :done})
      {:ok, %{id: 7, state: :done, n: 1}}
      iex> Larder.Table.search_ids(table, state: :done)
      [7]
      iex> Larder.Table.update(table, 8, %{state: :done})
      :error
  """
  @spec update(t(), term(), map()) :: {:ok, record()} | :error
  def update(table, key, changes) when is_map(changes) do
    check!(table)

    if Map.has_key?(changes, table.key) and Map.fetch!(changes, table.key) !== key do
      raise ArgumentError, "changes must not change the key field #{inspect(table.key)}"
    end

    guard(table, fn ->
      Lock.with_lock(table.meta, fn -> update_locked(table, key, changes) end)
    end)
  end

  def update(table, _key, changes) do
    check!(table)
    raise ArgumentError, "changes must be a map, got: #{inspect(changes)}"
  end

  defp update_locked(table, key, changes) do
    with id when id != nil <- row_id(table, key),
         [{^id, old}] <- :ets.lookup(table.rows, id) do
      new = Map.merge(old, changes)
      old_terms = if table.store, do: Index.terms_of(table.index, id), else: nil

      ops =
        Enum.flat_map(table.entries, fn {name, how} = entry ->
          if field_untouched?(how, changes) or
               (table.store != nil and not match?({:field, _}, how)) do
            []
          else
            before =
              if old_terms,
                do: for({^name, _} = term <- old_terms, do: term),
                else: entry_terms(entry, old)

            before = Enum.uniq(before)
            now = Enum.uniq(entry_terms(entry, new))

            for(t <- before -- now, do: {:remove, t, id}) ++
              for(t <- now -- before, do: {:add, t, id})
          end
        end)

      stored = stored(table, new)
      # Same order as insert: a new term never points at the old row.
      removes = for {:remove, _, _} = op <- ops, do: op
      adds = for {:add, _, _} = op <- ops, do: op
      Index.batch(table.index, removes)
      :ets.insert(table.rows, {id, stored})
      Index.batch(table.index, adds)
      {:ok, stored}
    else
      _ -> :error
    end
  end

  defp field_untouched?({:field, field}, changes), do: not Map.has_key?(changes, field)
  defp field_untouched?(_fun, _changes), do: false

  @doc """
  Deletes the record under `key`, if any. Atomic for readers.
  """
  @spec delete(t(), term()) :: :ok
  def delete(table, key) do
    check!(table)

    guard(table, fn ->
      Lock.with_lock(table.meta, fn ->
        with id when id != nil <- row_id(table, key) do
          Index.batch(table.index, [{:remove_terms, old_terms(table, id), id}])
          :ets.delete(table.rows, id)
          unless direct?(key), do: :ets.delete(table.keys, key)
        end

        :ok
      end)
    end)
  end

  @doc """
  The record under `key`, or `default`.
  """
  @spec get(t(), term(), term()) :: record() | term()
  def get(table, key, default \\ nil) do
    check!(table)

    guard(table, fn ->
      with id when id != nil <- row_id(table, key),
           [{_, record}] <- :ets.lookup(table.rows, id) do
        record
      else
        _ -> default
      end
    end)
  end

  @doc """
  The records for which every condition holds, in row id order (key order for
  integer keys). Empty conditions match every record.
  """
  @spec search(t(), conditions()) :: [record()]
  def search(table, conditions) do
    expr = expr!(table, conditions)
    guard(table, fn -> fetch_rows(table, Index.query(table.index, expr), conditions) end)
  end

  @doc """
  The keys of the records for which every condition holds, in row id order.
  """
  @spec search_ids(t(), conditions()) :: [term()]
  def search_ids(table, conditions) do
    expr = expr!(table, conditions)

    guard(table, fn ->
      ids = Index.query(table.index, expr)

      cond do
        empty?(conditions) -> Enum.map(all_rows(table), &Map.fetch!(&1, table.key))
        Enum.all?(ids, &(&1 < @direct_limit)) -> live!(table) && ids
        true -> table |> fetch_rows(ids, conditions) |> Enum.map(&Map.fetch!(&1, table.key))
      end
    end)
  end

  @doc """
  How many records every condition holds for, without fetching them.
  """
  @spec count(t(), conditions()) :: non_neg_integer()
  def count(table, conditions) do
    expr = expr!(table, conditions)

    guard(table, fn ->
      if empty?(conditions), do: size(table), else: live!(table) && Index.count(table.index, expr)
    end)
  end

  @doc """
  Answers many searches in one index call (one read lock, one scheduler hop),
  in order.

      iex> table = Larder.Table.new(key: :id, index: [:n])
      iex> :ok = Larder.Table.insert_many(table, for(i <- 1..4, do: %{id: i, n: rem(i, 2)}))
      iex> Larder.Table.search_many(table, [[n: 0], [n: 1], [n: 2]])
      [[%{id: 2, n: 0}, %{id: 4, n: 0}], [%{id: 1, n: 1}, %{id: 3, n: 1}], []]
  """
  @spec search_many(t(), [conditions()]) :: [[record()]]
  def search_many(table, many) when is_list(many) do
    exprs = Enum.map(many, &expr!(table, &1))

    guard(table, fn ->
      table.index
      |> Index.query_many(exprs)
      |> Enum.zip_with(many, &fetch_rows(table, &1, &2))
    end)
  end

  def search_many(table, many) do
    check!(table)
    raise ArgumentError, "searches must be a list of conditions, got: #{inspect(many)}"
  end

  @doc """
  A stream of every record, read from ETS in chunks as it is consumed (not a
  snapshot: concurrent writes may or may not show).
  """
  @spec stream(t()) :: Enumerable.t()
  def stream(table) do
    check!(table)
    match = [{{:_, :"$1"}, [], [:"$1"]}]

    Stream.resource(
      fn -> guard(table, fn -> :ets.select(table.rows, match, 500) end) end,
      fn
        :"$end_of_table" -> {:halt, nil}
        {records, cont} -> {records, guard(table, fn -> :ets.select(cont) end)}
      end,
      fn _ -> :ok end
    )
  end

  @doc "The number of records. O(1)."
  @spec size(t()) :: non_neg_integer()
  def size(table) do
    check!(table)

    case :ets.info(table.rows, :size) do
      :undefined ->
        raise ArgumentError,
              "unknown Larder.Table: it was dropped or the process that created it exited"

      size ->
        size
    end
  end

  @doc """
  Bytes the table holds: its ETS tables (words times the word size) plus the
  index's bytes in the NIF (`Larder.Index.memory/1`).
  """
  @spec memory(t()) :: non_neg_integer()
  def memory(table) do
    guard(table, fn ->
      live!(table)

      words =
        Enum.sum(for tab <- [table.rows, table.keys, table.meta], do: :ets.info(tab, :memory))

      words * :erlang.system_info(:wordsize) + Index.memory(table.index)
    end)
  end

  @doc """
  Deletes the table's ETS tables; the handle is unusable afterwards (every
  call raises `ArgumentError`).
  """
  @spec drop(t()) :: :ok
  def drop(table) do
    guard(table, fn ->
      for tab <- [table.rows, table.keys, table.meta], do: :ets.delete(tab)
      :ok
    end)
  end

  ## Terms and conditions

  defp record_terms(table, record) do
    Enum.flat_map(table.entries, &entry_terms(&1, record))
  end

  defp entry_terms({name, {:field, field}}, record) do
    case record do
      %{^field => value} -> [{name, value}]
      _ -> []
    end
  end

  defp entry_terms({name, fun}, record) do
    case fun.(record) do
      # Duplicates are harmless to an add; diffs (replace, update) dedupe first.
      values when is_list(values) -> Enum.map(values, &{name, &1})
      value -> [{name, value}]
    end
  end

  defp old_terms(table, id) do
    case :ets.lookup(table.rows, id) do
      [] -> []
      [_] when table.store != nil -> Index.terms_of(table.index, id)
      [{_, old}] -> record_terms(table, old)
    end
  end

  defp stored(%{store: nil}, record), do: record
  defp stored(%{store: fields}, record), do: Map.take(record, fields)

  defp empty?(conditions), do: conditions == [] or conditions == %{}

  defp expr!(%__MODULE__{} = table, conditions) when is_map(conditions),
    do: expr!(table, Map.to_list(conditions))

  defp expr!(%__MODULE__{} = table, conditions) when is_list(conditions),
    do: {:and, conditions!(table, conditions, conditions)}

  defp expr!(table, conditions) do
    check!(table)

    raise ArgumentError,
          "conditions must be a map or a list of {index, value} pairs, got: #{inspect(conditions)}"
  end

  # A direct recursion rather than Enum.map with a closure: this runs once per
  # condition of every search.
  defp conditions!(table, [{name, {:in, values}} | rest], all) when is_list(values) do
    indexed!(table, name)
    [{:or, for(v <- values, do: {name, v})} | conditions!(table, rest, all)]
  end

  defp conditions!(table, [{name, _value} = condition | rest], all) do
    indexed!(table, name)
    [condition | conditions!(table, rest, all)]
  end

  defp conditions!(_table, [], _all), do: []

  defp conditions!(_table, [other | _], _all) do
    raise ArgumentError, "each condition must be {index, value}, got: #{inspect(other)}"
  end

  defp conditions!(_table, _improper, all) do
    raise ArgumentError,
          "conditions must be a map or a list of {index, value} pairs, got: #{inspect(all)}"
  end

  defp indexed!(%{names: names}, name) when is_map_key(names, name), do: :ok

  defp indexed!(table, name) do
    raise ArgumentError,
          "no index named #{inspect(name)} in conditions; indexed fields: " <>
            inspect(Enum.map(table.entries, &elem(&1, 0)))
  end

  defp fetch_rows(table, [], conditions) do
    live!(table)
    if empty?(conditions), do: all_rows(table), else: []
  end

  defp fetch_rows(table, ids, conditions) do
    if empty?(conditions) do
      all_rows(table)
    else
      lookup_rows(table.rows, ids)
    end
  end

  # A row deleted since the index answered is skipped (see "Concurrency").
  defp lookup_rows(rows, [id | ids]) do
    case :ets.lookup(rows, id) do
      [{_, record}] -> [record | lookup_rows(rows, ids)]
      [] -> lookup_rows(rows, ids)
    end
  end

  defp lookup_rows(_rows, []), do: []

  defp all_rows(table) do
    table.rows
    |> :ets.select([{{:"$1", :"$2"}, [], [{{:"$1", :"$2"}}]}])
    |> Enum.sort()
    |> Enum.map(&elem(&1, 1))
  end

  ## Row ids

  defp direct?(key), do: is_integer(key) and key >= 0 and key < @direct_limit

  defp row_id(_table, key) when is_integer(key) and key >= 0 and key < @direct_limit, do: key

  defp row_id(table, key) do
    case :ets.lookup(table.keys, key) do
      [{_, id}] -> id
      [] -> nil
    end
  end

  # Called under the writer lock, so allocating an id cannot race.
  defp row_id!(table, key) do
    case row_id(table, key) do
      nil ->
        id = @direct_limit + :atomics.add_get(table.counter, 1, 1) - 1
        if id > @max_id, do: raise(ArgumentError, "table is out of row ids for non-integer keys")
        :ets.insert(table.keys, {key, id})
        id

      id ->
        id
    end
  end

  defp key!(table, record) when is_map(record) do
    unless Map.has_key?(record, table.key) do
      raise ArgumentError,
            "record must have the key field #{inspect(table.key)}, got: #{inspect(record, limit: 10)}"
    end
  end

  defp key!(_table, record),
    do: raise(ArgumentError, "record must be a map, got: #{inspect(record, limit: 10)}")

  ## Handles and options

  # Answers that do not touch ETS still check that the table exists.
  defp live!(table) do
    case :ets.info(table.rows, :size) do
      :undefined -> raise ArgumentError, "unknown Larder.Table"
      _ -> true
    end
  end

  defp check!(%__MODULE__{}), do: :ok

  defp check!(other),
    do:
      raise(
        ArgumentError,
        "table must be a Larder.Table (from Larder.Table.new/1), got: #{inspect(other)}"
      )

  # Runs an ETS access; a table that was dropped (or whose owner exited) turns
  # ETS's bare badarg into a message that says so.
  defp guard(%__MODULE__{} = table, fun) do
    fun.()
  rescue
    error in ArgumentError ->
      if :ets.info(table.rows, :id) == :undefined or :ets.info(table.meta, :id) == :undefined do
        raise ArgumentError,
              "unknown Larder.Table: it was dropped or the process that created it exited"
      else
        reraise error, __STACKTRACE__
      end
  end

  defp guard(other, _fun), do: check!(other)

  defp entry!(field) when is_atom(field) and field not in @reserved, do: {field, {:field, field}}

  defp entry!({name, fun} = entry) when is_function(fun, 1) do
    if name in @reserved, do: reserved!(name)
    entry
  end

  defp entry!(field) when field in @reserved, do: reserved!(field)

  defp entry!(other) do
    raise ArgumentError,
          "each :index entry must be a field name (atom) or {name, fun/1}, got: #{inspect(other)}"
  end

  defp reserved!(name),
    do:
      raise(
        ArgumentError,
        "index name #{inspect(name)} is reserved (#{inspect(@reserved)} are query operators)"
      )

  defp validate_opts!(opts) do
    valid = [:key, :index, :store]
    Larder.Options.check_keys!(opts, valid, "Larder.Table")

    unless Keyword.has_key?(opts, :key), do: raise(ArgumentError, "option :key is required")

    index = Keyword.get(opts, :index, [])
    store = Keyword.get(opts, :store)

    unless is_list(index),
      do: raise(ArgumentError, ":index must be a list, got: #{inspect(index)}")

    unless store == nil or is_list(store),
      do: raise(ArgumentError, ":store must be a list of fields, got: #{inspect(store)}")

    [key: opts[:key], index: index, store: store]
  end
end
