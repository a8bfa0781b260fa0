defmodule Larder.Replica.ServerTest do
  # The replica's process with its reader, on in-memory logs: a connection
  # used by the process that made it only, whatever the kind of source;
  # committed/2 told the start position first and each snapshot once its
  # manifest is in place; :batch_too_large halving the batch whatever the
  # source; a source that raises counted and retried, not a crash; no
  # snapshot at a position a restart cannot read on from (a source's
  # copy), for arity-1 and arity-2 apply functions.
  use ExUnit.Case, async: true

  alias Larder.Replica
  alias Larder.Replica.Snapshot
  alias Larder.Test.NotifyingSource
  alias Larder.Test.PartitionedSource, as: Log
  alias Larder.Test.ReplicaLog
  alias Larder.Test.ScriptedSource

  @moduletag :capture_log

  setup ctx do
    token = Base.encode16(:crypto.strong_rand_bytes(8), case: :lower)
    dir = Path.join(System.tmp_dir!(), "larder-server-#{token}")
    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf(dir) end)
    %{dir: dir, test_name: ctx.test}
  end

  defp name(ctx, what), do: :"#{ctx.test_name} #{what}"

  defp opts(ctx, source, extra) do
    Keyword.merge(
      [
        name: name(ctx, "r"),
        into: {Larder.Table, name: name(ctx, "t"), key: :id, index: [:v]},
        source: source,
        apply: &ReplicaLog.apply_entry/1,
        batch_size: 7,
        block_ms: 50
      ],
      extra
    )
  end

  defp start!(opts) do
    {:ok, pid} = Replica.start_link(opts)
    pid
  end

  defp source_errors(ctx) do
    Larder.Test.TelemetryEvents.forward(ctx.test_name, [[:larder, :replica, :source, :error]])
  end

  # The source errors this test's replica reported so far (the handler
  # gets every replica's).
  defp reported(ctx) do
    replica = name(ctx, "r")

    receive do
      {:event, _, _, %{replica: ^replica, error: error}} -> [error | reported(ctx)]
    after
      0 -> []
    end
  end

  for source <- [Log, NotifyingSource] do
    test "#{inspect(source)}: every call on the connection is made by the reader that made it",
         ctx do
      source_errors(ctx)
      module = unquote(source)
      log = module.new(3)
      Log.produce(module, log, for(k <- 1..60, do: {:put, k, k}))
      path = Path.join(ctx.dir, "r.snap")

      replica =
        start!(opts(ctx, {module, table: log}, snapshot: path, apply: &ReplicaLog.apply_entry/2))

      assert Replica.await(replica, :latest, 30_000) == :ok
      assert {:ok, _} = Replica.dump(replica)
      reader = :sys.get_state(replica).reader
      Larder.Test.Eventually.eventually(fn -> length(Log.committed(log)) == 2 end)

      assert Enum.uniq(for {pid, _} <- Log.committed(log), do: pid) == [reader]
      # Log's connection raises when another process uses it: no such error
      assert reported(ctx) == []
      assert ReplicaLog.contents(name(ctx, "t")) == Log.model(log)
    end
  end

  test "committed/2: the start position first, then each snapshot once its manifest names it",
       ctx do
    me = self()
    path = Path.join(ctx.dir, "c.snap")
    identity = %{source: Log, log: "partitioned", target: {:table, name(ctx, "t")}}

    on_committed = fn position ->
      manifest =
        case Snapshot.read(path, identity) do
          {:ok, %{offset: offset}} -> offset
          :none -> :none
        end

      send(me, {:committed, position, manifest})
    end

    log = Log.new(2)
    Log.produce(Log, log, for(k <- 1..20, do: {:put, k, k}))
    source = {Log, table: log, on_committed: on_committed}

    replica = start!(opts(ctx, source, snapshot: path))
    # no snapshot yet: the origin, before any read
    assert_receive {:committed, %{}, :none}
    assert Replica.await(replica, :latest, 30_000) == :ok
    assert {:ok, first} = Replica.dump(replica)
    assert_receive {:committed, ^first, ^first}
    :ok = Replica.drop(replica)

    Log.produce(Log, log, for(k <- 1..10, do: {:del, k}))
    replica = start!(opts(ctx, source, snapshot: path))
    # restarted from its snapshot: that position, before any read
    assert_receive {:committed, ^first, ^first}
    assert Replica.await(replica, :latest, 30_000) == :ok
    assert {:ok, second} = Replica.dump(replica)
    assert second != first
    assert_receive {:committed, ^second, ^second}

    [{_, start} | _] = Log.committed(log) |> Enum.drop(2)
    assert start == first
    assert ReplicaLog.contents(name(ctx, "t")) == Log.model(log)
  end

  test ":batch_too_large from any source halves the batch until the reads fit", ctx do
    source_errors(ctx)
    log = Log.new(1)
    Log.produce(Log, log, for(k <- 1..100, do: {:put, k, k}))

    replica = start!(opts(ctx, {Log, table: log, max_count: 10}, batch_size: 100))
    assert Replica.await(replica, :latest, 30_000) == :ok
    assert ReplicaLog.contents(name(ctx, "t")) == Log.model(log)

    # 100, 50, 25 and 12 refused; then 6 at a time
    assert [%{reason: :batch_too_large}, _, _, _] = reported(ctx)
  end

  test "a source that raises in read/4 is counted and retried, not the replica's crash", ctx do
    source_errors(ctx)
    script = ScriptedSource.new()

    ScriptedSource.script(script, :read, [
      fn _conn, _position, _count, _block -> raise "a bug in the source" end,
      fn conn, 0, _count, _block ->
        {:ok, [{1, %{"op" => "put", "k" => "1", "v" => "1"}}], 1, conn}
      end
    ])

    replica =
      start!(
        opts(ctx, {ScriptedSource, script: script},
          into: {Larder.Table, name: name(ctx, "t"), key: :id}
        )
      )

    assert Replica.await(replica, 1, 10_000) == :ok
    assert Process.alive?(replica)

    assert [%Larder.Error{reason: :source_failed, details: %{reason: {:error, _}}}] =
             reported(ctx)

    assert ReplicaLog.contents(name(ctx, "t")) == %{1 => 1}
  end

  for arity <- [1, 2] do
    test "arity #{arity}: no snapshot inside a source's copy; dump/1 waits for its end, and a " <>
           "clean stop inside it leaves none, so a restart reads from the origin",
         ctx do
      me = self()
      path = Path.join(ctx.dir, "copy.snap")
      put = fn id -> {id, %{"op" => "put", "k" => "#{id}", "v" => "#{id}"}} end
      # positions 1 to 99 are the copy's
      source = ScriptedSource.Copying

      apply =
        if unquote(arity) == 1, do: &ReplicaLog.apply_entry/1, else: &ReplicaLog.apply_entry/2

      script = ScriptedSource.new()

      ScriptedSource.script(script, :read, [
        fn conn, 0, _, _ -> {:ok, Enum.map(1..10, put), 10, conn} end,
        fn conn, 10, _, _ ->
          send(me, {:reading, self()})

          receive do
            :go -> {:ok, Enum.map(11..99, put), 99, conn}
          end
        end,
        fn conn, 99, _, _ -> {:ok, [put.(100)], 100, conn} end
      ])

      replica =
        start!(opts(ctx, {source, script: script}, snapshot: path, batch_size: 100, apply: apply))

      assert_receive {:reading, reader}, 10_000
      Larder.Test.Eventually.eventually(fn -> Replica.offset(replica) == 10 end)

      dump = Task.async(fn -> Replica.dump(replica) end)
      assert Task.yield(dump, 300) == nil
      refute File.exists?(path)

      send(reader, :go)
      assert Task.await(dump, 10_000) == {:ok, 100}
      identity = %{source: source, log: "scripted, copying", target: {:table, name(ctx, "t")}}
      assert {:ok, %{offset: 100}} = Snapshot.read(path, identity)
      :ok = Replica.drop(replica)

      # a clean stop at 10, inside the copy, writes none
      File.rm!(path)
      fresh = ScriptedSource.new()

      ScriptedSource.script(fresh, :read, [
        fn conn, 0, _, _ -> {:ok, Enum.map(1..10, put), 10, conn} end
      ])

      replica = start!(opts(ctx, {source, script: fresh}, snapshot: path, apply: apply))
      Larder.Test.Eventually.eventually(fn -> Replica.offset(replica) == 10 end)
      :ok = GenServer.stop(replica)
      refute File.exists?(path)

      replica = start!(opts(ctx, {source, script: fresh}, snapshot: path, apply: apply))
      assert Replica.offset(replica) == 0
      assert ReplicaLog.contents(name(ctx, "t")) == %{}
    end
  end
end
