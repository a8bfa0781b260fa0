defmodule Larder.Replica.PostgresTest do
  # A Larder.Replica over Larder.Replica.Postgres against a real server
  # (tagged :postgres), as a service uses it: the initial copy and the
  # stream with writers throughout (every entry applied once, the table
  # equal to Postgres's), a restart from a snapshot, await(:latest), each
  # trim with on_trimmed: :stop and :rebuild, and bad configurations seen
  # through await/3. The server killed, restarted and paused under
  # writers: test/larder/replica/postgres_fault_test.exs.
  use ExUnit.Case, async: true

  alias Larder.Replica
  alias Larder.Test.{PostgresServer, PostgresSetup, PostgresWriters}

  @moduletag :postgres

  setup_all do
    %{server: PostgresSetup.start()}
  end

  setup %{server: server} = ctx do
    name = PostgresSetup.name(ctx)

    PostgresServer.sql!(server, """
    CREATE TABLE #{name} (k int PRIMARY KEY, v text);
    ALTER TABLE #{name} REPLICA IDENTITY FULL;
    CREATE PUBLICATION #{name} FOR TABLE #{name};
    """)

    dir = Path.join(System.tmp_dir!(), "larder-pg-replica-#{name}")
    File.mkdir_p!(dir)
    replica = :"#{name} replica"

    on_exit(fn ->
      Replica.drop(replica)
      File.rm_rf(dir)
    end)

    acked = :ets.new(:acked, [:public, :duplicate_bag])
    applied = :ets.new(:applied, [:public, :duplicate_bag])
    %{name: name, dir: dir, acked: acked, applied: applied}
  end

  defp replica_opts(ctx, extra) do
    Keyword.merge(
      [
        name: :"#{ctx.name} replica",
        into: {Larder.Table, name: :"#{ctx.name} table", key: :k, index: [:v]},
        source: {Replica.Postgres, PostgresSetup.source_opts(ctx.server, ctx.name)},
        apply: PostgresWriters.apply(ctx.applied),
        snapshot: Path.join(ctx.dir, "r.snap"),
        snapshot_every: 86_400_000
      ],
      extra
    )
  end

  defp start!(opts) do
    {:ok, pid} = Replica.start_link(opts)
    pid
  end

  defp sql!(ctx, sql), do: PostgresServer.sql!(ctx.server, sql)

  defp equal?(ctx, replica) do
    PostgresWriters.contents(Replica.target(replica)) ==
      PostgresWriters.rows(ctx.server, ctx.name)
  end

  test "the initial copy, with writers before, during and after it, then the stream: the " <>
         "table equal to Postgres's, every write made during the copy applied, none twice",
       ctx do
    sql!(ctx, "INSERT INTO #{ctx.name} SELECT g, 'start-' || g FROM generate_series(1, 20000) g")

    writers =
      PostgresWriters.start(PostgresServer.options(ctx.server), ctx.name, 3, 30_000, ctx.acked)

    Larder.Test.Eventually.eventually(fn -> PostgresWriters.committed(ctx.acked) > 20 end)

    # The 5,000th entry applied (a copied row: there are 20,000 of them)
    # waits until the writers committed 100 more transactions, which the
    # copy cannot see: they are in the stream that follows it.
    apply = PostgresWriters.apply(ctx.applied)
    calls = :counters.new(1, [])
    me = self()

    gated = fn fields ->
      :counters.add(calls, 1, 1)

      if :counters.get(calls, 1) == 5_000 do
        before = :ets.tab2list(ctx.acked)
        send(me, {:copying, before})
        n = length(before)

        PostgresServer.wait_until(60_000, "100 more writes", fn ->
          PostgresWriters.committed(ctx.acked) >= n + 100
        end)
      end

      apply.(fields)
    end

    replica = start!(replica_opts(ctx, apply: gated, batch_size: 100))
    assert_receive {:copying, before}, 60_000
    assert {0, copied} = Replica.offset(replica)
    assert copied in 1..20_000

    assert Replica.await(replica, :latest, 120_000) == :ok
    PostgresWriters.stop(writers)
    assert Replica.await(replica, :latest, 60_000) == :ok
    assert equal?(ctx, replica)

    {twice, _} = PostgresWriters.check(ctx.acked, ctx.applied)
    assert twice == []

    # every write acknowledged once the copy was under way was applied
    during = :ets.tab2list(ctx.acked) -- before
    assert length(during) >= 100
    applied = MapSet.new(:ets.tab2list(ctx.applied))
    assert Enum.reject(during, &MapSet.member?(applied, &1)) == []
  end
end
