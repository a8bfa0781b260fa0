defmodule PriceSearch.PriceStream do
  @moduledoc """
  The `prices` Redis Stream that a price search service can follow through a
  `Larder.Replica`: the replica's options, and a producer that `XADD`s
  prices (eredis, from Debian's erlang-redis-client).

  An entry is a price change as `PriceCatalogue.Entry` encodes it (one
  field, `price` => the price's CSV columns joined by tabs, or `del` => an
  idx); the replica decodes it with `PriceCatalogue.Entry.decode/1` (the
  replica itself takes any fields; the encoding is the producer's choice).
  The producer side (`connect/1`, `fill/4`, `add/3`, `produce/5`) serves
  `producer.exs`; the service's replica reads the stream with Larder's own
  client.
  """

  alias PriceCatalogue.{Changes, Entry}

  @doc """
  The options of a replica that keeps the table `table` (the store's
  table, `PriceSearch.Store.table_opts/1`) equal to `stream` on the Redis
  server `redis` (`Larder.Replica.RedisStream`'s `:redis`), plus `extra`
  (`:snapshot`, `:snapshot_every`...).
  """
  @spec replica_opts(atom(), atom(), keyword(), String.t(), keyword()) :: keyword()
  def replica_opts(name, table, redis, stream, extra \\ []) do
    Keyword.merge(
      [
        name: name,
        into: {Larder.Table, PriceSearch.Store.table_opts(name: table)},
        source: {Larder.Replica.RedisStream, redis: redis, stream: stream},
        apply: &Entry.decode/1
      ],
      extra
    )
  end

  @doc "Connects to Redis (eredis): `redis` has `:host` (default 127.0.0.1) and `:port` (6379)."
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
  @spec add(pid(), String.t(), [PriceCatalogue.price()]) :: binary()
  def add(client, stream, prices) do
    client
    |> :eredis.qp(Enum.map(prices, &["XADD", stream, "*" | Entry.fields(&1)]), 60_000)
    |> List.last()
    |> then(fn {:ok, id} -> id end)
  end

  @doc """
  A steady producer: XADDs price changes (a price of `prices`, a tuple,
  with a new value) at `rate` entries per second, in a batch about every
  10 ms, for `duration_ms` (`PriceCatalogue.Changes`). Returns the number
  of entries added.
  """
  @spec produce(pid(), String.t(), tuple(), pos_integer(), pos_integer()) :: non_neg_integer()
  def produce(client, stream, prices, rate, duration_ms) do
    Changes.paced(rate, duration_ms, fn n ->
      add(client, stream, for(_ <- 1..n, do: Changes.random(prices)))
    end)
  end
end
