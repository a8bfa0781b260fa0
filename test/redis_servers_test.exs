defmodule Larder.RedisServersTest do
  # The test starters themselves (test/support/redis_sentinel.ex,
  # test/support/redis_cluster.ex): a Sentinel set fails over when its master is
  # killed and its sentinels agree on the new one; a cluster forms, fails
  # over on CLUSTER FAILOVER and moves slots on a reshard; the servers die
  # with the process that started them.
  use ExUnit.Case, async: true

  alias Larder.Test.{RedisCluster, RedisSentinel, RedisServer}

  @moduletag :redis

  test "Sentinel: the master killed with SIGKILL, the sentinels agree on the promoted replica" do
    set = RedisSentinel.start()
    on_exit(fn -> RedisSentinel.stop(set) end)

    master = RedisSentinel.master(set)
    replica = RedisSentinel.replica(set)
    assert RedisCluster.role(master) == "master"
    assert RedisCluster.role(replica) == "slave"
    assert length(RedisSentinel.addresses(set)) == 3

    # a paused sentinel does not stop the others from answering
    [sentinel | _] = set.sentinels
    :ok = RedisServer.pause(sentinel)
    :ok = RedisServer.resume(sentinel)

    assert RedisSentinel.kill_master(set) == master
    new = RedisSentinel.wait_failover(set, master)
    assert new.port == replica.port
    assert RedisCluster.role(new) == "master"
    assert RedisSentinel.master(set) == new
  end

  test "Cluster: forms with 3 masters and 3 replicas, fails over, reshards 1,000 slots" do
    cluster = RedisCluster.start()
    on_exit(fn -> RedisCluster.stop(cluster) end)

    masters = RedisCluster.masters(cluster)
    replicas = RedisCluster.replicas(cluster)
    assert length(masters) == 3 and length(replicas) == 3
    assert masters |> Enum.map(&RedisCluster.slot_count/1) |> Enum.sum() == 16_384

    [replica | _] = replicas
    old = RedisCluster.master_of(cluster, replica)
    assert RedisCluster.failover(cluster, replica) == old
    assert RedisCluster.role(replica) == "master"
    assert RedisCluster.role(old) == "slave"

    [from, to | _] = RedisCluster.masters(cluster)
    {before_from, before_to} = {RedisCluster.slot_count(from), RedisCluster.slot_count(to)}
    :ok = RedisCluster.reshard(cluster, from, to, 1_000)
    assert RedisCluster.slot_count(from) == before_from - 1_000
    assert RedisCluster.slot_count(to) == before_to + 1_000
  end

  test "Cluster: every node dies with the process that started the cluster" do
    test = self()

    {pid, ref} =
      spawn_monitor(fn ->
        send(test, {:cluster, RedisCluster.start()})
        receive do: (:stop -> :ok)
      end)

    assert_receive {:cluster, cluster}, 60_000
    on_exit(fn -> RedisCluster.stop(cluster) end)
    assert Enum.all?(cluster.nodes, &listening?/1)

    send(pid, :stop)
    assert_receive {:DOWN, ^ref, :process, ^pid, _}
    assert Enum.all?(cluster.nodes, &down_eventually?/1)
  end

  defp listening?(%RedisServer{port: port}) do
    case :gen_tcp.connect(~c"127.0.0.1", port, [:binary, active: false], 500) do
      {:ok, socket} -> :gen_tcp.close(socket) == :ok
      {:error, _} -> false
    end
  end

  defp down_eventually?(node, tries \\ 100) do
    cond do
      not listening?(node) ->
        true

      tries == 0 ->
        false

      true ->
        Process.sleep(50)
        down_eventually?(node, tries - 1)
    end
  end
end
