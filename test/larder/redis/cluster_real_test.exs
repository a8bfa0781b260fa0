defmodule Larder.Cache.Redis.ClusterRealTest do
  # Slot routing against a real six-node Redis Cluster
  # (Larder.Test.RedisCluster): our slots are the server's, the map sends
  # every key to its master, and after a reshard the server's MOVED names
  # the new owner that a refreshed map already knows.
  use ExUnit.Case, async: true

  alias Larder.Redis.Cluster
  alias Larder.Test.RedisCluster

  @moduletag :redis

  import Larder.Test.RedisSetup, only: [redis_cluster: 1]

  setup_all :redis_cluster

  test "slot/1 agrees with CLUSTER KEYSLOT on 5,000 random keys, hash tags included", ctx do
    keys =
      for i <- 1..5_000 do
        case rem(i, 5) do
          0 ->
            :crypto.strong_rand_bytes(:rand.uniform(40))

          1 ->
            "user:{#{:rand.uniform(1000)}}:#{i}"

          2 ->
            "{}#{i}{x}"

          3 ->
            "a{{#{i}}}b}"

          4 ->
            for(_ <- 1..:rand.uniform(12), into: "", do: Enum.random(["{", "}", "a", "ß", "0"]))
        end
      end

    conn = connect(hd(RedisCluster.seeds(ctx.cluster)))

    replies =
      Larder.Redis.Connection.qp(conn, Enum.map(keys, &["CLUSTER", "KEYSLOT", &1]), 30_000)

    for {key, {:ok, slot}} <- Enum.zip(keys, replies) do
      assert Cluster.slot(key) == String.to_integer(slot), inspect(key)
    end
  end

  test "the map built from CLUSTER SLOTS sends 2,000 keys to their masters: no MOVED", ctx do
    {map, conns} = route(ctx.cluster)
    assert map.bad == 0
    assert length(Cluster.masters(map)) == 3
    assert Enum.all?(0..16_383, &Cluster.master(map, &1))

    for i <- 1..2_000 do
      key = "route:#{i}:#{:rand.uniform(1_000_000)}"
      conn = Map.fetch!(conns, Cluster.master(map, Cluster.slot(key)))
      value = "v#{i}"
      assert {:ok, "OK"} = Larder.Redis.Connection.q(conn, ["SET", key, value])
      assert {:ok, ^value} = Larder.Redis.Connection.q(conn, ["GET", key])
    end

    # and a wrong master answers MOVED naming the right one
    key = "route:moved"
    right = Cluster.master(map, Cluster.slot(key))
    {_, wrong} = Enum.find(conns, fn {address, _} -> address != right end)
    assert {:error, error} = Larder.Redis.Connection.q(wrong, ["GET", key])
    assert {:moved, slot, {_, port}} = Cluster.redirect(error, "127.0.0.1")
    assert slot == Cluster.slot(key)
    assert {_, ^port} = right
  end

  test "after a reshard, MOVED names the new owner and a refreshed map routes right", ctx do
    {old, _} = route(ctx.cluster)
    [from, to | _] = RedisCluster.masters(ctx.cluster)
    :ok = RedisCluster.reshard(ctx.cluster, from, to, 200)
    {new, conns} = route(ctx.cluster)

    moved = Enum.filter(0..16_383, &(Cluster.master(old, &1) != Cluster.master(new, &1)))
    assert length(moved) == 200
    assert Enum.all?(moved, &(Cluster.master(new, &1) == {"127.0.0.1", to.port}))

    keys = Enum.filter(Enum.map(1..3_000, &"reshard:#{&1}"), &(Cluster.slot(&1) in moved))
    assert keys != []

    for key <- keys, slot = Cluster.slot(key) do
      stale = Map.fetch!(conns, Cluster.master(old, slot))
      assert {:error, error} = Larder.Redis.Connection.q(stale, ["GET", key])
      assert Cluster.redirect(error, "127.0.0.1") == {:moved, slot, {"127.0.0.1", to.port}}

      assert {:ok, _} =
               Larder.Redis.Connection.q(Map.fetch!(conns, Cluster.master(new, slot)), [
                 "GET",
                 key
               ])
    end
  end

  test "a slot halfway through a migration: ASK names the importing node, ASKING reads there",
       ctx do
    {map, conns} = route(ctx.cluster)
    key = "{ask:#{System.unique_integer([:positive])}}k"
    slot = Cluster.slot(key)
    {_, from_port} = source = Cluster.master(map, slot)
    {_, to_port} = target = Enum.find(Cluster.masters(map), &(&1 != source))

    [from, to] =
      Enum.map([from_port, to_port], fn p -> Enum.find(ctx.cluster.nodes, &(&1.port == p)) end)

    assert {:ok, "OK"} = Larder.Redis.Connection.q(conns[source], ["SET", key, "v"])

    :ok = RedisCluster.begin_migration(ctx.cluster, slot, from, to)
    # the key is still on the source, which serves it
    assert {:ok, "v"} = Larder.Redis.Connection.q(conns[source], ["GET", key])
    # the slot may hold keys of the file's other tests too: all of them move
    {:ok, [count]} = RedisCluster.cli(from, ~w(CLUSTER COUNTKEYSINSLOT #{slot}))
    assert RedisCluster.migrate_keys(ctx.cluster, slot, from, to) == String.to_integer(count)

    assert {:error, error} = Larder.Redis.Connection.q(conns[source], ["GET", key])
    assert Cluster.redirect(error, "127.0.0.1") == {:ask, slot, target}
    # without ASKING the target sends us back to the owner
    assert {:error, back} = Larder.Redis.Connection.q(conns[target], ["GET", key])
    assert Cluster.redirect(back, "127.0.0.1") == {:moved, slot, source}

    assert [{:ok, "OK"}, {:ok, "v"}] =
             Larder.Redis.Connection.qp(conns[target], [["ASKING"], ["GET", key]])

    :ok = RedisCluster.finish_migration(ctx.cluster, slot, to)
    assert {:error, moved} = Larder.Redis.Connection.q(conns[source], ["GET", key])
    assert Cluster.redirect(moved, "127.0.0.1") == {:moved, slot, target}
    {map, _} = route(ctx.cluster)
    assert Cluster.master(map, slot) == target
  end

  # The slot map from a node's CLUSTER SLOTS, and a connection per master.
  defp route(cluster) do
    conn = connect(hd(RedisCluster.seeds(cluster)))
    {:ok, reply} = Larder.Redis.Connection.q(conn, ["CLUSTER", "SLOTS"])
    {:ok, map} = Cluster.slot_map(reply, "127.0.0.1")
    conns = Map.new(Cluster.masters(map), &{&1, connect(&1)})
    {map, conns}
  end

  defp connect({host, port}) do
    {:ok, conn} = Larder.Redis.Connection.start_link(String.to_charlist(host), port)
    conn
  end
end
