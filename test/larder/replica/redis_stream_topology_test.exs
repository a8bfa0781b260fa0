defmodule Larder.Replica.RedisStreamTopologyTest do
  # Larder.Replica.RedisStream on the connection options it shares with
  # Larder.Cache.Redis (Larder.Redis.Options): an ACL user with a database,
  # a Redis Cluster (the stream's slot on one of three masters), and a
  # Sentinel set whose master is SIGKILLed while a producer writes.
  use ExUnit.Case, async: false

  import Larder.Test.Eventually

  alias Larder.Redis.Socket
  alias Larder.Replica
  alias Larder.Test.{RedisCluster, RedisSentinel, RedisServer}
  alias Larder.Test.RedisSetup
  alias Larder.Test.ReplicaLog, as: Log

  @moduletag :redis
  @moduletag :capture_log

  @password ~s(s3cr"et \\x41 pass)

  defp name(ctx, what), do: :"#{ctx.module}.#{ctx.test} #{what}"

  defp start_replica(ctx, redis, extra \\ []) do
    opts =
      Log.opts(name(ctx, "r"), name(ctx, "t"), 0, "s", extra)
      |> Keyword.put(:source, {Replica.RedisStream, redis: redis, stream: "s"})

    {:ok, pid} = Replica.start_link(opts)
    pid
  end

  # XADDs `ops` on the node at `port`, through the client's socket layer
  # with the handshake of `opts`; returns the ids.
  defp add(port, ops, opts \\ []) do
    commands = Enum.map(ops, &["XADD", "s", "*" | Log.fields(&1)])

    {:ok, replies} =
      Socket.request("127.0.0.1", port, commands,
        timeout: 5_000,
        handshake: Socket.handshake(opts)
      )

    for {:ok, id} <- replies, do: id
  end

  # The model of the stream on the node at `port` (database `db`).
  defp model(port, db \\ 0) do
    socket = Log.connect(port)
    if db != 0, do: {:ok, "OK"} = Log.command(socket, ["SELECT", Integer.to_string(db)])
    model = Log.model(socket, "s")
    :gen_tcp.close(socket)
    model
  end

  test ":username, :password and :database: the replica logs in as an ACL user and " <>
         "reads the stream of its database",
       ctx do
    server = RedisSetup.start(RedisServer)

    "+OK\r\n" =
      RedisServer.command(server, ~w(ACL SETUSER app on) ++ [">" <> @password] ++ ~w(~* &* +@all))

    "+OK\r\n" = RedisServer.command(server, ~w(ACL SETUSER default off))
    login = [username: "app", password: @password]
    ids = add(server.port, ops(200), login ++ [database: 3])
    # another stream of the same name in database 0
    add(server.port, [{:put, 1, -1}], login)

    redis = [port: server.port, timeout: 1_000, database: 3] ++ login
    replica = start_replica(ctx, redis)
    assert Replica.await(replica, :latest, 30_000) == :ok
    assert Replica.offset(replica) == List.last(ids)

    socket = Log.connect(server.port)
    {:ok, "OK"} = Log.command(socket, ["AUTH", "app", @password])
    {:ok, "OK"} = Log.command(socket, ["SELECT", "3"])
    assert Log.contents(name(ctx, "t")) == Log.model(socket, "s")
  end

  test ":cluster: the replica reads the stream from its slot's master" <>
         " and follows it when the slot moves",
       ctx do
    cluster = RedisSetup.start(RedisCluster)
    slot = Larder.Redis.Cluster.slot("s")
    owner = owner(cluster, slot)

    ids = add(owner.port, ops(200))
    replica = start_replica(ctx, cluster: RedisCluster.seeds(cluster), timeout: 1_000)
    assert Replica.await(replica, :latest, 30_000) == :ok
    assert Replica.offset(replica) == List.last(ids)
    assert Log.contents(name(ctx, "t")) == model(owner.port)

    # the slot moves to another master: the read gets MOVED, the replica
    # reconnects to the new owner and reads what is added there
    to = Enum.find(RedisCluster.masters(cluster), &(&1.port != owner.port))
    RedisCluster.begin_migration(cluster, slot, owner, to)
    RedisCluster.migrate_keys(cluster, slot, owner, to)
    RedisCluster.finish_migration(cluster, slot, to)
    eventually(fn -> owner(cluster, slot).port == to.port end, 600, 50)
    more = add(to.port, ops(50))
    assert Replica.await(replica, List.last(more), 30_000) == :ok
    assert Log.contents(name(ctx, "t")) == model(to.port)
  end

  # The master of `slot`, from a seed's CLUSTER SLOTS.
  defp owner(cluster, slot) do
    [{host, port} | _] = RedisCluster.seeds(cluster)

    {:ok, [{:ok, reply}]} =
      Socket.request(host, port, [["CLUSTER", "SLOTS"]],
        timeout: 5_000,
        max_reply_bytes: 4_000_000
      )

    {:ok, map} = Larder.Redis.Cluster.slot_map(reply, host)
    {_host, master_port} = Larder.Redis.Cluster.master(map, slot)
    Enum.find(cluster.nodes, &(&1.port == master_port))
  end

  defp ops(n),
    do:
      for(k <- 1..n, do: if(rem(k, 7) == 0, do: {:del, rem(k, 20)}, else: {:put, rem(k, 20), k}))

  test ":sentinel: a replica follows the master across a SIGKILL of it under a producer, " <>
         "and ends equal to the new master's stream",
       ctx do
    set = RedisSetup.start(RedisSentinel, down_after: 1_000, failover_timeout: 5_000)
    RedisSentinel.wait_replicated(set)

    replica =
      start_replica(
        ctx,
        [sentinel: [sentinels: RedisSentinel.addresses(set), master: set.name], timeout: 1_000],
        on_trimmed: :rebuild
      )

    # the producer writes to whichever node the sentinels name, until told
    # to stop; it returns how many of its writes were acknowledged
    control = :atomics.new(1, [])
    producer = Task.async(fn -> produce(set, control, 0, 0) end)

    old = RedisSentinel.master(set)
    eventually(fn -> Replica.offset(replica) != "0-0" end, 600, 50)
    Process.sleep(300)
    RedisSentinel.kill_master(set)
    new = RedisSentinel.wait_failover(set, old)
    assert new.port != old.port

    # writes go on on the new master for a while, then stop
    before = length(model_ids(new.port))
    eventually(fn -> length(model_ids(new.port)) > before + 20 end, 600, 50)
    :atomics.put(control, 1, 1)
    acked = Task.await(producer, 30_000)
    assert acked > 0

    # the same replica process, equal to what the new master holds
    assert Process.alive?(replica)
    assert Replica.await(replica, :latest, 30_000) == :ok
    assert Replica.offset(replica) == List.last(model_ids(new.port))
    assert Log.contents(name(ctx, "t")) == model(new.port)
  end

  defp produce(set, control, n, acked) do
    if :atomics.get(control, 1) == 1 do
      acked
    else
      result =
        case RedisSentinel.master(set) do
          nil ->
            :none

          master ->
            Socket.request(
              "127.0.0.1",
              master.port,
              [["XADD", "s", "*" | Log.fields({:put, rem(n, 20), n})]],
              timeout: 500
            )
        end

      case result do
        {:ok, [{:ok, _id}]} ->
          produce(set, control, n + 1, acked + 1)

        _ ->
          Process.sleep(50)
          produce(set, control, n + 1, acked)
      end
    end
  end

  defp model_ids(port) do
    {:ok, entries} =
      Socket.request("127.0.0.1", port, [["XRANGE", "s", "-", "+"]],
        timeout: 5_000,
        max_reply_bytes: 64_000_000
      )
      |> then(fn {:ok, [reply]} -> reply end)

    Enum.map(entries, &hd/1)
  end
end
