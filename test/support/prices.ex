# What Larder's benchmarks, `make demo` and tests do with the price
# catalogue (PriceCatalogue, examples/price_catalogue, a :dev and :test
# dependency): its Larder.Table, a replica that keeps one equal to the
# `prices` Redis Stream, a producer that XADDs to that stream (eredis, from
# Debian's erlang-redis-client) and the lag of a replica behind it. The
# catalogue itself (loading, generating, requests, the map index, the
# entries' encoding) is PriceCatalogue's.
defmodule Larder.Test.Prices do
  @moduledoc false

  alias PriceCatalogue.{Changes, Entry}

  @doc """
  The `Larder.Table.new/1` options for the catalogue: the Go service's
  indexes (offering, group, spec, one term per characteristic value), plus
  `extra` (`store:`, `name:`).
  """
  @spec table_opts(keyword()) :: keyword()
  def table_opts(extra \\ []) do
    [key: :idx, index: [:offering_id, :group_id, :spec, {:char, &PriceCatalogue.char_terms/1}]] ++
      extra
  end

  @doc """
  The options of a replica that keeps the table `table` (the catalogue's
  indexes, `store:` the fields the price service answers with) equal to
  `stream`, its entries decoded by `PriceCatalogue.Entry.decode/1`.
  """
  @spec replica_opts(atom(), atom(), keyword(), String.t(), keyword()) :: keyword()
  def replica_opts(name, table, redis, stream, extra \\ []) do
    store = [:idx, :spec, :value, :currency, :is_default]

    Keyword.merge(
      [
        name: name,
        into: {Larder.Table, table_opts(name: table, store: store)},
        source: {Larder.Replica.RedisStream, redis: redis, stream: stream},
        apply: &Entry.decode/1
      ],
      extra
    )
  end

  @doc "Connects to Redis (eredis)."
  @spec connect(keyword()) :: pid()
  def connect(redis) do
    host = redis |> Keyword.get(:host, "127.0.0.1") |> to_charlist()
    {:ok, client} = :eredis.start_link(host, Keyword.get(redis, :port, 6379))
    client
  end

  @doc "XADDs `prices` to `stream`, pipelined in chunks; returns the last id."
  @spec fill(pid(), String.t(), Enumerable.t(), pos_integer()) :: binary() | nil
  def fill(client, stream, prices, chunk \\ 2_000) do
    prices
    |> Stream.chunk_every(chunk)
    |> Enum.reduce(nil, fn chunk, _last -> add(client, stream, chunk) end)
  end

  @doc "XADDs `prices` in one pipeline; returns the last id."
  @spec add(pid(), String.t(), [map()]) :: binary()
  def add(client, stream, prices) do
    client
    |> :eredis.qp(Enum.map(prices, &["XADD", stream, "*" | Entry.fields(&1)]), 60_000)
    |> List.last()
    |> then(fn {:ok, id} -> id end)
  end

  @doc """
  A steady producer: XADDs price changes (`PriceCatalogue.Changes.random/1`
  of `prices`, a tuple) at `rate` entries per second, in a batch about
  every 10 ms (`PriceCatalogue.Changes.paced/3`), for `duration_ms`.
  Returns the number of entries added.
  """
  @spec produce(pid(), String.t(), tuple(), pos_integer(), pos_integer()) :: non_neg_integer()
  def produce(client, stream, prices, rate, duration_ms) do
    Changes.paced(rate, duration_ms, fn n ->
      add(client, stream, for(_ <- 1..n, do: Changes.random(prices)))
    end)
  end

  @doc """
  The lag of `replica` following `stream` into `table`, sampled until
  `deadline` (monotonic ms): every 5 ms a price change with a value no price
  has is XADDed, then waited for with `Larder.Replica.await/3` on its id
  (a message from the replica, no polling) and searched for (see
  `visible/3`); a search that does not find it yet (the replica has
  applied it, so it should) is retried every millisecond. Returns the
  lags in microseconds, each from before the XADD to the search that
  found it.

  Run it in a process of its own with a small `prices` (a sample), as the
  producer: a process that holds the whole catalogue takes a scheduler
  for a fraction of a second at each of its garbage collections, which
  the lag would then measure. `prices` must be prices that no producer
  changes meanwhile (a later change would hide the marker's value).
  """
  @spec marker_lags(pid(), String.t(), GenServer.server(), atom(), tuple(), integer()) ::
          [non_neg_integer()]
  def marker_lags(client, stream, replica, table, prices, deadline, acc \\ []) do
    if System.monotonic_time(:millisecond) >= deadline do
      acc
    else
      price = Changes.random(prices)
      marker = %{price | value: 2_000_000 + System.unique_integer([:positive])}
      started = System.monotonic_time(:microsecond)
      id = add(client, stream, [marker])
      :ok = Larder.Replica.await(replica, id, 60_000)
      visible(table, marker, started)
      lag = System.monotonic_time(:microsecond) - started
      Process.sleep(5)
      marker_lags(client, stream, replica, table, prices, deadline, [lag | acc])
    end
  end

  @doc """
  Returns once a search of `table` finds `marker` (by its offering, spec
  and every one of its characteristics, as the price service's requests
  search; its idx and value checked), retrying every millisecond; raises
  after 10 s from `started` (monotonic microseconds).

  The search names the characteristics so that it matches the marker's
  own price, not the 4,872 prices of its offering and spec: reading those
  took the probe 4-6 ms a search on a 2-core machine, which the lag then
  measured as the replica's.
  """
  @spec visible(atom(), map(), integer()) :: :ok
  def visible(table, marker, started) do
    conditions =
      [offering_id: marker.offering_id, spec: marker.spec] ++
        Enum.map(PriceCatalogue.char_terms(marker), &{:char, &1})

    found =
      Larder.Table.search(table, conditions)
      |> Enum.any?(&(&1.idx == marker.idx and &1.value == marker.value))

    cond do
      found ->
        :ok

      System.monotonic_time(:microsecond) - started > 10_000_000 ->
        raise "marker price #{marker.idx} applied but not found in a search after 10 s " <>
                "(did a producer change the same price?)"

      true ->
        Process.sleep(1)
        visible(table, marker, started)
    end
  end
end
