defmodule Larder.Replica.KafkaSourceTest do
  # Larder.Replica.Kafka's callbacks on their own: options, positions, and
  # read/4 and latest/2 against a real broker (trims, the position's
  # partitions and topic id, an unreachable broker). The replica over this
  # source is tested in test/larder/replica/kafka_test.exs.
  use ExUnit.Case, async: true

  alias Larder.Kafka.Native
  alias Larder.Replica.Kafka

  describe "validate!/1" do
    test "takes brokers as strings or tuples and fills the defaults" do
      opts = Kafka.validate!(brokers: ["b1:9092", {"b2", 9093}, {~c"::1", 9094}], topic: "t.x-1")

      assert opts[:brokers] == ["b1:9092", "b2:9093", "[::1]:9094"]
      assert opts[:isolation_level] == :read_committed
      assert opts[:tls] == false
      assert opts[:sasl] == nil
      assert opts[:client_id] == "larder"
    end

    test "TLS and SASL become librdkafka's settings" do
      opts =
        Kafka.validate!(
          brokers: ["b:9093"],
          topic: "t",
          tls: [cacertfile: "/etc/ssl/certs/ca-certificates.crt", verify: false],
          sasl: {:scram_sha_512, "user", "secret"},
          isolation_level: :read_uncommitted
        )

      config = Map.new(Kafka.librdkafka_config(opts))
      assert config["security.protocol"] == "sasl_ssl"
      assert config["sasl.mechanism"] == "SCRAM-SHA-512"
      assert config["sasl.username"] == "user"
      assert config["ssl.ca.location"] == "/etc/ssl/certs/ca-certificates.crt"
      assert config["enable.ssl.certificate.verification"] == "false"
      assert config["isolation.level"] == "read_uncommitted"

      plain =
        Map.new(Kafka.librdkafka_config(Kafka.validate!(brokers: ["b:1"], topic: "t", tls: true)))

      assert plain["security.protocol"] == "ssl"
      assert plain["enable.ssl.certificate.verification"] == "true"
    end

    test "librdkafka takes the options at both ends of their bounds" do
      for extra <- [
            [fetch_max_bytes: 1_048_576, max_partition_fetch_bytes: 1_024, queued_max_kbytes: 64],
            [
              fetch_max_bytes: 268_435_456,
              max_partition_fetch_bytes: 268_435_456,
              queued_max_kbytes: 1_048_576,
              max_record_bytes: 1_073_741_824,
              timeout: 600_000
            ],
            [tls: true, sasl: {:scram_sha_512, "u", "p"}, isolation_level: :read_uncommitted],
            [tls: [verify: false], sasl: {:plain, "u", "p"}]
          ] do
        opts = Kafka.validate!([brokers: ["127.0.0.1:1"], topic: "t"] ++ extra)

        assert {:ok, consumer} = Native.consumer_open(Kafka.librdkafka_config(opts)),
               inspect(extra)

        Native.consumer_close(consumer)
      end
    end

    test "rejects bad options with an ArgumentError naming them" do
      good = [brokers: ["127.0.0.1:9092"], topic: "t"]

      for {key, value} <- [
            brokers: [],
            brokers: "127.0.0.1:9092",
            brokers: ["127.0.0.1"],
            brokers: ["127.0.0.1:0"],
            brokers: ["127.0.0.1:65536"],
            brokers: ["host:port"],
            brokers: [{"h", "9092"}],
            brokers: [{"", 9092}],
            brokers: [{"h,evil=1", 9092}],
            brokers: List.duplicate("h:1", 101),
            topic: "a b",
            topic: "",
            topic: String.duplicate("t", 250),
            topic: :t,
            client_id: "",
            tls: "yes",
            tls: [verify: :maybe],
            tls: [cacertfile: 1],
            tls: [cacertfile: "a\0b"],
            tls: [ciphers: "x"],
            tls: [cacertfile: "/no/such/ca.pem"],
            sasl: {:gssapi, "u", "p"},
            sasl: {:plain, "u"},
            sasl: {:plain, "u", :p},
            sasl: {:plain, String.duplicate("u", 1_025), "p"},
            sasl: {:plain, "u", ""},
            isolation_level: :serializable,
            fetch_max_bytes: 0,
            fetch_max_bytes: 1_024,
            fetch_max_bytes: 2 ** 40,
            max_partition_fetch_bytes: 1,
            queued_max_kbytes: 2 ** 30,
            max_record_bytes: 10,
            timeout: 0,
            timeout: :infinity
          ] do
        error =
          assert_raise ArgumentError, fn -> Kafka.validate!(Keyword.put(good, key, value)) end

        assert error.message =~ inspect(key), "#{inspect({key, value})}: #{error.message}"
      end

      assert_raise ArgumentError, ~r/unknown/, fn -> Kafka.validate!([librdkafka: []] ++ good) end
      assert_raise ArgumentError, ~r/:topic/, fn -> Kafka.validate!(brokers: ["h:1"]) end
      assert_raise ArgumentError, fn -> Kafka.validate!(:nope) end
    end
  end

  describe "positions" do
    test "cast_position/1 takes partition offsets and a topic id, nothing else" do
      assert Kafka.cast_position(%{}) == {:ok, %{}}

      assert Kafka.cast_position(%{0 => 5, 3 => 0, topic_id: "abc"}) ==
               {:ok, %{0 => 5, 3 => 0, topic_id: "abc"}}

      for bad <- [
            nil,
            [{0, 1}],
            %{0 => -1},
            %{-1 => 0},
            %{"0" => 1},
            %{0 => 1.0},
            %{0 => 2 ** 63},
            %{(2 ** 31) => 0},
            %{topic_id: 1},
            %{topic_id: ""},
            %{other: "x"}
          ] do
        assert Kafka.cast_position(bad) == :error, inspect(bad)
      end
    end

    test "advance/2 and reached?/2 work per partition" do
      assert Kafka.advance(%{0 => 3}, {1, 7}) == %{0 => 3, 1 => 8}
      assert Kafka.advance(%{0 => 3, topic_id: "x"}, {0, 3}) == %{0 => 4, topic_id: "x"}

      assert Kafka.reached?(%{0 => 5, 1 => 2}, %{0 => 5, 1 => 2})
      refute Kafka.reached?(%{0 => 5, 1 => 1}, %{0 => 5, 1 => 2})
      # A partition absent from the position is at its start.
      assert Kafka.reached?(%{}, %{0 => 0})
      refute Kafka.reached?(%{}, %{0 => 1})
      assert Kafka.reached?(%{0 => 1, topic_id: "x"}, %{0 => 1})
      # The log's end below what was read: the log went backwards.
      refute Kafka.reached?(%{0 => 3}, %{0 => 5, topic_id: "y"})
    end
  end
end

defmodule Larder.Replica.KafkaSourceBrokerTest do
  # Larder.Replica.Kafka's read/4 and latest/2 against a real broker, and
  # the Source contract's conformance suite (on a topic of three
  # partitions per test; a trim is kafka-delete-records).
  use ExUnit.Case, async: false

  import Larder.Replica.Kafka, only: [kafka_record: 2]
  use Larder.Test.SourceConformance, source: Larder.Replica.Kafka

  @moduletag :kafka

  alias Larder.Kafka.Native
  alias Larder.Replica.Kafka

  setup_all do
    broker = Larder.Test.KafkaSetup.start()
    bootstrap = Larder.Test.KafkaBroker.bootstrap(broker)
    {:ok, admin} = Native.admin_open([{"bootstrap.servers", bootstrap}])
    {:ok, producer} = Native.producer_open([{"bootstrap.servers", bootstrap}])
    %{bootstrap: bootstrap, admin: admin, producer: producer}
  end

  setup do
    %{topic: "src-#{System.unique_integer([:positive])}"}
  end

  # The conformance suite's log: a topic of its own, of three partitions,
  # written to in turn.
  setup ctx do
    if ctx[:describe] == "Larder.Replica.Source conformance",
      do: conformance(ctx),
      else: :ok
  end

  defp conformance(ctx) do
    topic = "conf-#{System.unique_integer([:positive])}"
    :ok = Native.create_topic(ctx.admin, topic, 3, [], 60_000)
    opts = [brokers: [ctx.bootstrap], topic: topic]
    readable!(Kafka.validate!(opts), 100)
    counter = :counters.new(1, [])

    %{
      source_opts: opts,
      bad_opts: [
        [brokers: [], topic: topic],
        [brokers: [ctx.bootstrap], topic: "a topic"],
        [topic: topic]
      ],
      append: fn values ->
        records =
          for value <- values do
            :counters.add(counter, 1, 1)
            {rem(:counters.get(counter, 1), 3), nil, value, []}
          end

        :ok = Native.produce_batch(ctx.producer, topic, records)
        {:ok, _acks} = Native.producer_flush(ctx.producer, 60_000)
        :ok
      end,
      value: fn {:kafka_record, _key, value, _headers, _ts, _p, _o} -> value end,
      part: fn {partition, _offset} -> partition end,
      trim: fn ->
        {:ok, ends} = Kafka.latest(Kafka.validate!(opts), 30_000)
        offsets = for {p, high} <- ends, is_integer(p), high > 0, do: {p, high - 1}
        {:ok, _} = Native.delete_records(ctx.admin, topic, offsets, 60_000)
        :ok
      end
    }
  end

  defp create!(ctx, partitions) do
    :ok = Native.create_topic(ctx.admin, ctx.topic, partitions, [], 60_000)
  end

  defp produce!(ctx, records) do
    :ok = Native.produce_batch(ctx.producer, ctx.topic, records)
    {:ok, acks} = Native.producer_flush(ctx.producer, 60_000)
    acks
  end

  # A topic just created may not have its partitions' leaders yet (its
  # metadata or watermarks then fail for a moment): waits until its end is
  # read and a read from its start answers, as a replica's would after a
  # retry.
  defp readable!(opts, tries) do
    ready =
      with {:ok, ends} when map_size(ends) == 3 <- Kafka.latest(opts, 5_000),
           {:ok, conn} <- Kafka.connect(opts) do
        result = Kafka.read(conn, %{}, 1, 100)
        Kafka.close(conn)
        match?({:ok, _, _, _}, result)
      else
        _ -> false
      end

    cond do
      ready ->
        :ok

      tries > 0 ->
        Process.sleep(100)
        readable!(opts, tries - 1)

      true ->
        flunk("the topic #{opts[:topic]} never became readable")
    end
  end

  defp opts(ctx, extra \\ []),
    do: Kafka.validate!([brokers: [ctx.bootstrap], topic: ctx.topic] ++ extra)

  # Reads until the position reaches `target`: {entries, position, conn}.
  defp read_to(conn, position, target, acc \\ [], tries \\ 300) do
    if Kafka.reached?(position, target) or tries == 0 do
      {Enum.reverse(acc), position, conn}
    else
      case Kafka.read(conn, position, 500, 200) do
        {:ok, entries, position, conn} ->
          read_to(conn, position, target, Enum.reverse(entries, acc), tries - 1)

        other ->
          flunk("read returned #{inspect(other)}")
      end
    end
  end

  test "a read from the origin fills in every partition and the topic id", ctx do
    create!(ctx, 3)
    produce!(ctx, for(i <- 1..20, do: {rem(i, 2), "k#{i}", "v#{i}", []}))
    opts = opts(ctx)
    assert {:ok, latest} = Kafka.latest(opts, 30_000)
    assert latest == %{0 => 10, 1 => 10, 2 => 0}

    {:ok, conn} = Kafka.connect(opts)
    # The first read already holds every partition (the empty one too).
    assert {:ok, _entries, first, conn} = Kafka.read(conn, Kafka.origin(opts), 5, 5_000)
    assert Enum.sort(for {p, _} <- first, is_integer(p), do: p) == [0, 1, 2]
    assert is_binary(first[:topic_id])

    {entries, position, conn} = read_to(conn, Kafka.origin(opts), latest)
    assert length(entries) == 20
    assert Map.delete(position, :topic_id) == latest

    assert Enum.all?(entries, fn {{p, o}, f} ->
             kafka_record(f, :partition) == p and kafka_record(f, :offset) == o and
               kafka_record(f, :value) =~ "v"
           end)

    # Folding advance/2 over the entries reaches the same position.
    folded =
      Enum.reduce(entries, Map.take(first, [2, :topic_id]), fn {id, _}, acc ->
        Kafka.advance(acc, id)
      end)

    assert Kafka.reached?(folded, latest)
    Kafka.close(conn)
  end

  test "latest/2 is the high watermark past an open transaction, which read/4 waits out",
       ctx do
    create!(ctx, 2)
    produce!(ctx, [{0, nil, "before", []}, {1, nil, "before", []}])

    {:ok, txn} =
      Native.producer_open([
        {"bootstrap.servers", ctx.bootstrap},
        {"transactional.id", "src-#{ctx.topic}"},
        {"transaction.timeout.ms", "600000"}
      ])

    :ok = Native.producer_transaction(txn, :init, 60_000)
    :ok = Native.producer_transaction(txn, :begin, 60_000)
    :ok = Native.produce_batch(txn, ctx.topic, [{0, nil, "txn", []}, {1, nil, "txn", []}])
    {:ok, _} = Native.producer_flush(txn, 60_000)
    # Acknowledged after the transaction's first offset (1 in each partition).
    acks = produce!(ctx, for(p <- [0, 1], _ <- 1..3, do: {p, nil, "after", []}))
    assert Enum.sort(acks) == for(p <- [0, 1], o <- 2..4, do: {p, o})

    # The default, read_committed: the end is still every acknowledged record's.
    opts = opts(ctx)
    assert Kafka.latest(opts, 30_000) == {:ok, %{0 => 5, 1 => 5}}

    # The reader stops at the last stable offset, the transaction's first.
    {:ok, conn} = Kafka.connect(opts)
    {entries, position, conn} = read_to(conn, %{}, %{0 => 1, 1 => 1})
    assert Enum.map(entries, fn {_, f} -> kafka_record(f, :value) end) == ["before", "before"]
    assert {:ok, [], ^position, conn} = Kafka.read(conn, position, 10, 500)
    refute Kafka.reached?(position, %{0 => 5, 1 => 5})

    # Committed, it reads on, past the commit markers to the end.
    :ok = Native.producer_transaction(txn, :commit, 60_000)
    {rest, position, conn} = read_to(conn, position, %{0 => 6, 1 => 6})

    assert Enum.frequencies(Enum.map(rest, fn {_, f} -> kafka_record(f, :value) end)) == %{
             "txn" => 2,
             "after" => 6
           }

    assert Map.take(position, [0, 1]) == %{0 => 6, 1 => 6}
    Kafka.close(conn)
    Native.producer_close(txn)
  end

  test "records deleted past the position are a trim that resumes from the start", ctx do
    create!(ctx, 2)
    produce!(ctx, for(i <- 1..10, do: {0, nil, "#{i}", []}))
    opts = opts(ctx)
    {:ok, conn} = Kafka.connect(opts)
    {:ok, latest} = Kafka.latest(opts, 30_000)
    {_entries, position, conn} = read_to(conn, %{}, latest)
    Kafka.close(conn)

    stored = Map.put(position, 0, 4)
    {:ok, [{0, 6}]} = Native.delete_records(ctx.admin, ctx.topic, [{0, 6}], 60_000)
    {:ok, conn} = Kafka.connect(opts)
    assert {:trimmed, %{}, conn} = Kafka.read(conn, stored, 10, 1_000)
    # From the resume position the rest reads on, topic id and all.
    assert {:ok, first, resumed, conn} = Kafka.read(conn, %{}, 10, 1_000)
    assert resumed[:topic_id] == position[:topic_id]
    {rest, _, conn} = read_to(conn, resumed, latest)
    assert Enum.map(first ++ rest, fn {id, _} -> id end) == for(o <- 6..9, do: {0, o})
    Kafka.close(conn)
  end

  test "a topic created again is a trim; partitions added are a stop", ctx do
    create!(ctx, 2)
    produce!(ctx, for(i <- 1..4, do: {0, nil, "#{i}", []}))
    opts = opts(ctx)
    {:ok, conn} = Kafka.connect(opts)
    {:ok, _, position, conn} = Kafka.read(conn, %{}, 10, 1_000)
    id = position[:topic_id]
    Kafka.close(conn)

    # Another topic id than the stored one.
    {:ok, conn} = Kafka.connect(opts)

    assert {:trimmed, %{}, conn} =
             Kafka.read(conn, %{position | topic_id: "AAAAAAAAAAAAAAAAAAAAAA"}, 10, 1_000)

    # An offset above the partition's end (without an id to compare).
    assert {:trimmed, %{}, conn} = Kafka.read(conn, %{0 => 100, 1 => 0}, 10, 1_000)
    # A third partition added: no read nor rebuild can order a key's
    # records across two partitions.
    :ok = Native.create_partitions(ctx.admin, ctx.topic, 3, 60_000)
    Kafka.close(conn)
    {:ok, conn} = Kafka.connect(opts)

    assert wait_for(fn ->
             match?(
               {:stop, %Larder.Error{reason: :partitions_changed}, _},
               Kafka.read(conn, %{0 => 0, 1 => 0, topic_id: id}, 10, 100)
             )
           end)

    # (a position of the new topic's start reads on)
    assert {:ok, _, position, conn} = Kafka.read(conn, %{}, 10, 100)
    assert Map.take(position, [0, 1, 2]) |> map_size() == 3
    Kafka.close(conn)
  end

  test "a record over :max_record_bytes is skipped and its offset passed", ctx do
    create!(ctx, 1)

    produce!(ctx, [
      {0, "a", "small", []},
      {0, "b", :binary.copy("x", 5_000), []},
      {0, "c", "small", []}
    ])

    opts = opts(ctx, max_record_bytes: 1_024)
    {:ok, conn} = Kafka.connect(opts)

    {entries, position, conn} =
      ExUnit.CaptureLog.with_log(fn -> read_to(conn, %{}, %{0 => 3}) end) |> elem(0)

    assert Enum.map(entries, fn {id, _} -> id end) == [{0, 0}, {0, 2}]
    assert position[0] == 3
    Kafka.close(conn)
  end

  test "an unreachable broker is :source_unavailable, never a raise", ctx do
    port = Larder.Test.FreePort.get()
    opts = Kafka.validate!(brokers: ["127.0.0.1:#{port}"], topic: ctx.topic, timeout: 500)
    assert {:ok, conn} = Kafka.connect(opts)

    assert {:error, %Larder.Error{reason: :source_unavailable}, conn} =
             Kafka.read(conn, %{}, 10, 100)

    assert Kafka.close(conn) == :ok
    assert {:error, %Larder.Error{reason: :source_unavailable}} = Kafka.latest(opts, 500)
  end

  test "TLS or SASL to the PLAINTEXT broker, and a dead port: errors that name their cause",
       ctx do
    create!(ctx, 1)
    dead = "127.0.0.1:#{Larder.Test.FreePort.get()}"

    cases = [
      {[tls: true], ctx.bootstrap, :tls_to_plaintext, :source_failed, ~r/PLAINTEXT.*check :tls/},
      {[tls: true, sasl: {:plain, "u", "p"}], ctx.bootstrap, :tls_to_plaintext, :source_failed,
       ~r/PLAINTEXT.*check :tls/},
      {[sasl: {:scram_sha_256, "u", "p"}], ctx.bootstrap, :sasl_to_plaintext, :source_failed,
       ~r/without SASL.*check :sasl/},
      {[], dead, :connection_refused, :source_unavailable, ~r/connection refused.*:brokers/}
    ]

    hints =
      for {extra, broker, cause, reason, hint} <- cases do
        opts = Kafka.validate!([brokers: [broker], topic: ctx.topic, timeout: 3_000] ++ extra)
        {:ok, conn} = Kafka.connect(opts)

        assert {:error, %Larder.Error{} = read_error, conn} =
                 ExUnit.CaptureLog.with_log(fn -> Kafka.read(conn, %{}, 10, 100) end) |> elem(0)

        Kafka.close(conn)
        assert {:error, %Larder.Error{} = latest_error} = Kafka.latest(opts, 3_000)

        for error <- [read_error, latest_error] do
          message = Exception.message(error)
          assert %{reason: ^reason, details: %{cause: ^cause}} = error, message
          assert message =~ hint
          # (librdkafka's own words stay in the message and the details)
          assert message =~ "Broker transport failure"
          assert message =~ error.details.librdkafka
          refute error.details.librdkafka =~ "[thrd:"
        end

        read_error.message |> String.split(" (librdkafka: ") |> hd()
      end

    # What is left of each message without librdkafka's words differs.
    assert length(Enum.uniq(hints)) == 3
  end

  test "a topic that does not exist is :source_unavailable", ctx do
    opts = opts(ctx)
    {:ok, conn} = Kafka.connect(opts)

    assert {:error, %Larder.Error{reason: :source_unavailable}, conn} =
             Kafka.read(conn, %{}, 10, 100)

    Kafka.close(conn)
  end

  defp wait_for(fun, tries \\ 100) do
    cond do
      fun.() -> true
      tries == 0 -> false
      true -> Process.sleep(200) && wait_for(fun, tries - 1)
    end
  end
end
