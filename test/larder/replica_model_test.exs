defmodule Larder.ReplicaModelTest do
  # PropEr model test on a real redis-server: random sequences of puts,
  # deletes and increments, split over several producer processes that
  # XADD at the same time, while a replica follows the stream and is killed
  # and restarted once (from its snapshot) at a random point. Redis orders
  # the producers' entries; the model folds the stream's entries (XRANGE) in
  # that order into a map. After await(:latest) the replica's table equals
  # the model: nothing lost, and no increment applied twice (an increment
  # is a read-modify-write of the table, so a replayed entry shows). Half
  # the cases take a snapshot just before the kill.
  use ExUnit.Case, async: true

  alias Larder.Replica
  alias Larder.Test.PropEr
  alias Larder.Test.ReplicaLog, as: Log

  @moduletag :redis
  @moduletag :capture_log

  @producers 3

  import Larder.Test.RedisSetup, only: [redis_server: 1]

  setup_all :redis_server

  defp op_gen do
    key = :proper_types.integer(1, 8)

    :proper_types.oneof([
      {:put, key, :proper_types.integer(0, 100)},
      {:del, key},
      {:incr, key, :proper_types.integer(1, 5)}
    ])
  end

  defp case_gen do
    {:proper_types.vector(@producers, :proper_types.list(op_gen())), :proper_types.integer(1, 20),
     :proper_types.integer(0, 40), :proper_types.boolean()}
  end

  test "replicas equal the plain model of what several producers wrote", %{server: server} do
    redis = Log.connect(server.port)
    Process.flag(:trap_exit, true)
    dir = Path.join(System.tmp_dir!(), "larder-replica-model-#{Base.encode16(:rand.bytes(6))}")
    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf(dir) end)

    property =
      :proper.forall(case_gen(), fn {per_producer, batch_size, kill_after_ms, snapshot_first} ->
        n = System.unique_integer([:positive])
        stream = "model-#{n}"

        opts =
          Log.opts(:"replica_model_#{n}", :"replica_model_t#{n}", server.port, stream,
            apply: &Log.apply_entry/2,
            batch_size: batch_size,
            block_ms: 20,
            snapshot: Path.join(dir, "#{n}.snap"),
            snapshot_every: 100
          )

        {:ok, replica} = Replica.start_link(opts)
        me = self()

        producers =
          for ops <- per_producer do
            spawn_link(fn ->
              conn = Log.connect(server.port)

              for op <- ops do
                Log.add(conn, stream, [op])
                Process.sleep(:rand.uniform(3) - 1)
              end

              send(me, {:produced, self()})
            end)
          end

        Process.sleep(kill_after_ms)
        # a snapshot at a random point, so the restart starts from it
        if snapshot_first, do: {:ok, _} = Replica.dump(replica)
        Process.exit(replica, :kill)
        receive do: ({:EXIT, ^replica, :killed} -> :ok)
        # a restarted replica while the producers may still write
        {:ok, replica} = Replica.start_link(opts)

        for p <- producers, do: receive(do: ({:produced, ^p} -> :ok))
        :ok = Replica.await(replica, :latest, 30_000)
        model = Log.model(redis, stream)
        contents = Log.contents(:"replica_model_t#{n}")
        :ok = GenServer.stop(replica)
        for p <- producers, do: receive(do: ({:EXIT, ^p, _} -> :ok))

        contents == model or
          (IO.puts("replica #{inspect(contents)} != model #{inspect(model)}") && false)
      end)

    PropEr.check(property, numtests: 60, max_size: 25)
  end
end
