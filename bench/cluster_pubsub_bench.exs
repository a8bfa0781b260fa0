# Invalidation messages on a Redis Cluster: cluster-wide PUBLISH against
# sharded SPUBLISH (Redis 7), on a real six-node cluster started here
# (test/support/redis_cluster.ex).
#
#   mix run bench/cluster_pubsub_bench.exs [--quick] [--json PATH]
#
# A sample is one message: the publish command sent, until every
# subscriber has read it from its socket. PUBLISH goes to any node and the
# cluster bus carries it to every node, so a cache node may subscribe
# anywhere; SPUBLISH goes to the master that owns the channel's slot and
# reaches only that shard (its master and replicas), so every cache node
# subscribes (SSUBSCRIBE) there. "bus bytes" is what the publish costs the
# cluster bus per message (cluster_stats_messages_publish_sent, summed).

alias Larder.Bench
alias Larder.Redis.Cluster
alias Larder.Test.RedisCluster

defmodule Larder.ClusterPubsubBench do
  @moduledoc false

  # A subscriber socket (active) after SUBSCRIBE or SSUBSCRIBE `channel`.
  def subscribe({host, port}, command, channel) do
    {:ok, socket} =
      :gen_tcp.connect(String.to_charlist(host), port, [:binary, active: true, nodelay: true])

    :ok = :gen_tcp.send(socket, resp([command, channel]))

    receive do
      {:tcp, ^socket, "*3\r\n" <> _} -> socket
    after
      5_000 -> raise "#{command} got no confirmation"
    end
  end

  def connect({host, port}) do
    {:ok, conn} = Larder.Redis.Connection.start_link(String.to_charlist(host), port)
    conn
  end

  # One message: publish, then wait until every socket has read it.
  def round(conn, command, channel, sockets) do
    id = Integer.to_string(System.unique_integer([:positive]))
    {:ok, _} = Larder.Redis.Connection.q(conn, [command, channel, id])
    Enum.each(sockets, &await(&1, id, ""))
  end

  defp await(socket, id, acc) do
    receive do
      {:tcp, ^socket, data} ->
        acc = acc <> data
        if :binary.match(acc, id) == :nomatch, do: await(socket, id, acc), else: :ok
    after
      5_000 -> raise "a subscriber did not get message #{id}"
    end
  end

  def bus_publish_sent(cluster) do
    cluster.nodes
    |> Enum.map(fn node ->
      {:ok, lines} = RedisCluster.cli(node, ~w(CLUSTER INFO))

      Enum.reduce(lines, 0, fn
        "cluster_stats_messages_publish_sent:" <> n, acc -> acc + String.to_integer(n)
        "cluster_stats_messages_publishshard_sent:" <> n, acc -> acc + String.to_integer(n)
        _, acc -> acc
      end)
    end)
    |> Enum.sum()
  end

  # Closes subscribers no row reads any more, and drops the socket messages
  # in the mailbox (every round before has read what it waited for).
  def close(sockets) do
    Enum.each(sockets, &:gen_tcp.close/1)
    flush()
  end

  defp flush do
    receive do
      {:tcp, _socket, _data} -> flush()
    after
      0 -> :ok
    end
  end

  defp resp(args),
    do: ["*#{length(args)}\r\n" | Enum.map(args, &"$#{byte_size(&1)}\r\n#{&1}\r\n")]
end

alias Larder.ClusterPubsubBench, as: P

bench = Bench.start("Redis Cluster: PUBLISH vs SPUBLISH for invalidation messages")
each = Bench.pick(bench, 200, 1_000)
runs = Bench.pick(bench, 3, 5)

cluster = RedisCluster.start()

try do
  conn = P.connect(hd(RedisCluster.seeds(cluster)))
  {:ok, reply} = Larder.Redis.Connection.q(conn, ["CLUSTER", "SLOTS"])
  {:ok, map} = Cluster.slot_map(reply, "127.0.0.1")
  channel = Cluster.tagged("bench:1", "invalidate")
  owner = Cluster.master(map, Cluster.slot(channel))
  [other_a, other_b] = Cluster.masters(map) -- [owner]

  owner_node = Enum.find(cluster.nodes, &({"127.0.0.1", &1.port} == owner))

  owner_replica =
    Enum.find(
      RedisCluster.replicas(cluster),
      &(RedisCluster.master_of(cluster, &1) == owner_node)
    )

  replica = {"127.0.0.1", owner_replica.port}

  pub = %{owner => P.connect(owner), other_a => P.connect(other_a)}

  title = "one message until every subscriber read it (#{each} messages x #{runs} runs)"
  bench = Bench.table(bench, title, ["PUBLISH", "SPUBLISH"], anchor: "PUBLISH")
  opts = [each: each, runs: runs, interleave: true]

  # 1 subscriber: PUBLISH sent to one master, read on another; SPUBLISH
  # sent to the owner, read there.
  s_pub = P.subscribe(other_b, "SUBSCRIBE", channel)
  s_shard = P.subscribe(owner, "SSUBSCRIBE", channel)

  bench =
    Bench.row(
      bench,
      "1 subscriber",
      %{
        "PUBLISH" => fn -> P.round(pub[other_a], "PUBLISH", channel, [s_pub]) end,
        "SPUBLISH" => fn -> P.round(pub[owner], "SPUBLISH", channel, [s_shard]) end
      },
      opts
    )

  # SSUBSCRIBE on the owner's replica: the message comes by replication.
  P.close([s_shard])
  s_replica = P.subscribe(replica, "SSUBSCRIBE", channel)

  bench =
    Bench.row(
      bench,
      "1 subscriber on a replica",
      %{
        "PUBLISH" => fn -> P.round(pub[other_a], "PUBLISH", channel, [s_pub]) end,
        "SPUBLISH" => fn -> P.round(pub[owner], "SPUBLISH", channel, [s_replica]) end
      },
      opts
    )

  # 8 cache nodes: PUBLISH subscribers spread over the six nodes; SPUBLISH
  # ones all on the owner.
  P.close([s_pub, s_replica])

  spread =
    for i <- 0..7 do
      node = Enum.at(cluster.nodes, rem(i, 6))
      P.subscribe({"127.0.0.1", node.port}, "SUBSCRIBE", channel)
    end

  shard = for _ <- 1..8, do: P.subscribe(owner, "SSUBSCRIBE", channel)

  bench =
    Bench.row(
      bench,
      "8 subscribers",
      %{
        "PUBLISH" => fn -> P.round(pub[other_a], "PUBLISH", channel, spread) end,
        "SPUBLISH" => fn -> P.round(pub[owner], "SPUBLISH", channel, shard) end
      },
      opts
    )

  # Cluster-bus messages one publish costs.
  n = 200
  before = P.bus_publish_sent(cluster)
  for _ <- 1..n, do: Larder.Redis.Connection.q(pub[other_a], ["PUBLISH", channel, "x"])
  publish_bus = (P.bus_publish_sent(cluster) - before) / n
  before = P.bus_publish_sent(cluster)
  for _ <- 1..n, do: Larder.Redis.Connection.q(pub[owner], ["SPUBLISH", channel, "x"])
  spublish_bus = (P.bus_publish_sent(cluster) - before) / n

  bench =
    Bench.row(bench, "cluster-bus messages per publish", %{
      "PUBLISH" => Bench.value(publish_bus, "msgs"),
      "SPUBLISH" => Bench.value(spublish_bus, "msgs")
    })

  Enum.each([conn | Map.values(pub)], &GenServer.stop/1)
  Bench.finish(bench)
after
  RedisCluster.stop(cluster)
end
