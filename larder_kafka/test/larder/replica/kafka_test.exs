defmodule Larder.Replica.KafkaTest do
  # Replicas of Kafka topics on a real single-node Kafka 4 broker (KRaft,
  # test/support/kafka_broker.ex): convergence of several replicas to a
  # plain model, kills and restarts while a producer writes, the broker
  # SIGKILLed mid-read, a compacted topic after the cleaner ran, the four
  # codecs, partitions trimmed by delete-records, a topic deleted and
  # created again, poisoned records, and a snapshot of another topic.
  #
  # A key is always written to the same partition (as Kafka's own
  # partitioners do), so the plain model is the records folded in produce
  # order, which within a partition is offset order (the producer is
  # idempotent: a retry does not reorder).
  use ExUnit.Case, async: false

  import Larder.Replica.Kafka, only: [kafka_record: 1]

  alias Larder.Kafka.Native
  alias Larder.Replica
  alias Larder.Test.KafkaBroker
  alias Larder.Table
  alias Larder.Test.KafkaSetup

  @moduletag :kafka
  @moduletag :capture_log

  @timeout 60_000
  @await 120_000

  setup_all do
    # The broker looks for transactions past their timeout every 500 ms
    # (10 s by default), so that one a test leaves open is aborted soon
    # after its transaction.timeout.ms.
    broker =
      KafkaSetup.start(
        config: [{"transaction.abort.timed.out.transaction.cleanup.interval.ms", "500"}]
      )

    admin = admin!(broker)
    %{broker: broker, admin: admin}
  end

  setup ctx do
    # Random, not unique_integer/1: that is unique in this VM only, and other
    # VMs on the machine run these tests too. Not :rand either: ExUnit seeds
    # it alike in every test, so every test had the same directory, and a
    # replica of a finished test, stopping as its test process exits, could
    # write its last snapshot into the next test's.
    token = Base.encode16(:crypto.strong_rand_bytes(8), case: :lower)
    dir = Path.join(System.tmp_dir!(), "larder-kafka-replica-#{token}")

    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf(dir) end)
    %{dir: dir, topic: "replica-#{System.unique_integer([:positive])}", test_name: ctx.test}
  end

  ## Helpers

  defp admin!(broker) do
    {:ok, admin} = Native.admin_open([{"bootstrap.servers", KafkaBroker.bootstrap(broker)}])
    admin
  end

  defp producer!(broker, config \\ []) do
    {:ok, producer} =
      Native.producer_open(
        [
          {"bootstrap.servers", KafkaBroker.bootstrap(broker)},
          {"enable.idempotence", "true"},
          {"linger.ms", "5"}
        ] ++ config
      )

    producer
  end

  # A transactional producer, its transactions initialized.
  defp txn_producer!(broker, config) do
    id = "larder-test-#{Base.encode16(:crypto.strong_rand_bytes(6))}"
    producer = producer!(broker, [{"transactional.id", id} | config])
    :ok = Native.producer_transaction(producer, :init, @timeout)
    producer
  end

  defp create!(admin, topic, partitions, configs \\ []) do
    :ok = Native.create_topic(admin, topic, partitions, configs, @timeout)
  end

  defp name(ctx, what), do: :"#{ctx.test_name} #{what}"

  defp partition(key, partitions), do: :erlang.phash2(key, partitions)

  # Writes `records` ({key, value | nil}) to `topic` (each key to its
  # partition) and waits for the broker's acknowledgements.
  defp produce!(producer, topic, partitions, records) do
    for chunk <- Enum.chunk_every(records, 5_000) do
      :ok =
        Native.produce_batch(
          producer,
          topic,
          Enum.map(chunk, fn {k, v} -> {partition(k, partitions), k, v, []} end)
        )

      {:ok, _acks} = Native.producer_flush(producer, @timeout)
    end

    :ok
  end

  # Puts and tombstones of keys k1..k<keys>.
  defp random_records(n, keys) do
    for _ <- 1..n do
      key = "k#{:rand.uniform(keys)}"
      if :rand.uniform(6) == 1, do: {key, nil}, else: {key, "v#{:rand.uniform(1_000_000)}"}
    end
  end

  # The model of puts and tombstones: the last value of each key.
  defp model(records) do
    Enum.reduce(records, %{}, fn
      {k, nil}, acc -> Map.delete(acc, k)
      {k, v}, acc -> Map.put(acc, k, v)
    end)
  end

  # The model of increments: the sum of each key's values.
  defp sums(records) do
    Enum.reduce(records, %{}, fn {k, v}, acc ->
      Map.update(acc, k, String.to_integer(v), &(&1 + String.to_integer(v)))
    end)
  end

  def apply_record(kafka_record(key: k, value: nil)), do: {:delete, k}
  def apply_record(kafka_record(value: "poison")), do: raise("poisoned record")
  def apply_record(kafka_record(key: k, value: v)), do: {:insert, %{id: k, v: v}}

  # An increment per record: an entry applied twice, or lost, shows.
  def apply_increment(kafka_record(key: k, value: v), table) do
    n = String.to_integer(v)
    Table.update(table, k, %{id: k, v: n}, &%{&1 | v: &1.v + n})
  end

  defp opts(ctx, broker, extra) do
    Keyword.merge(
      [
        name: name(ctx, "r"),
        into: {Larder.Table, name: name(ctx, "t"), key: :id, index: [:v]},
        source:
          {Larder.Replica.Kafka, brokers: [KafkaBroker.bootstrap(broker)], topic: ctx.topic},
        apply: &__MODULE__.apply_record/1,
        batch_size: 500,
        block_ms: 100
      ],
      extra
    )
  end

  defp start!(opts) do
    {:ok, pid} = Replica.start_link(opts)
    pid
  end

  defp contents(table), do: table |> Table.stream() |> Map.new(&{&1.id, &1.v})

  ## Tests

  test "three replicas of one 8-partition topic converge to a plain model", ctx do
    create!(ctx.admin, ctx.topic, 8)
    producer = producer!(ctx.broker)
    before = random_records(3_000, 500)
    produce!(producer, ctx.topic, 8, before)

    replicas =
      for {i, batch} <- [{1, 1}, {2, 37}, {3, 1_000}] do
        opts(ctx, ctx.broker,
          name: name(ctx, "r#{i}"),
          into: {Larder.Table, name: name(ctx, "t#{i}"), key: :id, index: [:v]},
          batch_size: batch
        )
        |> start!()
      end

    # and more while they read
    later = random_records(2_000, 500)
    produce!(producer, ctx.topic, 8, later)
    model = model(before ++ later)

    for {replica, i} <- Enum.with_index(replicas, 1) do
      assert Replica.await(replica, :latest, @await) == :ok
      assert contents(name(ctx, "t#{i}")) == model
      assert map_size(Map.take(Replica.offset(replica), Enum.to_list(0..7))) == 8
    end
  end

  test "replicas killed and restarted at random points while a producer writes " <>
         "each equal the model afterwards",
       ctx do
    Process.flag(:trap_exit, true)
    create!(ctx.admin, ctx.topic, 4)
    producer = producer!(ctx.broker)
    records = for _ <- 1..6_000, do: {"k#{:rand.uniform(200)}", "#{:rand.uniform(9)}"}
    me = self()

    writer =
      spawn_link(fn ->
        for chunk <- Enum.chunk_every(records, 200) do
          produce!(producer, ctx.topic, 4, chunk)
          Process.sleep(20)
        end

        send(me, :produced)
      end)

    opts =
      for i <- 1..2 do
        opts(ctx, ctx.broker,
          name: name(ctx, "r#{i}"),
          into: {Larder.Table, name: name(ctx, "t#{i}"), key: :id, index: [:v]},
          apply: &__MODULE__.apply_increment/2,
          snapshot: Path.join(ctx.dir, "r#{i}.snap"),
          snapshot_every: 100,
          batch_size: 50
        )
      end

    pids = Enum.map(opts, &start!/1)

    {pids, from_snapshot} =
      Enum.reduce(1..12, {pids, 0}, fn _, {pids, from_snapshot} ->
        Process.sleep(200 + :rand.uniform(400))
        i = :rand.uniform(2) - 1
        victim = Enum.at(pids, i)
        Process.exit(victim, :kill)
        assert_receive {:EXIT, ^victim, :killed}, @timeout
        pid = start!(Enum.at(opts, i))
        resumed = Replica.offset(pid) != %{}
        {List.replace_at(pids, i, pid), from_snapshot + if(resumed, do: 1, else: 0)}
      end)

    assert_receive :produced, 300_000
    assert_receive {:EXIT, ^writer, :normal}, @timeout
    model = sums(records)

    for {pid, i} <- Enum.with_index(pids, 1) do
      assert Replica.await(pid, :latest, @await) == :ok
      assert contents(name(ctx, "t#{i}")) == model
    end

    assert from_snapshot > 0
  end

  test "the broker SIGKILLed and restarted mid-read: nothing lost, nothing applied twice", ctx do
    # A broker of its own: the restarted JVM belongs to this test's process.
    broker = KafkaSetup.start()
    admin = admin!(broker)
    create!(admin, ctx.topic, 4)
    producer = producer!(broker)
    records = for _ <- 1..40_000, do: {"k#{:rand.uniform(1_000)}", "#{:rand.uniform(9)}"}
    produce!(producer, ctx.topic, 4, records)
    Native.producer_close(producer)

    replica =
      start!(
        opts(ctx, broker,
          apply: &__MODULE__.apply_increment/2,
          batch_size: 200
        )
      )

    # Mid-read: some records applied, not all.
    Larder.Test.RedisServer.wait_until(@await, "the replica to apply records", fn ->
      Replica.offset(replica) |> Map.drop([:topic_id]) |> Map.values() |> Enum.sum() > 0
    end)

    :ok = KafkaBroker.kill(broker)
    at_kill = Replica.offset(replica) |> Map.drop([:topic_id]) |> Map.values() |> Enum.sum()
    # the scenario: the broker died while the replica had records left to read
    assert at_kill < length(records)
    Process.sleep(2_000)
    broker = KafkaBroker.restart(broker)

    assert Replica.await(replica, :latest, @await) == :ok
    assert contents(name(ctx, "t")) == sums(records)
    KafkaBroker.stop(broker)
  end

  test "a compacted topic with tombstones, after the log cleaner ran", ctx do
    create!(ctx.admin, ctx.topic, 2, [
      {"cleanup.policy", "compact"},
      {"segment.ms", "100"},
      {"min.cleanable.dirty.ratio", "0.01"},
      {"min.compaction.lag.ms", "0"},
      {"delete.retention.ms", "100"}
    ])

    producer = producer!(ctx.broker)
    records = random_records(3_000, 50)
    produce!(producer, ctx.topic, 2, records)

    # Segments roll on the next write after segment.ms; the cleaner then
    # compacts the closed ones. Records of other keys are written until
    # fewer records remain than the partitions' offsets.
    roll = for i <- 1..4, do: {"roll#{i}", "r"}

    Larder.Test.RedisServer.wait_until(@await, "the log cleaner to compact the topic", fn ->
      Process.sleep(500)
      produce!(producer, ctx.topic, 2, roll)
      {held, offsets} = count_records(ctx.broker, ctx.topic, 2)
      held < offsets
    end)

    replica = start!(opts(ctx, ctx.broker, []))
    assert Replica.await(replica, :latest, @await) == :ok
    assert contents(name(ctx, "t")) == model(records ++ roll)
  end

  # {records the topic holds, the sum of its partitions' high watermarks}.
  defp count_records(broker, topic, partitions) do
    {:ok, consumer} = Native.consumer_open([{"bootstrap.servers", KafkaBroker.bootstrap(broker)}])

    ends =
      for p <- 0..(partitions - 1), into: %{} do
        {:ok, {_low, high}} = Native.consumer_watermarks(consumer, topic, p, @timeout)
        {p, high}
      end

    :ok = Native.consumer_assign(consumer, topic, for(p <- 0..(partitions - 1), do: {p, 0}))
    held = poll_to(consumer, ends, 0, System.monotonic_time(:millisecond) + @timeout)
    Native.consumer_close(consumer)
    {held, Enum.sum(Map.values(ends))}
  end

  defp poll_to(consumer, ends, n, deadline) do
    {:ok, entries, positions, _errors} = Native.consumer_poll(consumer, 1_000, 200, 1_048_576)
    n = n + length(entries)
    positions = Map.new(positions)

    cond do
      Enum.all?(ends, fn {p, o} -> Map.get(positions, p, 0) >= o end) ->
        n

      System.monotonic_time(:millisecond) > deadline ->
        flunk("the consumer did not reach the end")

      true ->
        poll_to(consumer, ends, n, deadline)
    end
  end

  for codec <- ~w(gzip snappy lz4 zstd) do
    test "a topic written with #{codec} batches", ctx do
      create!(ctx.admin, ctx.topic, 3)

      producer =
        producer!(ctx.broker, [{"compression.type", unquote(codec)}, {"linger.ms", "50"}])

      records = for i <- 1..2_000, do: {"k#{rem(i, 300)}", :binary.copy("v#{i}", 20)}
      produce!(producer, ctx.topic, 3, records)

      replica = start!(opts(ctx, ctx.broker, []))
      assert Replica.await(replica, :latest, @await) == :ok
      assert contents(name(ctx, "t")) == model(records)
    end
  end

  describe "await(:latest) and a transaction open when it is called" do
    # A transaction in each partition, open, and records of a plain producer
    # acknowledged after its first offset: under read_committed the replica
    # cannot read past that offset (the partition's last stable offset)
    # until the transaction ends, and await(:latest) is for every record
    # acknowledged before the call.
    setup ctx do
      create!(ctx.admin, ctx.topic, 2)
      plain = producer!(ctx.broker)
      before = for i <- 1..20, do: {"b#{i}", "v#{i}"}
      in_txn = for i <- 1..10, do: {"t#{i}", "v#{i}"}
      later = for i <- 1..10, do: {"a#{i}", "v#{i}"}
      produce!(plain, ctx.topic, 2, before)
      %{plain: plain, before: before, in_txn: in_txn, later: later}
    end

    # Opens a transaction, writes `in_txn` in it (both partitions) and then
    # `later` outside it; returns the transactional producer and the time
    # before the transaction began.
    defp open_transaction(ctx, config) do
      txn = txn_producer!(ctx.broker, config)
      began = System.monotonic_time(:millisecond)
      :ok = Native.producer_transaction(txn, :begin, @timeout)
      produce!(txn, ctx.topic, 2, ctx.in_txn)
      assert Enum.sort(Enum.uniq(for {k, _} <- ctx.in_txn, do: partition(k, 2))) == [0, 1]
      produce!(ctx.plain, ctx.topic, 2, ctx.later)
      {txn, began}
    end

    test "waits for the commit, then holds every record acknowledged before the call", ctx do
      {txn, _began} = open_transaction(ctx, [{"transaction.timeout.ms", "600000"}])
      replica = start!(opts(ctx, ctx.broker, []))

      # What precedes the transaction is read...
      Larder.Test.RedisServer.wait_until(@await, "the records before the transaction", fn ->
        contents(name(ctx, "t")) == model(ctx.before)
      end)

      # ... and the transaction holds the rest back: :latest is not reached
      # while it is open (for 10 minutes at most, its timeout).
      assert {:error, %Larder.Error{reason: :timeout}} = Replica.await(replica, :latest, 2_000)

      assert contents(name(ctx, "t")) == model(ctx.before)

      table = name(ctx, "t")

      waiter =
        Task.async(fn ->
          result = Replica.await(replica, :latest, @await)
          {result, contents(table)}
        end)

      :ok = Native.producer_transaction(txn, :commit, @timeout)

      assert Task.await(waiter, @await + 5_000) ==
               {:ok, model(ctx.before ++ ctx.in_txn ++ ctx.later)}
    end

    test "a producer that died inside it: :ok only once the broker aborted it, " <>
           "with the records acknowledged after it",
         ctx do
      txn_timeout = 10_000
      {txn, began} = open_transaction(ctx, [{"transaction.timeout.ms", "#{txn_timeout}"}])
      # Closed with the transaction open: neither a commit nor an abort is
      # sent, as when the producer's process dies.
      :ok = Native.producer_close(txn)
      replica = start!(opts(ctx, ctx.broker, []))
      expected = model(ctx.before ++ ctx.later)
      deadline = System.monotonic_time(:millisecond) + @await

      # Each call waits 1 s. The broker aborts the transaction no sooner
      # than transaction.timeout.ms after it began: an :ok before that would
      # be an :ok without the records acknowledged after the transaction.
      Stream.repeatedly(fn ->
        result = Replica.await(replica, :latest, 1_000)
        {result, System.monotonic_time(:millisecond), contents(name(ctx, "t"))}
      end)
      |> Enum.find(fn
        {:ok, at, contents} ->
          assert at - began >= txn_timeout
          assert contents == expected
          true

        {{:error, %Larder.Error{reason: :timeout}}, at, _contents} ->
          assert at < deadline, "the aborted transaction never let the replica through"
          false

        {other, _at, _contents} ->
          flunk("await(:latest) returned #{inspect(other)}")
      end)
    end
  end

  describe "a partition trimmed past the snapshot with delete-records" do
    setup ctx do
      create!(ctx.admin, ctx.topic, 2)
      producer = producer!(ctx.broker)
      first = for i <- 1..200, do: {"k#{i}", "a#{i}"}
      produce!(producer, ctx.topic, 2, first)
      path = Path.join(ctx.dir, "trim.snap")
      replica = start!(opts(ctx, ctx.broker, snapshot: path))
      assert Replica.await(replica, :latest, @await) == :ok
      :ok = Replica.drop(replica)

      # Partition 0 gets records the replica never read, and loses them.
      lost = for {k, _} <- first, partition(k, 2) == 0, do: {k, nil}
      produce!(producer, ctx.topic, 2, lost)
      ends = KafkaBroker.offsets(ctx.broker, ctx.topic, :latest)
      {:ok, _} = Native.delete_records(ctx.admin, ctx.topic, [{0, ends[0]}], @timeout)
      left = for {k, v} <- first, partition(k, 2) == 1, do: {k, v}
      %{path: path, left: left}
    end

    test "on_trimmed: :stop stops the replica with :offset_trimmed", ctx do
      Process.flag(:trap_exit, true)
      replica = start!(opts(ctx, ctx.broker, snapshot: ctx.path))

      assert_receive {:EXIT, ^replica, {:shutdown, %Larder.Error{reason: :offset_trimmed}}},
                     @timeout
    end

    test "on_trimmed: :rebuild reads what every partition still holds", ctx do
      replica = start!(opts(ctx, ctx.broker, snapshot: ctx.path, on_trimmed: :rebuild))
      assert Replica.await(replica, :latest, @await) == :ok
      assert contents(name(ctx, "t")) == model(ctx.left)
    end
  end

  describe "a topic deleted and created again" do
    setup ctx do
      create!(ctx.admin, ctx.topic, 2)
      producer = producer!(ctx.broker)
      produce!(producer, ctx.topic, 2, for(i <- 1..300, do: {"k#{i}", "old#{i}"}))
      path = Path.join(ctx.dir, "recreated.snap")
      replica = start!(opts(ctx, ctx.broker, snapshot: path))
      assert Replica.await(replica, :latest, @await) == :ok
      :ok = Replica.drop(replica)

      :ok = Native.delete_topic(ctx.admin, ctx.topic, @timeout)

      # The deletion completes in the background: create until it is taken.
      Larder.Test.RedisServer.wait_until(@await, "the topic to be created again", fn ->
        Native.create_topic(ctx.admin, ctx.topic, 2, [], @timeout) == :ok
      end)

      fresh = for i <- 1..20, do: {"n#{i}", "new#{i}"}
      produce!(producer, ctx.topic, 2, fresh)
      %{path: path, fresh: fresh}
    end

    test "on_trimmed: :stop stops the replica with :offset_trimmed", ctx do
      Process.flag(:trap_exit, true)
      replica = start!(opts(ctx, ctx.broker, snapshot: ctx.path))

      assert_receive {:EXIT, ^replica, {:shutdown, %Larder.Error{reason: :offset_trimmed}}},
                     @await
    end

    test "on_trimmed: :rebuild holds the new topic's records only", ctx do
      replica = start!(opts(ctx, ctx.broker, snapshot: ctx.path, on_trimmed: :rebuild))
      assert Replica.await(replica, :latest, @await) == :ok
      assert contents(name(ctx, "t")) == model(ctx.fresh)
    end
  end

  describe "partitions added to the topic" do
    # Keys are spread by the partition count (as Kafka's partitioners do):
    # after the change a key's new records may be in another partition than
    # its earlier ones, and no read or rebuild can order the two.
    setup ctx do
      create!(ctx.admin, ctx.topic, 2)
      producer = producer!(ctx.broker)
      first = for i <- 1..200, do: {"k#{i}", "a#{i}"}
      produce!(producer, ctx.topic, 2, first)
      %{producer: producer, first: first}
    end

    defp add_partition_and_write(ctx) do
      :ok = Native.create_partitions(ctx.admin, ctx.topic, 3, @timeout)
      later = for i <- 1..200, do: {"k#{i}", "b#{i}"}

      # A producer that knows the third partition (a new one, once the
      # broker's metadata lists it).
      Larder.Test.RedisServer.wait_until(@await, "a producer to write to partition 2", fn ->
        producer = producer!(ctx.broker)

        written =
          Native.produce(producer, ctx.topic, 2, "probe", "p", []) == :ok and
            match?({:ok, _}, Native.producer_flush(producer, 5_000))

        Native.producer_close(producer)
        written
      end)

      produce!(producer!(ctx.broker), ctx.topic, 3, later)
      # (the scenario: some keys moved)
      assert Enum.any?(later, fn {k, _} -> partition(k, 3) != partition(k, 2) end)
    end

    test "while replicas read: they stop with :partitions_changed, :rebuild too, " <>
           "and a caller waiting gets that error",
         ctx do
      replicas =
        for on_trimmed <- [:stop, :rebuild] do
          opts =
            opts(ctx, ctx.broker,
              name: name(ctx, "r #{on_trimmed}"),
              into: {Larder.Table, name: name(ctx, "t #{on_trimmed}"), key: :id},
              on_trimmed: on_trimmed
            )

          pid = start_supervised!({Replica, opts}, id: on_trimmed)
          assert Replica.await(pid, :latest, @await) == :ok
          ref = Process.monitor(pid)
          # Plain processes wait for an offset no replica reaches.
          waiter = Task.async(fn -> Replica.await(pid, %{0 => 1_000_000_000}, @await) end)
          {pid, ref, waiter}
        end

      # The metadata check every 30 s finds the third partition.
      add_partition_and_write(ctx)

      for {pid, ref, waiter} <- replicas do
        assert {:error, %Larder.Error{reason: :partitions_changed} = error} =
                 Task.await(waiter, @await + 5_000)

        assert error.details.partitions == 3
        assert error.details.position_partitions == 2
        assert Exception.message(error) =~ "on_trimmed"

        assert_receive {:DOWN, ^ref, :process, ^pid,
                        {:shutdown, %Larder.Error{reason: :partitions_changed}}},
                       @await
      end
    end

    test "after a restart from an earlier snapshot: a stop, :rebuild too", ctx do
      path = Path.join(ctx.dir, "partitions.snap")
      opts = opts(ctx, ctx.broker, snapshot: path, on_trimmed: :rebuild)
      replica = start!(opts)
      assert Replica.await(replica, :latest, @await) == :ok
      :ok = Replica.drop(replica)

      add_partition_and_write(ctx)

      for _ <- 1..2 do
        pid = start_supervised!({Replica, opts}, restart: :temporary)
        ref = Process.monitor(pid)

        assert_receive {:DOWN, ^ref, :process, ^pid,
                        {:shutdown, %Larder.Error{reason: :partitions_changed}}},
                       @await
      end
    end
  end

  describe "a poisoned record" do
    setup ctx do
      create!(ctx.admin, ctx.topic, 1)
      producer = producer!(ctx.broker)
      records = [{"a", "1"}, {"b", "2"}, {"c", "poison"}, {"d", "4"}]
      produce!(producer, ctx.topic, 1, records)
      %{records: records}
    end

    test "on_error: :stop stops the replica after the records before it", ctx do
      Process.flag(:trap_exit, true)
      replica = start!(opts(ctx, ctx.broker, []))

      assert_receive {:EXIT, ^replica,
                      {:shutdown, %Larder.Error{reason: :apply_failed, details: %{id: {0, 2}}}}},
                     @await
    end

    test "on_error: :skip skips it and applies the rest", ctx do
      replica = start!(opts(ctx, ctx.broker, on_error: :skip))
      assert Replica.await(replica, :latest, @await) == :ok
      assert contents(name(ctx, "t")) == %{"a" => "1", "b" => "2", "d" => "4"}
    end
  end

  test "a snapshot of another topic is refused", ctx do
    create!(ctx.admin, ctx.topic, 1)
    other = ctx.topic <> "-other"
    create!(ctx.admin, other, 1)
    producer = producer!(ctx.broker)
    produce!(producer, ctx.topic, 1, [{"a", "1"}])

    path = Path.join(ctx.dir, "other.snap")
    replica = start!(opts(ctx, ctx.broker, snapshot: path))
    assert Replica.await(replica, :latest, @await) == :ok
    :ok = Replica.drop(replica)

    opts = opts(ctx, ctx.broker, snapshot: path)

    opts =
      Keyword.put(
        opts,
        :source,
        {Larder.Replica.Kafka, brokers: [KafkaBroker.bootstrap(ctx.broker)], topic: other}
      )

    assert {:error, %Larder.Error{reason: :snapshot_mismatch}} = Replica.start_link(opts)
  end
end
