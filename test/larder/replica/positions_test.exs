defmodule Larder.Replica.PositionsTest do
  # The Source contract's positions made of several parts (v2), on an
  # in-memory log with a Kafka topic's shapes (Larder.Test.PartitionedSource):
  # one next offset per partition, gaps in the offsets, ends past the last
  # entry, trimmed partitions. A key lives in one partition, as in Kafka,
  # so the plain model is the entries folded partition by partition.
  use ExUnit.Case, async: true

  alias Larder.Replica
  alias Larder.Test.PartitionedSource, as: Log
  alias Larder.Test.ReplicaLog

  @moduletag :capture_log

  @partitions 4

  setup ctx do
    # Random, not unique_integer/1 (unique in this VM only, and other VMs on
    # the machine run these tests too), nor :rand (ExUnit seeds it alike in
    # every test).
    token = Base.encode16(:crypto.strong_rand_bytes(8), case: :lower)
    dir = Path.join(System.tmp_dir!(), "larder-positions-#{token}")
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
        block_ms: 20
      ],
      extra
    )
  end

  defp start!(opts) do
    {:ok, pid} = Replica.start_link(opts)
    pid
  end

  defp produce(log, ops), do: Log.produce(Log, log, ops)
  defp model(log), do: Log.model(log)
  defp ends(log), do: Log.ends(log)

  test "every partition is applied in offset order, past gaps, and await(:latest) " <>
         "reaches ends that no entry is at",
       ctx do
    # puts and deletes (the arity-1 apply's ops)
    produce(
      ctx.log,
      for(
        _ <- 1..300,
        do:
          Enum.random([{:put, :rand.uniform(40), :rand.uniform(999)}, {:del, :rand.uniform(40)}])
      )
    )

    # Gaps: compacted entries inside partitions, ends past the last entry
    # (as a transaction marker leaves), and a partition of gaps only.
    for p <- 0..2, o <- Enum.take_random(0..60, 5), do: Log.compact(ctx.log, p, o)
    Log.skip(ctx.log, 2, 5)
    for o <- 0..100, do: Log.compact(ctx.log, 3, o)
    Log.skip(ctx.log, 3, 3)

    replica = start!(opts(ctx, []))
    assert Replica.await(replica, :latest, 30_000) == :ok
    assert ReplicaLog.contents(name(ctx, "t")) == model(ctx.log)
    assert Replica.offset(replica) == ends(ctx.log)

    # An explicit position: one partition's end only.
    assert Replica.await(replica, %{2 => ends(ctx.log)[2]}, 1_000) == :ok

    assert {:error, %Larder.Error{reason: :timeout}} =
             Replica.await(replica, %{0 => ends(ctx.log)[0] + 1}, 50)

    # Entries after a tail gap are read too.
    produce(ctx.log, for(k <- [2, 6, 10], do: {:put, k, 7}))
    assert Replica.await(replica, :latest, 30_000) == :ok
    assert ReplicaLog.contents(name(ctx, "t")) == model(ctx.log)
  end

  test "a restart from a snapshot resumes every partition at its own offset: " <>
         "no entry is applied twice",
       ctx do
    path = Path.join(ctx.dir, "r.snap")
    # increments show an entry applied twice
    opts = opts(ctx, snapshot: path, apply: &ReplicaLog.apply_entry/2)
    produce(ctx.log, for(_ <- 1..200, do: {:incr, :rand.uniform(30), :rand.uniform(9)}))
    Log.skip(ctx.log, 1, 4)

    replica = start!(opts)
    assert Replica.await(replica, :latest, 30_000) == :ok
    assert {:ok, position} = Replica.dump(replica)
    assert position == ends(ctx.log)
    :ok = Replica.drop(replica)

    produce(ctx.log, for(_ <- 1..100, do: {:incr, :rand.uniform(30), :rand.uniform(9)}))
    replica = start!(opts)
    assert Replica.await(replica, :latest, 30_000) == :ok
    assert ReplicaLog.contents(name(ctx, "t")) == model(ctx.log)
    assert Replica.offset(replica) == ends(ctx.log)
  end

  describe "a partition trimmed past the snapshot's position" do
    setup ctx do
      path = Path.join(ctx.dir, "trim.snap")
      produce(ctx.log, for(k <- 1..40, do: {:put, k, k}))
      replica = start!(opts(ctx, snapshot: path))
      assert Replica.await(replica, :latest, 30_000) == :ok
      :ok = Replica.drop(replica)

      # Partition 1 gets entries the replica never read, then loses them.
      produce(ctx.log, for(k <- [1, 5, 9], do: {:put, k, 100}))
      produce(ctx.log, for(k <- [13, 17], do: {:del, k}))
      Log.trim(ctx.log, 1, ends(ctx.log)[1] - 1)
      %{path: path}
    end

    test "on_trimmed: :stop stops the replica with :offset_trimmed", ctx do
      Process.flag(:trap_exit, true)
      replica = start!(opts(ctx, snapshot: ctx.path))

      assert_receive {:EXIT, ^replica, {:shutdown, %Larder.Error{reason: :offset_trimmed}}}
    end

    test "on_trimmed: :rebuild reads what every partition still holds", ctx do
      replica = start!(opts(ctx, snapshot: ctx.path, on_trimmed: :rebuild))
      assert Replica.await(replica, :latest, 30_000) == :ok
      assert ReplicaLog.contents(name(ctx, "t")) == model(ctx.log)
      assert Replica.offset(replica) == ends(ctx.log)
    end
  end

  test "a reader process's read that says stop ends the replica with its error " <>
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
