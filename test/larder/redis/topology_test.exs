defmodule Larder.Redis.TopologyTest do
  # The topologies' one interface, as a connection of its own uses it (a
  # stream's reader): locate/3 finds the server, the master a Sentinel set
  # names (checked with ROLE) and the master of a key's slot on a cluster,
  # against a real redis-server behind fake sentinels and seeds; what each
  # says is untrusted. relocate?/1 tells the error replies that mean the
  # key is served elsewhere now.
  use ExUnit.Case, async: true

  alias Larder.Redis.{Cluster, Topology}
  alias Larder.Test.{GarbageServer, RedisServer}

  @moduletag :redis

  import Larder.Test.RedisSetup, only: [redis_server: 1]

  setup_all :redis_server

  defp fake(fun) do
    server = GarbageServer.start(fun)
    on_exit(fn -> GarbageServer.stop(server) end)
    server
  end

  defp bulk(s), do: "$#{byte_size(s)}\r\n#{s}\r\n"

  test "one server: the one named" do
    assert Topology.locate([host: "h", port: 1], "k", 100) == {:ok, {"h", 1}}
  end

  test "Sentinel: the master the first sentinel that answers names, checked with ROLE", ctx do
    names = fn request ->
      if request =~ "get-master-addr-by-name",
        do: "*2\r\n" <> bulk("127.0.0.1") <> bulk(Integer.to_string(ctx.server.port)),
        else: "-ERR unknown\r\n"
    end

    down = RedisServer.free_port()
    sentinel = fake(names)

    opts = [
      sentinel: [sentinels: [{"127.0.0.1", down}, {"127.0.0.1", sentinel.port}], master: "m"]
    ]

    assert Topology.locate(opts, "k", 500) == {:ok, {"127.0.0.1", ctx.server.port}}

    # a sentinel that knows no such master, or names a node that is no master
    unknown = fake(fn _ -> "*-1\r\n" end)
    opts = [sentinel: [sentinels: [{"127.0.0.1", unknown.port}], master: "m"]]
    where = "sentinel 127.0.0.1:#{unknown.port}"
    assert Topology.locate(opts, "k", 500) == {:error, {:sentinel, {where, :unknown_master}}}

    replica = fake(fn _ -> "*1\r\n" <> bulk("slave") end)

    names_replica = fn _ ->
      "*2\r\n" <> bulk("127.0.0.1") <> bulk(Integer.to_string(replica.port))
    end

    opts = [sentinel: [sentinels: [{"127.0.0.1", fake(names_replica).port}], master: "m"]]

    assert {:error, {:sentinel, {"master 127.0.0.1:" <> _, {:not_master, "slave"}}}} =
             Topology.locate(opts, "k", 500)
  end

  test "Cluster: the master of the key's slot in the first usable CLUSTER SLOTS" do
    key = "stream:#{System.unique_integer([:positive])}"
    slot = Cluster.slot(key)

    # every slot on port 7001 but the key's, on 7002
    ranges =
      [{slot, slot, 7002}] ++
        if(slot > 0, do: [{0, slot - 1, 7001}], else: []) ++
        if slot < 16_383, do: [{slot + 1, 16_383, 7001}], else: []

    reply =
      IO.iodata_to_binary([
        "*#{length(ranges)}\r\n"
        | for {first, last, port} <- ranges do
            "*3\r\n:#{first}\r\n:#{last}\r\n*2\r\n" <> bulk("127.0.0.1") <> ":#{port}\r\n"
          end
      ])

    seed = fake(fn _ -> reply end)
    garbage = fake(:wrong_types)
    seeds = [{"127.0.0.1", RedisServer.free_port()}, {"127.0.0.1", garbage.port}]

    assert Topology.locate([cluster: seeds ++ [{"127.0.0.1", seed.port}]], key, 500) ==
             {:ok, {"127.0.0.1", 7002}}

    # no seed answers with a map
    assert {:error, {:cluster, _reason}} = Topology.locate([cluster: seeds], key, 500)
  end

  test "relocate?/1: the error replies that say the key is served elsewhere now" do
    for text <- [
          "MOVED 3999 127.0.0.1:6381",
          "ASK 3999 127.0.0.1:6381",
          "TRYAGAIN Multiple keys request during rehashing of slot",
          "CLUSTERDOWN The cluster is down",
          "READONLY You can't write against a read only replica.",
          "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."
        ] do
      assert Topology.relocate?(text), text
    end

    for other <- ["ERR no such key", "WRONGTYPE x", "NOAUTH x", "MOVEDX", "", :closed, nil] do
      refute Topology.relocate?(other), inspect(other)
    end
  end
end
