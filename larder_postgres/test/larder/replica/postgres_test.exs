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

  # A :block_ms past await/3's timeout: only a replica whose copy's end
  # moves it to the slot's consistent point at once (not after the first
  # read of the stream has waited its :block_ms) passes.
  test "the copy's end takes the replica to the log's end at once, not after a read's :block_ms",
       ctx do
    sql!(ctx, "INSERT INTO #{ctx.name} SELECT g, 'v-' || g FROM generate_series(1, 100) g")
    replica = start!(replica_opts(ctx, block_ms: 60_000))
    assert Replica.await(replica, :latest, 20_000) == :ok
    assert equal?(ctx, replica)
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

  defp slot_confirmed(ctx) do
    text =
      sql!(
        ctx,
        "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '#{ctx.name}'"
      )

    {:ok, lsn} = Larder.Postgres.Protocol.parse_lsn(text)
    lsn
  end

  test "a restart from a snapshot reads on from its LSN: no copy again, the changes made " <>
         "meanwhile applied once; the slot told only what a durable snapshot holds",
       ctx do
    sql!(ctx, "INSERT INTO #{ctx.name} SELECT g, 'v' || g FROM generate_series(1, 1000) g")
    replica = start!(replica_opts(ctx, []))
    assert Replica.await(replica, :latest, 60_000) == :ok
    created = slot_confirmed(ctx)

    # applied, not yet in a snapshot: the slot keeps its consistent point
    sql!(ctx, "UPDATE #{ctx.name} SET v = 'u' || k WHERE k <= 5")
    assert Replica.await(replica, :latest, 60_000) == :ok
    Process.sleep(300)
    assert slot_confirmed(ctx) == created

    {:ok, {lsn, _} = position} = Replica.dump(replica)
    assert lsn > created

    PostgresServer.wait_until(10_000, "the flush", fn ->
      slot_confirmed(ctx) == Larder.Postgres.Replication.flush_lsn(position)
    end)

    :ok = Replica.drop(replica)
    :ets.delete_all_objects(ctx.applied)

    sql!(ctx, """
    UPDATE #{ctx.name} SET v = 'changed-' || k WHERE k <= 10;
    DELETE FROM #{ctx.name} WHERE k > 990;
    """)

    replica = start!(replica_opts(ctx, []))
    # from the snapshot, at once
    assert {_, _} = Replica.offset(replica)
    assert Replica.offset(replica) >= position
    assert Replica.await(replica, :latest, 60_000) == :ok
    assert equal?(ctx, replica)

    # the 20 changes, not the 1,000 rows again
    assert length(:ets.tab2list(ctx.applied)) == 20
    {twice, _} = PostgresWriters.check(ctx.acked, ctx.applied)
    assert twice == []
  end

  test "await(:latest): every transaction committed before the call applied", ctx do
    replica = start!(replica_opts(ctx, []))
    assert Replica.await(replica, :latest, 60_000) == :ok
    assert PostgresWriters.contents(Replica.target(replica)) == %{}

    for i <- 1..20 do
      sql!(ctx, "INSERT INTO #{ctx.name} VALUES (#{i}, 'x#{i}')")
      assert Replica.await(replica, :latest, 60_000) == :ok
      assert Larder.Table.get(Replica.target(replica), i) == %{k: i, v: "x#{i}"}
    end

    # a position of the source
    assert {lsn, _} = Replica.offset(replica)
    assert Replica.await(replica, {lsn, 0}, 1_000) == :ok
  end

  describe "trims" do
    test "a slot dropped while the replica was stopped: :stop stops it, :rebuild copies again",
         ctx do
      sql!(ctx, "INSERT INTO #{ctx.name} SELECT g, 'v' || g FROM generate_series(1, 100) g")
      replica = start!(replica_opts(ctx, []))
      assert Replica.await(replica, :latest, 60_000) == :ok
      :ok = Replica.drop(replica)
      PostgresSetup.await_slot_free(ctx.server, ctx.name)

      sql!(ctx, """
      SELECT pg_drop_replication_slot('#{ctx.name}');
      DELETE FROM #{ctx.name} WHERE k <= 50;
      """)

      Process.flag(:trap_exit, true)
      replica = start!(replica_opts(ctx, on_trimmed: :stop))

      assert_receive {:EXIT, ^replica, {:shutdown, %Larder.Error{reason: :offset_trimmed}}},
                     60_000

      replica = start!(replica_opts(ctx, on_trimmed: :rebuild))
      assert Replica.await(replica, :latest, 60_000) == :ok
      assert equal?(ctx, replica)
      assert map_size(PostgresWriters.contents(Replica.target(replica))) == 50
    end

    test "a snapshot older than the slot's confirmed position: a trim, and a rebuild", ctx do
      sql!(ctx, "INSERT INTO #{ctx.name} SELECT g, 'v' || g FROM generate_series(1, 100) g")
      replica = start!(replica_opts(ctx, []))
      assert Replica.await(replica, :latest, 60_000) == :ok
      {:ok, _} = Replica.dump(replica)
      old = Path.join(ctx.dir, "old")
      File.mkdir_p!(old)

      for file <- File.ls!(ctx.dir),
          file != "old",
          do: File.cp!(Path.join(ctx.dir, file), Path.join(old, file))

      sql!(ctx, "UPDATE #{ctx.name} SET v = 'later' WHERE k <= 10")
      assert Replica.await(replica, :latest, 60_000) == :ok
      {:ok, later} = Replica.dump(replica)

      PostgresServer.wait_until(10_000, "the flush", fn ->
        slot_confirmed(ctx) >= Larder.Postgres.Replication.flush_lsn(later)
      end)

      :ok = Replica.drop(replica)

      # the older snapshot put back
      for file <- File.ls!(ctx.dir), file != "old", do: File.rm!(Path.join(ctx.dir, file))
      for file <- File.ls!(old), do: File.cp!(Path.join(old, file), Path.join(ctx.dir, file))
      File.rm_rf!(old)

      replica = start!(replica_opts(ctx, on_trimmed: :rebuild))
      assert Replica.await(replica, :latest, 60_000) == :ok
      assert equal?(ctx, replica)
      assert Larder.Table.get(Replica.target(replica), 1) == %{k: 1, v: "later"}
    end

    test "a slot invalidated (wal_status lost): a trim, and a rebuild", ctx do
      # a slot that holds back more than 1 MB of WAL is invalidated at the
      # next checkpoint
      server = PostgresSetup.start(config: [{"max_slot_wal_keep_size", "'1MB'"}])
      ctx = %{ctx | server: server}

      sql!(ctx, """
      CREATE TABLE #{ctx.name} (k int PRIMARY KEY, v text);
      CREATE PUBLICATION #{ctx.name} FOR TABLE #{ctx.name};
      INSERT INTO #{ctx.name} SELECT g, 'v' || g FROM generate_series(1, 100) g;
      """)

      replica = start!(replica_opts(ctx, on_trimmed: :rebuild))
      assert Replica.await(replica, :latest, 60_000) == :ok
      :ok = Replica.drop(replica)
      PostgresSetup.await_slot_free(server, ctx.name)

      for _ <- 1..3 do
        sql!(ctx, """
        CREATE TABLE IF NOT EXISTS filler (v text);
        INSERT INTO filler SELECT repeat('x', 100) FROM generate_series(1, 1000);
        UPDATE #{ctx.name} SET v = v || '+';
        SELECT pg_switch_wal();
        """)
      end

      sql!(ctx, "CHECKPOINT")

      assert sql!(
               ctx,
               "SELECT wal_status FROM pg_replication_slots WHERE slot_name = '#{ctx.name}'"
             ) == "lost"

      replica = start!(replica_opts(ctx, on_trimmed: :rebuild))
      assert Replica.await(replica, :latest, 60_000) == :ok
      assert equal?(ctx, replica)
      assert Larder.Table.get(Replica.target(replica), 1) == %{k: 1, v: "v1+++"}
    end

    test "a copy whose connection is cut: :stop stops the replica, :rebuild copies again", ctx do
      sql!(ctx, "INSERT INTO #{ctx.name} SELECT g, 'v' || g FROM generate_series(1, 5000) g")
      Process.flag(:trap_exit, true)

      for on_trimmed <- [:stop, :rebuild] do
        # the 1,000th row applied: the copy's connection is terminated
        apply = PostgresWriters.apply(ctx.applied)
        calls = :counters.new(1, [])

        cut = fn fields ->
          :counters.add(calls, 1, 1)

          if :counters.get(calls, 1) == 1_000 do
            sql!(ctx, """
            SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE query LIKE 'COPY%' AND pid <> pg_backend_pid()
            """)
          end

          apply.(fields)
        end

        replica =
          start!(
            replica_opts(ctx, apply: cut, batch_size: 50, on_trimmed: on_trimmed, snapshot: nil)
          )

        case on_trimmed do
          :stop ->
            assert_receive {:EXIT, ^replica, {:shutdown, %Larder.Error{reason: :offset_trimmed}}},
                           60_000

          :rebuild ->
            assert Replica.await(replica, :latest, 60_000) == :ok
            assert equal?(ctx, replica)
            :ok = Replica.drop(replica)
        end
      end
    end
  end

  describe "a bad configuration, seen through await/3" do
    test "bad credentials: :timeout, with the source's error naming the option", ctx do
      source = PostgresSetup.source_opts(ctx.server, ctx.name, password: "wrong")
      replica = start!(replica_opts(ctx, source: {Replica.Postgres, source}))

      assert {:error, %Larder.Error{reason: :timeout} = error} =
               Replica.await(replica, :latest, 1_000)

      assert %Larder.Error{reason: :source_failed, details: %{option: :password}} =
               error.details.source_error

      assert Exception.message(error) =~ ":username and :password"
    end

    test "a missing publication", ctx do
      source = PostgresSetup.source_opts(ctx.server, ctx.name, publication: "no_such_pub")
      replica = start!(replica_opts(ctx, source: {Replica.Postgres, source}))

      assert {:error, %Larder.Error{reason: :timeout} = error} =
               Replica.await(replica, :latest, 1_000)

      assert error.details.source_error.details.option == :publication
      assert Exception.message(error) =~ "CREATE PUBLICATION"
    end
  end

  test "two replicas side by side in one directory, each on its slot; a third on a slot in " <>
         "use is refused, naming it",
       ctx do
    sql!(ctx, "INSERT INTO #{ctx.name} SELECT g, 'v' || g FROM generate_series(1, 500) g")
    other = ctx.name <> "_b"
    source_b = PostgresSetup.source_opts(ctx.server, ctx.name, slot: other)

    a = start!(replica_opts(ctx, []))

    b =
      start!(
        replica_opts(ctx,
          name: :"#{other} replica",
          into: {Larder.Table, name: :"#{other} table", key: :k},
          source: {Replica.Postgres, source_b},
          snapshot: Path.join(ctx.dir, "r.snap.b")
        )
      )

    on_exit(fn -> Replica.drop(:"#{other} replica") end)
    sql!(ctx, "UPDATE #{ctx.name} SET v = 'both' WHERE k <= 100")

    for replica <- [a, b] do
      assert Replica.await(replica, :latest, 60_000) == :ok
      assert equal?(ctx, replica)
      assert {:ok, _} = Replica.dump(replica)
    end

    # a's slot, taken by a third
    c =
      start!(
        replica_opts(ctx,
          name: :"#{other} c",
          into: {Larder.Table, name: :"#{other} c table", key: :k},
          snapshot: nil
        )
      )

    assert {:error, %Larder.Error{reason: :timeout} = error} = Replica.await(c, {1, 0}, 8_000)
    assert %{reason: :source_unavailable, details: %{option: :slot}} = error.details.source_error
    :ok = Replica.drop(c)

    # a and b go on
    sql!(ctx, "DELETE FROM #{ctx.name} WHERE k > 400")

    for replica <- [a, b] do
      assert Replica.await(replica, :latest, 60_000) == :ok
      assert equal?(ctx, replica)
    end
  end
end
