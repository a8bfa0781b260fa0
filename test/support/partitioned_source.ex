# A Larder.Replica.Source over an in-memory log of several partitions, with
# the shapes a Kafka topic has: a position made of one next offset per
# partition, offsets with gaps (compaction), a partition whose end is past
# its last entry (a gap at the tail, as a transaction marker leaves), and
# partitions trimmed from their start. For the tests of the Source
# contract without a broker; Larder.Replica.Kafka has the same shapes. It
# implements committed/2 (recording each position told), and its
# connection raises when a process other than the one that made it uses
# it (a socket owned by its process would fail).
defmodule Larder.Test.PartitionedSource do
  @moduledoc false

  @behaviour Larder.Replica.Source

  alias Larder.Test.ReplicaLog

  # The log lives in a public ETS table owned by the test:
  #   {{:entry, partition, offset}, fields}
  #   {{:end, partition}, next_offset}      (at or past the last entry's + 1)
  #   {{:start, partition}, log_start}      (entries below it are gone)
  #   {:partitions, n}
  #   {{:committed, n}, pid, position}     (committed/2's calls)

  @doc "A new empty log of `partitions` partitions; returns its table."
  def new(partitions) do
    table = :ets.new(__MODULE__, [:public, :ordered_set])
    :ets.insert(table, {:partitions, partitions})
    for p <- 0..(partitions - 1), do: :ets.insert(table, [{{:end, p}, 0}, {{:start, p}, 0}])
    table
  end

  @doc "Appends `fields` to `partition`; returns its offset."
  def append(table, partition, fields) do
    offset = :ets.lookup_element(table, {:end, partition}, 2)
    :ets.insert(table, [{{:entry, partition, offset}, fields}, {{:end, partition}, offset + 1}])
    offset
  end

  @doc "Moves `partition`'s end `n` offsets past its last entry (a gap, no entries)."
  def skip(table, partition, n) do
    :ets.update_counter(table, {:end, partition}, n)
    :ok
  end

  @doc """
  Makes every read from now on `{:stop, error, conn}`: the log changed in a
  way no read nor rebuild can follow (as a Kafka topic whose partitions
  were added).
  """
  def stop(table, %Larder.Error{} = error) do
    :ets.insert(table, {:stop, error})
    :ok
  end

  @doc "Removes an entry (compaction: its offset becomes a gap)."
  def compact(table, partition, offset) do
    :ets.delete(table, {:entry, partition, offset})
    :ok
  end

  @doc "Deletes `partition`'s entries below `offset` (a trim)."
  def trim(table, partition, offset) do
    for o <- :ets.lookup_element(table, {:start, partition}, 2)..(offset - 1)//1,
        do: :ets.delete(table, {:entry, partition, o})

    :ets.insert(table, {{:start, partition}, offset})
    :ok
  end

  @doc """
  Appends each op of Larder.Test.ReplicaLog's shapes (`{:put, k, v}`,
  `{:del, k}`, `{:incr, k, n}`) to its key's partition (`k rem
  partitions`, so a key lives in one partition, as in Kafka), through
  `module.append/3`: this module's, or a wrapper's (NotifyingSource).
  """
  def produce(module, table, ops) do
    partitions = :ets.lookup_element(table, :partitions, 2)

    for op <- ops do
      fields =
        op |> ReplicaLog.fields() |> Enum.chunk_every(2) |> Map.new(fn [k, v] -> {k, v} end)

      module.append(table, rem(elem(op, 1), partitions), fields)
    end
  end

  @doc """
  The plain model of the log: every entry still in it folded in offset
  order within each partition (a key's entries are all in one).
  """
  def model(table) do
    Enum.reduce(entries(table), %{}, fn {_id, fields}, acc ->
      case fields do
        %{"op" => "put", "k" => k, "v" => v} -> Map.put(acc, int(k), int(v))
        %{"op" => "del", "k" => k} -> Map.delete(acc, int(k))
        %{"op" => "incr", "k" => k, "n" => n} -> Map.update(acc, int(k), int(n), &(&1 + int(n)))
      end
    end)
  end

  defp int(s), do: String.to_integer(s)

  @doc "Every partition's end: the position latest/2 gives."
  def ends(table) do
    {:ok, latest} = latest([table: table], 0)
    latest
  end

  @doc "Every entry, partition by partition, in offset order."
  def entries(table) do
    table
    |> :ets.match_object({{:entry, :_, :_}, :_})
    |> Enum.map(fn {{:entry, p, o}, fields} -> {{p, o}, fields} end)
  end

  # Options: the log's table; the log's name; the most entries a read
  # takes (a read of more is :batch_too_large, as a reply over a source's
  # bound); a function called with each committed position, in
  # committed/2.
  @impl true
  def validate!(opts) do
    Larder.Options.validate!(
      opts,
      [
        table: {{:custom, "the log's ETS table", &is_reference/1}, :required},
        name: {{:string, 1, 100}, "partitioned"},
        max_count: {{:or_nil, {:integer, 1, 100_000}}, nil},
        on_committed: {{:or_nil, {:custom, "a function of arity 1", &is_function(&1, 1)}}, nil}
      ],
      inspect(__MODULE__)
    )
  end

  @impl true
  def identity(opts), do: opts[:name]

  @impl true
  def origin(_opts), do: %{}

  @impl true
  def cast_position(position) when is_map(position) do
    if Enum.all?(position, fn {p, o} -> is_integer(p) and p >= 0 and is_integer(o) and o >= 0 end),
      do: {:ok, position},
      else: :error
  end

  def cast_position(_other), do: :error

  @impl true
  def advance(position, {partition, offset}), do: Map.put(position, partition, offset + 1)

  @impl true
  def reached?(position, target),
    do: Enum.all?(target, fn {p, o} -> Map.get(position, p, 0) >= o end)

  @doc "The committed positions told so far: `{pid, position}`, in order."
  def committed(table) do
    for [_, pid, position] <- :ets.match(table, {{:committed, :"$1"}, :"$2", :"$3"}),
        do: {pid, position}
  end

  # The connection is the table and the options, and the process that
  # made it, which alone may use it.
  @impl true
  def connect(opts), do: {:ok, %{table: opts[:table], opts: opts, owner: self()}}

  @impl true
  def close(conn) do
    owned!(conn)
    :ok
  end

  @impl true
  def committed(conn, position) do
    owned!(conn)
    n = :ets.update_counter(conn.table, :committed_count, 1, {:committed_count, 0})
    :ets.insert(conn.table, {{:committed, n}, self(), position})
    if conn.opts[:on_committed], do: conn.opts[:on_committed].(position)
    {:ok, conn}
  end

  defp owned!(%{owner: owner}) when owner == self(), do: :ok

  defp owned!(conn) do
    raise "a connection of #{inspect(conn.owner)} used by #{inspect(self())}"
  end

  # Up to `count` entries, taken from the partitions in turn (so a batch
  # interleaves them), and the position after them: a partition read to
  # its end moves to its end, past a gap at its tail.
  @impl true
  def read(conn, position, count, block_ms) do
    owned!(conn)

    if conn.opts[:max_count] && count > conn.opts[:max_count] do
      {:error, Larder.Error.new(:batch_too_large, "more than :max_count entries"), conn}
    else
      read_log(conn, position, count, block_ms)
    end
  end

  defp read_log(%{table: table} = conn, position, count, block_ms) do
    n = :ets.lookup_element(table, :partitions, 2)

    trimmed =
      Enum.any?(0..(n - 1), fn p ->
        Map.get(position, p, 0) < :ets.lookup_element(table, {:start, p}, 2)
      end)

    cond do
      match?([_], :ets.lookup(table, :stop)) ->
        {:stop, :ets.lookup_element(table, :stop, 2), conn}

      trimmed ->
        {:trimmed, Map.new(0..(n - 1), &{&1, :ets.lookup_element(table, {:start, &1}, 2)}), conn}

      true ->
        read_entries(conn, n, position, count, block_ms)
    end
  end

  defp read_entries(%{table: table} = conn, n, position, count, block_ms) do
    {entries, position_after} = take(table, n, position, count)

    if entries == [] and position_after == position do
      Process.sleep(min(block_ms, 20))
      {:ok, [], position, conn}
    else
      {:ok, entries, position_after, conn}
    end
  end

  defp take(table, n, position, count) do
    per = max(div(count, n), 1)

    Enum.reduce(0..(n - 1), {[], position}, fn p, {acc, pos} ->
      from = Map.get(pos, p, 0)
      last = :ets.lookup_element(table, {:end, p}, 2)
      room = count - length(acc)

      found =
        if room > 0 do
          for o <- from..(last - 1)//1,
              [{_, fields}] <- [:ets.lookup(table, {:entry, p, o})],
              do: {{p, o}, fields}
        else
          []
        end

      batch = Enum.take(found, min(per, room))

      pos =
        cond do
          length(batch) < length(found) -> Map.put(pos, p, elem(elem(List.last(batch), 0), 1) + 1)
          room > 0 and last > from -> Map.put(pos, p, last)
          true -> pos
        end

      {acc ++ batch, pos}
    end)
  end

  @impl true
  def latest(opts, _timeout) do
    table = opts[:table]
    n = :ets.lookup_element(table, :partitions, 2)
    {:ok, Map.new(0..(n - 1), &{&1, :ets.lookup_element(table, {:end, &1}, 2)})}
  end
end
