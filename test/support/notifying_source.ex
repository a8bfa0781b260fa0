# Larder.Test.PartitionedSource with the Source contract's optional
# notify/2: a replica reads it in its own process, with no wait, and is
# sent :larder_source_ready by append/3 once it has armed a notice (as
# librdkafka's queue callback does for Larder.Replica.Kafka). It counts
# the reads and keeps the last reader's pid and block_ms, for the tests.
defmodule Larder.Test.NotifyingSource do
  @moduledoc false

  @behaviour Larder.Replica.Source

  alias Larder.Test.PartitionedSource, as: Log

  # Besides the log's rows (see PartitionedSource):
  #   {:appended, n}             appends so far
  #   {:seen, n}                 appends there were when the last read began
  #   {:armed, pid}              a notice owed to pid
  #   {:reads, n}, {:last_read, pid, block_ms}
  #   {:hold_connect}            connect/1 waits while it is there
  #   {{:connected, pid}}        pid called connect/1

  @doc "A new empty log of `partitions` partitions; returns its table."
  def new(partitions) do
    table = Log.new(partitions)
    :ets.insert(table, [{:appended, 0}, {:seen, 0}, {:reads, 0}])
    table
  end

  @doc "Appends `fields` to `partition` and sends the owed notice, if any."
  def append(table, partition, fields) do
    offset = Log.append(table, partition, fields)
    # Counted before the armed row is looked at, and notify/2 arms before
    # it compares the counts: one of the two sees the other.
    :ets.update_counter(table, :appended, 1)

    for {:armed, pid} <- :ets.take(table, :armed), do: send(pid, :larder_source_ready)
    offset
  end

  @doc "`{reads so far, the last reader's pid, its block_ms}`."
  def reads(table) do
    case :ets.lookup(table, :last_read) do
      [{:last_read, pid, block_ms}] -> {:ets.lookup_element(table, :reads, 2), pid, block_ms}
      [] -> {0, nil, nil}
    end
  end

  defdelegate entries(table), to: Log
  defdelegate stop(table, error), to: Log

  @impl true
  defdelegate validate!(opts), to: Log
  @impl true
  defdelegate identity(opts), to: Log
  @impl true
  defdelegate origin(opts), to: Log
  @impl true
  defdelegate cast_position(position), to: Log
  @impl true
  defdelegate advance(position, id), to: Log
  @impl true
  defdelegate reached?(position, target), to: Log

  @doc "Makes connect/1 wait (up to 30 s) until release_connect/1, as a server that does not answer."
  def hold_connect(table), do: :ets.insert(table, {:hold_connect})

  def release_connect(table), do: :ets.delete(table, :hold_connect)

  @doc "The processes that called connect/1."
  def connected(table), do: for([pid] <- :ets.match(table, {{:connected, :"$1"}}), do: pid)

  @impl true
  def connect(opts) do
    held(opts[:table], 3_000)
    :ets.insert(opts[:table], {{:connected, self()}})
    Log.connect(opts)
  end

  defp held(table, tries) do
    if tries > 0 and :ets.member(table, :hold_connect) do
      Process.sleep(10)
      held(table, tries - 1)
    end
  end

  @impl true
  defdelegate close(conn), to: Log
  @impl true
  defdelegate latest(opts, timeout), to: Log

  @impl true
  defdelegate committed(conn, position), to: Log

  @impl true
  def read(%{table: table} = conn, position, count, block_ms) do
    :ets.insert(table, [
      {:seen, :ets.lookup_element(table, :appended, 2)},
      {:last_read, self(), block_ms}
    ])

    :ets.update_counter(table, :reads, 1)
    Log.read(conn, position, count, block_ms)
  end

  @impl true
  def notify(%{table: table} = conn, pid) do
    :ets.insert(table, {:armed, pid})

    if :ets.lookup_element(table, :appended, 2) > :ets.lookup_element(table, :seen, 2) do
      :ets.delete(table, :armed)
      {:ready, conn}
    else
      {:armed, conn}
    end
  end
end
