defmodule Larder.Redis.PoolTest do
  # The pool of command connections to one node, on a real redis-server:
  # each connection that ends is counted and replaced, and a storm of ends
  # is one warning, not one per end; a node that refuses connections costs
  # one attempt per backoff (not one per connection), and once it answers
  # every connection opens.
  use ExUnit.Case, async: true

  import ExUnit.CaptureLog
  import Larder.Test.Eventually

  alias Larder.Redis.{Connection, Pool, Table}
  alias Larder.Test.RedisServer

  @moduletag :redis

  defp start_pool(port, keys, opts \\ []) do
    table = :ets.new(:pool_test, [:set, :public])

    {:ok, pool} =
      Pool.start_link(
        Keyword.merge(
          [
            owner: self(),
            ref: :test,
            table: table,
            node: {"127.0.0.1", port},
            keys: keys,
            connection: [timeout: 1_000],
            backoff: {1, 2_000}
          ],
          opts
        )
      )

    {pool, table}
  end

  defp client(table, key) do
    case Table.get(table, key) do
      pid when is_pid(pid) -> pid
      _ -> nil
    end
  end

  test "a storm of ended connections: each counted and replaced, one warning" do
    server = Larder.Test.RedisSetup.start(RedisServer)
    rounds = 40

    log =
      capture_log(fn ->
        {pool, table} = start_pool(server.port, [0, 1])

        for round <- 1..rounds do
          slot = rem(round, 2)
          eventually(fn -> client(table, slot) != nil end, 250)
          pid = client(table, slot)
          Process.exit(pid, :kill)
          # replaced by a new connection
          eventually(fn -> client(table, slot) not in [nil, pid] end, 250)
        end

        # which works
        eventually(fn -> Enum.all?(0..1, &(client(table, &1) != nil)) end, 250)
        assert Connection.q(client(table, 0), ["SET", "k", "v"]) == {:ok, "OK"}
        assert Connection.q(client(table, 1), ["GET", "k"]) == {:ok, "v"}
        assert Table.counter(table, :ended_connections) == rounds
        Pool.stop(pool)
      end)

    ended = ~r/command connection \d to 127\.0\.0\.1:#{server.port} ended \(killed\)/
    # (other tests' pools log too: count this server's)
    ends = ~r/command connection \S+ to 127\.0\.0\.1:#{server.port} ended/
    assert length(Regex.scan(ends, log)) == 1
    assert log =~ ended
  end

  @tag :capture_log
  test "a node that refuses connections: down once, one attempt per backoff, then every " <>
         "connection opens once it answers" do
    port = RedisServer.free_port()
    {pool, table} = start_pool(port, [:a, :b, :c], backoff: {50, 200})

    assert_receive {:larder_redis, ^pool, :test, :node_down, %{node: {"127.0.0.1", ^port}}}
    assert Enum.all?([:a, :b, :c], &(Table.get(table, &1) == :none))

    # one connection is tried per wait (50 ms doubling to 200 ms, +-25%:
    # each wait from the third on at least 150 ms), not each of the three
    # every 50 ms (60 a second)
    :erlang.trace_pattern({Connection, :start_link, 3}, true, [:local])
    1 = :erlang.trace(pool, true, [:call])
    started = System.monotonic_time(:millisecond)
    Process.sleep(1_000)
    :erlang.trace(pool, false, [:call])
    elapsed = System.monotonic_time(:millisecond) - started
    attempts = count_calls(pool)
    report = "#{attempts} connection attempts in #{elapsed} ms"
    assert attempts >= 2, report
    assert attempts <= 3 + div(elapsed, 150), report
    refute_received {:larder_redis, ^pool, :test, :node_down, _}

    server = Larder.Test.RedisSetup.start(RedisServer, port: port)
    assert_receive {:larder_redis, ^pool, :test, :node_up, %{node: {"127.0.0.1", ^port}}}, 5_000
    eventually(fn -> Enum.all?([:a, :b, :c], &is_pid(client(table, &1))) end)
    assert Connection.q(client(table, :c), ["PING"]) == {:ok, "PONG"}
    assert :ok = Pool.move(pool, nil)
    assert Enum.all?([:a, :b, :c], &(Table.get(table, &1) == :none))
    _ = server
  end

  defp count_calls(pid) do
    ref = :erlang.trace_delivered(pid)
    receive do: ({:trace_delivered, ^pid, ^ref} -> :ok)
    count_calls(pid, 0)
  end

  defp count_calls(pid, n) do
    receive do
      {:trace, ^pid, :call, {Connection, :start_link, _}} -> count_calls(pid, n + 1)
    after
      0 -> n
    end
  end

  @tag :capture_log
  test "retire/1 deletes the pool's rows and opens nothing more" do
    server = Larder.Test.RedisSetup.start(RedisServer)
    {pool, table} = start_pool(server.port, [{"h", 1, 0}])
    pid = client(table, {"h", 1, 0})
    assert is_pid(pid)
    :ok = Pool.retire(pool)
    assert :ets.lookup(table, {"h", 1, 0}) == []
    Process.exit(pid, :kill)
    Process.sleep(300)
    assert :ets.lookup(table, {"h", 1, 0}) == []
    ref = Process.monitor(pool)
    Pool.stop(pool)
    assert_receive {:DOWN, ^ref, _, _, _}
  end

  @tag :capture_log
  test "the pool and its connections go with their owner" do
    server = Larder.Test.RedisSetup.start(RedisServer)
    parent = self()

    {owner, ref} =
      spawn_monitor(fn ->
        {pool, table} = start_pool(server.port, [0, 1])
        send(parent, {:pool, pool, client(table, 0), client(table, 1)})
        Process.sleep(:infinity)
      end)

    assert_receive {:pool, pool, c0, c1}
    refs = for pid <- [pool, c0, c1], do: Process.monitor(pid)
    Process.exit(owner, :kill)
    assert_receive {:DOWN, ^ref, _, _, _}
    for ref <- refs, do: assert_receive({:DOWN, ^ref, _, _, _})
  end
end
