defmodule Larder.Replica.SnapshotTest do
  # A replica's snapshot taken while entries keep coming, on a real
  # redis-server: the replica goes on applying while its dump is held in
  # the middle (the dump's process suspended), the snapshot holds exactly
  # the entries up to the offset it names (a Table) or what a replay from it
  # makes equal to the log (a deduplicating Bag), writers race the dumps,
  # and a replica killed mid-dump restarts from the snapshot before.
  use ExUnit.Case, async: true

  alias Larder.Bag
  alias Larder.Replica
  alias Larder.Replica.Handle
  alias Larder.Table
  alias Larder.Test.Dumps
  alias Larder.Test.ReplicaLog, as: Log

  import Larder.Test.RedisSetup, only: [redis_server: 1]

  @moduletag :redis
  @moduletag :capture_log

  setup_all :redis_server

  setup ctx do
    dir = Path.join(System.tmp_dir!(), "larder-replica-snap-#{Base.encode16(:rand.bytes(6))}")
    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf(dir) end)
    id = System.unique_integer([:positive])

    %{
      redis: Log.connect(ctx.server.port),
      path: Path.join(dir, "r.snap"),
      stream: "snap-#{id}",
      name: :"replica_snap_#{id}",
      table: :"replica_snap_t#{id}",
      bag: :"replica_snap_b#{id}"
    }
  end

  defp table_opts(ctx, extra \\ []) do
    Log.opts(
      ctx.name,
      ctx.table,
      ctx.server.port,
      ctx.stream,
      [snapshot: ctx.path, snapshot_every: 86_400_000, batch_size: 1_000] ++ extra
    )
  end

  defp start!(opts) do
    {:ok, pid} = Replica.start_link(opts)
    pid
  end

  defp kill(pid) do
    Process.unlink(pid)
    ref = Process.monitor(pid)
    Process.exit(pid, :kill)
    assert_receive {:DOWN, ^ref, :process, _, _}, 10_000
  end

  # The processes a replica's dump can run in: the replica and its Table's
  # writer (and, through Dumps, the processes linked to them).
  defp owners(replica) do
    fn ->
      case Replica.target(replica) do
        %Table{writer: writer} -> [replica, writer]
        _bag -> [replica]
      end
    end
  end

  # The model of the stream's entries up to `offset` (a stream id).
  defp model_until(redis, stream, offset) do
    {:ok, entries} = Log.command(redis, ["XRANGE", stream, "-", offset])
    tmp = "snap-model-#{System.unique_integer([:positive])}"

    for [id, fields] <- entries,
        do: {:ok, _} = Log.command(redis, ["XADD", tmp, id | fields])

    model = Log.model(redis, tmp)
    Log.command(redis, ["DEL", tmp])
    model
  end

  # What the snapshot at `path` holds: its offset and its Table's contents.
  defp snapshot_table(ctx, opts) do
    {:ok, %{offset: offset, dump: dump}} = Larder.Replica.Snapshot.read(ctx.path, identity(opts))
    table = Table.load!(dump, key: :id, index: [:v])
    contents = Log.contents(table)
    Table.drop(table)
    {offset, contents}
  end

  defp identity(opts) do
    {source, source_opts} = opts[:source]

    %{
      source: source,
      log: source.identity(source_opts),
      target: Larder.Replica.Target.identity(Larder.Replica.Target.new!(opts[:into]), opts[:name])
    }
  end

  # One more entry added and applied: what Dumps.suspend_dump/3 runs to
  # move the replica on while it waits for the dump to be held.
  defp one_more(ctx, replica) do
    fn ->
      [id] = Log.add(ctx.redis, ctx.stream, [{:put, 1, :rand.uniform(1_000)}])
      :ok = Replica.await(replica, id, 10_000)
    end
  end

  test "a Table replica applies entries while its dump is written; the snapshot holds the cut",
       ctx do
    Log.add(ctx.redis, ctx.stream, for(k <- 1..30_000, do: {:put, k, k}))
    opts = table_opts(ctx)
    replica = start!(opts)
    assert Replica.await(replica, :latest, 60_000) == :ok

    again = one_more(ctx, replica)

    again.()
    {dumper, task} = Dumps.suspend_dump(owners(replica), fn -> Replica.dump(replica) end, again)
    # every entry added so far was applied before the dump began
    before = Replica.offset(replica)

    try do
      # The dump is held in the middle: these entries are applied meanwhile.
      ids = Log.add(ctx.redis, ctx.stream, [{:put, 2, -2}, {:del, 3}, {:put, 40_000, 4}])

      assert Replica.await(replica, List.last(ids), 10_000) == :ok,
             "no entry was applied while the dump was written"

      assert Table.get(ctx.table, 2).v == -2
      assert Table.get(ctx.table, 3) == nil
      assert Table.search_keys(ctx.table, v: 4) == [4, 40_000]
      assert Task.yield(task, 0) == nil
    after
      Dumps.resume(dumper)
    end

    # The snapshot names the offset of the cut, and holds exactly the
    # entries up to it.
    assert {:ok, offset} = Task.await(task, 60_000)
    assert offset == before
    assert snapshot_table(ctx, opts) == {offset, model_until(ctx.redis, ctx.stream, offset)}

    # Restarted from it, the replica reads on from there and equals the log.
    kill(replica)
    replica = start!(opts)
    assert Replica.await(replica, :latest, 60_000) == :ok
    assert Log.contents(ctx.table) == Log.model(ctx.redis, ctx.stream)
    :ok = GenServer.stop(replica)
  end

  test "snapshots taken while a producer writes each hold their cut; a restart equals the log",
       ctx do
    # An arity-2 apply (increments read and write the table): an entry
    # applied twice would show.
    opts = table_opts(ctx, apply: &Log.apply_entry/2, batch_size: 50)
    Log.add(ctx.redis, ctx.stream, for(k <- 1..5_000, do: {:put, k, k}))
    replica = start!(opts)
    assert Replica.await(replica, :latest, 60_000) == :ok
    me = self()

    producer =
      spawn_link(fn ->
        conn = Log.connect(ctx.server.port)

        for _ <- 1..40 do
          Log.add(conn, ctx.stream, for(_ <- 1..100, do: Log.random_op(6_000)))
          Process.sleep(5)
        end

        send(me, {:produced, self()})
      end)

    offsets =
      for _ <- 1..6 do
        assert {:ok, offset} = Replica.dump(replica)
        assert snapshot_table(ctx, opts) == {offset, model_until(ctx.redis, ctx.stream, offset)}
        offset
      end

    assert length(Enum.uniq(offsets)) > 1
    assert_receive {:produced, ^producer}, 60_000
    kill(replica)
    replica = start!(opts)
    assert Replica.await(replica, :latest, 60_000) == :ok
    assert Log.contents(ctx.table) == Log.model(ctx.redis, ctx.stream)
    :ok = GenServer.stop(replica)
  end

  test "a replica killed mid-dump restarts from the snapshot before it", ctx do
    Log.add(ctx.redis, ctx.stream, for(k <- 1..20_000, do: {:put, k, k}))
    opts = table_opts(ctx)
    replica = start!(opts)
    assert Replica.await(replica, :latest, 60_000) == :ok
    assert {:ok, first} = Replica.dump(replica)

    again = one_more(ctx, replica)

    again.()

    {dumper, task} =
      Dumps.suspend_dump(owners(replica), fn -> catch_exit(Replica.dump(replica)) end, again)

    Log.add(ctx.redis, ctx.stream, [{:put, 5, -5}, {:del, 6}])
    kill(replica)
    Dumps.resume(dumper)
    Task.await(task, 60_000)

    # The manifest still names the first snapshot, whose dump is whole.
    assert {:ok, %{offset: ^first}} = Larder.Replica.Snapshot.read(ctx.path, identity(opts))
    replica = start!(opts)
    assert Replica.await(replica, :latest, 60_000) == :ok
    assert Log.contents(ctx.table) == Log.model(ctx.redis, ctx.stream)

    # The next snapshot sweeps what the killed one left.
    Log.add(ctx.redis, ctx.stream, [{:put, 7, -7}])
    assert Replica.await(replica, :latest, 10_000) == :ok
    assert {:ok, _} = Replica.dump(replica)
    files = File.ls!(Path.dirname(ctx.path))
    assert Enum.count(files, &String.ends_with?(&1, ".dump")) == 1
    refute Enum.any?(files, &String.ends_with?(&1, ".tmp"))
    :ok = GenServer.stop(replica)
  end

  describe "replicas side by side in one directory" do
    # Paths that are prefixes of each other's names: each replica's sweep
    # and lock touch only its own files, so each restarts from its own
    # last snapshot.
    @siblings ["x", "x.b", "x.x.dump", "x.1700000000000-abcd1234", "x.b.c"]

    test "each snapshotting repeatedly, each restarts from its own snapshot", ctx do
      dir = Path.dirname(ctx.path)

      replicas =
        for {base, i} <- Enum.with_index(@siblings) do
          stream = "#{ctx.stream}-#{i}"
          table = :"#{ctx.table}_#{i}"

          opts =
            Log.opts(:"#{ctx.name}_#{i}", table, ctx.server.port, stream,
              snapshot: Path.join(dir, base),
              snapshot_every: 100
            )

          %{base: base, stream: stream, table: table, opts: opts, pid: start!(opts)}
        end

      # Rounds of new entries for every replica, each dumped in turn, one
      # way and then the other, so that the last to dump is "x", a prefix
      # of every other name (the :snapshot_every timer writes more in
      # between).
      offsets =
        Enum.reduce(1..4, %{}, fn round, _ ->
          order = if rem(round, 2) == 1, do: replicas, else: Enum.reverse(replicas)

          for r <- order, into: %{} do
            Log.add(ctx.redis, r.stream, for(k <- 1..5, do: {:put, k + round, round}))
            assert Replica.await(r.pid, :latest, 10_000) == :ok
            assert {:ok, offset} = Replica.dump(r.pid)
            {r.base, offset}
          end
        end)

      # Killed (no last snapshot on the way out): each restarts from its
      # last dump, and reads nothing it held (no entry came since).
      for r <- replicas, do: kill(r.pid)

      for r <- replicas do
        assert File.exists?(Path.join(dir, r.base))
        replica = start!(r.opts)
        assert Replica.offset(replica) == offsets[r.base], "the replica at #{r.base}"
        assert Log.contents(r.table) == Log.model(ctx.redis, r.stream)
        :ok = Replica.drop(replica)
      end

      # One dump each, no temporary file, no lock file after clean stops.
      files = File.ls!(dir)

      for r <- replicas do
        dumps =
          Enum.filter(
            files,
            &Regex.match?(~r/\A#{Regex.escape(r.base)}\.\d+-[0-9a-f]{8}\.dump\z/, &1)
          )

        assert length(dumps) == 1, "the dumps of #{r.base}: #{inspect(files)}"
      end

      refute Enum.any?(files, &String.ends_with?(&1, [".tmp", ".lock"])), inspect(files)
    end

    test "a path that is a name derived from another path is refused, naming :snapshot", ctx do
      dir = Path.dirname(ctx.path)

      for base <- [
            "x.lock",
            "x.1700000000000-abcd1234.dump",
            "x.123.0123456789abcdef-7.tmp",
            "x.1700000000000-abcd1234.dump.123.0123456789abcdef-7.tmp"
          ] do
        assert_raise ArgumentError, ~r/option :snapshot.*#{Regex.escape(base)}/, fn ->
          Replica.start_link(Keyword.put(table_opts(ctx), :snapshot, Path.join(dir, base)))
        end
      end

      for path <- [dir <> "/", Path.join(dir, "..")] do
        assert_raise ArgumentError, ~r/option :snapshot/, fn ->
          Replica.child_spec(Keyword.put(table_opts(ctx), :snapshot, path))
        end
      end
    end
  end

  describe "a long path" do
    # The longest name a replica derives, a dump's temporary file, adds 81
    # bytes to the path's file name; NAME_MAX is 255.
    @longest 255 - 81

    test "whose derived names fit is used; one byte more is refused at start", ctx do
      dir = Path.dirname(ctx.path)
      Log.add(ctx.redis, ctx.stream, for(k <- 1..10, do: {:put, k, k}))
      path = Path.join(dir, String.duplicate("a", @longest))
      replica = start!(Keyword.put(table_opts(ctx), :snapshot, path))
      assert Replica.await(replica, :latest, 10_000) == :ok
      assert {:ok, _} = Replica.dump(replica)
      [id] = Log.add(ctx.redis, ctx.stream, [{:put, 1, 2}])
      assert Replica.await(replica, id, 10_000) == :ok
      assert {:ok, ^id} = Replica.dump(replica)
      kill(replica)
      assert Replica.offset(start!(Keyword.put(table_opts(ctx), :snapshot, path))) == id

      for n <- [@longest + 1, 250, 255, 256] do
        assert_raise ArgumentError, ~r/option :snapshot.*at most #{@longest} bytes/, fn ->
          Replica.start_link(
            Keyword.put(table_opts(ctx), :snapshot, Path.join(dir, String.duplicate("a", n)))
          )
        end
      end

      deep = Path.join([dir | List.duplicate(String.duplicate("d", 200), 20)]) <> "/r.snap"

      assert_raise ArgumentError, ~r/option :snapshot.*PATH_MAX/, fn ->
        Replica.child_spec(Keyword.put(table_opts(ctx), :snapshot, deep))
      end
    end
  end

  describe "a Bag replica" do
    defp bag_apply(%{"op" => "put", "k" => k, "v" => v}), do: {:insert, k, v}
    defp bag_apply(%{"op" => "del", "k" => k}), do: {:delete, k}
    defp bag_apply(%{"op" => "delp", "k" => k, "v" => v}), do: {:delete, k, v}

    defp bag_opts(ctx, dedup) do
      Log.opts(ctx.name, nil, ctx.server.port, ctx.stream,
        into: {Bag, name: ctx.bag, dedup: dedup},
        apply: &bag_apply/1,
        snapshot: ctx.path,
        snapshot_every: 86_400_000,
        batch_size: 1_000
      )
    end

    # The log's pairs: a set, or with dedup: false a sorted list of copies.
    defp bag_model(redis, stream, dedup) do
      {:ok, entries} = Log.command(redis, ["XRANGE", stream, "-", "+"])

      entries
      |> Enum.reduce([], fn [_id, fields], pairs ->
        case Map.new(Enum.chunk_every(fields, 2), fn [k, v] -> {k, v} end) do
          %{"op" => "put", "k" => k, "v" => v} ->
            if dedup and {k, v} in pairs, do: pairs, else: [{k, v} | pairs]

          %{"op" => "del", "k" => k} ->
            Enum.reject(pairs, &(elem(&1, 0) == k))

          %{"op" => "delp", "k" => k, "v" => v} ->
            Enum.reject(pairs, &(&1 == {k, v}))
        end
      end)
      |> Enum.sort()
    end

    defp bag_contents(bag), do: bag |> Bag.stream() |> Enum.sort()

    defp racing_ops do
      for _ <- 1..300 do
        k = :rand.uniform(2_000)

        case :rand.uniform(4) do
          1 -> {:put, k, :rand.uniform(3)}
          2 -> {:del, k}
          3 -> {:delp, k, :rand.uniform(3)}
          4 -> {:put, k + 1_000_000, 1}
        end
      end
    end

    test "deduplicating: applies while its dump is written, and a restart equals the log",
         ctx do
      seed = for k <- 1..20_000, v <- 1..2, do: {:put, k, v}
      Log.add(ctx.redis, ctx.stream, seed)
      opts = bag_opts(ctx, true)
      replica = start!(opts)
      assert Replica.await(replica, :latest, 60_000) == :ok

      again = one_more(ctx, replica)

      again.()
      {dumper, task} = Dumps.suspend_dump(owners(replica), fn -> Replica.dump(replica) end, again)

      try do
        # Pairs the dump has read or not yet, changed while it is held.
        ids = Log.add(ctx.redis, ctx.stream, racing_ops())

        assert Replica.await(replica, List.last(ids), 10_000) == :ok,
               "no entry was applied while the dump was written"

        assert Task.yield(task, 0) == nil
      after
        Dumps.resume(dumper)
      end

      assert {:ok, _offset} = Task.await(task, 60_000)
      Log.add(ctx.redis, ctx.stream, racing_ops())
      kill(replica)
      replica = start!(opts)
      assert Replica.await(replica, :latest, 60_000) == :ok
      assert bag_contents(ctx.bag) == bag_model(ctx.redis, ctx.stream, true)
      :ok = GenServer.stop(replica)
    end

    test "without dedup: the dump is a cut (the replica waits for it), a restart equals the log",
         ctx do
      Log.add(ctx.redis, ctx.stream, for(k <- 1..2_000, v <- 1..2, do: {:put, k, v}))
      opts = bag_opts(ctx, false)
      replica = start!(opts)
      me = self()

      producer =
        spawn_link(fn ->
          conn = Log.connect(ctx.server.port)
          for _ <- 1..10, do: Log.add(conn, ctx.stream, racing_ops())
          send(me, {:produced, self()})
        end)

      for _ <- 1..3, do: assert({:ok, _} = Replica.dump(replica))
      assert_receive {:produced, ^producer}, 60_000
      kill(replica)
      replica = start!(opts)
      assert Replica.await(replica, :latest, 60_000) == :ok
      assert bag_contents(ctx.bag) == bag_model(ctx.redis, ctx.stream, false)
      :ok = GenServer.stop(replica)
    end
  end

  test "dump/1 calls made while a snapshot is written get the next one", ctx do
    Log.add(ctx.redis, ctx.stream, for(k <- 1..20_000, do: {:put, k, k}))
    opts = table_opts(ctx)
    replica = start!(opts)
    assert Replica.await(replica, :latest, 60_000) == :ok

    again = one_more(ctx, replica)

    again.()
    {dumper, first} = Dumps.suspend_dump(owners(replica), fn -> Replica.dump(replica) end, again)
    [id] = Log.add(ctx.redis, ctx.stream, [{:put, 9, -9}])
    assert Replica.await(replica, id, 10_000) == :ok
    second = Task.async(fn -> Replica.dump(replica) end)
    assert Task.yield(second, 100) == nil
    Dumps.resume(dumper)
    assert {:ok, offset1} = Task.await(first, 60_000)
    assert {:ok, ^id} = Task.await(second, 60_000)
    assert offset1 != id
    assert Handle.position(Handle.lookup(replica)) |> elem(0) == id
    :ok = GenServer.stop(replica)
  end
end
