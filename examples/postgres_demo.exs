# Larder.Replica on Postgres: the price catalogue as a Postgres table,
# kept in memory by a replica over logical replication. A PostgreSQL
# server (Debian's, which scripts/setup installs) started on a free
# loopback port in a temporary directory; the 487,200-price catalogue
# (../shared/data, or the generated catalogue of the same shape) copied
# into a `prices` table; then a replica's initial copy into a `store:`
# Table beside decoding and inserting the same rows from memory, a
# reference request answered from it, a restart from its snapshot after
# 10,000 changes, and the lag under 5,000 committed changes a second. One
# run each; larder_postgres/bench/replica_postgres_bench.exs measures
# them against their targets. Run by `make demo` in larder_postgres/
# (`cd larder_postgres && mix run ../examples/postgres_demo.exs`).

defmodule Demo.Postgres do
  alias Larder.{Bench, Replica, Table}
  alias Larder.Bench.PostgresLoad
  alias Larder.Test.{PostgresServer, Prices}

  @store [:idx, :spec, :value, :currency, :is_default]
  @rate 5_000

  def run do
    IO.puts("\n## Larder.Replica on Postgres: a table in memory, kept equal to the server\n")

    if PostgresServer.available?() do
      {us, server} =
        :timer.tc(fn -> PostgresServer.start(config: [{"synchronous_commit", "on"}]) end)

      IO.puts("PostgreSQL started in #{ms(us)} (port #{server.port}, wal_level = logical)")
      dir = Path.join(System.tmp_dir!(), "larder-postgres-demo-#{System.pid()}")
      File.mkdir_p!(dir)

      try do
        demo(server, dir)
      after
        PostgresServer.stop(server)
        File.rm_rf(dir)
      end
    else
      IO.puts("PostgreSQL is not installed (scripts/setup installs it): skipped.")
    end
  end

  defp ms(us), do: "#{round(us / 1_000)} ms"
  defp rate(n, us), do: "#{round(n * 1_000_000 / max(us, 1))} rows/s"

  defp opts(server, dir) do
    [
      name: :demo_pg_replica,
      into: {Table, Prices.table_opts(name: :demo_pg_prices, store: @store)},
      source:
        {Replica.Postgres, PostgresServer.options(server, publication: "prices", slot: "demo")},
      apply: &PostgresLoad.apply/1,
      snapshot: Path.join(dir, "prices.snap"),
      snapshot_every: 86_400_000
    ]
  end

  defp ready!(server, dir) do
    {:ok, pid} = Replica.start_link(opts(server, dir))
    Process.unlink(pid)
    :ok = Replica.await(pid, :latest, :infinity)
    pid
  end

  defp demo(server, dir) do
    {source, prices, requests} = PriceCatalogue.reference_or_generated()
    n = length(prices)
    PostgresLoad.create!(server)
    {us, :ok} = :timer.tc(fn -> PostgresLoad.fill!(server, prices, dir) end)
    IO.puts("table \"prices\": #{n} prices of #{source}, loaded with \\copy in #{ms(us)}")

    # The anchor: the rows the source hands over, already in memory,
    # decoded and inserted in one insert_many/2, as the bench measures it
    # (PostgresLoad.copy_floor/3), reading the rows held off the heap.
    rows = Bench.off_heap(:demo_copy_rows, PostgresLoad.copy_entries(prices))

    {anchor_us, :ok} =
      :timer.tc(fn -> PostgresLoad.copy_floor(rows, n, Prices.table_opts(store: @store)) end)

    Bench.release_off_heap()

    {us, pid} = :timer.tc(fn -> ready!(server, dir) end)
    ^n = Table.size(:demo_pg_prices)

    IO.puts(
      "initial copy (a new slot, its exported snapshot, COPY, then the stream): " <>
        "#{ms(us)}, #{rate(n, us)}; decode + Table.insert_many/2 of the same rows " <>
        "from memory: #{ms(anchor_us)} (x#{Float.round(us / anchor_us, 2)})"
    )

    conditions = hd(requests)
    [answer] = Table.search(:demo_pg_prices, conditions)
    [expected] = PriceCatalogue.filter(prices, conditions)
    true = answer.value == expected.value

    IO.puts(
      "  a reference request answers #{answer.value} #{answer.currency}, as the catalogue says"
    )

    # A restarted node: a snapshot, a crash, 10,000 changes, a restart.
    {snap_us, {:ok, _}} = :timer.tc(fn -> Replica.dump(pid) end)
    Process.exit(pid, :kill)
    IO.puts("snapshot (prices and the LSN) written in #{ms(snap_us)}; the node is killed")
    table = List.to_tuple(prices)
    conn = PostgresLoad.connect!(server)

    conn =
      Enum.reduce(1..10, conn, fn _, conn ->
        PostgresLoad.change!(conn, for(_ <- 1..1_000, do: PriceCatalogue.Changes.random(table)))
      end)

    Larder.Postgres.Connection.close(conn)
    {us, pid} = :timer.tc(fn -> ready!(server, dir) end)

    IO.puts(
      "restarted node: snapshot loaded and 10,000 committed changes applied, ready in #{ms(us)}"
    )

    # Lag under a steady writer, from a marker's commit to a search that finds it.
    seconds = 3
    {sample, markers} = prices |> Enum.take_random(20_000) |> Enum.split(10_000)
    {sample, markers} = {List.to_tuple(sample), List.to_tuple(markers)}
    producer = Task.async(fn -> PostgresLoad.produce(server, sample, @rate, seconds * 1_000) end)
    deadline = System.monotonic_time(:millisecond) + seconds * 1_000

    lags =
      Task.async(fn -> PostgresLoad.marker_lags(server, :demo_pg_prices, markers, deadline) end)
      |> Task.await(seconds * 1_000 + 60_000)

    sent = Task.await(producer, 60_000)
    commit = Bench.summarize(Enum.map(lags, &elem(&1, 1)), nil, 1)

    IO.puts(
      "lag under #{@rate} committed changes/s (#{sent} in #{seconds} s), from a commit to " <>
        "visible in a search, #{length(lags)} markers: median #{Bench.fmt_us(commit.median_us)}, " <>
        "p99 #{Bench.fmt_us(commit.p99_us)}"
    )

    :ok = Replica.drop(pid)

    IO.puts(
      "`mix run bench/replica_postgres_bench.exs` (in larder_postgres/) measures these " <>
        "against their targets."
    )
  end
end

Demo.Postgres.run()
