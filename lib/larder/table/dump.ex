# A dump of a Larder.Table that its writer does not wait for: the writer
# takes a cut (the index forked, its id state, two tables for what it
# changes from then on) in O(1), and a process of its own writes the file
# of the table as it was at the cut while the writer goes on writing.
defmodule Larder.Table.Dump do
  @moduledoc false

  # The cut is consistent because the writer applies every write whole, one
  # at a time (and a claimed chunk ends before the writer takes the next
  # request): at the moment it takes the cut no write is half done.
  #
  #   * The index is forked (Larder.Native.index_fork/1): the fork holds
  #     the index's immutable snapshot of that moment, which later writes
  #     do not change (they copy what they change), and the dump exports it.
  #   * `next` and `free` (the ids of non-integer keys) are copied.
  #   * `top` is the writer's then: every row of an integer key below 2^31
  #     has a lower id. A row whose id is in top..2^31-1 was made after the
  #     cut (a build's claimed chunk writes such rows straight into ETS): the
  #     dump skips those, and the writer saves nothing for them.
  #   * For every other row, and every key of the keys table, the writer
  #     saves the object as it was at the cut before it first changes it
  #     while the dump runs (save_rows/3, save_keys/3): `{id, []}` for a
  #     row that did not exist, `{id, [row]}` for one that did; the first
  #     save of an id is the one kept.
  #
  # The dump process walks the live ETS tables (fixed, in chunks); for each
  # object it has read it then looks its key up among the saved. Found: the
  # saved object is written (or nothing, for `[]`), once. Not found: the
  # object had not changed when it was read, since the writer saves before
  # it changes, so the object read is the cut's. At the end it writes the
  # saved objects the walk wrote nothing for (rows deleted before it got
  # there). The walk keeps the keys it wrote (a private ETS set: a key
  # per object of the table, for the length of the dump) so that no object
  # is written twice.
  # What a write costs while a dump runs: one lookup and one insert per row
  # and key it changes, the first time only.
  #
  # The file is Larder.Table.Snapshot's format, written by its dump/5 from
  # what this module reads; the dump process is linked to the writer (it
  # dies with a killed writer; a writer stopped normally deletes the ETS
  # tables, and the walk then fails and ends) and monitored by it, which
  # sends the result to the process that asked, as {Larder.Table.Dump,
  # ref, result}, once the file is renamed and synced.

  alias Larder.Native
  alias Larder.Table.Snapshot

  @direct_limit 0x80000000
  # Objects per chunk, and per pause (see pause/0): 4,096 left the replica
  # lag bench's p99 at 29-35 ms, 1,024 made a dump of 487,200 rows too slow
  # for a snapshot every 3 s (bench/replica_bench.exs snapshots).
  @chunk 2_048

  @enforce_keys [:ref, :pid, :monitor, :notify, :rows, :keys, :top]
  defstruct @enforce_keys

  @type t :: %__MODULE__{
          ref: reference(),
          pid: pid(),
          monitor: reference(),
          notify: pid(),
          rows: :ets.tid(),
          keys: :ets.tid(),
          top: non_neg_integer()
        }

  @doc """
  Takes the cut of the writer's `state` (its table, `next`, `free`, `top`)
  and starts the process that writes it to `path`. `notify` gets
  `{Larder.Table.Dump, ref, result}` when it ends. Runs in the writer.
  """
  @spec start(map(), Path.t(), pid()) :: t()
  def start(state, path, notify) do
    table = state.table
    fork = Native.index_fork(table.index.ref)

    unless is_reference(fork) do
      raise ArgumentError, "unknown Larder.Table: its index is gone"
    end

    rows = :ets.new(__MODULE__.Rows, [:set, :protected])
    keys = :ets.new(__MODULE__.Keys, [:set, :protected])
    cut = %{next: state.next, free: state.free, top: state.top, rows: rows, keys: keys}
    ref = make_ref()
    writer = self()

    {pid, monitor} =
      Process.spawn(
        fn ->
          # Background work: the writer, and whoever writes through it, come
          # first (low is run less often than normal, never starved).
          Process.flag(:priority, :low)

          result =
            try do
              Snapshot.dump(table, cut, fork, path, &walk/4)
            catch
              kind, reason -> {:raise, kind, reason, __STACKTRACE__}
            after
              Native.index_drop(fork)
            end

          send(writer, {__MODULE__, ref, result})
        end,
        [:link, :monitor]
      )

    %__MODULE__{
      ref: ref,
      pid: pid,
      monitor: monitor,
      notify: notify,
      rows: rows,
      keys: keys,
      top: state.top
    }
  end

  @doc """
  Asks the writer of `table` for a dump to `path` whose result goes to
  `notify`: `{:ok, ref}` once the cut is taken (see `await/2`), or `:gone`
  when the table is. Not from a process a writer runs a function in.
  """
  @spec request(Larder.Table.t(), Path.t(), pid()) :: {:ok, reference()} | :gone
  def request(table, path, notify) do
    case GenServer.call(table.writer, {:dump, path, notify}, :infinity) do
      {:ok, ref} -> {:ok, ref}
      {:raise, kind, reason, stack} -> :erlang.raise(kind, reason, stack)
    end
  catch
    :exit, _ -> :gone
  end

  @doc """
  Waits, in the process the result goes to, for the dump `ref` of the
  table whose writer is `writer`: `:ok`, `{:error, %Larder.Error{}}`,
  `{:raise, kind, reason, stack}` (the dump raised, or its process was
  killed), or `:gone` when the table went first.
  """
  @spec await(pid(), reference()) :: :ok | {:error, Larder.Error.t()} | tuple() | :gone
  def await(writer, ref) do
    monitor = Process.monitor(writer)

    receive do
      {__MODULE__, ^ref, result} ->
        Process.demonitor(monitor, [:flush])
        result

      {:DOWN, ^monitor, :process, _, _} ->
        receive do
          {__MODULE__, ^ref, result} -> result
        after
          0 -> :gone
        end
    end
  end

  @doc """
  Ends the dump `ref` of `dumps` with `result` (its own, or its process's
  exit): tells the process that asked and frees the saved objects. Returns
  the dumps left.
  """
  @spec finish([t()], reference(), term()) :: [t()]
  def finish(dumps, ref, result) do
    case Enum.split_with(dumps, &(&1.ref == ref)) do
      {[dump], rest} ->
        Process.demonitor(dump.monitor, [:flush])
        :ets.delete(dump.rows)
        :ets.delete(dump.keys)
        send(dump.notify, {__MODULE__, ref, result})
        rest

      {[], _} ->
        dumps
    end
  end

  @doc "The dump whose process is down (monitor `monitor`), if any."
  @spec down([t()], reference()) :: t() | nil
  def down(dumps, monitor), do: Enum.find(dumps, &(&1.monitor == monitor))

  @doc """
  Saves, for each dump running, the rows `ids` as they are before the
  writer changes them. Runs in the writer, before the change.
  """
  @spec save_rows([t()], :ets.tid(), [non_neg_integer()]) :: :ok
  def save_rows([], _tab, _ids), do: :ok

  def save_rows(dumps, tab, ids) do
    for dump <- dumps, id <- ids, id < dump.top or id >= @direct_limit do
      :ets.member(dump.rows, id) or :ets.insert(dump.rows, {id, :ets.lookup(tab, id)})
    end

    :ok
  end

  @doc "As `save_rows/3`, for keys of the keys table."
  @spec save_keys([t()], :ets.tid(), [term()]) :: :ok
  def save_keys([], _tab, _keys), do: :ok

  def save_keys(dumps, tab, keys) do
    for dump <- dumps, key <- keys do
      :ets.member(dump.keys, key) or :ets.insert(dump.keys, {key, :ets.lookup(tab, key)})
    end

    :ok
  end

  # Hands `write_chunk` the objects of `tab` at the cut, in chunks:
  # `which` is `:rows` or `:keys` (which of the cut's saved tables). Returns
  # `{:ok, count}` or the first error of `write_chunk`.
  #
  # Each object is written once: an object read before the writer saved it
  # (written as read) may be saved later, and one deleted and inserted again
  # during the walk may be met twice; so the walk keeps the keys it wrote as
  # read (`emitted`, a private ETS set) and the saved keys it wrote (`met`),
  # and the saved objects written at the end are those in neither.
  defp walk(tab, which, cut, write_chunk) do
    saved = Map.fetch!(cut, which)
    keep = if which == :rows, do: &(&1 < cut.top or &1 >= @direct_limit), else: fn _ -> true end
    emitted = :ets.new(__MODULE__.Emitted, [:set, :private])
    :ets.safe_fixtable(tab, true)

    try do
      walk = %{saved: saved, keep: keep, emitted: emitted, write_chunk: write_chunk}

      with {:ok, count, met} <-
             walk_chunks(:ets.select(tab, [{:_, [], [:"$_"]}], @chunk), walk, 0, %{}) do
        # The saved objects the walk did not write: deleted before it got there.
        rest =
          for {key, [object]} <- :ets.tab2list(saved),
              not is_map_key(met, key),
              not :ets.member(emitted, key),
              do: object

        write_all(rest, write_chunk, count)
      end
    after
      unfix(tab)
      :ets.delete(emitted)
    end
  end

  defp walk_chunks(:"$end_of_table", _walk, count, met), do: {:ok, count, met}

  defp walk_chunks({objects, cont}, walk, count, met) do
    {objects, read, met} = at_cut(objects, walk, [], [], met)
    :ets.insert(walk.emitted, read)

    case write_some(objects, walk.write_chunk) do
      :ok ->
        pause()
        walk_chunks(:ets.select(cont), walk, count + length(objects), met)

      error ->
        error
    end
  end

  # The objects as they were at the cut (read first, looked up among the
  # saved after), the keys of those written as read, and the saved keys met.
  defp at_cut([{key, _} = object | rest], walk, acc, read, met) do
    cond do
      not walk.keep.(key) ->
        at_cut(rest, walk, acc, read, met)

      is_map_key(met, key) ->
        at_cut(rest, walk, acc, read, met)

      true ->
        case :ets.lookup(walk.saved, key) do
          [] ->
            at_cut(rest, walk, [object | acc], [{key} | read], met)

          [{_, saved}] ->
            # Met before, read as it was then (before its save): written.
            written = :ets.member(walk.emitted, key) or List.keymember?(read, key, 0)
            acc = if written, do: acc, else: saved ++ acc
            at_cut(rest, walk, acc, read, Map.put(met, key, true))
        end
    end
  end

  defp at_cut([], _walk, acc, read, met), do: {:lists.reverse(acc), read, met}

  # Between two chunks the dump's scheduler is left idle for a moment, so
  # that it takes over runnable work from the other schedulers' queues
  # (while it runs a low-priority dump it steals none).
  defp pause do
    receive do
    after
      1 -> :ok
    end
  end

  defp write_some([], _write_chunk), do: :ok
  defp write_some(objects, write_chunk), do: write_chunk.(objects)

  defp write_all([], _write_chunk, count), do: {:ok, count}

  defp write_all(objects, write_chunk, count) do
    {now, rest} = Enum.split(objects, @chunk)

    case write_chunk.(now) do
      :ok -> write_all(rest, write_chunk, count + length(now))
      error -> error
    end
  end

  defp unfix(tab) do
    :ets.safe_fixtable(tab, false)
  rescue
    ArgumentError -> :ok
  end
end
