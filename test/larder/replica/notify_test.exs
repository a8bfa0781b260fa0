defmodule Larder.Replica.NotifyTest do
  # The Source contract's optional notify/2: a source that implements it
  # (a client that reads ahead in threads of its own, as librdkafka) is read
  # by the replica's reader with no wait, and the reader waits for the
  # source's notice instead of blocking in read/4. On an in-memory log of
  # several partitions (Larder.Test.NotifyingSource,
  # Larder.Test.PartitionedSource's shapes).
  use ExUnit.Case, async: true

  alias Larder.Replica
  alias Larder.Test.NotifyingSource, as: Log
  alias Larder.Test.PartitionedSource
  alias Larder.Test.ReplicaLog

  @moduletag :capture_log

  @partitions 4

  setup ctx do
    token = Base.encode16(:crypto.strong_rand_bytes(8), case: :lower)
    dir = Path.join(System.tmp_dir!(), "larder-notify-#{token}")
    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf(dir) end)
    %{dir: dir, log: Log.new(@partitions), test_name: ctx.test}
  end

  defp name(ctx, what), do: :"#{ctx.test_name} #{what}"

  defp opts(ctx, extra) do
    Keyword.merge(
      [
        name: name(ctx, "r"),
        into: {Larder.Table, name: name(ctx, "t"), key: :id, index: [:v]},
        source: {Log, table: ctx.log},
        apply: &ReplicaLog.apply_entry/1,
        batch_size: 7,
        block_ms: 60_000
      ],
      extra
    )
  end

  defp start!(opts) do
    {:ok, pid} = Replica.start_link(opts)
    pid
  end

  defp produce(log, ops), do: PartitionedSource.produce(Log, log, ops)

  # The offset of the snapshot at `path` of the replica of opts(ctx, _).
  defp snapshot_offset(ctx, path) do
    identity = %{source: Log, log: "partitioned", target: {:table, name(ctx, "t")}}

    with {:ok, %{offset: offset}} <- Larder.Replica.Snapshot.read(path, identity),
         do: {:ok, offset}
  end

  defp model(log), do: PartitionedSource.model(log)
  defp ends(log), do: PartitionedSource.ends(log)

  test "the reader reads with no wait, and a waiting reader reads again only on the " <>
         "source's notice",
       ctx do
    produce(ctx.log, for(k <- 1..50, do: {:put, k, k}))
    replica = start!(opts(ctx, []))
    assert Replica.await(replica, :latest, 30_000) == :ok

    # read with no wait, by the replica's reader, the process that connected
    {_reads, reader, block_ms} = Log.reads(ctx.log)
    assert reader == :sys.get_state(replica).reader
    assert reader != replica
    assert block_ms == 0
    assert Log.connected(ctx.log) == [reader]

    # Caught up and waiting: no reads without a notice (no polling loop;
    # the fallback read comes after block_ms, 60 s here).
    {before, _, _} = Log.reads(ctx.log)
    Process.sleep(300)
    {idle, _, _} = Log.reads(ctx.log)
    assert idle - before <= 1

    # A notice wakes it well before block_ms; calls are answered meanwhile.
    assert %{} = Replica.offset(replica)
    produce(ctx.log, [{:put, 7, 700}, {:del, 9}])
    assert Replica.await(replica, ends(ctx.log), 10_000) == :ok
    assert ReplicaLog.contents(name(ctx, "t")) == model(ctx.log)
  end

  test "calls are answered while the source's connect/1 waits on a server that does not answer",
       ctx do
    path = Path.join(ctx.dir, "held.snap")
    produce(ctx.log, for(k <- 1..20, do: {:put, k, k}))
    Log.hold_connect(ctx.log)
    replica = start!(opts(ctx, snapshot: path))

    # dump/1 is a call of the replica's process: answered, not held.
    task = Task.async(fn -> Replica.dump(replica) end)
    assert {:ok, {:ok, %{}}} = Task.yield(task, 10_000) || Task.shutdown(task)

    Log.release_connect(ctx.log)
    assert Replica.await(replica, :latest, 30_000) == :ok
    assert ReplicaLog.contents(name(ctx, "t")) == model(ctx.log)
    assert :ok = Replica.drop(replica)
  end

  test "every partition converges to the model under a producer, with an arity-2 apply " <>
         "too, and a restart from a snapshot applies nothing twice",
       ctx do
    path = Path.join(ctx.dir, "r.snap")
    opts = opts(ctx, snapshot: path, apply: &ReplicaLog.apply_entry/2)
    replica = start!(opts)

    producer =
      Task.async(fn ->
        for _ <- 1..20 do
          produce(ctx.log, for(_ <- 1..15, do: {:incr, :rand.uniform(30), :rand.uniform(9)}))
          Process.sleep(5)
        end
      end)

    Task.await(producer, 30_000)
    assert Replica.await(replica, :latest, 30_000) == :ok
    assert ReplicaLog.contents(name(ctx, "t")) == model(ctx.log)
    assert {:ok, _position} = Replica.dump(replica)
    :ok = Replica.drop(replica)

    produce(ctx.log, for(_ <- 1..100, do: {:incr, :rand.uniform(30), :rand.uniform(9)}))
    replica = start!(opts)
    assert Replica.await(replica, :latest, 30_000) == :ok
    assert ReplicaLog.contents(name(ctx, "t")) == model(ctx.log)
    assert Replica.offset(replica) == ends(ctx.log)
  end

  test "a partition trimmed past the position is rebuilt with on_trimmed: :rebuild", ctx do
    path = Path.join(ctx.dir, "trim.snap")
    produce(ctx.log, for(k <- 1..40, do: {:put, k, k}))
    replica = start!(opts(ctx, snapshot: path))
    assert Replica.await(replica, :latest, 30_000) == :ok
    :ok = Replica.drop(replica)

    produce(ctx.log, for(k <- [1, 5, 9], do: {:put, k, 100}))
    Larder.Test.PartitionedSource.trim(ctx.log, 1, ends(ctx.log)[1] - 1)

    replica = start!(opts(ctx, snapshot: path, on_trimmed: :rebuild))
    assert Replica.await(replica, :latest, 30_000) == :ok
    assert ReplicaLog.contents(name(ctx, "t")) == model(ctx.log)
    assert Replica.offset(replica) == ends(ctx.log)
  end

  # An apply that does not return holds the reader (arity 1) or the step
  # that applies its batch (arity 2), not the replica's process: drop/1
  # ends it, and a process that started the replica (linked, not trapping
  # exits) lives on. A reader stuck in an arity-1 apply has written
  # nothing: the replica stops with a last snapshot, of the entries before
  # the stuck one. A step stuck in an arity-2 apply may be mid-entry: no
  # snapshot.
  for arity <- [1, 2] do
    test "an arity-#{arity} apply stuck on an entry: drop/1 ends it, not the process that " <>
           "started the replica",
         ctx do
      owner = self()
      path = Path.join(ctx.dir, "stuck.snap")
      produce(ctx.log, for(k <- 1..5, do: {:put, k, k}))

      stuck = fn fields ->
        if fields["k"] == "3" do
          send(owner, {:stuck, self()})
          Process.sleep(:infinity)
        end

        ReplicaLog.apply_entry(fields)
      end

      apply =
        case unquote(arity) do
          1 -> stuck
          2 -> fn fields, _into -> stuck.(fields) end
        end

      opts = opts(ctx, apply: apply, snapshot: path, batch_size: 1)

      starter =
        spawn(fn ->
          {:ok, replica} = Replica.start_link(opts)
          send(owner, {:started, replica})

          receive do
            :drop -> send(owner, {:dropped, Replica.drop(replica)})
          end

          receive do
            :exit -> :ok
          end
        end)

      watch = Process.monitor(starter)
      assert_receive {:started, replica}, 10_000
      assert_receive {:stuck, step}, 10_000

      # the replica answers meanwhile
      assert %{} = offset = Replica.offset(replica)

      assert {:error, %Larder.Error{reason: :timeout}} =
               Replica.await(replica, ends(ctx.log), 200)

      send(starter, :drop)
      assert_receive {:dropped, :ok}, 20_000
      refute_received {:DOWN, ^watch, _, _, _}
      assert Process.alive?(starter)
      refute Process.alive?(replica)
      refute Process.alive?(step)

      case unquote(arity) do
        1 ->
          # every entry but the stuck one (key 3's): those the reader read
          # before it, the last of them applied while it was stuck
          but_stuck =
            for {id, fields} <- Log.entries(ctx.log), fields["k"] != "3", reduce: %{} do
              position -> Log.advance(position, id)
            end

          assert snapshot_offset(ctx, path) == {:ok, but_stuck}
          assert Log.reached?(but_stuck, offset)

        2 ->
          refute File.exists?(path)
      end

      send(starter, :exit)
      assert_receive {:DOWN, ^watch, :process, _, :normal}, 10_000
    end
  end

  test "a read in the replica's own process that says stop ends it with its error " <>
         "whatever :on_trimmed, and a caller waiting gets it",
       ctx do
    for on_trimmed <- [:stop, :rebuild] do
      log = Log.new(@partitions)
      produce(log, for(k <- 1..40, do: {:put, k, k}))

      opts =
        opts(ctx,
          name: name(ctx, "r #{on_trimmed}"),
          into: {Larder.Table, name: name(ctx, "t #{on_trimmed}"), key: :id},
          source: {Log, table: log},
          on_trimmed: on_trimmed
        )

      replica = start_supervised!({Replica, opts}, id: on_trimmed)
      ref = Process.monitor(replica)
      assert Replica.await(replica, :latest, 30_000) == :ok

      # A plain process waits for a position the replica will never reach.
      waiter = Task.async(fn -> Replica.await(replica, %{0 => 1_000_000}, 30_000) end)
      error = Larder.Error.new(:partitions_changed, "the log changed under the replica")
      Log.stop(log, error)
      produce(log, [{:put, 1, 2}])

      assert Task.await(waiter, 35_000) == {:error, error}
      assert_receive {:DOWN, ^ref, :process, ^replica, {:shutdown, ^error}}, 30_000
    end
  end
end
