defmodule Larder.Replica.PostgresFaultTest do
  # A Larder.Replica over Larder.Replica.Postgres while its server fails
  # (tagged :postgres), each test with a server of its own: SIGKILLed and
  # restarted under writers (every acknowledged write applied, none twice,
  # the table equal to Postgres's; the process that started the replica,
  # which does not trap exits, untouched), down when the replica starts,
  # paused (SIGSTOP) under writers, and restarted during the initial copy.
  use ExUnit.Case, async: true

  alias Larder.Replica
  alias Larder.Test.{PostgresServer, PostgresSetup, PostgresWriters}

  @moduletag :postgres

  # synchronous_commit on: a commit the writers saw acknowledged survives
  # the server's SIGKILL, so it must reach the replica
  setup ctx do
    server = PostgresSetup.start(config: [{"synchronous_commit", "on"}])
    name = PostgresSetup.name(ctx)

    PostgresServer.sql!(server, """
    CREATE TABLE #{name} (k int PRIMARY KEY, v text);
    ALTER TABLE #{name} REPLICA IDENTITY FULL;
    CREATE PUBLICATION #{name} FOR TABLE #{name};
    INSERT INTO #{name} SELECT g, 'start-' || g FROM generate_series(1, 2000) g;
    """)

    dir = Path.join(System.tmp_dir!(), "larder-pg-fault-#{name}")
    File.mkdir_p!(dir)
    replica = :"#{name} replica"

    on_exit(fn ->
      Replica.drop(replica)
      File.rm_rf(dir)
    end)

    %{
      server: server,
      name: name,
      dir: dir,
      acked: :ets.new(:acked, [:public, :duplicate_bag]),
      applied: :ets.new(:applied, [:public, :duplicate_bag])
    }
  end

  defp replica_opts(ctx, extra) do
    Keyword.merge(
      [
        name: :"#{ctx.name} replica",
        into: {Larder.Table, name: :"#{ctx.name} table", key: :k, index: [:v]},
        source:
          {Replica.Postgres, PostgresSetup.source_opts(ctx.server, ctx.name, timeout: 5_000)},
        apply: PostgresWriters.apply(ctx.applied),
        snapshot: Path.join(ctx.dir, "r.snap"),
        snapshot_every: 500
      ],
      extra
    )
  end

  # The replica started by a plain process that does not trap exits, as
  # a user's would be: it lives as long as the replica is not a crash.
  defp start_from_plain_process!(opts) do
    me = self()

    starter =
      spawn(fn ->
        {:ok, pid} = Replica.start_link(opts)
        send(me, {:started, pid})
        Process.sleep(:infinity)
      end)

    assert_receive {:started, replica}, 30_000
    on_exit(fn -> Process.exit(starter, :kill) end)
    {starter, replica}
  end

  defp equal?(ctx, replica) do
    PostgresWriters.contents(Replica.target(replica)) ==
      PostgresWriters.rows(ctx.server, ctx.name)
  end

  defp wait_commits(ctx, more) do
    target = PostgresWriters.committed(ctx.acked) + more

    PostgresServer.wait_until(120_000, "#{more} more commits", fn ->
      PostgresWriters.committed(ctx.acked) >= target
    end)
  end

  test "SIGKILLed twice and restarted under writers: nothing lost, nothing applied twice", ctx do
    {starter, replica} = start_from_plain_process!(replica_opts(ctx, []))
    assert Replica.await(replica, :latest, 60_000) == :ok
    # the copy's rows are not writes of the writers: only the stream's count
    :ets.delete_all_objects(ctx.applied)

    writers =
      PostgresWriters.start(PostgresServer.options(ctx.server), ctx.name, 3, 3_000, ctx.acked)

    server =
      Enum.reduce(1..2, ctx.server, fn _, server ->
        wait_commits(ctx, 300)
        PostgresServer.kill(server)
        Process.sleep(300)
        server = PostgresServer.restart(server)
        wait_commits(ctx, 300)
        server
      end)

    PostgresWriters.stop(writers)
    ctx = %{ctx | server: server}
    assert Replica.await(replica, :latest, 120_000) == :ok
    assert equal?(ctx, replica)
    {twice, lost} = PostgresWriters.check(ctx.acked, ctx.applied)
    assert twice == []
    assert lost == []
    assert Process.alive?(starter) and Process.alive?(replica)
  end

  test "down when the replica starts: await waits up to its timeout, then it catches up", ctx do
    PostgresServer.kill(ctx.server)
    {starter, replica} = start_from_plain_process!(replica_opts(ctx, []))

    assert {:error, %Larder.Error{reason: :timeout} = error} =
             Replica.await(replica, :latest, 1_500)

    assert %Larder.Error{reason: :source_unavailable} = error.details.source_error
    assert Exception.message(error) =~ "127.0.0.1:#{ctx.server.port}"

    server = PostgresServer.restart(ctx.server)
    assert Replica.await(replica, :latest, 60_000) == :ok
    assert equal?(%{ctx | server: server}, replica)
    assert Process.alive?(starter)
  end

  test "paused (SIGSTOP) under writers, then resumed: the replica goes on", ctx do
    {_starter, replica} = start_from_plain_process!(replica_opts(ctx, []))
    assert Replica.await(replica, :latest, 60_000) == :ok
    :ets.delete_all_objects(ctx.applied)

    writers =
      PostgresWriters.start(PostgresServer.options(ctx.server), ctx.name, 2, 3_000, ctx.acked)

    wait_commits(ctx, 200)

    PostgresServer.pause(ctx.server)
    offset = Replica.offset(replica)
    Process.sleep(2_000)
    # nothing to read, nothing lost: the structure keeps serving
    assert Replica.offset(replica) >= offset
    assert map_size(PostgresWriters.contents(Replica.target(replica))) > 0
    PostgresServer.resume(ctx.server)

    wait_commits(ctx, 200)
    PostgresWriters.stop(writers)
    assert Replica.await(replica, :latest, 120_000) == :ok
    assert equal?(ctx, replica)
    assert PostgresWriters.check(ctx.acked, ctx.applied) == {[], []}
  end

  test "restarted during the initial copy: on_trimmed: :rebuild copies again, equal", ctx do
    PostgresServer.sql!(
      ctx.server,
      "INSERT INTO #{ctx.name} SELECT g, 'more-' || g FROM generate_series(2001, 20000) g"
    )

    apply = PostgresWriters.apply(ctx.applied)
    calls = :counters.new(1, [])
    me = self()

    # the 2,000th row copied: the server killed and started again
    gated = fn fields ->
      :counters.add(calls, 1, 1)

      if :counters.get(calls, 1) == 2_000 do
        send(me, {:copying, self()})
        receive do: (:go -> :ok)
      end

      apply.(fields)
    end

    {_starter, replica} =
      start_from_plain_process!(
        replica_opts(ctx, apply: gated, batch_size: 100, on_trimmed: :rebuild)
      )

    assert_receive {:copying, reader}, 60_000
    assert {0, n} = Replica.offset(replica)
    assert n > 0
    server = PostgresServer.restart(ctx.server)
    send(reader, :go)

    assert Replica.await(replica, :latest, 120_000) == :ok
    assert equal?(%{ctx | server: server}, replica)
  end
end
