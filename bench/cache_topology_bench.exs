# Larder.Cache on Redis topologies (issue 17). Today one workload, on a
# single redis-server:
#   * a foreign write: another client's SET of a cache's key, timed until
#     every node's L1 (two nodes, invalidation: :tracking) has dropped it;
#     p99 over 1,000 writes (100 with --quick).
#
#   mix run bench/cache_topology_bench.exs [--quick] [--json PATH]
#
# Starts its own redis-server on a free loopback port (and says so and does
# nothing if none is installed).
Code.require_file("support/bench.ex", __DIR__)
Code.require_file("../support/redis_server.ex", __DIR__)

defmodule Larder.CacheTopologyBench do
  alias Larder.Bench
  alias Larder.Cache
  alias Larder.Cache.{Owner, Remote}
  alias Larder.Support.RedisServer

  @title "Foreign write until every node's L1 drops the key (single server)"
  @col "SET by another client until 2 nodes dropped it"

  def run(argv) do
    bench = Bench.start("Larder.Cache on Redis topologies", argv)

    if RedisServer.available?() do
      redis = RedisServer.start()

      try do
        bench |> foreign_write(redis) |> Bench.finish()
      after
        RedisServer.stop(redis)
      end
    else
      IO.puts("\nredis-server is not installed: nothing to measure.")
    end
  end

  def foreign_write(bench, redis) do
    l2 = {Cache.Redis, port: redis.port, timeout: 1_000}
    nodes = for n <- [:topo_a, :topo_b], do: start_cache(n, l2)
    wait_tracking(redis, 2 * length(nodes))
    cfgs = Enum.map(nodes, &:persistent_term.get(Owner.config_key(&1)))
    l2_key = Remote.l2_key(hd(cfgs), :k)
    {:ok, writer} = :gen_tcp.connect(~c"127.0.0.1", redis.port, [:binary, active: false])

    # Both nodes hold :old in L1, and the reports of that SET are all in.
    setup = fn ->
      seen = Enum.map(nodes, &Cache.stats(&1).invalidations)
      set(writer, l2_key, :old)
      # each node gets one report per data connection (2)
      wait(fn ->
        Enum.zip(nodes, seen) |> Enum.all?(fn {n, s} -> invalidations(n) >= s + 2 end)
      end)

      wait(fn -> Enum.all?(nodes, &(Cache.get(&1, :k) == :old)) and held?(cfgs) end)
    end

    timed = fn _ ->
      set(writer, l2_key, :new)
      spin(fn -> not Enum.any?(cfgs, &(:ets.lookup(&1.data, :k) != [])) end)
    end

    runs = Bench.pick(bench, 100, 1_000)

    bench =
      bench
      |> Bench.table(@title, [@col])
      |> Bench.row("latency", %{@col => timed}, setup: setup, runs: runs, warmup: 10)

    [%{results: %{@col => result}}] = Enum.find(bench.tables, &(&1.title == @title)).rows
    :gen_tcp.close(writer)
    Enum.each(nodes, &GenServer.stop/1)

    Bench.target(
      bench,
      "foreign write, p99 over #{result.runs} writes (ms)",
      result.p99_us / 1_000,
      :<=,
      5
    )
  end

  defp start_cache(name, l2) do
    {:ok, pid} =
      Cache.start_link(name: name, l2: l2, namespace: "topology", invalidation: :tracking)

    Process.unlink(pid)
    name
  end

  defp set(socket, key, value) do
    bin = :erlang.term_to_binary(value)
    args = ["SET", key, bin]
    :ok = :gen_tcp.send(socket, ["*3\r\n" | Enum.map(args, &"$#{byte_size(&1)}\r\n#{&1}\r\n")])
    {:ok, "+OK\r\n"} = :gen_tcp.recv(socket, 0, 5_000)
  end

  defp invalidations(node), do: Cache.stats(node).invalidations
  defp held?(cfgs), do: Enum.all?(cfgs, &(:ets.lookup(&1.data, :k) != []))

  defp spin(fun) do
    unless fun.() do
      :erlang.yield()
      spin(fun)
    end
  end

  defp wait(fun, tries \\ 5_000) do
    cond do
      fun.() -> :ok
      tries == 0 -> raise "the caches did not settle"
      true -> Process.sleep(1) && wait(fun, tries - 1)
    end
  end

  defp wait_tracking(redis, n) do
    wait(fn ->
      RedisServer.command(redis, ["CLIENT", "LIST", "TYPE", "normal"])
      |> String.split("\n")
      |> Enum.count(&(&1 =~ ~r/ flags=\S*t\S* / and &1 =~ ~r/ redir=[1-9]/))
      |> Kernel.==(n)
    end)
  end
end

Larder.CacheTopologyBench.run(System.argv())
