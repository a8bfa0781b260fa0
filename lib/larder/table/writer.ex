# The process behind each Larder.Table: it owns the table's ETS tables and
# index, hands out (and reuses) row ids, and applies every write whole, so a
# caller killed mid-write cannot leave half of one behind.
defmodule Larder.Table.Writer do
  @moduledoc false

  use GenServer

  alias Larder.Index
  alias Larder.Table
  alias Larder.Table.Records
  alias Larder.Table.Snapshot

  @direct_limit 0x80000000
  @max_id 0xFFFFFFFF

  # `max_id` is state rather than a constant so that a test can lower it.
  # Every id below `@direct_limit` that holds a row is below `top`.
  defstruct [:table, :owner, next: @direct_limit, free: [], max_id: @max_id, top: 0]

  @doc "Starts the writer of a table owned by `owner` (it stops when `owner` exits)."
  @spec start(map(), pid()) :: GenServer.on_start()
  def start(config, owner), do: GenServer.start(__MODULE__, {config, owner, nil})

  @doc """
  Starts the writer of a table owned by `owner`, filled from the snapshot
  at `path` (read here, so the file's bytes are this process's garbage, not
  the caller's); `{:error, {:shutdown, %Larder.Error{}}}` when the file is
  bad (the writer then stops, its tables with it).
  """
  @spec load(map(), pid(), Path.t()) :: GenServer.on_start()
  def load(config, owner, path), do: GenServer.start(__MODULE__, {config, owner, path})

  @doc "Starts the writer of a supervised table, linked to the caller."
  @spec start_link(map()) :: GenServer.on_start()
  def start_link(config), do: GenServer.start_link(__MODULE__, {config, nil, nil})

  @doc """
  Whether the calling process is a table's writer, that is, whether a write
  now would come from a function a writer runs (an `upsert/3` function or an
  index function). Such a write is refused: it could wait for ever on a
  writer that waits on this one.
  """
  @spec writer?() :: boolean()
  def writer?, do: Process.get(__MODULE__, false)

  @doc "The handle of the table `writer` owns."
  @spec handle(pid()) :: Table.t()
  def handle(writer), do: GenServer.call(writer, :handle, :infinity)

  @impl true
  def init({config, owner, path}) do
    # A snapshot is checked whole before any table is created.
    case path && Snapshot.read(path, config) do
      {:error, error} -> {:stop, {:shutdown, error}}
      {:ok, read} -> init(config, owner, {read, path})
      nil -> init(config, owner, nil)
    end
  end

  defp init(config, owner, snapshot) do
    Process.flag(:trap_exit, true)
    Process.put(__MODULE__, true)
    if owner, do: Process.monitor(owner)

    table = %Table{
      # Public so that a caller can insert a claimed chunk (see handle_call/3).
      rows: :ets.new(Table, [:set, :public, read_concurrency: true]),
      keys: :ets.new(Table.Keys, [:set, :protected, read_concurrency: true]),
      index: Index.new(reverse: config.store != nil),
      key: config.key,
      entries: config.entries,
      names: Map.new(config.entries, fn {name, _} -> {name, true} end),
      store: config.store,
      writer: self(),
      name: config.name,
      # :telemetry is looked for once, here, when the table starts.
      telemetry: Larder.Telemetry.enabled?(config.telemetry)
    }

    with {:ok, state} <- fill(%__MODULE__{table: table, owner: owner}, snapshot),
         :ok <- register(table) do
      {:ok, state}
    else
      {:error, error} -> {:stop, error}
    end
  end

  defp fill(state, nil), do: {:ok, state}

  defp fill(state, {read, path}) do
    case Snapshot.fill(state.table, read, path) do
      {:ok, {next, free, top}} ->
        # The file's bytes and the decoded chunks are garbage now.
        :erlang.garbage_collect()
        {:ok, %{state | next: next, free: free, top: top}}

      # A shutdown: a bad file is not a crash to report.
      {:error, error} ->
        {:error, {:shutdown, error}}
    end
  end

  # The name maps to the handle through :persistent_term; the global lock
  # makes check-and-put atomic between two tables started with one name.
  defp register(%Table{name: nil}), do: :ok

  defp register(%Table{name: name} = table) do
    :global.trans(
      {{Table, name}, self()},
      fn ->
        case :persistent_term.get({Table, name}, nil) do
          %Table{writer: pid} when pid != self() and is_pid(pid) ->
            if Process.alive?(pid),
              do:
                {:error, ArgumentError.exception("a Larder.Table named #{inspect(name)} exists")},
              else: put_name(table)

          _ ->
            put_name(table)
        end
      end,
      [node()]
    )
  end

  defp put_name(table) do
    :persistent_term.put({Table, table.name}, table)
    :ok
  end

  @impl true
  def handle_call(:handle, _from, state), do: {:reply, state.table, state}

  # A dump by the writer: no write runs during it, so the file is one
  # state of the table.
  def handle_call({:dump, path}, _from, state) do
    {:reply, Snapshot.dump(state.table, state.next, state.free, path), state}
  catch
    kind, reason -> {:reply, {:raise, kind, reason, __STACKTRACE__}, state}
  end

  def handle_call(:drop, _from, state) do
    release(state)
    {:stop, :normal, :ok, state}
  end

  # A claim for fresh rows (Table.insert_many/2): the caller inserts them
  # into ETS itself and then releases the claim; no other write runs in
  # between. Whether the rows are in ETS (one atomic insert, checked by its
  # lowest id) decides whether the write is completed or dropped, also when
  # the caller died holding the claim.
  def handle_call({:claim, {low, high}, ops, ids}, {caller, _} = from, state)
      when low >= state.top do
    ref = Process.monitor(caller)
    GenServer.reply(from, {:claimed, ref})

    release =
      receive do
        {:"$gen_call", release, {:release, ^ref}} ->
          Process.demonitor(ref, [:flush])
          release

        {:DOWN, ^ref, :process, _, _} ->
          nil
      end

    {reply, state} =
      if :ets.member(state.table.rows, low),
        do: apply_claimed(ops, ids, high, state),
        else: {:ok, state}

    if release, do: GenServer.reply(release, reply)
    {:noreply, state}
  end

  def handle_call({:claim, _span, _ops, _ids}, _from, state), do: {:reply, :stale, state}

  def handle_call(request, _from, state) do
    {reply, state} = apply_write(request, state)
    {:reply, reply, state}
  catch
    # Nothing has changed yet when a step raises (see apply_write/2): the
    # caller re-raises, the table is as it was.
    kind, reason -> {:reply, {:raise, kind, reason, __STACKTRACE__}, state}
  end

  @impl true
  def handle_info({:DOWN, _ref, :process, owner, _reason}, %{owner: owner} = state),
    do: {:stop, :normal, state}

  def handle_info(_other, state), do: {:noreply, state}

  @impl true
  def terminate(_reason, state), do: release(state)

  defp release(%{table: table}) do
    for tab <- [table.rows, table.keys], :ets.info(tab, :id) != :undefined, do: :ets.delete(tab)
    Index.drop(table.index)

    case table.name && :persistent_term.get({Table, table.name}, nil) do
      %Table{writer: writer} when writer == self() -> :persistent_term.erase({Table, table.name})
      _ -> :ok
    end

    :ok
  end

  ## Writes. Each computes everything first (ids, terms, ops), then changes
  ## the index in one batch (atomic, the only step that can still fail), then
  ## the ETS tables (which cannot fail), then the id state.

  # The rows of a claim are in ETS: index them, or take them out again when
  # the index refuses the ops.
  defp apply_claimed(ops, ids, high, state) do
    Index.batch(state.table.index, ops)
    {:ok, %{state | top: high + 1}}
  catch
    kind, reason ->
      for id <- ids, do: :ets.delete(state.table.rows, id)
      {{:raise, kind, reason, __STACKTRACE__}, state}
  end

  # `rows` and `ops` come ready from the caller (Records.write/2) for keys
  # that are row ids: when none of those ids holds a row (all are at or
  # above `top`, as in a build, or else checked one by one) the writer only
  # applies them. `keyed` records get their ids here.
  defp apply_write({:insert, rows, ops, keyed, span}, state) do
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
          {[{id, stored} | rows], keys, diff(old_terms(t, id), terms, id, ops), next, free}
      end)

    Index.batch(t.index, ops)
    :ets.insert(t.keys, keys)
    :ets.insert(t.rows, rows)
    {:ok, %{state | next: next, free: free, top: top}}
  end

  defp apply_write({:delete, key}, state) do
    t = state.table

    case id_of(t, key) do
      nil ->
        {:ok, state}

      id ->
        Index.batch(t.index, [{:remove_terms, old_terms(t, id), id}])
        :ets.delete(t.rows, id)

        if direct?(key) do
          {:ok, state}
        else
          :ets.delete(t.keys, key)
          {:ok, %{state | free: [id | state.free]}}
        end
    end
  end

  defp apply_write({:update, key, changes}, state) do
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
              Records.entry_terms(entry, new)

            {name, _} ->
              for {^name, _} = term <- before, do: term
          end)
        else
          Records.terms(t, new)
        end

      stored = Records.stored(t, new)
      Index.batch(t.index, diff(before, now, id, []))
      :ets.insert(t.rows, {id, stored})
      {{:ok, stored}, state}
    else
      _ -> {:error, state}
    end
  end

  defp apply_write({:upsert, key, fun}, state) do
    t = state.table

    current =
      with id when id != nil <- id_of(t, key),
           [{_, record}] <- :ets.lookup(t.rows, id) do
        record
      else
        _ -> nil
      end

    new = fun.(current)

    case new do
      %{} when is_map_key(new, t.key) and :erlang.map_get(t.key, new) === key ->
        {rows, ops, keyed, span} = Records.write(t, [new])
        {:ok, state} = apply_write({:insert, rows, ops, keyed, span}, state)
        {{:ok, Records.stored(t, new)}, state}

      _ ->
        raise ArgumentError,
              "the function given to upsert/3 must return a map whose key field " <>
                "#{inspect(t.key)} is #{inspect(key)}, got: #{inspect(new, limit: 10)}"
    end
  end

  # The ops of Records.write/2, with each id that holds a row taken out of
  # them and given a diff from its old terms instead.
  defp replace_ops(t, _rows, [{:add_terms, terms, id}] = ops),
    do: if(:ets.member(t.rows, id), do: diff(old_terms(t, id), terms, id, []), else: ops)

  defp replace_ops(t, rows, ops) do
    case for {id, _} <- rows, :ets.member(t.rows, id), into: %{}, do: {id, []} do
      replaced when replaced == %{} ->
        ops

      replaced ->
        {ops, now} =
          Enum.reduce(ops, {[], replaced}, fn {:add, term, ids}, {ops, now} ->
            {fresh, now} =
              Enum.reduce(id_list(ids), {[], now}, fn id, {fresh, now} ->
                case now do
                  %{^id => terms} -> {fresh, %{now | id => [term | terms]}}
                  _ -> {[id | fresh], now}
                end
              end)

            {[{:add, term, fresh} | ops], now}
          end)

        Enum.reduce(now, ops, fn {id, terms}, ops -> diff(old_terms(t, id), terms, id, ops) end)
    end
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

          [] when next > state.max_id ->
            raise ArgumentError,
                  "Larder.Table is out of row ids: #{state.max_id - @direct_limit + 1} " <>
                    "records with non-integer keys are live"

          [] ->
            {next, [{key, next} | keys], next + 1, free}
        end

      id ->
        {id, keys, next, free}
    end
  end
end
