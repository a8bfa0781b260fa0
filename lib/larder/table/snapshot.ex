# The snapshot file format of Larder.Table: its definition, its ETS rows and
# keys, and its index's postings (Roaring's portable bytes), in checksummed
# chunks; a process of the writer's dumps it (a consistent cut, see
# Larder.Table.Dump) and the writer fills a new table from it without
# re-indexing a record.
defmodule Larder.Table.Snapshot do
  @moduledoc false

  # File layout (integers big-endian):
  #
  #   "LARDERTAB" <<version::8>>
  #   chunk*      <<kind::8, size::32, count::32, crc32::32, payload::binary-size(size)>>
  #   trailer     <<0::8, rows::64, keys::64, terms::64>>
  #
  # Each `payload` is term_to_binary/1 (uncompressed) of a list of `count`
  # items, `crc32` covers it. The kinds, in this order:
  #
  #   1 definition (exactly one chunk, count 1):
  #     [{key_field, store, index_names, next, free}], where store is nil
  #     or the stored fields (key first), index_names the names of the
  #     :index entries in order, and next/free the writer's state of
  #     non-integer keys (the next fresh row id, the freed ids);
  #   2 rows: ETS objects {row_id, stored_record}; in version 2, with
  #     :store (at most 32 fields), a stored record that holds every
  #     stored field is written as {row_id, values}, `values` a tuple of
  #     its values in the term order of the store fields' names (see
  #     compact/2);
  #   3 keys: {key, row_id} for keys that are not their own row id;
  #   4 index: {term, postings}, postings being the NIF's
  #     <<chunks::32, (bytes::32, Roaring portable bitmap)*>>, one bitmap per
  #     64Ki-id chunk of the term's ids.
  #
  # The trailer counts the items of kinds 2, 3 and 4, so a file cut at a
  # chunk boundary is caught too. Nothing may follow it.
  #
  # A file is not trusted on load. The whole file is read and every chunk's
  # length, checksum, kind order and count (at most @max_chunk_count) are
  # checked against the bytes before anything is decoded or created. Each
  # payload is decoded with binary_to_term(payload, [:safe, :used]) (no
  # compressed term, no new atom, the term fills the payload) and must be a
  # proper list of `count` items of its kind's shape; the definition must
  # equal the one load/2 is given; rows must hold the key field (a row id
  # below 2^31 is the record's key), keys must point at rows whose record has
  # that key, and the free ids must be distinct, unused and below `next`.
  # The index bytes are checked by the NIF (Roaring's checked
  # deserialisation, chunk ranges, distinct terms), and its ids are cut
  # down to the rows: checksums catch damage, not forgery, and a few bytes
  # of run container name 65,536 ids. fill/3 hands the NIF the row ids of
  # the file (one binary of 32-bit ids per rows chunk, read from the
  # chunk's bytes by the NIF and checked against its decoded rows, see
  # scan_ids/1); every chunk of
  # every posting is ANDed with the rows of its 64Ki range before it is
  # kept, at a cost of its bytes (and a constant), so a posting names at
  # most as many ids as there are rows and a search finds only rows. The
  # ids that are not rows are dropped and counted, and import/4 logs one
  # warning with their count: a forged file names them, and so does a
  # genuine dump of a table whose impure index function left a deleted
  # record's id under a stale term, which must still load. Bounded too, by
  # 256 a row plus 8 a byte of postings, at least 2^24 (snapshot.rs,
  # max_pairs): the ids built anew from run containers cut down to the rows
  # (a run of a few bytes can become 8 KB of array), and, with an
  # id-to-terms map (`store:`), the (id, term) pairs.
  #
  # Writing is Larder.SnapshotFile's: a temporary file, fsync, rename, and
  # the sweep of killed dumps' temporary files.

  require Logger

  alias Larder.Native
  alias Larder.Table

  @magic "LARDERTAB"
  # Version 2 writes a stored record as its values (rows, above); version
  # 1 files are read as ever.
  @version 2
  @versions [1, 2]
  # The most stored fields whose records are written as values (a flatmap's).
  @max_compact 32
  # The most rows of a chunk expanded on a normal scheduler (0.1-0.25 us
  # each, so well under a millisecond): a dump's chunk of rows (Dump's
  # walk), not a forged larger one.
  @normal_expand 2_048
  # The largest payload whose row ids are scanned on a normal scheduler
  # (a few hundred us).
  @normal_scan 262_144
  @chunk 4_096
  @max_chunk_count 65_536
  @direct_limit 0x80000000
  @max_id 0xFFFFFFFF

  @definition 1
  @rows 2
  @keys 3
  @index 4

  @doc """
  Writes `table` as it was at the writer's cut `cut` (see
  Larder.Table.Dump) to `path`: `next` and `free` are the writer's id state
  then, `index` the fork of its index, and `walk.(tab, :rows | :keys, cut,
  write_chunk)` hands `write_chunk` the objects of the ETS table `tab` at
  the cut, in lists, and returns `{:ok, count}` or the error of a write.
  """
  @spec dump(Table.t(), map(), reference(), Path.t(), function()) ::
          :ok | {:error, Larder.Error.t()}
  def dump(table, cut, index, path, walk) do
    names = Enum.map(table.entries, &elem(&1, 0))
    fields = value_fields(table)

    Larder.SnapshotFile.write(path, "Larder.Table.dump/2", fn write ->
      definition = [{table.key, table.store, names, cut.next, cut.free}]

      with :ok <- write.([@magic, @version]),
           :ok <- write.(chunk(@definition, definition)),
           {:ok, rows} <-
             walk.(table.rows, :rows, cut, &write.(chunk(@rows, compact(&1, fields)))),
           {:ok, keys} <- walk.(table.keys, :keys, cut, &write.(chunk(@keys, &1))),
           {:ok, count} <- write_list(write, @index, Native.index_export(index), 0) do
        write.(<<0, rows::64, keys::64, count::64>>)
      end
    end)
  end

  # The stored fields whose values a version 2 file writes instead of the
  # record (with :store, at most @max_compact of them), in term order, the
  # order a map keeps its keys in, so the NIF builds each map without
  # sorting them; nil when records are written whole.
  defp value_fields(%{store: fields}) when is_list(fields) and length(fields) <= @max_compact,
    do: Enum.sort(fields)

  defp value_fields(_table), do: nil

  # Each stored record that holds every one of `fields` becomes {id,
  # values}: load/2 decodes values about five times faster than maps
  # (binary_to_term/2 with :safe), and builds the maps in the NIF with the
  # keys it knows (Native.table_rows_expand/2).
  defp compact(items, nil), do: items

  defp compact(items, fields) do
    n = length(fields)

    for {id, stored} = item <- items do
      case map_size(stored) == n and values(fields, stored, []) do
        values when is_list(values) -> {id, List.to_tuple(values)}
        _ -> item
      end
    end
  end

  # The values of `fields` in `stored`, or false when one is missing (a
  # record of a file forged with other keys, loaded as it was).
  defp values([field | rest], stored, acc) do
    case stored do
      %{^field => value} -> values(rest, stored, [value | acc])
      _ -> false
    end
  end

  defp values([], _stored, acc), do: :lists.reverse(acc)

  defp chunk(kind, items) do
    payload = :erlang.term_to_binary(items)
    [<<kind, byte_size(payload)::32, length(items)::32, :erlang.crc32(payload)::32>>, payload]
  end

  defp write_list(_write, _kind, [], total), do: {:ok, total}

  defp write_list(write, kind, items, total) do
    {now, rest} = Enum.split(items, @chunk)

    case write.(chunk(kind, now)) do
      :ok -> write_list(write, kind, rest, total + length(now))
      error -> error
    end
  end

  @doc """
  Reads and checks the framing of the snapshot at `path` and its
  definition against `config` (the validated options of `load/2`).
  Returns what `fill/3` needs, and the file's size in `:bytes`; nothing is
  created.
  """
  @spec read(Path.t(), map()) :: {:ok, map()} | {:error, Larder.Error.t()}
  def read(path, config) do
    with {:ok, data} <- Larder.SnapshotFile.read(path),
         {:ok, chunks} <- parse(data, path),
         {:ok, definition} <- definition(chunks, config, path) do
      <<_magic::binary-size(byte_size(@magic)), version, _::binary>> = data
      {:ok, Map.merge(definition, %{chunks: chunks, bytes: byte_size(data), version: version})}
    end
  end

  defp parse(<<@magic, version, rest::binary>>, path) when version in @versions,
    do: parse_chunks(rest, @definition, [], {0, 0, 0}, path)

  defp parse(<<@magic, version, _::binary>>, path),
    do: corrupt("unsupported snapshot version #{version}", path)

  defp parse(_data, path), do: corrupt("not a Larder.Table snapshot", path)

  defp parse_chunks(<<0, rows::64, keys::64, terms::64>>, _kind, acc, seen, path) do
    cond do
      acc == [] -> corrupt("no definition", path)
      seen != {rows, keys, terms} -> corrupt("the trailer's counts do not match the chunks", path)
      true -> {:ok, Enum.reverse(acc)}
    end
  end

  defp parse_chunks(<<0, _::binary>>, _kind, _acc, _seen, path),
    do: corrupt("truncated, or bytes after the trailer", path)

  defp parse_chunks(
         <<kind, size::32, count::32, crc::32, payload::binary-size(size), rest::binary>>,
         last,
         acc,
         seen,
         path
       )
       when kind in @definition..@index do
    cond do
      kind < last or (kind == @definition and acc != []) or
          (last == @definition and acc == [] and kind != @definition) ->
        corrupt("a chunk of kind #{kind} out of order", path)

      count == 0 or count > @max_chunk_count or (kind == @definition and count != 1) ->
        corrupt("a chunk of kind #{kind} announces #{count} items", path)

      :erlang.crc32(payload) != crc ->
        corrupt("checksum mismatch in a chunk of kind #{kind}", path)

      true ->
        parse_chunks(rest, kind, [{kind, count, payload} | acc], add(seen, kind, count), path)
    end
  end

  defp parse_chunks(<<kind, _::binary>>, _last, _acc, _seen, path) when kind in 1..4,
    do: corrupt("truncated", path)

  defp parse_chunks(<<kind, _::binary>>, _last, _acc, _seen, path),
    do: corrupt("unknown chunk kind #{kind}", path)

  defp parse_chunks(<<>>, _last, _acc, _seen, path), do: corrupt("truncated", path)

  defp add(seen, @definition, _count), do: seen
  defp add({r, k, t}, @rows, count), do: {r + count, k, t}
  defp add({r, k, t}, @keys, count), do: {r, k + count, t}
  defp add({r, k, t}, @index, count), do: {r, k, t + count}

  defp definition([{@definition, 1, payload} | _], config, path) do
    names = Enum.map(config.entries, &elem(&1, 0))

    case decode(payload) do
      {:ok, [{key, store, file_names, next, free}], 1} ->
        cond do
          {key, store, file_names} != {config.key, config.store, names} ->
            {:error,
             Larder.Error.new(
               :definition_mismatch,
               "the snapshot's table definition differs from the one given to load/2",
               path: path,
               snapshot: [key: key, store: store, index: file_names],
               given: [key: config.key, store: config.store, index: names]
             )}

          not (is_integer(next) and next >= @direct_limit and next <= @max_id + 1) ->
            corrupt("a bad next row id", path)

          not proper_ids?(free, next) ->
            corrupt("bad free row ids", path)

          true ->
            {:ok, %{next: next, free: free}}
        end

      {:ok, _other, _count} ->
        corrupt("a definition of the wrong shape", path)

      {:error, why} ->
        corrupt("the definition #{why}", path)
    end
  end

  defp proper_ids?([id | rest], next)
       when is_integer(id) and id >= @direct_limit and id < next,
       do: proper_ids?(rest, next)

  defp proper_ids?([], _next), do: true
  defp proper_ids?(_other, _next), do: false

  # A compressed term (tag 80) declares its uncompressed size: a few bytes
  # could ask for gigabytes. dump/4 never writes one.
  defp decode(<<131, 80, _::binary>>), do: {:error, "is compressed"}

  defp decode(payload) do
    {term, used} = :erlang.binary_to_term(payload, [:safe, :used])

    cond do
      used != byte_size(payload) -> {:error, "has bytes after its term"}
      not is_list(term) -> {:error, "is not a list"}
      true -> {:ok, term, length(term)}
    end
  rescue
    # binary_to_term/2 raises ArgumentError on a bad or unsafe term, and
    # length/1 on an improper list.
    _ -> {:error, "is not a valid external term, or holds an atom this VM does not know"}
  end

  @doc """
  Fills the new, empty `table` (in its writer's init) from what `read/2`
  returned. Returns the writer's id state `{next, free, top}`, or an error
  (the caller then stops the writer, and its tables go with it).
  """
  @spec fill(Table.t(), map(), Path.t()) ::
          {:ok, {non_neg_integer(), [non_neg_integer()], non_neg_integer()}}
          | {:error, Larder.Error.t()}
  def fill(table, %{chunks: [_definition | chunks], next: next, free: free} = read, path) do
    names = Map.new(table.entries, fn {name, _} -> {name, true} end)
    {rows, others} = Enum.split_with(chunks, &(elem(&1, 0) == @rows))
    {keys, index} = Enum.split_with(others, &(elem(&1, 0) == @keys))

    with {:ok, terms} <- decode_chunks(index, [], &take_index(&1, names, &2)) do
      # The index is imported beside the rows' decoding and inserts when
      # the rows' bytes show their ids (see scan_ids/1), else after them.
      scanned = scan_ids(rows)
      importing = scanned && Task.async(fn -> import(table, terms, scanned, path) end)

      result =
        with {:ok, top, ids} <- fill_rows(table, rows, read.version, scanned),
             {:ok, keyed} <- decode_chunks(keys, [], &take_keys(&1, table, &2)),
             :ok <- check_ids(table, keyed, free, next, path),
             :ok <-
               if(importing,
                 do: Task.await(importing, :infinity),
                 else: import(table, terms, ids, path)
               ) do
          {:ok, {next, free, top}}
        end

      if importing, do: Task.shutdown(importing, :brutal_kill)
      result
    end
    |> case do
      {:ok, _} = ok -> ok
      {:error, %Larder.Error{}} = error -> error
      {:error, why} -> corrupt("a chunk #{why}", path)
    end
  end

  # The row ids of each rows chunk (a binary of 32-bit ids), read from its
  # bytes by the NIF without decoding it, so that the index's import (which
  # needs every id, and is about a quarter of a load's work) starts at once
  # instead of after every row is decoded and inserted. nil when a chunk's
  # bytes are not what the scan knows (a record holding a pid, say): its
  # ids then come from the decoded rows. A filler checks that its chunk's
  # decoded rows have exactly the scanned ids.
  defp scan_ids(chunks) do
    Enum.reduce_while(chunks, [], fn {_kind, _count, payload}, acc ->
      ids =
        if byte_size(payload) <= @normal_scan,
          do: Native.table_payload_row_ids(payload),
          else: Native.table_payload_row_ids_dirty(payload)

      if is_binary(ids), do: {:cont, [ids | acc]}, else: {:halt, nil}
    end)
    |> then(&(&1 && Enum.reverse(&1)))
  end

  # Rows are decoded and inserted (the rows table is public) by as many
  # processes as there are schedulers: decoding records is most of a load.
  # Each process's garbage goes with it. Each chunk's row ids come back as
  # one binary of 32-bit ids, for the NIF to check the index against.
  defp fill_rows(table, chunks, version, scanned) do
    fields = if version >= 2, do: value_fields(table)

    chunks
    |> Enum.zip(scanned || Stream.repeatedly(fn -> nil end))
    |> Task.async_stream(fn {chunk, ids} -> fill_chunk(table, chunk, fields, ids) end,
      max_concurrency: System.schedulers_online(),
      ordered: false,
      timeout: :infinity
    )
    |> Enum.reduce_while({:ok, 0, []}, fn
      {:ok, {:ok, top, ids}}, {:ok, max, all} -> {:cont, {:ok, max(top, max), [ids | all]}}
      {:ok, {:error, _} = error}, _ -> {:halt, error}
    end)
  end

  defp fill_chunk(table, {_kind, count, payload}, fields, scanned) do
    with {:ok, items, ^count} <- decode(payload),
         {:ok, items, ids} <- expand_rows(items, count, fields),
         :ok <- same_ids(scanned, ids),
         {:ok, top} <- rows(items, table.key, 0) do
      :ets.insert(table.rows, items)
      {:ok, top, ids}
    else
      {:ok, _items, n} -> {:error, "holds #{n} items, its header says #{count}"}
      {:error, _} = error -> error
    end
  end

  defp same_ids(nil, _ids), do: :ok
  defp same_ids(ids, ids), do: :ok
  defp same_ids(_scanned, _ids), do: {:error, "decodes to other row ids than its bytes show"}

  defp decode_chunks(chunks, acc, take) do
    Enum.reduce_while(chunks, {:ok, acc}, fn {_kind, count, payload}, {:ok, acc} ->
      with {:ok, items, ^count} <- decode(payload),
           {:ok, acc} <- take.(items, acc) do
        {:cont, {:ok, acc}}
      else
        {:ok, _items, n} -> {:halt, {:error, "holds #{n} items, its header says #{count}"}}
        {:error, why} -> {:halt, {:error, why}}
      end
    end)
  end

  defp take_keys(items, table, keyed) do
    case keys(items, table, keyed) do
      {:ok, keyed} ->
        :ets.insert(table.keys, items)
        {:ok, keyed}

      error ->
        error
    end
  end

  defp take_index(items, names, terms) do
    if Enum.all?(
         items,
         &match?({{name, _}, bin} when is_map_key(names, name) and is_binary(bin), &1)
       ),
       do: {:ok, [items | terms]},
       else: {:error, "holds an index entry of the wrong shape"}
  end

  # Rows `{id, record}`: a record with the key field; an id below 2^31 is
  # the record's key (an id above is checked through the keys).
  defp rows([{id, record} | rest], key, top) when is_integer(id) and id >= 0 and is_map(record) do
    case record do
      %{^key => ^id} when id < @direct_limit -> rows(rest, key, max(top, id + 1))
      %{^key => _} when id >= @direct_limit and id <= @max_id -> rows(rest, key, top)
      _ -> {:error, "holds a row whose key does not match its id"}
    end
  end

  defp rows([], _key, top), do: {:ok, top}
  defp rows(_other, _key, _top), do: {:error, "holds a row of the wrong shape"}

  defp keys([{key, id} | rest], table, keyed) when is_integer(id) and id >= @direct_limit do
    field = table.key

    case :ets.lookup(table.rows, id) do
      [{_, %{^field => ^key}}] -> keys(rest, table, [id | keyed])
      _ -> {:error, "holds a key whose row is missing or has another key"}
    end
  end

  defp keys([], _table, keyed), do: {:ok, keyed}
  defp keys(_other, _table, _keyed), do: {:error, "holds a key of the wrong shape"}

  # Every keyed id and free id distinct and below `next`, and every row
  # above 2^31 named by a key.
  defp check_ids(_table, [], [], _next, _path), do: :ok

  defp check_ids(table, keyed, free, next, path) do
    all = keyed ++ free

    rows_above =
      :ets.select_count(table.rows, [{{:"$1", :_}, [{:>=, :"$1", @direct_limit}], [true]}])

    cond do
      Enum.any?(keyed, &(&1 >= next)) -> corrupt("a key's row id is not below next", path)
      length(Enum.uniq(all)) != length(all) -> corrupt("row ids given twice", path)
      rows_above != :ets.info(table.keys, :size) -> corrupt("rows without a key", path)
      true -> :ok
    end
  end

  # A chunk's rows and their ids packed in a binary (see row_ids/2); in a
  # version 2 file with value fields (value_fields/1), the rows as maps
  # again and the ids, in one pass of the NIF.
  defp expand_rows(items, count, nil) do
    with {:ok, ids} <- row_ids(items, count), do: {:ok, items, ids}
  end

  defp expand_rows(items, count, fields) do
    expanded =
      if count <= @normal_expand,
        do: Native.table_rows_expand(fields, items),
        else: Native.table_rows_expand_dirty(fields, items)

    case expanded do
      {rows, ids} when is_list(rows) and is_binary(ids) -> {:ok, rows, ids}
      {:error, _} -> {:error, "holds a row of the wrong shape"}
    end
  end

  # The chunk's row ids packed in a binary, by the NIF: gathered here, row
  # by row, into a list or a binary, they cost a load about a quarter more
  # (a list is copied to the loading process and grows its heap).
  defp row_ids(items, count) do
    ids =
      if count <= 16_384,
        do: Native.table_row_ids(items),
        else: Native.table_row_ids_dirty(items)

    case ids do
      ids when is_binary(ids) -> {:ok, ids}
      {:error, _} -> {:error, "holds a row of the wrong shape"}
    end
  end

  defp import(table, terms, ids, path) do
    case Native.index_import(table.index.ref, Enum.concat(terms), ids) do
      {:ok, 0} ->
        :ok

      {:ok, dropped} ->
        Logger.warning(
          "Larder.Table.load: #{inspect(path)}: the index named #{dropped} row ids " <>
            "that have no record in the file; they were left out of the loaded index"
        )

        :ok

      {:error, :bad_snapshot} ->
        corrupt("the index data is malformed", path)
    end
  end

  @doc """
  Logs, at info, the one line of a load that filled `table` from `path`:
  its name (or handle), the path, its records, the file's `bytes` and the
  load's time, `native` time units since `started` (a monotonic time).
  """
  @spec log_loaded(Table.t(), Path.t(), non_neg_integer(), integer()) :: :ok
  def log_loaded(table, path, bytes, started) do
    ms = System.convert_time_unit(System.monotonic_time() - started, :native, :microsecond) / 1000

    Logger.info(fn ->
      records = :ets.info(table.rows, :size)

      "#{Larder.Instance.describe(Table, table.name, table)} loaded from #{inspect(path)}: " <>
        "#{records} #{if records == 1, do: "record", else: "records"}, #{bytes} bytes, " <>
        "in #{:erlang.float_to_binary(ms, decimals: 1)} ms"
    end)
  end

  defp corrupt(message, path) do
    {:error, Larder.Error.new(:corrupt_snapshot, message, path: path)}
  end
end
