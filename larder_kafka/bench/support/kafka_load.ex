# What bench/replica_kafka_bench.exs and `make demo` (examples/kafka_demo.exs)
# share: filling Kafka topics through the Kafka NIF's internal producer and
# admin client (Larder.Kafka.Native), the story's records and its anchors
# (the same NIF consumer into an ETS :bag or :duplicate_bag), the price
# catalogue's record encoding and the replica's apply, a steady producer
# and the marker lags. Depends on Larder, and for prices on PriceCatalogue
# (examples/price_catalogue, a :dev and :test dependency) and
# Larder.Test.Prices (the core's test/support).
#
# Record encodings:
#   * a price: key = its idx as decimal text, value = PriceCatalogue.Entry's
#     payload (the price's CSV columns joined by tabs, as the Redis Stream
#     replica's bench sends it); a nil value deletes the idx. The apply
#     decodes it with PriceCatalogue.Entry.decode/1 and checks the key.
#   * the story: key = <<key::32>> (10,000 keys), value = <<n::64>> where n is
#     the record's number (1M distinct values, about 100 per key); the apply
#     decodes both to integers, as does the ETS anchors' loop.
defmodule Larder.Bench.KafkaLoad do
  @moduledoc false

  alias Larder.Kafka.Native

  @timeout 120_000
  # Records per produce_batch/3 call (the NIF takes up to 100,000).
  @chunk 50_000

  ## Topics

  @doc "An admin client on the broker at `bootstrap`."
  def admin!(bootstrap) do
    {:ok, admin} = Native.admin_open([{"bootstrap.servers", bootstrap}])
    admin
  end

  @doc "Creates `topic` with `partitions` partitions."
  def create_topic!(admin, topic, partitions) do
    :ok = Native.create_topic(admin, topic, partitions, [], @timeout)
  end

  @doc """
  A producer for filling topics: batches of up to 1 MB, 5 ms linger, lz4
  (a producer of a real service would compress; the replica decompresses).
  """
  def producer!(bootstrap, extra \\ []) do
    config =
      [
        {"bootstrap.servers", bootstrap},
        {"linger.ms", "5"},
        {"batch.size", "1048576"},
        {"batch.num.messages", "100000"},
        {"queue.buffering.max.messages", "1000000"},
        {"queue.buffering.max.kbytes", "1048576"},
        {"compression.type", "lz4"},
        {"acks", "all"}
      ]
      |> Enum.reject(fn {key, _} -> List.keymember?(extra, key, 0) end)
      |> Kernel.++(extra)

    {:ok, producer} = Native.producer_open(config)
    producer
  end

  @doc "The marker producer's settings: no linger, Nagle's algorithm off."
  def probe_config, do: [{"linger.ms", "0"}, {"socket.nagle.disable", "true"}]

  @doc """
  Produces `records` (`{key, value}`, partitioned by key) to `topic` in
  chunks, each flushed; returns the end offsets `%{partition => next_offset}`
  of what was acknowledged (the partitions written to).
  """
  def fill!(producer, topic, records) do
    records
    |> Stream.chunk_every(@chunk)
    |> Enum.reduce(%{}, fn chunk, ends ->
      :ok =
        Native.produce_batch(producer, topic, Enum.map(chunk, fn {k, v} -> {-1, k, v, []} end))

      {:ok, acks} = Native.producer_flush(producer, @timeout)

      if length(acks) != length(chunk),
        do: raise("#{length(chunk)} records produced, #{length(acks)} acknowledged")

      Enum.reduce(acks, ends, fn {p, o}, acc -> Map.update(acc, p, o + 1, &max(&1, o + 1)) end)
    end)
  end

  ## The story: 1M records over 10k keys

  @doc """
  The story's records: `n` of them over `keys` keys, each value the record's
  number (so every pair is distinct: about n / keys distinct values per
  key), keys in random order (seeded).
  """
  def story_records(n, keys) do
    :rand.seed(:exsss, {2026, 11, 27})
    for i <- 1..n, do: {<<:rand.uniform(keys)::32>>, <<i::64>>}
  end

  @doc "The story's apply for a replica into a Larder.Bag."
  def story_apply({:kafka_record, <<k::32>>, <<v::64>>, _headers, _ts, _p, _o}),
    do: {:insert, k, v}

  @doc """
  The consumer's librdkafka configuration: the one Larder.Replica.Kafka
  builds from its default options (`librdkafka_config/1` of the validated
  `brokers: [bootstrap]`), so that every anchor reads exactly as the
  replica does (read committed, 50 MB fetches, 4 MB per partition, 16 MB
  prefetch per partition refilled below 100,000 records with a 10 ms
  backoff, 100 ms fetch wait).
  """
  def consumer_config(bootstrap) do
    [brokers: [bootstrap], topic: "anchor"]
    |> Larder.Replica.Kafka.validate!()
    |> Larder.Replica.Kafka.librdkafka_config()
  end

  @doc """
  What a team writes by hand today: opens the NIF consumer, assigns every
  partition from its start, reads each partition's end, and polls (`batch`
  records at a time, as the replica's `batch_size`) until every partition
  reached it, handing each poll's entries to `insert` (`fn entries -> _`).
  Returns the number of entries read.
  """
  def consume_all(bootstrap, topic, batch, insert) do
    drain(bootstrap, topic, batch, nil, fn entries, nil ->
      insert.(entries)
      nil
    end).records
  end

  @doc """
  `consume_all/4` as a fold: each poll's entries go to `fun.(entries,
  acc)`. Returns `%{records: n, acc: acc, wall_us: w, cpu_us: c}`: `w` is
  the time from the consumer's opening to the last poll's `fun` returning
  (the close is not counted, as in the C and Java drains of
  bench/support/anchors.ex), `c` the VM's CPU time over the same span
  (every thread of the OS process: schedulers, their busy wait, and
  librdkafka's threads).
  """
  def drain(bootstrap, topic, batch, acc, fun) do
    cpu0 = cpu_us()
    t0 = System.monotonic_time(:microsecond)
    {:ok, consumer} = Native.consumer_open(consumer_config(bootstrap))

    try do
      {:ok, %{partitions: partitions}} = Native.consumer_metadata(consumer, topic, @timeout)

      ends =
        Map.new(partitions, fn p ->
          {:ok, {_low, high}} = Native.consumer_watermarks(consumer, topic, p, @timeout)
          {p, high}
        end)

      :ok = Native.consumer_assign(consumer, topic, Enum.map(partitions, &{&1, -1}))

      {read, acc} =
        poll_until(consumer, ends, batch, fun, Map.new(partitions, &{&1, 0}), {0, acc})

      %{
        records: read,
        acc: acc,
        wall_us: System.monotonic_time(:microsecond) - t0,
        cpu_us: cpu_us() - cpu0
      }
    after
      Native.consumer_close(consumer)
    end
  end

  @doc "The VM's CPU time (every thread of the OS process, user and system), in us."
  def cpu_us do
    {ms, _} = :erlang.statistics(:runtime)
    ms * 1_000
  end

  defp poll_until(consumer, ends, batch, fun, at, {read, acc}) do
    if Enum.all?(ends, fn {p, e} -> at[p] >= e end) do
      {read, acc}
    else
      {:ok, entries, positions, []} = Native.consumer_poll(consumer, batch, 100, 16_777_216)
      acc = fun.(entries, acc)
      at = Enum.reduce(positions, at, fn {p, o}, acc -> Map.put(acc, p, o) end)
      poll_until(consumer, ends, batch, fun, at, {read + length(entries), acc})
    end
  end

  @doc "The anchors' insert: each entry decoded as the story's apply does, into an ETS table."
  def ets_insert(tab) do
    fn entries ->
      rows =
        for {_id, {:kafka_record, <<k::32>>, <<v::64>>, _h, _ts, _p, _o}} <- entries, do: {k, v}

      :ets.insert(tab, rows)
    end
  end

  ## The price catalogue

  @doc """
  A price as a record: key = its idx as text, value = the payload of
  PriceCatalogue.Entry.fields/1 (the CSV columns joined by tabs), the encoding
  the Redis Stream replica's bench uses: 171 bytes a price on average
  against 418 for :erlang.term_to_binary/1, and no slower to decode.
  """
  def price_record(price) do
    ["price", payload] = PriceCatalogue.Entry.fields(price)
    {Integer.to_string(price.idx), payload}
  end

  @doc """
  The replica's apply for prices: a tombstone deletes the key's idx;
  otherwise PriceCatalogue.Entry.decode/1 decodes the payload
  (raising on a payload of another shape) and the key must be its idx.
  """
  def price_apply({:kafka_record, key, nil, _headers, _ts, _p, _o}),
    do: {:delete, String.to_integer(key)}

  def price_apply({:kafka_record, key, value, _headers, _ts, _p, _o}) do
    {:insert, price} = op = PriceCatalogue.Entry.decode(%{"price" => value})

    if Integer.to_string(price.idx) != key,
      do: raise(ArgumentError, "price: key #{inspect(key)} is not its idx #{price.idx}")

    op
  end

  @doc "A random price of `prices` (a tuple) with a new value."
  defdelegate change(prices), to: PriceCatalogue.Changes, as: :random

  @doc """
  A steady producer: price changes of `prices` (a tuple) at `rate` records
  per second, a batch handed to librdkafka every 10 ms (sent after its
  5 ms linger), for `duration_ms`, then flushed. Returns the number of
  records acknowledged. (A flush after each batch held the producer for up
  to 100 ms, see `await_ack/2`, and it fell behind its rate.)
  """
  def produce_steadily(producer, topic, prices, rate, duration_ms) do
    PriceCatalogue.Changes.paced(rate, duration_ms, fn n ->
      records = for _ <- 1..n, do: price_record(change(prices))

      :ok =
        Native.produce_batch(producer, topic, Enum.map(records, fn {k, v} -> {-1, k, v, []} end))
    end)

    {:ok, acks} = Native.producer_flush(producer, @timeout)
    length(acks)
  end

  @doc """
  The lag of `replica` (following `topic` into the table `table`), sampled
  until `deadline` (monotonic ms): every 5 ms a price change of `prices`
  with a value no price has is produced and flushed (`producer`, no
  linger), its acknowledgement waited for (`await_ack/2`), then the record
  waited for with `Larder.Replica.await/3` on its partition's offset and
  searched for (`Larder.Test.Prices.visible/3`; retried every
  millisecond if not found yet). Returns `[{from_produce_us,
  from_ack_us}]`: from before the produce call, and from the broker's
  acknowledgement, to the search that found it.
  """
  def marker_lags(producer, topic, replica, table, prices, deadline, acc \\ []) do
    if System.monotonic_time(:millisecond) >= deadline do
      acc
    else
      price = change(prices)
      marker = %{price | value: 2_000_000 + System.unique_integer([:positive])}
      {key, value} = price_record(marker)
      started = System.monotonic_time(:microsecond)
      :ok = Native.produce(producer, topic, -1, key, value, [])
      {{p, o}, acked} = await_ack(producer, started + 60_000_000)
      :ok = Larder.Replica.await(replica, %{p => o + 1}, 60_000)
      Larder.Test.Prices.visible(table, marker, started)
      done = System.monotonic_time(:microsecond)
      Process.sleep(5)

      marker_lags(producer, topic, replica, table, prices, deadline, [
        {done - started, done - acked} | acc
      ])
    end
  end

  @doc """
  Waits for the acknowledgement of the one record `producer` has in
  flight; returns `{{partition, offset}, monotonic_us}` when it came.

  Flushes of 1 ms in a loop: each returns the acknowledgement as soon as
  its delivery report is served, and one that times out keeps it for the
  next (`producer_flush/2` also returns as soon as the last record is
  acknowledged, so one longer flush would take the same moment).
  """
  def await_ack(producer, deadline_us) do
    case Native.producer_flush(producer, 1) do
      {:ok, [ack]} ->
        {ack, System.monotonic_time(:microsecond)}

      _not_yet ->
        if System.monotonic_time(:microsecond) > deadline_us, do: raise("no acknowledgement")
        await_ack(producer, deadline_us)
    end
  end
end
