defmodule Larder.ReplicaTest do
  # Replicas of a Redis Stream on a real redis-server: convergence to a
  # plain model, kills and restarts while a producer writes, trimmed
  # streams, poisoned entries, Redis paused, snapshots of another stream or
  # table, and servers that answer garbage.
  use ExUnit.Case, async: true

  alias Larder.Replica
  alias Larder.Test.RedisServer
  alias Larder.Table
  alias Larder.Test.GarbageServer
  alias Larder.Test.ReplicaLog, as: Log

  @moduletag :redis
  @moduletag :capture_log

  setup ctx do
    server = RedisServer.start()
    on_exit(fn -> RedisServer.stop(server) end)
    token = Base.encode16(:rand.bytes(6), case: :lower)
    dir = Path.join(System.tmp_dir!(), "larder-replica-#{token}")
    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf(dir) end)
    id = System.unique_integer([:positive])

    %{
      server: server,
      redis: Log.connect(server.port),
      dir: dir,
      stream: "stream-#{id}",
      id: id,
      test_name: ctx.test
    }
  end

  defp name(ctx, what), do: :"#{ctx.test_name} #{what}"

  # The events of this test's replica (named "r"), sent to the test process.
  defp forward(ctx, events) do
    me = self()
    replica = name(ctx, "r")

    :ok =
      :telemetry.attach_many(
        ctx.test_name,
        events,
        fn event, measurements, meta, _ ->
          if meta.replica == replica, do: send(me, {:event, event, measurements, meta})
        end,
        nil
      )

    on_exit(fn -> :telemetry.detach(ctx.test_name) end)
  end

  defp start!(opts) do
    {:ok, pid} = Replica.start_link(opts)
    pid
  end

  defp random_ops(n, keys), do: for(_ <- 1..n, do: Log.random_op(keys))

  defp put_del_ops(n, keys),
    do: Enum.filter(random_ops(n * 2, keys), &(elem(&1, 0) != :incr)) |> Enum.take(n)

  test "three replicas of one stream converge to the model", ctx do
    Log.add(ctx.redis, ctx.stream, put_del_ops(500, 50))

    replicas =
      for i <- 1..3 do
        start!(Log.opts(name(ctx, "r#{i}"), name(ctx, "t#{i}"), ctx.server.port, ctx.stream))
      end

    # more while they follow
    for _ <- 1..10, do: Log.add(ctx.redis, ctx.stream, put_del_ops(50, 50))

    model = Log.model(ctx.redis, ctx.stream)
    assert map_size(model) > 0

    for {replica, i} <- Enum.with_index(replicas, 1) do
      assert Replica.await(replica, :latest, 30_000) == :ok
      assert Log.contents(name(ctx, "t#{i}")) == model
      # the index follows too
      {k, v} = Enum.at(model, 0)
      assert k in Table.search_keys(name(ctx, "t#{i}"), v: v)
    end

    offsets = Enum.map(replicas, &Replica.offset/1)

    assert Enum.uniq(offsets) == [
             Log.command(ctx.redis, ["XREVRANGE", ctx.stream, "+", "-", "COUNT", "1"])
             |> then(fn {:ok, [[id, _]]} -> id end)
           ]
  end

  test "a Bag replica", ctx do
    Log.add(ctx.redis, ctx.stream, [
      {:put, 1, 10},
      {:put, 1, 11},
      {:put, 2, 20},
      {:del, 1},
      {:put, 1, 12}
    ])

    apply = fn
      %{"op" => "put", "k" => k, "v" => v} -> {:insert, k, v}
      %{"op" => "del", "k" => k} -> {:delete, k}
    end

    opts =
      Log.opts(name(ctx, "r"), nil, ctx.server.port, ctx.stream,
        into: {Larder.Bag, name: name(ctx, "bag")},
        apply: apply
      )

    replica = start!(opts)
    assert Replica.await(replica, :latest, 10_000) == :ok
    assert Larder.Bag.lookup(name(ctx, "bag"), "1") == ["12"]
    assert Larder.Bag.lookup(name(ctx, "bag"), "2") == ["20"]
  end

  # The number of times Redis ran `command` since its stats were reset.
  defp calls(redis, command) do
    {:ok, info} = Log.command(redis, ["INFO", "commandstats"])

    case Regex.run(~r/cmdstat_#{command}(?:\|\w+)?:calls=(\d+)/, info) do
      [_, n] -> String.to_integer(n)
      nil -> 0
    end
  end

  # Waits until the replica's reader is blocked in its XREAD.
  defp await_blocked(redis) do
    {:ok, info} = Log.command(redis, ["INFO", "clients"])

    unless info =~ "blocked_clients:1" do
      Process.sleep(5)
      await_blocked(redis)
    end
  end

  test "a replica that reached the end waits for the next entry, not reading the end again",
       ctx do
    Log.add(ctx.redis, ctx.stream, for(k <- 1..5, do: {:put, k, k}))
    opts = Log.opts(name(ctx, "r"), name(ctx, "t"), ctx.server.port, ctx.stream, block_ms: 60_000)
    replica = start!(opts)
    :ok = Replica.await(replica, :latest, 10_000)
    await_blocked(ctx.redis)
    {:ok, "OK"} = Log.command(ctx.redis, ["CONFIG", "RESETSTAT"])

    # One wake-up: the blocked XREAD returns, one atomic read (MULTI,
    # XINFO, XREAD, EXEC) takes the entry, and the reader blocks again.
    [id] = Log.add(ctx.redis, ctx.stream, [{:put, 6, 6}])
    :ok = Replica.await(replica, id, 10_000)
    await_blocked(ctx.redis)
    assert calls(ctx.redis, "xinfo") == 1
    assert calls(ctx.redis, "exec") == 1
    assert calls(ctx.redis, "xread") == 2
    assert Log.contents(name(ctx, "t")) == Map.new(1..6, &{&1, &1})
  end

  test "its server and its reader are OTP processes: :sys.get_state/1 answers for each", ctx do
    Log.add(ctx.redis, ctx.stream, for(k <- 1..5, do: {:put, k, k}))
    opts = Log.opts(name(ctx, "r"), name(ctx, "t"), ctx.server.port, ctx.stream, block_ms: 200)
    replica = start!(opts)
    :ok = Replica.await(replica, :latest, 10_000)
    reader = :sys.get_state(replica).reader
    assert is_pid(reader) and Process.alive?(reader)
    # between two blocking reads of up to :block_ms, at the latest
    assert %{server: ^replica, source: Larder.Replica.RedisStream} = :sys.get_state(reader, 5_000)
  end

  test "entries too large for the batch size within :max_reply_bytes are read in smaller batches",
       ctx do
    big = String.duplicate("x", 3_000)
    Log.add(ctx.redis, ctx.stream, for(k <- 1..40, do: {:put, k, big}))

    opts =
      Log.opts(name(ctx, "r"), nil, ctx.server.port, ctx.stream,
        into: {Larder.Bag, name: name(ctx, "bag")},
        apply: fn %{"k" => k, "v" => v} -> {:insert, k, byte_size(v)} end,
        source:
          {Larder.Replica.RedisStream,
           redis: [port: ctx.server.port, max_reply_bytes: 16_384], stream: ctx.stream}
      )

    replica = start!(opts)
    assert Replica.await(replica, :latest, 20_000) == :ok
    assert Larder.Bag.size(name(ctx, "bag")) == 40
    assert Larder.Bag.lookup(name(ctx, "bag"), "40") == [3_000]
  end

  test "replicas killed and restarted at random points while a producer writes each equal the model",
       ctx do
    Process.flag(:trap_exit, true)
    me = self()

    producer =
      spawn_link(fn ->
        redis = Log.connect(ctx.server.port)

        for _ <- 1..150 do
          Log.add(redis, ctx.stream, random_ops(:rand.uniform(30), 40))
          Process.sleep(:rand.uniform(4))
        end

        send(me, :produced)
      end)

    paths = for i <- 1..2, do: Path.join(ctx.dir, "r#{i}.snap")

    opts =
      for {path, i} <- Enum.with_index(paths, 1) do
        Log.opts(name(ctx, "r#{i}"), name(ctx, "t#{i}"), ctx.server.port, ctx.stream,
          apply: &Log.apply_entry/2,
          snapshot: path,
          snapshot_every: 100,
          batch_size: 20
        )
      end

    pids = Enum.map(opts, &start!/1)

    {pids, from_snapshot} =
      Enum.reduce(1..25, {pids, 0}, fn round, {pids, from_snapshot} ->
        Process.sleep(:rand.uniform(60))
        i = :rand.uniform(2) - 1
        victim = Enum.at(pids, i)
        # A loaded machine can kill every replica before its 100 ms timer
        # writes a snapshot; every fifth victim writes one first, so some
        # restarts are sure to start from a snapshot (the others are killed
        # wherever they are, mid-snapshot included).
        if rem(round, 5) == 0, do: {:ok, _} = Replica.dump(victim)
        Process.exit(victim, :kill)
        assert_receive {:EXIT, ^victim, :killed}
        pid = start!(Enum.at(opts, i))
        started_at = Replica.offset(pid)
        {List.replace_at(pids, i, pid), from_snapshot + if(started_at != "0-0", do: 1, else: 0)}
      end)

    assert_receive :produced, 60_000
    assert_receive {:EXIT, ^producer, :normal}
    model = Log.model(ctx.redis, ctx.stream)

    for {pid, i} <- Enum.with_index(pids, 1) do
      assert Replica.await(pid, :latest, 30_000) == :ok
      assert Log.contents(name(ctx, "t#{i}")) == model
    end

    # the restarts did start from snapshots, not from the beginning
    assert from_snapshot > 0
  end

  describe "a trimmed stream" do
    setup ctx do
      path = Path.join(ctx.dir, "trim.snap")
      # explicit ids: 100-1 .. 100-10, then 100-11 .. 100-20
      Log.add_at(ctx.redis, ctx.stream, for(k <- 1..10, do: {"100-#{k}", {:put, k, k}}))
      opts = Log.opts(name(ctx, "r"), name(ctx, "t"), ctx.server.port, ctx.stream, snapshot: path)
      replica = start!(opts)
      assert Replica.await(replica, :latest, 10_000) == :ok
      offset = Replica.offset(replica)
      # a clean stop writes the snapshot
      :ok = GenServer.stop(replica)
      Log.add_at(ctx.redis, ctx.stream, for(k <- 11..20, do: {"100-#{k}", {:put, k, k}}))
      forward(ctx, [[:larder, :replica, :trimmed]])
      %{opts: opts, offset: offset}
    end

    test "past the snapshot's id, on_trimmed: :stop stops with :offset_trimmed", ctx do
      {:ok, "15"} = Log.command(ctx.redis, ["XTRIM", ctx.stream, "MAXLEN", "5"])
      Process.flag(:trap_exit, true)
      replica = start!(ctx.opts)
      assert_receive {:event, [:larder, :replica, :trimmed], %{count: 1}, %{action: :stop}}
      assert_receive {:EXIT, ^replica, {:shutdown, %Larder.Error{reason: :offset_trimmed}}}
    end

    test "past the snapshot's id, on_trimmed: :rebuild rebuilds from what is left", ctx do
      {:ok, "15"} = Log.command(ctx.redis, ["XTRIM", ctx.stream, "MAXLEN", "5"])
      replica = start!(Keyword.put(ctx.opts, :on_trimmed, :rebuild))
      assert Replica.await(replica, :latest, 10_000) == :ok
      assert_receive {:event, [:larder, :replica, :trimmed], %{count: 1}, %{action: :rebuild}}
      assert Log.contents(name(ctx, "t")) == Map.new(16..20, &{&1, &1})
      assert Log.model(ctx.redis, ctx.stream) == Map.new(16..20, &{&1, &1})
    end

    test "only up to the snapshot's id is not a trim", ctx do
      # the 10 entries the snapshot holds are removed, the 10 after stay
      assert ctx.offset == "100-10"
      {:ok, "10"} = Log.command(ctx.redis, ["XTRIM", ctx.stream, "MINID", "100-11"])
      replica = start!(ctx.opts)
      assert Replica.await(replica, :latest, 10_000) == :ok
      refute_received {:event, [:larder, :replica, :trimmed], _, _}
      assert Log.contents(name(ctx, "t")) == Map.new(1..20, &{&1, &1})
    end
  end

  describe "a log that went backwards" do
    # 1000-1 .. 1000-100 applied, then the stream deleted and written again
    # with lower ids: below the replica's offset, where no new entry wakes
    # its blocked XREAD.
    setup ctx do
      Log.add_at(ctx.redis, ctx.stream, for(k <- 1..100, do: {"1000-#{k}", {:put, k, k}}))
      forward(ctx, [[:larder, :replica, :trimmed]])
      :ok
    end

    defp follow(ctx, extra) do
      replica =
        start!(Log.opts(name(ctx, "r"), name(ctx, "t"), ctx.server.port, ctx.stream, extra))

      assert Replica.await(replica, :latest, 10_000) == :ok
      assert Replica.offset(replica) == "1000-100"
      await_blocked(ctx.redis)
      replica
    end

    defp rewrite(ctx, pairs) do
      {:ok, _} = Log.command(ctx.redis, ["DEL", ctx.stream])
      Log.add_at(ctx.redis, ctx.stream, pairs)
    end

    test "is a trim: on_trimmed: :stop stops with :offset_trimmed, and await(:latest) gets it",
         ctx do
      Process.flag(:trap_exit, true)
      replica = follow(ctx, block_ms: 2_000)
      rewrite(ctx, for(k <- 1..10, do: {"5-#{k}", {:put, k, 9999}}))

      assert {:error, %Larder.Error{reason: :offset_trimmed}} =
               Replica.await(replica, :latest, 20_000)

      assert_receive {:event, [:larder, :replica, :trimmed], %{count: 1},
                      %{action: :stop, offset: "1000-100"}}

      assert_receive {:EXIT, ^replica, {:shutdown, %Larder.Error{reason: :offset_trimmed}}}
    end

    test "is a trim: on_trimmed: :rebuild rebuilds from the log, and await(:latest) waits for it",
         ctx do
      replica = follow(ctx, on_trimmed: :rebuild)
      rewrite(ctx, for(k <- 1..10, do: {"5-#{k}", {:put, k, 9999}}))
      assert Replica.await(replica, :latest, 20_000) == :ok
      assert Replica.offset(replica) == "5-10"
      assert Log.contents(name(ctx, "t")) == Map.new(1..10, &{&1, 9999})

      assert_receive {:event, [:larder, :replica, :trimmed], %{count: 1},
                      %{action: :rebuild, resume_after: "0-0"}}
    end

    test "a log that lost its last entries (a failover) is rebuilt the same way", ctx do
      replica = follow(ctx, on_trimmed: :rebuild)
      # the same first 90 entries, the last 10 lost
      rewrite(ctx, for(k <- 1..90, do: {"1000-#{k}", {:put, k, k}}))
      assert Replica.await(replica, :latest, 20_000) == :ok
      assert Replica.offset(replica) == "1000-90"
      assert Log.contents(name(ctx, "t")) == Map.new(1..90, &{&1, &1})
      assert_receive {:event, [:larder, :replica, :trimmed], _, %{action: :rebuild}}
    end

    test "a log that lost its last entries and got new ones past them is rebuilt too", ctx do
      replica = follow(ctx, on_trimmed: :rebuild)
      # the last 10 lost, and new entries past the replica's id
      rewrite(
        ctx,
        for(k <- 1..90, do: {"1000-#{k}", {:put, k, k}}) ++
          for(k <- 1..5, do: {"2000-#{k}", {:put, k, -k}})
      )

      assert Replica.await(replica, :latest, 20_000) == :ok
      assert Replica.offset(replica) == "2000-5"
      assert Log.contents(name(ctx, "t")) == Log.model(ctx.redis, ctx.stream)
      assert_receive {:event, [:larder, :replica, :trimmed], _, %{action: :rebuild}}
    end

    test "a replica restarted from a snapshot above the log sees it at its first read", ctx do
      Process.flag(:trap_exit, true)
      path = Path.join(ctx.dir, "back.snap")
      replica = follow(ctx, snapshot: path)
      :ok = GenServer.stop(replica)
      rewrite(ctx, for(k <- 1..10, do: {"5-#{k}", {:put, k, 9999}}))

      replica =
        start!(
          Log.opts(name(ctx, "r"), name(ctx, "t"), ctx.server.port, ctx.stream, snapshot: path)
        )

      assert_receive {:EXIT, ^replica, {:shutdown, %Larder.Error{reason: :offset_trimmed}}},
                     10_000
    end
  end

  describe "an arity-2 apply stuck on an entry" do
    # The apply blocks for good on the entry of key 2 (in a process of the
    # replica's, a step, which it reports): calls that only read or wait
    # must still answer, and drop/1 must end it without killing a process
    # linked to the replica. The test process does not trap exits.
    setup ctx do
      me = self()
      [first, _] = Log.add(ctx.redis, ctx.stream, [{:put, 1, 1}, {:put, 2, 2}])

      apply = fn
        %{"k" => "2"}, _into ->
          send(me, {:stuck, self()})
          Process.sleep(:infinity)

        fields, into ->
          Log.apply_entry(fields, into)
      end

      path = Path.join(ctx.dir, "stuck.snap")

      opts =
        Log.opts(name(ctx, "r"), name(ctx, "t"), ctx.server.port, ctx.stream,
          apply: apply,
          batch_size: 1,
          snapshot: path,
          snapshot_every: 86_400_000
        )

      %{opts: opts, first: first, path: path}
    end

    # The call's result, or :hung when it has not answered in 20 s.
    defp answer(fun) do
      task = Task.async(fun)

      case Task.yield(task, 20_000) || Task.shutdown(task, :brutal_kill) do
        {:ok, result} -> result
        _ -> :hung
      end
    end

    test "await/3 answers by its timeout, offset/1 and target/1 at once", ctx do
      replica = start!(ctx.opts)
      assert_receive {:stuck, _step}, 10_000

      assert answer(fn -> Replica.offset(replica) end) == ctx.first
      assert %Table{} = answer(fn -> Replica.target(replica) end)
      assert answer(fn -> Replica.await(replica, ctx.first, 1_000) end) == :ok

      assert {:error, %Larder.Error{reason: :timeout}} =
               answer(fn -> Replica.await(replica, :latest, 1_000) end)

      # in the caller's own process: a late answer would not reach it
      assert {:error, %Larder.Error{reason: :timeout}} =
               Replica.await(name(ctx, "r"), "99999999999999-0", 300)

      refute_receive {_ref, :ok}, 500
    end

    test "drop/1 from the plain process that started it ends the apply, not that process",
         ctx do
      owner = self()

      # a plain process, not trapping exits, linked to the replica
      starter =
        spawn(fn ->
          {:ok, replica} = Replica.start_link(ctx.opts)
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
      send(starter, :drop)
      assert_receive {:dropped, :ok}, 20_000

      refute_received {:DOWN, ^watch, _, _, _}
      assert Process.alive?(starter)
      refute Process.alive?(replica)
      refute Process.alive?(step)
      # no snapshot: the structure was mid-batch
      refute File.exists?(ctx.path)
      assert_raise ArgumentError, ~r/unknown Larder.Replica/, fn -> Replica.offset(replica) end

      send(starter, :exit)
      assert_receive {:DOWN, ^watch, :process, _, :normal}, 10_000
    end

    test "drop/1 from another process: the linked caller lives on, the name is free again",
         ctx do
      refute Process.flag(:trap_exit, false)
      replica = start!(ctx.opts)
      assert_receive {:stuck, step}, 10_000
      assert answer(fn -> Replica.drop(replica) end) == :ok
      # this process, linked to the replica and not trapping, is alive
      refute Process.alive?(replica)
      refute Process.alive?(step)
      refute File.exists?(ctx.path)

      # a new replica of the same name and structure starts (and gets stuck)
      again = start!(ctx.opts)
      assert_receive {:stuck, _}, 10_000
      assert answer(fn -> Replica.drop(name(ctx, "r")) end) == :ok
      refute Process.alive?(again)
    end

    test "drop/1 of a supervised one ends it and it stays dropped", ctx do
      {:ok, sup} = Supervisor.start_link([{Replica, ctx.opts}], strategy: :one_for_one)
      on_exit(fn -> Process.exit(sup, :kill) end)
      assert_receive {:stuck, step}, 10_000
      [{_, replica, _, _}] = Supervisor.which_children(sup)
      assert answer(fn -> Replica.drop(name(ctx, "r")) end) == :ok
      refute Process.alive?(replica)
      refute Process.alive?(step)
      assert [{{Replica, _}, :undefined, :worker, _}] = Supervisor.which_children(sup)
      refute_receive {:stuck, _}, 500
      assert Replica.drop(name(ctx, "r")) == :ok
    end

    test "a supervisor's shutdown ends it too, without a snapshot", ctx do
      {:ok, sup} = Supervisor.start_link([{Replica, ctx.opts}], strategy: :one_for_one)
      Process.unlink(sup)
      assert_receive {:stuck, step}, 10_000
      assert answer(fn -> Supervisor.stop(sup) end) == :ok
      refute Process.alive?(step)
      refute File.exists?(ctx.path)
    end
  end

  test "an apply that calls drop/1 or dump/1 on its own replica gets an answer, not a deadlock",
       ctx do
    me = self()
    replica_name = name(ctx, "r")

    apply = fn fields, into ->
      if fields["k"] == "1" do
        send(me, {:inside, Replica.dump(replica_name), Replica.drop(replica_name)})
      end

      Log.apply_entry(fields, into)
    end

    Log.add(ctx.redis, ctx.stream, for(k <- 1..3, do: {:put, k, k}))

    opts =
      Log.opts(replica_name, name(ctx, "t"), ctx.server.port, ctx.stream,
        apply: apply,
        snapshot: Path.join(ctx.dir, "own.snap")
      )

    replica = start!(opts)
    assert_receive {:inside, {:error, %Larder.Error{reason: :in_apply}}, :ok}, 10_000
    # nothing was done: the replica goes on
    assert Replica.await(replica, :latest, 10_000) == :ok
    assert Process.alive?(replica)
    assert Log.contents(name(ctx, "t")) == Map.new(1..3, &{&1, &1})
    assert {:ok, _} = Replica.dump(replica)
  end

  describe "a poisoned entry" do
    setup ctx do
      [_, _, poison, _, _] =
        Log.add(ctx.redis, ctx.stream, [
          {:put, 1, 1},
          {:put, 2, 2},
          :poison,
          {:put, 3, 3},
          {:del, 1}
        ])

      forward(ctx, [[:larder, :replica, :rejected]])
      %{poison: poison}
    end

    test "on_error: :stop stops at it, and reports it", ctx do
      Process.flag(:trap_exit, true)
      replica = start!(Log.opts(name(ctx, "r"), name(ctx, "t"), ctx.server.port, ctx.stream))

      assert_receive {:EXIT, ^replica,
                      {:shutdown, %Larder.Error{reason: :apply_failed, details: %{id: id}}}}

      assert id == ctx.poison

      assert_receive {:event, [:larder, :replica, :rejected], %{count: 1},
                      %{id: ^id, action: :stop}}
    end

    test "on_error: :stop: a caller waiting in await/3 gets the error", ctx do
      Process.flag(:trap_exit, true)
      stream = ctx.stream <> "-late"
      [first] = Log.add(ctx.redis, stream, [{:put, 1, 1}])
      replica = start!(Log.opts(name(ctx, "r"), name(ctx, "t"), ctx.server.port, stream))
      assert Replica.await(replica, first, 10_000) == :ok
      waiter = Task.async(fn -> Replica.await(replica, "99999999999999-0", 60_000) end)

      RedisServer.wait_until(10_000, "the waiter", fn ->
        :sys.get_state(replica).waiters != []
      end)

      Log.add(ctx.redis, stream, [{:put, 2, 2}, :poison])

      assert {:error, %Larder.Error{reason: :apply_failed}} = Task.await(waiter, 30_000)
      assert_receive {:EXIT, ^replica, {:shutdown, %Larder.Error{reason: :apply_failed}}}
      # the entry before the poisoned one was applied before it stopped
      assert_receive {:event, [:larder, :replica, :rejected], _, %{action: :stop}}
    end

    test "on_error: :skip skips it and applies the rest", ctx do
      replica =
        start!(
          Log.opts(name(ctx, "r"), name(ctx, "t"), ctx.server.port, ctx.stream, on_error: :skip)
        )

      assert Replica.await(replica, :latest, 10_000) == :ok
      poison = ctx.poison

      assert_receive {:event, [:larder, :replica, :rejected], %{count: 1},
                      %{id: ^poison, action: :skip}}

      assert Log.contents(name(ctx, "t")) == %{2 => 2, 3 => 3}
      assert Log.contents(name(ctx, "t")) == Log.model(ctx.redis, ctx.stream)
    end

    test "an apply function that returns something else, or writes a bad record, is rejected",
         ctx do
      apply = fn
        %{"op" => "put", "k" => "1"} -> :not_an_op
        %{"op" => "put", "k" => "2"} -> {:insert, %{no_key: 1}}
        fields -> Log.apply_entry(fields)
      end

      replica =
        start!(
          Log.opts(name(ctx, "r"), name(ctx, "t"), ctx.server.port, ctx.stream,
            on_error: :skip,
            apply: apply
          )
        )

      assert Replica.await(replica, :latest, 10_000) == :ok

      for _ <- 1..3,
          do:
            assert_receive(
              {:event, [:larder, :replica, :rejected], %{count: 1}, %{action: :skip}}
            )

      assert Log.contents(name(ctx, "t")) == %{3 => 3}
    end
  end

  test "Redis stopped (SIGSTOP) pauses the replica, which resumes after SIGCONT", ctx do
    forward(ctx, [[:larder, :replica, :source, :error]])
    Log.add(ctx.redis, ctx.stream, for(k <- 1..10, do: {:put, k, k}))
    replica = start!(Log.opts(name(ctx, "r"), name(ctx, "t"), ctx.server.port, ctx.stream))
    assert Replica.await(replica, :latest, 10_000) == :ok

    RedisServer.pause(ctx.server)
    on_exit(fn -> RedisServer.resume(ctx.server) end)

    assert_receive {:event, [:larder, :replica, :source, :error], %{count: 1},
                    %{error: %Larder.Error{reason: :source_unavailable}}},
                   10_000

    # still serving, and still alive
    assert Log.contents(name(ctx, "t")) == Map.new(1..10, &{&1, &1})
    assert Process.alive?(replica)

    RedisServer.resume(ctx.server)
    Log.add(ctx.redis, ctx.stream, for(k <- 11..20, do: {:put, k, k}))
    assert Replica.await(replica, :latest, 20_000) == :ok
    assert Log.contents(name(ctx, "t")) == Map.new(1..20, &{&1, &1})
  end

  describe "await(:latest) on a source that is down" do
    # A boot that waits for its replica (`:ok = Replica.await(r, :latest,
    # 30_000)`) must not crash because Redis comes up a second late: every
    # source is asked for its end again until the caller's timeout.

    # `fun`'s result and the ms it took.
    defp timed(fun) do
      started = System.monotonic_time(:millisecond)
      result = fun.()
      {result, System.monotonic_time(:millisecond) - started}
    end

    test "waits for a Redis that comes up late, from a plain process", ctx do
      port = RedisServer.free_port()
      opts = Log.opts(name(ctx, "r"), name(ctx, "t"), port, ctx.stream)
      replica = start!(opts)

      waiter = Task.async(fn -> timed(fn -> Replica.await(replica, :latest, 30_000) end) end)
      Process.sleep(1_500)
      refute Task.yield(waiter, 0)

      late = RedisServer.start(port: port)
      on_exit(fn -> RedisServer.stop(late) end)
      Log.add(Log.connect(port), ctx.stream, for(k <- 1..10, do: {:put, k, k}))

      assert {:ok, {:ok, elapsed}} = Task.yield(waiter, 30_000)
      assert elapsed >= 1_500
      # (the waiter's :latest may be the stream's end before the entries
      # were added, as Redis answered between its start and the XADD)
      assert :ok = Replica.await(replica, :latest, 10_000)
      assert Log.contents(name(ctx, "t")) == Map.new(1..10, &{&1, &1})
    end

    test "that stays down: :timeout once the caller's timeout is spent, naming the source's error",
         ctx do
      port = RedisServer.free_port()
      replica = start!(Log.opts(name(ctx, "r"), name(ctx, "t"), port, ctx.stream))

      for timeout <- [0, 300, 1_000] do
        {result, elapsed} = timed(fn -> Replica.await(replica, :latest, timeout) end)

        assert {:error, %Larder.Error{reason: :timeout, details: details} = error} = result
        assert elapsed >= timeout
        # bounded by the caller's timeout, with room for a loaded machine
        assert elapsed < timeout + 2_000

        if timeout > 0 do
          assert %Larder.Error{reason: :source_unavailable} = details.source_error
          assert Exception.message(error) =~ "source's last error"
          assert Exception.message(error) =~ Exception.message(details.source_error)
        end
      end

      # an id: the reader's last error says why it is not reached
      assert {:error, %Larder.Error{reason: :timeout, details: details}} =
               Replica.await(replica, "1-0", 500)

      assert %Larder.Error{reason: :source_unavailable} = details.source_error
    end

    test "a Redis that does not answer (SIGSTOP): :timeout by the caller's timeout", ctx do
      Log.add(ctx.redis, ctx.stream, for(k <- 1..10, do: {:put, k, k}))
      replica = start!(Log.opts(name(ctx, "r"), name(ctx, "t"), ctx.server.port, ctx.stream))
      assert Replica.await(replica, :latest, 10_000) == :ok

      RedisServer.pause(ctx.server)
      on_exit(fn -> RedisServer.resume(ctx.server) end)

      {result, elapsed} = timed(fn -> Replica.await(replica, :latest, 1_000) end)
      assert {:error, %Larder.Error{reason: :timeout}} = result
      assert elapsed >= 1_000 and elapsed < 3_000

      # resumed within the caller's timeout: answered
      waiter = Task.async(fn -> Replica.await(replica, :latest, 30_000) end)
      Process.sleep(500)
      RedisServer.resume(ctx.server)
      assert Task.await(waiter, 30_000) == :ok
    end
  end

  describe "a Redis user without a permission the replica needs" do
    # The source's refusal (an ACL's NOPERM) is in await/3's error, not
    # only in the log: reason :timeout, the source's last error in the
    # details and the message.
    setup ctx do
      Log.add(ctx.redis, ctx.stream, for(k <- 1..10, do: {:put, k, k}))
      :ok
    end

    defp as_user(ctx, user, denied) do
      {:ok, "OK"} =
        Log.command(
          ctx.redis,
          ["ACL", "SETUSER", user, "reset", "on", ">pw", "~*", "+@all"] ++
            Enum.map(denied, &"-#{&1}")
        )

      Log.opts(name(ctx, "r-#{user}"), name(ctx, "t-#{user}"), ctx.server.port, ctx.stream,
        source:
          {Larder.Replica.RedisStream,
           redis: [port: ctx.server.port, timeout: 1_000, username: user, password: "pw"],
           stream: ctx.stream}
      )
    end

    for denied <- [["xread"], ["multi"], ["xinfo"]] do
      test "(#{Enum.join(denied, ", ")} denied): await/3's error names the refusal", ctx do
        replica = start!(as_user(ctx, "u#{ctx.id}", unquote(denied)))

        for position <- [:latest, "99999999999999-0"] do
          assert {:error, %Larder.Error{reason: :timeout, details: details} = error} =
                   Replica.await(replica, position, 1_500)

          assert %Larder.Error{reason: :source_failed} = details.source_error
          assert Exception.message(details.source_error) =~ "NOPERM"
          assert Exception.message(error) =~ "NOPERM"
        end

        # granted again: the replica reads, and the wait ends
        {:ok, "OK"} = Log.command(ctx.redis, ["ACL", "SETUSER", "u#{ctx.id}", "+@all"])
        assert Replica.await(replica, :latest, 30_000) == :ok
        assert Log.contents(Replica.target(replica)) == Map.new(1..10, &{&1, &1})
      end
    end
  end

  describe "a snapshot" do
    setup ctx do
      path = Path.join(ctx.dir, "r.snap")
      Log.add(ctx.redis, ctx.stream, for(k <- 1..10, do: {:put, k, k}))
      opts = Log.opts(name(ctx, "r"), name(ctx, "t"), ctx.server.port, ctx.stream, snapshot: path)
      replica = start!(opts)
      assert Replica.await(replica, :latest, 10_000) == :ok
      assert {:ok, _offset} = Replica.dump(replica)
      :ok = GenServer.stop(replica)
      %{opts: opts, path: path}
    end

    test "restarts from its id: the entries it holds are not read again", ctx do
      Log.add(ctx.redis, ctx.stream, [:poison])
      Log.add(ctx.redis, ctx.stream, [{:put, 11, 11}])
      # the snapshot's 10 entries would be counted as applied if read again
      forward(ctx, [[:larder, :replica, :batch]])
      replica = start!(Keyword.put(ctx.opts, :on_error, :skip))
      assert Replica.await(replica, :latest, 10_000) == :ok
      assert_receive {:event, [:larder, :replica, :batch], %{count: 1, rejected: 1}, _}
      refute_received {:event, [:larder, :replica, :batch], _, _}
      assert Log.contents(name(ctx, "t")) == Map.new(1..11, &{&1, &1})
    end

    test "leaves one dump, and sweeps the files of dumps killed mid-write", ctx do
      stale = [
        ctx.path <> ".1700000000000-0000aaaa.dump",
        ctx.path <> ".1700000000001-0000bbbb.dump.123.0123456789abcdef-7.tmp"
      ]

      for file <- stale, do: File.write!(file, "x")
      Log.add(ctx.redis, ctx.stream, [{:put, 11, 11}])
      replica = start!(ctx.opts)
      assert Replica.await(replica, :latest, 10_000) == :ok
      assert {:ok, _} = Replica.dump(replica)
      files = File.ls!(Path.dirname(ctx.path))
      assert Enum.count(files, &String.ends_with?(&1, ".dump")) == 1
      refute Enum.any?(stale, &File.exists?/1)
    end

    test "of another stream is refused", ctx do
      opts =
        Keyword.put(
          ctx.opts,
          :source,
          {Larder.Replica.RedisStream, redis: [port: ctx.server.port], stream: "other"}
        )

      assert {:error, %Larder.Error{reason: :snapshot_mismatch}} = Replica.start_link(opts)
    end

    test "of another table is refused", ctx do
      opts =
        Keyword.put(
          ctx.opts,
          :into,
          {Larder.Table, name: name(ctx, "other"), key: :id, index: [:v]}
        )

      assert {:error, %Larder.Error{reason: :snapshot_mismatch}} = Replica.start_link(opts)

      opts = Keyword.put(ctx.opts, :into, {Larder.Bag, name: name(ctx, "t")})
      assert {:error, %Larder.Error{reason: :snapshot_mismatch}} = Replica.start_link(opts)

      # the same name with another definition
      opts =
        Keyword.put(ctx.opts, :into, {Larder.Table, name: name(ctx, "t"), key: :id, index: [:w]})

      assert {:error, %Larder.Error{reason: :definition_mismatch}} = Replica.start_link(opts)
      # The reader, started while the snapshot loaded, is gone with its
      # connection by the time start_link/1 returns.
      assert started_by_me() == []
    end

    test "that is damaged is refused", ctx do
      data = File.read!(ctx.path)
      File.write!(ctx.path, binary_part(data, 0, byte_size(data) - 1) <> "x")
      assert {:error, %Larder.Error{reason: :corrupt_snapshot}} = Replica.start_link(ctx.opts)
      File.write!(ctx.path, "garbage")
      assert {:error, %Larder.Error{reason: :corrupt_snapshot}} = Replica.start_link(ctx.opts)
    end
  end

  describe "one snapshot path" do
    # Two replicas on one path would sweep each other's dumps: the second
    # is refused, in this VM or from another one. (Both are replicas of one
    # stream into one table name, so the second can start from the first
    # one's snapshot once the path is free.)
    setup ctx do
      Log.add(ctx.redis, ctx.stream, for(k <- 1..10, do: {:put, k, k}))
      path = Path.join(ctx.dir, "shared.snap")

      opts =
        for i <- 1..2 do
          Log.opts(name(ctx, "r#{i}"), name(ctx, "t"), ctx.server.port, ctx.stream,
            snapshot: path,
            snapshot_every: 100
          )
        end

      %{path: path, opts: opts}
    end

    test "in this VM: the second is refused, the first keeps its snapshots", ctx do
      [opts1, opts2] = ctx.opts
      first = start!(opts1)
      assert Replica.await(first, :latest, 10_000) == :ok

      assert {:error, %Larder.Error{reason: :snapshot_in_use, details: details} = error} =
               Replica.start_link(opts2)

      assert details.path == ctx.path
      assert details.holder == first
      assert Exception.message(error) =~ ctx.path
      refute Process.whereis(name(ctx, "r2"))

      # the first one's snapshots go on and a restart starts from them
      Log.add(ctx.redis, ctx.stream, [{:put, 11, 11}])
      assert Replica.await(first, :latest, 10_000) == :ok
      assert {:ok, offset} = Replica.dump(first)
      :ok = GenServer.stop(first)
      first = start!(opts1)
      assert Replica.offset(first) == offset
      assert Log.contents(name(ctx, "t")) == Map.new(1..11, &{&1, &1})

      # once the first is dropped, the second may take the path (and its
      # last snapshot)
      :ok = Replica.drop(first)
      second = start!(opts2)
      assert Replica.offset(second) == offset

      # the lock file goes with a clean stop
      assert File.exists?(ctx.path <> ".lock")
      :ok = Replica.drop(second)
      refute File.exists?(ctx.path <> ".lock")
    end

    test "a replica killed is followed at once by its restart on the path", ctx do
      Process.flag(:trap_exit, true)
      [opts1, _] = ctx.opts

      for _ <- 1..5 do
        pid = start!(opts1)
        assert Replica.await(pid, :latest, 10_000) == :ok
        Process.exit(pid, :kill)
        assert_receive {:EXIT, ^pid, :killed}
      end
    end

    test "held by another OS process: refused, and free again once that VM is SIGKILLed",
         ctx do
      [opts, _] = ctx.opts
      peer = Larder.Test.Isolated.start_peer()
      on_exit(fn -> catch_exit(:peer.stop(peer)) end)
      os_pid = Larder.Test.Isolated.os_pid(peer)

      # a replica in the other VM, on the same path (and the same Redis)
      assert {:ok, :started} =
               Larder.Test.Isolated.eval(
                 peer,
                 quote do
                   {:ok, pid} = Larder.Replica.start_link(unquote(Macro.escape(opts)))
                   Process.unlink(pid)
                   :ok = Larder.Replica.await(pid, :latest, 10_000)
                   :started
                 end
               )

      # the same replica started a second time, in this VM
      assert {:error, %Larder.Error{reason: :snapshot_in_use, details: details}} =
               Replica.start_link(opts)

      assert details.path == ctx.path
      assert details.holder_os_pid == os_pid

      # the holder dies without a word: its lock goes with it
      {_, 0} = System.cmd("kill", ["-KILL", os_pid])

      RedisServer.wait_until(10_000, "the peer VM's exit", fn ->
        {_, status} = System.cmd("kill", ["-0", os_pid], stderr_to_stdout: true)
        status != 0
      end)

      restarted = start!(opts)
      assert Replica.await(restarted, :latest, 10_000) == :ok
      assert Log.contents(name(ctx, "t")) == Map.new(1..10, &{&1, &1})
    end
  end

  describe "a server that is not Redis" do
    for mode <- [:random, :wrong_types, :endless, :close_mid_reply] do
      test "(#{mode}) is counted, never fatal", ctx do
        forward(ctx, [[:larder, :replica, :source, :error]])
        garbage = GarbageServer.start(unquote(mode))
        on_exit(fn -> GarbageServer.stop(garbage) end)

        opts =
          Log.opts(name(ctx, "r"), name(ctx, "t"), garbage.port, ctx.stream,
            source:
              {Larder.Replica.RedisStream,
               redis: [port: garbage.port, timeout: 200, max_reply_bytes: 65_536], stream: "s"}
          )

        replica = start!(opts)

        for _ <- 1..2 do
          assert_receive {:event, [:larder, :replica, :source, :error], %{count: 1},
                          %{error: %Larder.Error{}}},
                         10_000
        end

        assert Process.alive?(replica)
        assert Replica.offset(replica) == "0-0"
        assert Table.size(name(ctx, "t")) == 0
        {:memory, memory} = Process.info(replica, :memory)
        assert memory < 10_000_000
      end
    end

    test "a well-formed reply with ids that do not increase is a bad reply", ctx do
      forward(ctx, [[:larder, :replica, :source, :error]])

      # a well-formed XINFO (length 2, last id 5-0), no entry 0-0, and XREAD
      reply =
        "+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n*3\r\n" <>
          "*4\r\n$6\r\nlength\r\n:2\r\n$17\r\nlast-generated-id\r\n$3\r\n5-0\r\n" <>
          "*0\r\n*1\r\n*2\r\n$1\r\ns\r\n*2\r\n" <>
          "*2\r\n$3\r\n5-0\r\n*2\r\n$2\r\nop\r\n$3\r\ndel\r\n" <>
          "*2\r\n$3\r\n4-0\r\n*2\r\n$2\r\nop\r\n$3\r\ndel\r\n"

      garbage = GarbageServer.start(fn _request -> reply end)
      on_exit(fn -> GarbageServer.stop(garbage) end)

      opts =
        Log.opts(name(ctx, "r"), name(ctx, "t"), garbage.port, "s",
          source:
            {Larder.Replica.RedisStream, redis: [port: garbage.port, timeout: 200], stream: "s"}
        )

      replica = start!(opts)

      # refused by the check of the entries, not of the XINFO reply
      assert_receive {:event, [:larder, :replica, :source, :error], _,
                      %{
                        error: %Larder.Error{
                          reason: :source_bad_reply,
                          message: "an unexpected reply to XREAD"
                        }
                      }},
                     10_000

      assert Replica.offset(replica) == "0-0"
    end
  end

  test "await/3: an id, a timeout, bad arguments", ctx do
    [id] = Log.add(ctx.redis, ctx.stream, [{:put, 1, 1}])
    replica = start!(Log.opts(name(ctx, "r"), name(ctx, "t"), ctx.server.port, ctx.stream))
    assert Replica.await(replica, id, 10_000) == :ok
    assert Replica.offset(replica) == id

    assert {:error, %Larder.Error{reason: :timeout}} =
             Replica.await(replica, "99999999999999-0", 50)

    assert_raise ArgumentError, ~r/position/, fn -> Replica.await(replica, "bogus", 10) end
    assert_raise ArgumentError, ~r/timeout/, fn -> Replica.await(replica, id, -1) end

    assert_raise ArgumentError, ~r/unknown Larder.Replica/, fn ->
      Replica.offset(name(ctx, "none"))
    end
  end

  test "a call or cast that is not the replica's is answered or ignored, and logged; the replica goes on",
       ctx do
    import ExUnit.CaptureLog

    [id] = Log.add(ctx.redis, ctx.stream, [{:put, 1, 1}])
    replica = start!(Log.opts(name(ctx, "r"), name(ctx, "t"), ctx.server.port, ctx.stream))
    assert Replica.await(replica, id, 10_000) == :ok

    log =
      capture_log(fn ->
        assert {:error, %Larder.Error{reason: :unknown_call, details: %{request: {:bogus, 1}}}} =
                 GenServer.call(replica, {:bogus, 1})

        GenServer.cast(replica, :bogus_cast)
        # Served after the cast: the replica is still there.
        assert Replica.offset(replica) == id
      end)

    assert log =~ "unknown call"
    assert log =~ "{:bogus, 1}"
    assert log =~ "unknown cast"

    [id2] = Log.add(ctx.redis, ctx.stream, [{:put, 2, 2}])
    assert Replica.await(replica, id2, 10_000) == :ok
    assert Process.alive?(replica)
  end

  test "bad options raise ArgumentError naming them", ctx do
    opts = Log.opts(name(ctx, "r"), name(ctx, "t"), ctx.server.port, ctx.stream)

    assert_raise ArgumentError, ~r/:batch_size/, fn ->
      Replica.start_link(Keyword.put(opts, :batch_size, 0))
    end

    assert_raise ArgumentError, ~r/:on_trimmed/, fn ->
      Replica.start_link(Keyword.put(opts, :on_trimmed, :skip))
    end

    assert_raise ArgumentError, ~r/:apply/, fn ->
      Replica.child_spec(Keyword.put(opts, :apply, fn -> :ok end))
    end

    assert_raise ArgumentError, ~r/:bogus/, fn -> Replica.child_spec([{:bogus, 1} | opts]) end

    assert_raise ArgumentError, ~r/:port/, fn ->
      Replica.child_spec(
        Keyword.put(opts, :source, {Larder.Replica.RedisStream, stream: "s", redis: [port: 0]})
      )
    end

    assert_raise ArgumentError, ~r/:key/, fn ->
      Replica.start_link(Keyword.put(opts, :into, {Larder.Table, name: name(ctx, "t")}))
    end
  end

  # The live processes this test started, through any number of start_links.
  defp started_by_me do
    me = self()

    for pid <- Process.list(),
        {:dictionary, dict} <- [Process.info(pid, :dictionary)],
        me in Keyword.get(dict, :"$ancestors", []),
        do: pid
  end
end

defmodule Larder.ReplicaAwaitLatestTest do
  # await(replica, :latest) on a scripted source (no server): the log's
  # end is compared with what the replica had applied before it was asked.
  use ExUnit.Case, async: true

  alias Larder.Replica
  alias Larder.Test.ScriptedSource, as: S

  @moduletag :capture_log

  defp wait(fun) do
    if fun.(), do: :ok, else: Process.sleep(5) && wait(fun)
  end

  test "a replica that moves past the log's end while it is asked is not taken for a log " <>
         "that went backwards",
       ctx do
    script = S.new()
    name = :"#{ctx.test} r"

    # The end is read as 3; the log then grows to 5, and the replica
    # applies 1..5, before the end's answer arrives.
    S.script(script, :latest, [
      fn _opts, _timeout ->
        :ets.insert(script, {:asked})
        wait(fn -> Replica.offset(name) == 5 end)
        {:ok, 3}
      end
    ])

    S.script(script, :read, [
      fn conn, 0, _count, _block_ms ->
        wait(fn -> :ets.member(script, :asked) end)
        {:ok, S.entries(0, 5), 5, conn}
      end
    ])

    {:ok, replica} =
      Replica.start_link(
        name: name,
        into: {Larder.Table, name: :"#{ctx.test} t", key: :id},
        source: {S, script: script},
        apply: fn %{"n" => n} -> {:insert, %{id: n}} end,
        block_ms: 50
      )

    assert Replica.await(replica, :latest, 10_000) == :ok
  end
end
