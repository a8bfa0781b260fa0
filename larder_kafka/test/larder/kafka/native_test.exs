defmodule Larder.Kafka.NativeTest do
  # The Kafka NIF against a real broker: records, codecs, offsets, errors,
  # hostile arguments, and the schedulers its calls run on.
  use ExUnit.Case, async: false

  import Larder.Replica.Kafka, only: [kafka_record: 2]

  @moduletag :kafka

  alias Larder.Kafka.Native
  alias Larder.Test.KafkaBroker
  alias Larder.Test.KafkaSetup

  @timeout 60_000

  setup_all do
    broker = KafkaSetup.start()
    bootstrap = KafkaBroker.bootstrap(broker)
    {:ok, admin} = Native.admin_open([{"bootstrap.servers", bootstrap}])
    %{broker: broker, bootstrap: bootstrap, admin: admin}
  end

  setup do
    topic = "native-#{System.unique_integer([:positive])}"
    %{topic: topic}
  end

  defp create!(ctx, partitions, configs \\ []) do
    assert :ok = Native.create_topic(ctx.admin, ctx.topic, partitions, configs, @timeout)
    ctx.topic
  end

  defp producer!(ctx, config \\ []) do
    {:ok, producer} = Native.producer_open([{"bootstrap.servers", ctx.bootstrap} | config])
    producer
  end

  defp consumer!(ctx, config \\ []) do
    {:ok, consumer} = Native.consumer_open([{"bootstrap.servers", ctx.bootstrap} | config])
    consumer
  end

  # Polls until `n` records came (or the deadline), returning them and the
  # last positions seen.
  defp poll_n(consumer, n, deadline_ms \\ @timeout) do
    deadline = System.monotonic_time(:millisecond) + deadline_ms
    poll_n(consumer, n, deadline, [], [])
  end

  defp poll_n(consumer, n, deadline, acc, positions) do
    if length(acc) >= n or System.monotonic_time(:millisecond) > deadline do
      {Enum.reverse(acc), positions}
    else
      {:ok, entries, positions, []} = Native.consumer_poll(consumer, 1_000, 200, 1_048_576)
      poll_n(consumer, n, deadline, Enum.reverse(entries, acc), positions)
    end
  end

  # Polls until the positions reach `target` (a map), returning the positions.
  defp poll_until_positions(consumer, target, deadline_ms \\ @timeout) do
    deadline = System.monotonic_time(:millisecond) + deadline_ms

    Stream.repeatedly(fn -> Native.consumer_poll(consumer, 1_000, 200, 1_048_576) end)
    |> Enum.reduce_while(nil, fn {:ok, _entries, positions, _}, _ ->
      if Map.new(positions) == target or System.monotonic_time(:millisecond) > deadline,
        do: {:halt, Map.new(positions)},
        else: {:cont, nil}
    end)
  end

  test "records round trip with keys, values, tombstones, headers and positions", ctx do
    topic = create!(ctx, 3)
    producer = producer!(ctx)

    records =
      for i <- 0..29 do
        key = if rem(i, 7) == 6, do: nil, else: "k#{i}"
        value = if rem(i, 5) == 4, do: nil, else: :binary.copy("v#{i}", i)
        headers = if rem(i, 2) == 0, do: [{"h", "#{i}"}, {"empty", nil}], else: []
        {rem(i, 3), key, value, headers}
      end

    :ok = Native.produce_batch(producer, topic, records)
    assert {:ok, acks} = Native.producer_flush(producer, @timeout)
    assert length(acks) == 30
    assert Enum.sort(acks) == for(p <- 0..2, o <- 0..9, do: {p, o})

    consumer = consumer!(ctx)
    assert :ok = Native.consumer_assign(consumer, topic, [{0, -1}, {1, -1}, {2, -1}])
    {entries, _} = poll_n(consumer, 30)
    assert length(entries) == 30

    for {{p, o}, record} <- entries do
      i = o * 3 + p
      {^p, key, value, headers} = Enum.at(records, i)
      assert {:kafka_record, ^key, ^value, ^headers, timestamp, ^p, ^o} = record
      assert is_integer(timestamp)
    end

    # Records of one partition come in offset order.
    for p <- 0..2 do
      offsets = for {{^p, o}, _} <- entries, do: o
      assert offsets == Enum.to_list(0..9)
    end

    assert poll_until_positions(consumer, %{0 => 10, 1 => 10, 2 => 10}) ==
             %{0 => 10, 1 => 10, 2 => 10}
  end

  for codec <- ~w(gzip snappy lz4 zstd) do
    test "records compressed with #{codec} are read back", ctx do
      topic = create!(ctx, 1)
      producer = producer!(ctx, [{"compression.type", unquote(codec)}, {"linger.ms", "50"}])
      values = for i <- 1..500, do: String.duplicate("#{unquote(codec)}-#{i}-", 20)
      :ok = Native.produce_batch(producer, topic, Enum.map(values, &{0, nil, &1, []}))
      assert {:ok, acks} = Native.producer_flush(producer, @timeout)
      assert length(acks) == 500

      consumer = consumer!(ctx)
      :ok = Native.consumer_assign(consumer, topic, [{0, -1}])
      {entries, _} = poll_n(consumer, 500)
      assert Enum.map(entries, fn {_, f} -> kafka_record(f, :value) end) == values
    end
  end

  test "watermarks, metadata and assigning at an offset", ctx do
    topic = create!(ctx, 2)
    producer = producer!(ctx)
    :ok = Native.produce_batch(producer, topic, for(i <- 0..9, do: {0, nil, "#{i}", []}))
    {:ok, _} = Native.producer_flush(producer, @timeout)

    consumer = consumer!(ctx)
    assert {:ok, {0, 10}} = Native.consumer_watermarks(consumer, topic, 0, @timeout)
    assert {:ok, {0, 0}} = Native.consumer_watermarks(consumer, topic, 1, @timeout)

    assert {:ok, %{partitions: [0, 1], topic_id: id}} =
             Native.consumer_metadata(consumer, topic, @timeout)

    assert is_binary(id) and byte_size(id) > 0

    :ok = Native.consumer_assign(consumer, topic, [{0, 6}, {1, 0}])
    {entries, _} = poll_n(consumer, 4)

    assert Enum.map(entries, fn {id, f} -> {id, kafka_record(f, :value)} end) ==
             for(o <- 6..9, do: {{0, o}, "#{o}"})

    # The empty partition's position is known from its end-of-partition event.
    assert poll_until_positions(consumer, %{0 => 10, 1 => 0}) == %{0 => 10, 1 => 0}

    # A topic that does not exist is an error value.
    assert {:error, {_code, _msg}} =
             Native.consumer_metadata(consumer, "no-such-topic-#{ctx.topic}", 5_000)
  end

  test "notify: one :larder_source_ready once a record comes into the empty queue, " <>
         ":ready when it is not empty",
       ctx do
    topic = create!(ctx, 2)
    producer = producer!(ctx)
    consumer = consumer!(ctx)
    :ok = Native.consumer_assign(consumer, topic, [{0, 0}, {1, 0}])
    # Both partitions' end events, then an empty queue.
    assert poll_until_positions(consumer, %{0 => 0, 1 => 0}) == %{0 => 0, 1 => 0}
    {:ok, [], _, []} = Native.consumer_poll(consumer, 1_000, 0, 1_048_576)

    assert Native.consumer_notify(consumer, self()) == :armed
    refute_receive :larder_source_ready, 200

    :ok = Native.produce_batch(producer, topic, [{1, "k", "v", []}])
    {:ok, _} = Native.producer_flush(producer, @timeout)
    assert_receive :larder_source_ready, @timeout
    # One notice per arm.
    refute_receive :larder_source_ready, 200

    # Not read yet: the queue holds the record, so no wait.
    assert Native.consumer_notify(consumer, self()) == :ready
    {entries, _} = poll_n(consumer, 1)
    assert [{{1, 0}, {:kafka_record, "k", "v", [], _, 1, 0}}] = entries

    # A closed consumer is an error value; a remote-looking pid an ArgumentError.
    :ok = Native.consumer_close(consumer)
    assert {:error, {:closed, _}} = Native.consumer_notify(consumer, self())
    assert_raise ArgumentError, ~r/pid/, fn -> Native.consumer_notify(consumer, :me) end
  end

  test "an offset out of range is reported with its partition", ctx do
    topic = create!(ctx, 2)
    producer = producer!(ctx)
    :ok = Native.produce_batch(producer, topic, for(i <- 0..9, do: {1, nil, "#{i}", []}))
    {:ok, _} = Native.producer_flush(producer, @timeout)
    assert {:ok, [{1, 5}]} = Native.delete_records(ctx.admin, topic, [{1, 5}], @timeout)

    consumer = consumer!(ctx)
    :ok = Native.consumer_assign(consumer, topic, [{0, 0}, {1, 2}])

    result =
      Enum.find_value(1..300, fn _ ->
        case Native.consumer_poll(consumer, 100, 200, 1_048_576) do
          {:ok, [], _, []} -> nil
          other -> other
        end
      end)

    assert {:error, {:offset_out_of_range, 1, message}} = result
    assert is_binary(message)
  end

  test "a record over the size cap is not copied, and its position passes", ctx do
    topic = create!(ctx, 1)
    producer = producer!(ctx)
    big = :binary.copy("x", 5_000)

    :ok =
      Native.produce_batch(producer, topic, [
        {0, "a", "small", []},
        {0, "b", big, []},
        {0, "c", "small", []}
      ])

    {:ok, _} = Native.producer_flush(producer, @timeout)

    consumer = consumer!(ctx)
    :ok = Native.consumer_assign(consumer, topic, [{0, 0}])

    {entries, oversize} =
      Enum.reduce_while(1..300, {[], []}, fn _, {es, os} ->
        {:ok, e, _pos, o} = Native.consumer_poll(consumer, 100, 200, 1_024)
        acc = {es ++ e, os ++ o}
        if length(elem(acc, 0)) + length(elem(acc, 1)) >= 3, do: {:halt, acc}, else: {:cont, acc}
      end)

    assert Enum.map(entries, fn {id, _} -> id end) == [{0, 0}, {0, 2}]
    assert [{0, 1, bytes}] = oversize
    assert bytes >= 5_000
  end

  # Flushes with `timeout_ms` until every one of `n` records was returned
  # (or the deadline): the acks of every flush that returned some.
  defp flush_all(producer, n, timeouts) do
    deadline = System.monotonic_time(:millisecond) + @timeout

    timeouts
    |> Stream.cycle()
    |> Enum.reduce_while([], fn timeout_ms, acc ->
      acc =
        case Native.producer_flush(producer, timeout_ms) do
          {:ok, acks} -> acc ++ acks
          {:error, {:operation_timed_out, _}} -> acc
        end

      if length(acc) >= n or System.monotonic_time(:millisecond) > deadline,
        do: {:halt, acc},
        else: {:cont, acc}
    end)
  end

  test "a flush with no time left returns the acks that already arrived", ctx do
    topic = create!(ctx, 1)
    producer = producer!(ctx)
    :ok = Native.produce(producer, topic, 0, "k", "v", [])

    # The broker has the record: its acknowledgement is on its way or here.
    consumer = consumer!(ctx)
    :ok = Native.consumer_assign(consumer, topic, [{0, 0}])
    assert {[_], _} = poll_n(consumer, 1)
    Native.consumer_close(consumer)

    # Only zero-time flushes: each must serve what arrived.
    assert flush_all(producer, 1, [0]) == [{0, 0}]
    assert Native.producer_flush(producer, 0) == {:ok, []}
  end

  test "no acknowledgement is lost across flushes that time out", ctx do
    topic = create!(ctx, 4)
    producer = producer!(ctx, [{"linger.ms", "20"}])
    records = for i <- 1..2_000, do: {rem(i, 4), "k#{i}", "v#{i}", []}
    :ok = Native.produce_batch(producer, topic, records)

    acks = flush_all(producer, 2_000, [0, 1, 0, 2])
    expected = for p <- 0..3, o <- 0..499, do: {p, o}
    assert Enum.sort(acks) == expected
    assert Native.producer_flush(producer, 0) == {:ok, []}
  end

  test "bad configuration and bad values are error values, never a crash", ctx do
    assert {:error, {:config, _}} = Native.consumer_open([{"no.such.setting", "1"}])
    assert {:error, {:config, _}} = Native.consumer_open([{"fetch.max.bytes", "lots"}])
    assert {:error, {:bad_arg, _}} = Native.consumer_open([{"client.id", "a\0b"}])
    assert {:error, {:bad_arg, _}} = Native.consumer_open([{<<255, 254>>, "x"}])
    assert {:error, {:config, _}} = Native.producer_open([{"acks", "sometimes"}])
    assert {:error, {:config, _}} = Native.admin_open([{"no.such.setting", "1"}])

    consumer = consumer!(ctx)
    assert {:error, {:bad_arg, _}} = Native.consumer_metadata(consumer, "bad topic!", 1_000)
    assert {:error, {:bad_arg, _}} = Native.consumer_metadata(consumer, "", 1_000)
    assert {:error, {:bad_arg, _}} = Native.consumer_assign(consumer, "t/x", [{0, 0}])
    assert :ok = Native.consumer_close(consumer)
    assert {:error, {:closed, _}} = Native.consumer_poll(consumer, 10, 0, 1_024)
    assert {:error, {:closed, _}} = Native.consumer_watermarks(consumer, "t", 0, 1_000)
    assert :ok = Native.consumer_close(consumer)

    producer = producer!(ctx)
    assert {:error, {:bad_arg, _}} = Native.produce(producer, "bad topic", -1, nil, "v", [])
    assert {:error, {:bad_arg, _}} = Native.produce(producer, "t", 0, nil, "v", [{<<255>>, nil}])
    assert {:error, {:bad_arg, _}} = Native.create_topic(ctx.admin, "bad topic", 1, [], 1_000)
  end

  test "arguments of the wrong type raise ArgumentError naming them", ctx do
    consumer = consumer!(ctx)
    {:ok, producer} = Native.producer_open([{"bootstrap.servers", ctx.bootstrap}])

    for {fun, message} <- [
          {fn -> Native.consumer_open(:nope) end, "config"},
          {fn -> Native.consumer_open([{"a", 1}]) end, "config"},
          {fn -> Native.consumer_open(Enum.map(1..300, &{"k#{&1}", "v"})) end, "config"},
          {fn -> Native.consumer_poll(:nope, 10, 0, 1024) end, "consumer"},
          {fn -> Native.consumer_failure(producer) end, "consumer"},
          {fn -> Native.consumer_poll(make_ref(), 10, 0, 1024) end, "consumer"},
          {fn -> Native.consumer_poll(producer, 10, 0, 1024) end, "consumer"},
          {fn -> Native.consumer_poll(consumer, 0, 0, 1024) end, "max"},
          {fn -> Native.consumer_poll(consumer, 100_001, 0, 1024) end, "max"},
          {fn -> Native.consumer_poll(consumer, 10, -1, 1024) end, "block_ms"},
          {fn -> Native.consumer_poll(consumer, 10, 0, 2 ** 40) end, "max_record_bytes"},
          {fn -> Native.consumer_assign(consumer, "t", [{0, -2}]) end, "offsets"},
          {fn -> Native.consumer_assign(consumer, "t", [{-1, 0}]) end, "offsets"},
          {fn -> Native.consumer_assign(consumer, "t", :all) end, "offsets"},
          {fn -> Native.consumer_assign(consumer, :t, [{0, 0}]) end, "topic"},
          {fn -> Native.consumer_watermarks(consumer, "t", 2 ** 31, 10) end, "partition"},
          {fn -> Native.consumer_metadata(consumer, "t", :infinity) end, "timeout_ms"},
          {fn -> Native.produce(producer, "t", 0, :key, "v", []) end, "record"},
          {fn -> Native.produce(producer, "t", 0, nil, "v", [{"h", 1}]) end, "record"},
          {fn -> Native.produce_batch(producer, "t", [:x]) end, "record"},
          {fn -> Native.producer_flush(consumer, 10) end, "producer"},
          {fn -> Native.producer_transaction(producer, :prepare, 10) end, "step"},
          {fn -> Native.producer_transaction(consumer, :begin, 10) end, "producer"},
          {fn -> Native.create_topic(ctx.admin, "t", 0, [], 10) end, "partitions"},
          {fn -> Native.delete_records(ctx.admin, "t", [{0, -1}], 10) end, "offsets"}
        ] do
      error = assert_raise ArgumentError, fun
      assert error.message =~ message
    end
  end

  test "a blocking poll holds a dirty I/O scheduler, not a normal one", ctx do
    topic = create!(ctx, 1)
    # Twice as many polls as normal schedulers, each waiting 10 s for a
    # record that never comes: on normal schedulers they would hold every
    # one of them and nothing else could run until they return.
    n = System.schedulers_online() * 2

    polls =
      for _ <- 1..n do
        consumer = consumer!(ctx)
        :ok = Native.consumer_assign(consumer, topic, [{0, 0}])
        # Waits out the end-of-partition event so the next poll blocks.
        _ = poll_until_positions(consumer, %{0 => 0})
        Task.async(fn -> Native.consumer_poll(consumer, 10, 10_000, 1_024) end)
      end

    Process.sleep(500)
    assert Enum.all?(polls, &(Task.yield(&1, 0) == nil)), "the polls did not block"
    # Work on the normal schedulers goes on while the polls block.
    assert Task.await(Task.async(fn -> Enum.sum(1..1_000) end), 8_000) == 500_500
    assert Enum.all?(polls, &(Task.yield(&1, 0) == nil)), "the polls returned before 10 s"

    for task <- polls, do: assert({:ok, [], [{0, 0}], []} = Task.await(task, @timeout))
  end
end
