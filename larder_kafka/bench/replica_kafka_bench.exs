# Larder.Replica.Kafka (issues 26 and 37), against a single-node Kafka 4
# broker (KRaft) this script starts on free loopback ports from the jars
# scripts/setup fetched (test/support/kafka_broker.ex; it does nothing, with
# a message, when Java or the jars are missing). Topics are filled through
# the Kafka NIF's producer (lz4 batches, acks=all), see
# bench/support/kafka_load.ex for the record encodings:
#   * a price: key = its idx as text, value = its CSV columns joined by tabs
#     (PriceCatalogue.Entry's payload, as the core's bench/replica_bench.exs sends it
#     to Redis); the apply decodes it with PriceCatalogue.Entry.decode/1;
#   * the story: key = <<key::32>>, value = <<n::64>> (the record's number),
#     decoded to integers by the apply and by the anchors' loop alike.
#
# Every reader of a topic here reads at the replica's fetch settings (its
# default options' librdkafka configuration, Larder.Replica.Kafka's
# librdkafka_config/1, which KafkaLoad.consumer_config/1 returns; Java's
# consumer at the same fetch sizes, wait and isolation level, see
# bench/support/anchors.ex). Each section runs its contenders in
# interleaved rounds (round i starts with the i-th column, so a change of
# the machine's load hits every column alike) and prints the load average
# before and after. A contender that opens a consumer (the NIF loops, C,
# Java) is timed from the consumer's creation to its last record, the
# close excluded (the C and Java programs time themselves: a JVM's start
# is not counted, its class loading and JIT warm-up are, a fresh JVM each
# round); a replica from start_link/1 to await(:latest); the floors from
# memory; setup and teardown (an empty table's creation before a floor or
# insert_many/2, its drop, the replica's kill) are not timed. Each timed
# call runs in a process of its own, whose heap holds only its own work.
# Each table has a second row, the CPU time over the same span: the OS
# process's, every thread (the VM's: its schedulers, their busy wait, and
# librdkafka's threads; the JVM's: its compiler and collector). Measured,
# each against anchors of the same run:
#   * the story's sync at start-up: 1M records over 10k keys (about 100
#     distinct values per key) from an 8-partition topic.
#       - Drained, no structure: librdkafka alone (a C program built from
#         the NIF crate's own librdkafka, bench/support/librdkafka_drain.c:
#         each record's bytes summed), Larder's NIF consumer polled 1,000
#         records at a time (the raw loop: the replica's read, no apply,
#         no structure), Java's KafkaConsumer (bench/support/KafkaDrain.java:
#         each record's bytes summed). Target: the raw loop within 1.3x of
#         C.
#       - Into a structure: the floor, the records already in memory
#         exactly as the NIF hands them to the apply (read once with the
#         NIF consumer before the rounds), decoded by the story's apply and
#         inserted with Larder.Bag.insert_many/2 in batches of 1,000; the
#         NIF loop into an ETS :duplicate_bag and an ETS :bag; Java's
#         KafkaConsumer into a HashMap of lists; the replica into a
#         Larder.Bag, start_link/1 to await(:latest). Targets: the replica
#         within 1.25x of the floor, at least 684k records/s (4x the
#         171k/s of a Kafka Streams GlobalKTable restore measured for issue
#         37), within 1.5x of the :duplicate_bag loop, at least 5x faster
#         than the :bag loop;
#   * catch-up from zero: the 487,200-price catalogue (../shared/data, or
#     CATALOGUE_DIR; the generated catalogue of the same shape when absent)
#     from an 8-partition topic into a `store:` Table, start_link/1 to
#     await(:latest), against the floor (the records in memory as the NIF
#     read them, decoded by the same KafkaLoad.price_apply/1, then one
#     Larder.Table.insert_many/2, in a process whose heap starts large
#     enough for the decoded catalogue: a floor pays for no heap growth),
#     insert_many/2 of the catalogue's prices
#     (already decoded, in idx order), librdkafka alone and Java's
#     KafkaConsumer into a HashMap (key text to value bytes, not decoded).
#     Targets: within 1.3x of the floor, within 1.5x of insert_many/2, at
#     least 300k records/s;
#   * restart from a snapshot of the whole catalogue, then 10,000 new
#     records: start_link/1 to await(:latest). Target: 0.5 s;
#   * lag under a producer of 10,000 records/s (a batch every 10 ms, each
#     flushed): a marker price change produced every 5 ms by a producer of
#     its own (no linger, Nagle off) and flushed, timed from the flush's
#     return (the broker's acknowledgement) and from before the produce,
#     until a search finds it (after Replica.await/3 on its partition's
#     offset); with no snapshot, and with a snapshot (a dump of the whole
#     catalogue) begun every second. Target: p99 from the acknowledgement
#     20 ms, in both;
#   * the broker SIGKILLed mid-catch-up of the story's topic into a Bag (an
#     apply that counts its calls), restarted on the same data: the records
#     lost (pairs missing from the Bag, against the produced model), the
#     records applied twice (calls beyond the record count), and the time
#     from the restarted broker answering a metadata request to the
#     replica's offset reaching the topic's end (and, to tell a slow
#     resumption from the rest of the catch-up, to its first batch applied
#     after that). This replica prefetches
#     64 KiB (:queued_max_kbytes, the least), with 64 KiB partition
#     fetches: by default librdkafka would have fetched the whole topic
#     before the kill.
#
#   mix run bench/replica_kafka_bench.exs [--quick] [--json PATH] [SECTION...]
#
# SECTIONs (story, catch_up, restart, lag, kill) run only those (the topics
# are filled all the same); without any, all of them.
# --quick: 50,000 prices, a 200,000-record story over 2,000 keys, one round
# each, a 2 s producer. Where cc, javac or the Kafka jars are missing, the
# C or Java anchor is left out, with a line saying why.

defmodule Larder.ReplicaKafkaBench do
  alias Larder.{Bag, Bench, Replica, Table}
  alias Larder.Bench.{Anchors, KafkaLoad}
  alias Larder.Test.KafkaBroker
  alias Larder.Test.Prices

  @store [:idx, :spec, :value, :currency, :is_default]
  @prices "prices"
  @story "story"
  @partitions 8
  # Prices the lag's producer changes, and as many the probe changes.
  @sample 10_000
  @rate 10_000

  def run(argv) do
    bench = Bench.start("Larder.Replica: a Table or Bag fed from a Kafka topic", argv)

    if KafkaBroker.available?() do
      {us, broker} = :timer.tc(fn -> KafkaBroker.start() end)
      IO.puts("\nKafka broker started in #{Bench.fmt_us(us)} (#{KafkaBroker.bootstrap(broker)})")
      dir = Path.join(System.tmp_dir!(), "larder-replica-kafka-bench-#{System.pid()}")
      File.mkdir_p!(dir)
      # The kill scenario restarts the broker: its handle changes.
      Process.put(:broker, broker)

      try do
        measure(bench, broker, dir)
      after
        KafkaBroker.stop(Process.get(:broker))
        File.rm_rf(dir)
      end
    else
      IO.puts(
        "\nJava or the Kafka jars are missing (run scripts/setup; jars in " <>
          "#{KafkaBroker.home()}/libs): nothing to measure."
      )
    end
  end

  defp measure(bench, broker, dir) do
    bootstrap = KafkaBroker.bootstrap(broker)
    admin = KafkaLoad.admin!(bootstrap)
    producer = KafkaLoad.producer!(bootstrap)

    {source, prices, _requests} = PriceCatalogue.reference_or_generated()
    prices = Enum.take(prices, Bench.pick(bench, 50_000, length(prices)))
    KafkaLoad.create_topic!(admin, @prices, @partitions)

    {us, _} =
      :timer.tc(fn ->
        KafkaLoad.fill!(producer, @prices, Enum.map(prices, &KafkaLoad.price_record/1))
      end)

    IO.puts(
      "#{length(prices)} prices of #{source} produced to #{@partitions} partitions in " <>
        "#{Bench.fmt_us(us)} (#{round(length(prices) * 1_000_000 / us)} records/s)"
    )

    {n, keys} = Bench.pick(bench, {200_000, 2_000}, {1_000_000, 10_000})
    story = KafkaLoad.story_records(n, keys)
    KafkaLoad.create_topic!(admin, @story, @partitions)
    {us, story_ends} = :timer.tc(fn -> KafkaLoad.fill!(producer, @story, story) end)

    IO.puts(
      "story: #{n} records over #{keys} keys produced in #{Bench.fmt_us(us)} " <>
        "(#{round(n * 1_000_000 / us)} records/s)"
    )

    ctx = %{
      c_drain: anchor(Anchors.c_drain(), "librdkafka alone (C)"),
      java_drain: anchor(Anchors.java_drain(), "Java's KafkaConsumer"),
      bootstrap: bootstrap,
      producer: producer,
      prices: prices,
      story: story,
      story_ends: story_ends,
      keys: keys,
      dir: dir
    }

    # Sections named on the command line, else all of them.
    sections = [
      catch_up: &catch_up/2,
      story: &story_sync/2,
      restart: &restart/2,
      lag: &lag/2,
      kill: &broker_kill/2
    ]

    only = Enum.map(bench.argv, &String.to_atom/1)

    sections
    |> Enum.filter(fn {name, _} -> only == [] or name in only end)
    |> Enum.reduce(bench, fn {_name, section}, bench -> section.(bench, ctx) end)
    |> Bench.finish()
  end

  # An outside anchor's program, or nil: its columns are left out, with a
  # line saying why.
  defp anchor({:ok, drain}, _what), do: drain

  defp anchor({:error, why}, what) do
    IO.puts("#{what}: anchor skipped (#{why})")
    nil
  end

  defp source(ctx, topic), do: {Larder.Replica.Kafka, brokers: [ctx.bootstrap], topic: topic}

  defp price_opts(ctx, extra \\ []) do
    Keyword.merge(
      [
        name: :bench_replica,
        into: {Table, Prices.table_opts(name: :bench_prices, store: @store)},
        source: source(ctx, @prices),
        apply: &KafkaLoad.price_apply/1
      ],
      extra
    )
  end

  defp start!(opts) do
    {:ok, pid} = Replica.start_link(opts)
    Process.unlink(pid)
    pid
  end

  # The replica as a column: started, awaited to the log's end, its
  # structure's size (`size.()`) checked against `n`; killed after the
  # timed run.
  defp replica_column(opts, size, n) do
    %{
      run: fn _ ->
        pid = start!(opts)
        :ok = Replica.await(pid, :latest, :infinity)
        ^n = size.()
        pid
      end,
      teardown: fn _, pid -> kill(pid) end
    }
  end

  defp kill(pid) do
    ref = Process.monitor(pid)
    Process.exit(pid, :kill)
    receive do: ({:DOWN, ^ref, _, _, _} -> :ok)
  end

  def catch_up(bench, ctx) do
    n = length(ctx.prices)
    title = "Catch-up from zero: #{n} prices from #{@partitions} partitions into a store: Table"
    label = "#{n} records"
    floor = "floor: decode + insert_many/2"
    anchor = "Table.insert_many/2"
    c = "librdkafka alone (C)"
    java = "Java into a HashMap"
    col = "Replica, start to await(:latest)"

    # The records as the NIF hands them to the apply, read once. The
    # columns' functions hold nothing larger than a few terms: each runs in
    # a process of its own, spawned within its time, and a term held in
    # :persistent_term is not copied there.
    records = Bench.off_heap(:prices_floor, read_records(ctx, @prices, n))
    prices = Bench.off_heap(:prices, ctx.prices)
    opts = price_opts(ctx)

    columns = [
      {floor,
       %{
         setup: fn -> Table.new(Prices.table_opts(store: @store)) end,
         # A floor: its process starts with a heap that holds the decoded
         # catalogue (about 80 words a price) and the binaries it refers to,
         # so it does not pay for growing its heap by copying collections,
         # which the replica, working in batches of 1,000, never does.
         spawn_opts: [min_heap_size: 100 * n, min_bin_vheap_size: 100_000_000],
         run: fn table ->
           prices =
             Enum.map(records, fn record ->
               {:insert, price} = KafkaLoad.price_apply(record)
               price
             end)

           :ok = Table.insert_many(table, prices)
         end,
         teardown: fn table, _ -> Table.drop(table) end
       }},
      {anchor,
       %{
         setup: fn -> Table.new(Prices.table_opts(store: @store)) end,
         run: fn table -> :ok = Table.insert_many(table, prices) end,
         teardown: fn table, _ -> Table.drop(table) end
       }},
      c_column(ctx, c, @prices, n),
      java_column(ctx, java, "map", @prices, n),
      {col, replica_column(opts, fn -> Table.size(:bench_prices) end, n)}
    ]

    results = rounds(columns, Bench.pick(bench, 1, 3), n)
    Bench.release_off_heap()

    bench =
      bench
      |> Bench.table(title, [floor, anchor, c, java, col], per_op: true)
      |> Bench.row(label, walls(results))
      |> Bench.row("CPU time", cpus(results))

    result = Bench.result(bench, title, label, col)
    insert_many = Bench.result(bench, title, label, anchor)

    bench
    |> Bench.target("catch-up from zero (records/s)", result.ops_per_s, :>=, 300_000)
    |> Bench.target(
      "catch-up / floor: decode + one insert_many/2 (x)",
      Bench.ratio(bench, title, label, col),
      :<=,
      1.3
    )
    |> Bench.target(
      "catch-up / insert_many/2 of the same records (x)",
      result.median_us / insert_many.median_us,
      :<=,
      1.5
    )
  end

  def story_sync(bench, ctx) do
    n = length(ctx.story)
    drained = "The story drained: #{n} records from #{@partitions} partitions, no structure"
    title = "The story's sync: #{n} records over #{ctx.keys} keys from #{@partitions} partitions"
    c = "librdkafka alone (C)"
    raw = "NIF loop, no apply"
    java = "Java KafkaConsumer"
    floor = "floor: decode + Bag.insert_many"
    dup = "ETS :duplicate_bag"
    bag = "ETS :bag"
    java_map = "Java into a HashMap of lists"
    col = "Replica into a Larder.Bag"
    label = "start to every partition's end"

    # The records as the NIF hands them to the apply, read once, in
    # batches of 1,000 (off the heap, as in catch_up/2).
    chunks =
      Bench.off_heap(:story_floor, ctx |> read_records(@story, n) |> Enum.chunk_every(1_000))

    bootstrap = ctx.bootstrap
    source = source(ctx, @story)

    ets = fn type ->
      %{
        setup: fn -> :ets.new(:story, [type, :public]) end,
        run: fn tab ->
          %{records: ^n} = report = KafkaLoad.drain(bootstrap, @story, 1_000, nil, ets_fold(tab))

          report
        end,
        teardown: fn tab, _ -> :ets.delete(tab) end
      }
    end

    columns = [
      c_column(ctx, c, @story, n),
      {raw,
       %{
         run: fn _ ->
           %{records: ^n} =
             report = KafkaLoad.drain(bootstrap, @story, 1_000, nil, fn _, nil -> nil end)

           report
         end
       }},
      java_column(ctx, java, "drain", @story, n),
      {floor,
       %{
         setup: fn -> Bag.new() end,
         run: fn b ->
           Enum.each(chunks, fn chunk ->
             Bag.insert_many(
               b,
               Enum.map(chunk, fn record ->
                 {:insert, k, v} = KafkaLoad.story_apply(record)
                 {k, v}
               end)
             )
           end)

           ^n = Bag.size(b)
         end,
         teardown: fn b, _ -> Bag.drop(b) end
       }},
      {dup, ets.(:duplicate_bag)},
      {bag, ets.(:bag)},
      java_column(ctx, java_map, "story", @story, n),
      {col,
       replica_column(
         [
           name: :bench_story,
           into: {Bag, name: :bench_story_bag},
           source: source,
           apply: &KafkaLoad.story_apply/1
         ],
         fn -> Bag.size(:bench_story_bag) end,
         n
       )}
    ]

    results = rounds(columns, Bench.pick(bench, 1, 3), n)
    Bench.release_off_heap()

    bench =
      bench
      |> Bench.table(drained, [c, raw, java])
      |> Bench.row(label, walls(results))
      |> Bench.row("CPU time", cpus(results))
      |> Bench.table(title, [floor, dup, bag, java_map, col])
      |> Bench.row(label, walls(results))
      |> Bench.row("CPU time", cpus(results))

    replica = Bench.result(bench, title, label, col)
    dup_us = Bench.result(bench, title, label, dup).median_us
    bag_us = Bench.result(bench, title, label, bag).median_us

    bench
    |> Bench.target(
      "story drain: NIF loop / librdkafka alone (x)",
      Bench.ratio(bench, drained, label, raw),
      :<=,
      1.3
    )
    |> Bench.target(
      "story sync: Replica into a Bag / floor (x)",
      Bench.ratio(bench, title, label, col),
      :<=,
      1.25
    )
    |> Bench.target("story sync (records/s)", replica.ops_per_s, :>=, 684_000)
    |> Bench.target(
      "story sync: ETS :bag / Replica into a Bag (x faster)",
      bag_us / replica.median_us,
      :>=,
      5
    )
    |> Bench.target(
      "story sync: Replica into a Bag / ETS :duplicate_bag (x)",
      replica.median_us / dup_us,
      :<=,
      1.5
    )
  end

  # The story's decode into an ETS table, as the NIF loop's fold.
  defp ets_fold(tab) do
    insert = KafkaLoad.ets_insert(tab)

    fn entries, nil ->
      insert.(entries)
      nil
    end
  end

  # Every record of `topic` (n of them) as the NIF consumer hands them to
  # an apply, read once before the timed rounds.
  defp read_records(ctx, topic, n) do
    %{records: ^n, acc: polls} =
      KafkaLoad.drain(ctx.bootstrap, topic, 1_000, [], fn entries, acc ->
        [Enum.map(entries, fn {_id, record} -> record end) | acc]
      end)

    polls |> Enum.reverse() |> Enum.concat()
  end

  # The C drain of `topic` as a column, or nothing (the anchor skipped,
  # said once when the run started).
  defp c_column(%{c_drain: nil}, _name, _topic, _n), do: []

  defp c_column(ctx, name, topic, n) do
    exe = ctx.c_drain
    config = KafkaLoad.consumer_config(ctx.bootstrap)
    {name, %{run: fn _ -> drained(Anchors.run_c(exe, topic, config), name, n) end}}
  end

  defp java_column(%{java_drain: nil}, _name, _mode, _topic, _n), do: []

  defp java_column(ctx, name, mode, topic, n) do
    java = ctx.java_drain
    config = KafkaLoad.consumer_config(ctx.bootstrap)
    {name, %{run: fn _ -> drained(Anchors.run_java(java, mode, topic, config), name, n) end}}
  end

  defp drained(%{records: n} = report, _name, n), do: report
  defp drained(%{records: read}, name, n), do: raise("#{name} read #{read} of #{n} records")

  # Runs `columns` ([{name, column}], nested lists flattened) in `runs`
  # interleaved rounds (round i starts with the i-th column) and returns
  # `%{name => {wall, cpu}}`, each summarized over `ops` records. A column
  # is a map: `:run` (`state -> returned`), timed; `:setup` (`-> state`)
  # and `:teardown` (`state, returned -> any`), untimed. A `:run` that
  # returns a report (`%{wall_us:, cpu_us:}`: a contender that times
  # itself, from its consumer's creation to its last record) is taken at
  # its word; otherwise the call's wall time, and the VM's CPU time over
  # it, are the sample. `:run` runs in a process of its own: in this one,
  # each collection would copy the topics' records that it holds.
  defp rounds(columns, runs, ops) do
    columns = List.flatten(columns)
    IO.puts("\nload average before: #{load_average()}")

    samples =
      for round <- 0..(runs - 1), {name, column} <- rotate(columns, round) do
        {name, sample(column)}
      end

    IO.puts("load average after: #{load_average()}")

    Map.new(columns, fn {name, _} ->
      mine = for {^name, sample} <- samples, do: sample

      {name,
       {Bench.summarize(Enum.map(mine, & &1.wall_us), ops, 1),
        Bench.summarize(Enum.map(mine, & &1.cpu_us), ops, 1)}}
    end)
  end

  defp sample(column) do
    state = if setup = column[:setup], do: setup.()
    :erlang.garbage_collect()
    cpu0 = KafkaLoad.cpu_us()
    t0 = System.monotonic_time(:microsecond)
    returned = Bench.in_process(fn -> column.run.(state) end, column[:spawn_opts] || [])
    wall = System.monotonic_time(:microsecond) - t0
    cpu = KafkaLoad.cpu_us() - cpu0
    if teardown = column[:teardown], do: teardown.(state, returned)

    case returned do
      %{wall_us: wall, cpu_us: cpu} -> %{wall_us: wall, cpu_us: cpu}
      _ -> %{wall_us: wall, cpu_us: cpu}
    end
  end

  defp rotate(list, n) do
    {front, back} = Enum.split(list, rem(n, length(list)))
    back ++ front
  end

  defp walls(results), do: Map.new(results, fn {name, {wall, _cpu}} -> {name, wall} end)
  defp cpus(results), do: Map.new(results, fn {name, {_wall, cpu}} -> {name, cpu} end)

  defp load_average do
    case File.read("/proc/loadavg") do
      {:ok, text} -> text |> String.split(" ") |> Enum.take(3) |> Enum.join(" ")
      {:error, _} -> "unknown"
    end
  end

  def restart(bench, ctx) do
    path = Path.join(ctx.dir, "prices.snap")
    title = "Restart from a snapshot of #{length(ctx.prices)} prices, then 10,000 new records"
    col = "start_link/1 to await(:latest)"
    prices = List.to_tuple(ctx.prices)
    snapshot_opts = price_opts(ctx, snapshot: path, snapshot_every: 86_400_000)

    # The snapshot covers the whole topic; then 10,000 records are added.
    setup = fn ->
      pid = start!(snapshot_opts)
      :ok = Replica.await(pid, :latest, :infinity)
      {:ok, _} = Replica.dump(pid)
      kill(pid)
      changes = for _ <- 1..10_000, do: KafkaLoad.price_record(KafkaLoad.change(prices))
      KafkaLoad.fill!(ctx.producer, @prices, changes)
      :ok
    end

    timed = fn _ ->
      pid = start!(snapshot_opts)
      :ok = Replica.await(pid, :latest, :infinity)
      kill(pid)
    end

    bench =
      bench
      |> Bench.table(title, [col])
      |> Bench.row("restart", %{col => timed},
        setup: setup,
        runs: Bench.pick(bench, 1, 5),
        warmup: 0
      )

    result = Bench.result(bench, title, "restart", col)

    Bench.target(
      bench,
      "restart + 10k records, ready (s)",
      result.median_us / 1_000_000,
      :<=,
      0.5
    )
  end

  def lag(bench, ctx) do
    duration = Bench.pick(bench, 2_000, 10_000)
    title = "Lag to a search, under a producer of #{@rate} records/s"
    from_ack = "ack to visible"
    from_produce = "produce to visible"
    # Two disjoint samples, the producer's and the markers' (see
    # bench/replica_bench.exs: a process holding the whole catalogue stalls
    # a scheduler at each collection; a change to a marker's price would
    # hide it).
    {prices, markers} = ctx.prices |> Enum.take_random(2 * @sample) |> Enum.split(@sample)
    {prices, markers} = {List.to_tuple(prices), List.to_tuple(markers)}
    pid = start!(price_opts(ctx))
    :ok = Replica.await(pid, :latest, :infinity)
    steady = KafkaLoad.producer!(ctx.bootstrap)
    probe_producer = KafkaLoad.producer!(ctx.bootstrap, KafkaLoad.probe_config())

    producer =
      Task.async(fn -> KafkaLoad.produce_steadily(steady, @prices, prices, @rate, duration) end)

    deadline = System.monotonic_time(:millisecond) + duration

    probe =
      Task.async(fn ->
        KafkaLoad.marker_lags(probe_producer, @prices, pid, :bench_prices, markers, deadline)
      end)

    samples = Task.await(probe, duration + 60_000)
    sent = Task.await(producer, duration + 60_000)
    kill(pid)

    IO.puts("\n#{sent} records produced in #{duration} ms; #{length(samples)} markers timed")
    ack = Bench.summarize(Enum.map(samples, &elem(&1, 1)), nil, 1)
    produce = Bench.summarize(Enum.map(samples, &elem(&1, 0)), nil, 1)

    bench =
      bench
      |> Bench.table(title, [from_ack, from_produce])
      |> Bench.row("median / p99 over the markers", %{from_ack => ack, from_produce => produce})

    Bench.target(
      bench,
      "lag p99 from the ack at #{@rate} records/s (ms)",
      ack.p99_us / 1_000,
      :<=,
      20
    )
  end

  def broker_kill(bench, ctx) do
    n = length(ctx.story)
    title = "Broker SIGKILLed and restarted mid-catch-up of #{n} records into a Bag"
    col = "replica"
    calls = :counters.new(1, [:write_concurrency])

    apply = fn fields ->
      :counters.add(calls, 1, 1)
      KafkaLoad.story_apply(fields)
    end

    # librdkafka prefetches up to :queued_max_kbytes per partition (16 MB
    # by default: the whole topic): with the smallest prefetch and fetches,
    # the replica still reads from the broker when it is killed.
    {Larder.Replica.Kafka, source_opts} = source(ctx, @story)

    small_fetches =
      source_opts ++
        [queued_max_kbytes: 64, max_partition_fetch_bytes: 65_536, fetch_max_bytes: 1_048_576]

    pid =
      start!(
        name: :bench_kill,
        into: {Bag, name: :bench_kill_bag},
        source: {Larder.Replica.Kafka, small_fetches},
        apply: apply
      )

    # Killed (KafkaBroker.restart/1 SIGKILLs it first) once a fifth of the
    # records is applied.
    applied_at_kill = wait_applied(pid, div(n, 5), 120_000)
    broker = KafkaBroker.restart(Process.get(:broker))
    Process.put(:broker, broker)
    answered = System.monotonic_time(:microsecond)
    applied_at_answer = pid |> Replica.offset() |> applied()
    resumed_us = wait_applied_over(pid, applied_at_answer, answered + 120_000_000) - answered
    :ok = Replica.await(pid, ctx.story_ends, 120_000)
    ready_us = System.monotonic_time(:microsecond) - answered

    model = Enum.group_by(ctx.story, fn {<<k::32>>, _} -> k end, fn {_, <<v::64>>} -> v end)

    lost =
      Enum.reduce(model, 0, fn {k, vs}, acc ->
        have = MapSet.new(Bag.lookup(:bench_kill_bag, k))
        acc + Enum.count(vs, &(not MapSet.member?(have, &1)))
      end)

    extra = Bag.size(:bench_kill_bag) - (n - lost)
    twice = :counters.get(calls, 1) - n
    kill(pid)

    IO.puts(
      "\nbroker killed after #{applied_at_kill} of #{n} records applied; restarted, " <>
        "answering with #{applied_at_answer} applied; " <>
        "applying again #{Bench.fmt_us(resumed_us)} later; " <>
        "#{:counters.get(calls, 1)} apply calls, #{lost} records missing, #{extra} pairs not in the model"
    )

    bench =
      bench
      |> Bench.table(title, [col])
      |> Bench.row("records lost", %{col => Bench.value(lost + extra, "records")})
      |> Bench.row("records applied twice", %{col => Bench.value(twice, "records")})
      |> Bench.row("broker answering to applying again", %{
        col => Bench.summarize([resumed_us], nil, 1)
      })
      |> Bench.row("broker answering to ready", %{col => Bench.summarize([ready_us], nil, 1)})

    bench
    |> Bench.target("broker kill: records lost", lost + extra, :<=, 0)
    |> Bench.target("broker kill: records applied twice", twice, :<=, 0)
    |> Bench.target(
      "broker kill: ready after the broker answers (s)",
      ready_us / 1_000_000,
      :<=,
      2
    )
  end

  # The number of records applied (the offsets' sum) once it is at least
  # `min` (or at the timeout).
  defp wait_applied(pid, min, timeout) do
    deadline = System.monotonic_time(:millisecond) + timeout

    Stream.repeatedly(fn ->
      applied = pid |> Replica.offset() |> applied()
      if applied < min, do: Process.sleep(5)
      applied
    end)
    |> Enum.find(fn applied ->
      applied >= min or System.monotonic_time(:millisecond) > deadline
    end)
  end

  # The monotonic time (us) when the replica's offsets pass `applied`.
  defp wait_applied_over(pid, applied, deadline_us) do
    now = System.monotonic_time(:microsecond)

    cond do
      applied(Replica.offset(pid)) > applied ->
        now

      now > deadline_us ->
        now

      true ->
        Process.sleep(2)
        wait_applied_over(pid, applied, deadline_us)
    end
  end

  defp applied(position) when is_map(position),
    do: for({p, o} <- position, is_integer(p), reduce: 0, do: (acc -> acc + o))

  defp applied(_), do: 0
end

Larder.ReplicaKafkaBench.run(System.argv())
