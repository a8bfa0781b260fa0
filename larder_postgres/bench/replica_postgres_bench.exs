# Larder.Replica.Postgres (issue 39), against a PostgreSQL server this
# script starts from Debian's packages on a free loopback port
# (test/support/postgres_server.ex: fsync off, synchronous_commit on, as
# a server that acknowledges a commit once its WAL is written; it does
# nothing, with a message, when PostgreSQL is not installed). The price
# catalogue is a table (bench/support/postgres_load.ex), filled by psql's
# \copy; the replica's apply decodes each row's text columns to a price
# (PostgresLoad.apply/1) into a `store:` Table with the catalogue's
# indexes (the core's test/support/prices.ex).
#
# Measured, each against an anchor of the same run:
#   * the initial copy: the 487,200-price catalogue (../shared/data, or
#     CATALOGUE_DIR; the generated catalogue of the same shape when absent)
#     into a `store:` Table, start_link/1 to await(:latest) (a new slot and
#     its snapshot each run), against decoding the same rows (the maps of
#     text the source hands over, already in memory) and
#     Larder.Table.insert_many/2 of the prices, in a process whose heap
#     starts large enough for the decoded catalogue (a floor pays for no
#     heap growth);
#   * a restart from a snapshot of the whole catalogue, then 10,000 price
#     changes committed while it was stopped: start_link/1 to
#     await(:latest);
#   * the lag under 5,000 committed changes a second (a transaction about
#     every 10 ms): a marker price change committed alone every 5 ms on a
#     connection of its own, timed from the commit's return, and from
#     before its statement, until a search finds it;
#   * the server SIGKILLed and restarted under 3 writers (each committing
#     one change at a time, a value no other change gives): the changes
#     acknowledged and never applied, those applied twice, and the time
#     from the restarted server answering to the replica applying again:
#     from the first connection of a prober (connecting every ms from the
#     SIGKILL on) that completes its startup and authentication, to the
#     first call of the replica's apply on a change after that instant
#     (the apply records each call's monotonic time; the changes read
#     before the kill were applied long before the server came back). It
#     holds the reader's reconnect backoff, the slot checks and the
#     stream's start, and the first change's way to the apply.
#
#   mix run bench/replica_postgres_bench.exs [--quick] [--json PATH] [SECTION...]
#
# SECTIONs (copy, restart, lag, kill) run only those; without any, all.
# --quick: 50,000 prices, one run each, a 3 s producer.

defmodule Larder.ReplicaPostgresBench do
  alias Larder.{Bench, Replica, Table}
  alias Larder.Bench.PostgresLoad
  alias Larder.Test.{PostgresServer, Prices}

  @store [:idx, :spec, :value, :currency, :is_default]
  @rate 5_000
  # Prices the lag's producer changes, and as many the probe changes.
  @sample 10_000

  def run(argv) do
    bench = Bench.start("Larder.Replica: a Table kept equal to a Postgres table", argv)

    if PostgresServer.available?() do
      {us, server} =
        :timer.tc(fn -> PostgresServer.start(config: [{"synchronous_commit", "on"}]) end)

      IO.puts("\nPostgreSQL started in #{Bench.fmt_us(us)} (port #{server.port})")
      dir = Path.join(System.tmp_dir!(), "larder-replica-postgres-bench-#{System.pid()}")
      File.mkdir_p!(dir)
      # The kill scenario restarts the server: its handle changes.
      Process.put(:server, server)

      try do
        measure(bench, server, dir)
      after
        PostgresServer.stop(Process.get(:server))
        File.rm_rf(dir)
      end
    else
      IO.puts("\nPostgreSQL is not installed (scripts/setup installs it): nothing to measure.")
    end
  end

  defp measure(bench, server, dir) do
    {source, prices, _requests} = PriceCatalogue.reference_or_generated()
    prices = Enum.take(prices, Bench.pick(bench, 50_000, length(prices)))
    PostgresLoad.create!(server)
    {us, :ok} = :timer.tc(fn -> PostgresLoad.fill!(server, prices, dir) end)

    IO.puts("#{length(prices)} prices of #{source} copied into the table in #{Bench.fmt_us(us)}")

    ctx = %{prices: prices, dir: dir}
    sections = [copy: &copy/2, restart: &restart/2, lag: &lag/2, kill: &kill_server/2]
    only = Enum.map(bench.argv, &String.to_atom/1)

    sections
    |> Enum.filter(fn {name, _} -> only == [] or name in only end)
    |> Enum.reduce(bench, fn {_name, section}, bench -> section.(bench, ctx) end)
    |> Bench.finish()
  end

  defp server, do: Process.get(:server)

  defp source(extra \\ []) do
    {Replica.Postgres,
     PostgresServer.options(server(), [publication: "prices", slot: "bench"] ++ extra)}
  end

  defp price_opts(extra) do
    Keyword.merge(
      [
        name: :bench_replica,
        into: {Table, Prices.table_opts(name: :bench_prices, store: @store)},
        source: source(),
        apply: &PostgresLoad.apply/1
      ],
      extra
    )
  end

  defp start!(opts) do
    {:ok, pid} = Replica.start_link(opts)
    Process.unlink(pid)
    pid
  end

  defp kill(pid) do
    ref = Process.monitor(pid)
    Process.exit(pid, :kill)
    receive do: ({:DOWN, ^ref, _, _, _} -> :ok)
  end

  defp stop(pid) do
    ref = Process.monitor(pid)
    :ok = Replica.drop(pid)
    receive do: ({:DOWN, ^ref, _, _, _} -> :ok)
  end

  def copy(bench, ctx) do
    n = length(ctx.prices)
    title = "The initial copy: #{n} prices into a store: Table"
    anchor = "decode + Table.insert_many/2"
    col = "Replica, start to await(:latest)"
    # Held off the heap: the anchor runs in a process of its own, which
    # reads them without a copy.
    rows = Bench.off_heap(:copy_rows, PostgresLoad.copy_entries(ctx.prices))
    insert_many = fn -> PostgresLoad.copy_floor(rows, n, Prices.table_opts(store: @store)) end

    replica = fn ->
      pid = start!(price_opts([]))
      :ok = Replica.await(pid, :latest, :infinity)
      ^n = Table.size(:bench_prices)
      stop(pid)
    end

    bench =
      bench
      |> Bench.table(title, [anchor, col], per_op: true)
      |> Bench.row("#{n} rows", %{anchor => insert_many, col => replica},
        runs: Bench.pick(bench, 1, 3),
        warmup: Bench.pick(bench, 0, 1),
        ops: n,
        interleave: true
      )

    Bench.release_off_heap()

    Bench.target(
      bench,
      "initial copy / decode + insert_many/2 of the same rows (x)",
      Bench.ratio(bench, title, "#{n} rows", col),
      :<=,
      1.5
    )
  end

  def restart(bench, ctx) do
    path = Path.join(ctx.dir, "prices.snap")
    title = "Restart from a snapshot of #{length(ctx.prices)} prices, then 10,000 changes"
    col = "start_link/1 to await(:latest)"
    prices = List.to_tuple(ctx.prices)
    opts = price_opts(snapshot: path, snapshot_every: 86_400_000)

    # A snapshot of the whole table; then 10,000 changes are committed.
    setup = fn ->
      pid = start!(opts)
      :ok = Replica.await(pid, :latest, :infinity)
      {:ok, _} = Replica.dump(pid)
      stop(pid)
      conn = PostgresLoad.connect!(server())

      conn =
        Enum.reduce(1..10, conn, fn _, conn ->
          PostgresLoad.change!(
            conn,
            for(_ <- 1..1_000, do: PriceCatalogue.Changes.random(prices))
          )
        end)

      Larder.Postgres.Connection.close(conn)
      :ok
    end

    # Ended with a kill, as the Kafka bench's restart is: a clean stop
    # writes a last snapshot of the whole table, which is not the restart.
    timed = fn _ ->
      pid = start!(opts)
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
      "restart + 10k changes, ready (s)",
      result.median_us / 1_000_000,
      :<=,
      0.5
    )
  end

  def lag(bench, ctx) do
    duration = Bench.pick(bench, 3_000, 10_000)
    title = "Lag to a search, under #{@rate} committed changes/s"
    from_commit = "commit to visible"
    from_statement = "statement to visible"
    # Two disjoint samples, the producer's and the markers' (a change to a
    # marker's price would hide it; a process holding the whole catalogue
    # stalls a scheduler at each collection).
    {prices, markers} = ctx.prices |> Enum.take_random(2 * @sample) |> Enum.split(@sample)
    {prices, markers} = {List.to_tuple(prices), List.to_tuple(markers)}
    pid = start!(price_opts([]))
    :ok = Replica.await(pid, :latest, :infinity)
    server = server()
    producer = Task.async(fn -> PostgresLoad.produce(server, prices, @rate, duration) end)
    deadline = System.monotonic_time(:millisecond) + duration

    probe =
      Task.async(fn -> PostgresLoad.marker_lags(server, :bench_prices, markers, deadline) end)

    samples = Task.await(probe, duration + 60_000)
    sent = Task.await(producer, duration + 60_000)
    stop(pid)

    IO.puts("\n#{sent} changes committed in #{duration} ms; #{length(samples)} markers timed")
    commit = Bench.summarize(Enum.map(samples, &elem(&1, 1)), nil, 1)
    statement = Bench.summarize(Enum.map(samples, &elem(&1, 0)), nil, 1)

    bench =
      bench
      |> Bench.table(title, [from_commit, from_statement])
      |> Bench.row("median / p99 over the markers", %{
        from_commit => commit,
        from_statement => statement
      })

    Bench.target(
      bench,
      "lag p99 from the commit at #{@rate} changes/s (ms)",
      commit.p99_us / 1_000,
      :<=,
      20
    )
  end

  def kill_server(bench, ctx) do
    title = "Server SIGKILLed and restarted under 3 writers"
    col = "replica"
    prices = List.to_tuple(Enum.take(ctx.prices, 20_000))
    acked = :ets.new(:acked, [:public, :duplicate_bag])
    applied = :ets.new(:applied, [:public, :duplicate_bag])
    times = :ets.new(:applied_at, [:public, :ordered_set])

    pid =
      start!(
        price_opts(
          source: source(timeout: 5_000),
          apply: PostgresLoad.recording_apply(applied, times),
          snapshot: Path.join(ctx.dir, "kill.snap"),
          snapshot_every: 1_000
        )
      )

    :ok = Replica.await(pid, :latest, :infinity)
    writers = PostgresLoad.writers(server(), prices, 3, acked)
    wait_until(fn -> :ets.info(applied, :size) >= 2_000 end)
    PostgresServer.kill(server())
    killed_at = :ets.info(applied, :size)
    prober = PostgresLoad.first_answer(server())
    # restart/1 kills again (a no-op now) and starts the server
    Process.put(:server, PostgresServer.restart(server()))
    answered = Task.await(prober, 120_000)
    wait_until(fn -> :ets.next(times, answered) != :"$end_of_table" end)
    resumed_us = :ets.next(times, answered) - answered
    wait_until(fn -> :ets.info(acked, :size) >= killed_at + 2_000 end)
    PostgresLoad.stop(writers)
    :ok = Replica.await(pid, :latest, 120_000)

    all = :ets.tab2list(applied)
    twice = length(all) - MapSet.size(MapSet.new(all))
    have = MapSet.new(all)
    lost = Enum.count(:ets.tab2list(acked), &(not MapSet.member?(have, &1)))
    stop(pid)

    IO.puts(
      "\nkilled with #{killed_at} changes applied; #{:ets.info(acked, :size)} acknowledged " <>
        "in all, #{length(all)} applied; applying again #{Bench.fmt_us(resumed_us)} after the " <>
        "restarted server answered"
    )

    bench =
      bench
      |> Bench.table(title, [col])
      |> Bench.row("changes lost", %{col => Bench.value(lost, "changes")})
      |> Bench.row("changes applied twice", %{col => Bench.value(twice, "changes")})
      |> Bench.row("server answering to applying again", %{
        col => Bench.summarize([resumed_us], nil, 1)
      })

    bench
    |> Bench.target("server kill: changes lost", lost, :<=, 0)
    |> Bench.target("server kill: changes applied twice", twice, :<=, 0)
  end

  # The monotonic time (us) once `fun` is true (every 2 ms, for up to 120 s).
  defp wait_until(fun, deadline \\ nil) do
    deadline = deadline || System.monotonic_time(:millisecond) + 120_000

    cond do
      fun.() -> System.monotonic_time(:microsecond)
      System.monotonic_time(:millisecond) > deadline -> raise "timed out"
      true -> Process.sleep(2) && wait_until(fun, deadline)
    end
  end
end

Larder.ReplicaPostgresBench.run(System.argv())
