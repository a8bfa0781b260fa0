defmodule Larder.Test.PriceStream do
  @moduledoc false
  # The `prices` Redis Stream of the replica benchmarks and `make demo`
  # (bench/replica_bench.exs, examples/demo/70_replica.exs), and the price
  # record encoding bench/support/kafka_load.ex sends to Kafka: a price as
  # the fields of a stream entry, the replica's apply function and options,
  # a producer that XADDs prices (eredis, from Debian's erlang-redis-client)
  # and the marker lags. The price search example has its own copy of the
  # encoding and the producer, for its service and producer script.
  #
  # An entry carries one field, as a Kafka message carries one value: a
  # price is `price` => its CSV columns joined by tabs,
  #
  #     idx offeringId groupId spec chars values value isDefault currency
  #
  # (`chars` and `values` joined by `|`, as in the CSV), and a deletion is
  # `del` => the idx. One payload field rather than a field per column: the
  # stream's reply then holds 5 RESP values per entry instead of 21, which
  # is what a replica's catch-up spends most of its time reading.

  @columns 9

  @doc """
  The fields of a stream entry that sets `price`. Raises `ArgumentError`
  for a price whose text holds a tab (it would not read back).
  """
  @spec fields(map()) :: [binary()]
  def fields(price) do
    texts = [price.offering_id, price.group_id, price.spec, price.currency]
    chars = Enum.map_join(price.chars, "|", & &1.char)
    values = Enum.map_join(price.chars, "|", & &1.value)

    if Enum.any?([chars, values | texts], &String.contains?(&1, "\t")) do
      raise ArgumentError, "price: a tab in its text cannot be sent: #{inspect(price)}"
    end

    payload =
      Enum.join(
        [
          Integer.to_string(price.idx),
          price.offering_id,
          price.group_id,
          price.spec,
          chars,
          values,
          Integer.to_string(price.value),
          if(price.is_default, do: "true", else: "false"),
          price.currency
        ],
        "\t"
      )

    ["price", payload]
  end

  @doc """
  The replica's apply function: an entry's fields to `{:insert, price}` or
  `{:delete, idx}`. Raises on an entry of another shape (the replica then
  stops or skips it, by its `:on_error`). Each entry's characteristics
  are decoded anew: a cache of shared lists (as the CSV loader shares
  them) would sit in the process dictionary of the replica's reader, which
  every garbage collection scans, and the lists are copied to the
  replica's process anyway (a `store:` table keeps none of them); without
  it, catch-up is about 15% faster.
  """
  @spec apply_entry(%{binary() => binary()}) :: {:insert, map()} | {:delete, integer()}
  def apply_entry(%{"del" => idx}), do: {:delete, String.to_integer(idx)}

  def apply_entry(%{"price" => payload}) do
    [idx, offering, group, spec, chars, values, value, default, currency] = split(payload)

    {:insert,
     %{
       idx: String.to_integer(idx),
       offering_id: offering,
       group_id: group,
       spec: spec,
       chars: chars(chars, values),
       value: String.to_integer(value),
       is_default: default == "true",
       currency: currency
     }}
  end

  defp split(payload) do
    case :binary.split(payload, "\t", [:global]) do
      parts when length(parts) == @columns -> parts
      _ -> raise ArgumentError, "price: not #{@columns} tab-separated columns"
    end
  end

  defp chars(chars, values) do
    zip(:binary.split(chars, "|", [:global]), :binary.split(values, "|", [:global]))
  end

  defp zip([c | cs], [v | vs]), do: [%{char: c, value: v} | zip(cs, vs)]
  defp zip(_, _), do: []

  @doc """
  The options of a replica that keeps the table `table` (the catalogue's
  indexes, `store:` the fields the service answers with) equal to `stream`.
  """
  @spec replica_opts(atom(), atom(), keyword(), String.t(), keyword()) :: keyword()
  def replica_opts(name, table, redis, stream, extra \\ []) do
    store = [:idx, :spec, :value, :currency, :is_default]

    Keyword.merge(
      [
        name: name,
        into: {Larder.Table, Larder.Test.Catalogue.table_opts(name: table, store: store)},
        source: {Larder.Replica.RedisStream, redis: redis, stream: stream},
        apply: &__MODULE__.apply_entry/1
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
    |> :eredis.qp(Enum.map(prices, &["XADD", stream, "*" | fields(&1)]), 60_000)
    |> List.last()
    |> then(fn {:ok, id} -> id end)
  end

  @doc """
  A steady producer: XADDs price changes (a price of `prices` with a new
  value) at `rate` entries per second, in a batch every 10 ms, for
  `duration_ms`. Returns the number of entries added.
  """
  @spec produce(pid(), String.t(), tuple(), pos_integer(), pos_integer()) :: non_neg_integer()
  def produce(client, stream, prices, rate, duration_ms) do
    paced(rate, duration_ms, fn n -> add(client, stream, for(_ <- 1..n, do: change(prices))) end)
  end

  @doc """
  Calls `send.(n)` every 10 ms for `duration_ms` with the `n` items due
  since the last call at `rate` per second (none: no call), so that `rate`
  holds however long each call takes. Returns the number of items due in
  all (the producers of this module and of the Kafka benchmarks).
  """
  @spec paced(pos_integer(), pos_integer(), (pos_integer() -> term())) :: non_neg_integer()
  def paced(rate, duration_ms, send) do
    started = System.monotonic_time(:millisecond)
    paced(rate, send, started, started + duration_ms, 0)
  end

  defp paced(rate, send, started, deadline, sent) do
    now = System.monotonic_time(:millisecond)

    if now >= deadline do
      sent
    else
      due = div((now - started) * rate, 1_000)
      if due > sent, do: send.(due - sent)
      Process.sleep(min(10, max(0, deadline - now)))
      paced(rate, send, started, deadline, max(due, sent))
    end
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
      price = change(prices)
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
        Enum.map(Larder.Test.Catalogue.char_terms(marker), &{:char, &1})

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

  @doc "A random price of `prices` (a tuple) with a new value."
  @spec change(tuple()) :: map()
  def change(prices) do
    price = elem(prices, :rand.uniform(tuple_size(prices)) - 1)
    %{price | value: :rand.uniform(1_000_000)}
  end
end
