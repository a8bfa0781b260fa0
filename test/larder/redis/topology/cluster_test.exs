defmodule Larder.Redis.Topology.ClusterTest do
  # A cluster topology (through Larder.Cache.Redis) against a hostile seed (a fake node whose CLUSTER
  # SLOTS names masters on ports nothing listens on): a map naming more
  # than Cluster.max_masters/0 masters is refused and counted, and one
  # under that bound whose masters are all dead costs a bounded number of
  # connection attempts per master (a backoff per node, in each master's
  # pool), not one per pool connection every :reconnect_sleep.
  #
  # Not async: it traces every process's calls to Connection.start_link/3
  # (the pools').
  use ExUnit.Case, async: false

  alias Larder.Cache.Redis
  alias Larder.Redis.{Connection, Topology}
  alias Larder.Test.RedisServer
  alias Larder.Test.GarbageServer

  @moduletag :capture_log

  test "a seed naming 4,000 masters: the map is refused and counted, nothing is connected" do
    {seed, slots_calls} = hostile_seed(Enum.to_list(1..4_000))

    {:ok, state} =
      Larder.Test.L2Process.start(
        Redis,
        [timeout: 300, cluster: [{"127.0.0.1", seed.port}]],
        self(),
        "ch"
      )

    assert Topology.bad_replies(state) >= 1
    assert :counters.get(slots_calls, 1) >= 1
    # no slot is served, and no pool was started
    assert :ets.lookup(state.table, 0) == []
    assert :ets.select_count(state.table, [{{{:_, :_, :_}, :_}, [], [true]}]) == 0

    assert {:error, %Larder.Error{reason: :l2_unavailable}} =
             Redis.put(state, "k", "v", :infinity, :always)
  end

  test "a map of 50 dead masters: connection attempts per master back off" do
    ports = closed_ports(50)
    {seed, slots_calls} = hostile_seed(ports)

    {:ok, state} =
      Larder.Test.L2Process.start(
        Redis,
        [timeout: 300, pool_size: 2, reconnect_sleep: 100, cluster: [{"127.0.0.1", seed.port}]],
        self(),
        "ch"
      )

    [{:manager, manager}] = :ets.lookup(state.table, :manager)
    calls_before = :counters.get(slots_calls, 1)
    {:reductions, reductions_before} = Process.info(manager, :reductions)
    counter = trace_connects()
    Process.sleep(3_000)
    attempts = stop_trace(counter)
    {:reductions, reductions_after} = Process.info(manager, :reductions)
    slots = :counters.get(slots_calls, 1) - calls_before

    total = attempts |> Map.values() |> Enum.sum()
    worst = attempts |> Map.values() |> Enum.max(fn -> 0 end)

    report =
      "#{total} connection attempts in 3 s (at most #{worst} to one master), " <>
        "#{slots} CLUSTER SLOTS, #{reductions_after - reductions_before} reductions"

    # the masters are tried again (each is down, and still in the map:
    # 3 or more times each in 3 s)...
    assert total >= length(ports), report
    # ...after a wait that doubles from 100 ms, once per master (not per
    # pool connection): 5 attempts in 3 s with every wait at its shortest
    # (-25%), where one per connection every 100 ms would be 60
    assert worst <= 8, report
    # and the map is read again while it names masters that are down (at
    # most twice a second after the first few: about 7 in 3 s) and after
    # each failure of the pub/sub connection (whose channel's master is dead
    # too), which backs off to 2 s: about 5 in 3 s
    assert slots >= 1 and slots <= 20, report
  end

  test "masters that accept and then close: connection attempts per master back off too" do
    listeners = for _ <- 1..10, do: accept_and_close()
    {seed, _slots_calls} = hostile_seed(Enum.map(listeners, &elem(&1, 0)))

    {:ok, _state} =
      Larder.Test.L2Process.start(
        Redis,
        [timeout: 300, pool_size: 2, reconnect_sleep: 100, cluster: [{"127.0.0.1", seed.port}]],
        self(),
        "ch"
      )

    counter = trace_connects()
    Process.sleep(3_000)
    attempts = stop_trace(counter)

    total = attempts |> Map.values() |> Enum.sum()
    worst = attempts |> Map.values() |> Enum.max(fn -> 0 end)
    report = "#{total} connection attempts in 3 s (at most #{worst} to one master)"

    # every master is tried again...
    assert map_size(attempts) == length(listeners), report
    # ...after a wait that doubles from 100 ms (each success starts the
    # pool's other connection: 2 attempts a round, 5 rounds in 3 s with
    # every wait at its shortest), where a connection started again every
    # 100 ms after each close would be about 60 a master
    assert worst <= 16, report
  end

  # A listener on a free loopback port that accepts every connection and
  # closes it at once; {port, pid}, stopped when the test exits.
  defp accept_and_close do
    {:ok, listen} =
      :gen_tcp.listen(0, [:binary, ip: {127, 0, 0, 1}, active: false, reuseaddr: true])

    {:ok, port} = :inet.port(listen)

    pid =
      spawn(fn ->
        loop = fn loop ->
          case :gen_tcp.accept(listen) do
            {:ok, socket} ->
              :gen_tcp.close(socket)
              loop.(loop)

            {:error, _} ->
              :ok
          end
        end

        loop.(loop)
      end)

    :ok = :gen_tcp.controlling_process(listen, pid)
    on_exit(fn -> Process.exit(pid, :kill) end)
    {port, pid}
  end

  # A fake node whose CLUSTER SLOTS gives 16,384 slots to one master per
  # port, in equal ranges (and answers anything else with an error); the
  # counter counts its CLUSTER SLOTS requests.
  defp hostile_seed(ports) do
    n = length(ports)
    calls = :counters.new(1, [])

    ranges =
      for {port, i} <- Enum.with_index(ports) do
        first = div(i * 16_384, n)
        last = div((i + 1) * 16_384, n) - 1
        "*3\r\n:#{first}\r\n:#{last}\r\n*2\r\n$9\r\n127.0.0.1\r\n:#{port}\r\n"
      end

    reply = IO.iodata_to_binary(["*#{n}\r\n" | ranges])

    seed =
      GarbageServer.start(fn request ->
        if String.contains?(request, "SLOTS") do
          :counters.add(calls, 1, 1)
          reply
        else
          "-ERR not a node\r\n"
        end
      end)

    on_exit(fn -> GarbageServer.stop(seed) end)
    {seed, calls}
  end

  # `n` distinct loopback ports that nothing listens on now.
  defp closed_ports(n), do: closed_ports(n, MapSet.new())

  defp closed_ports(n, acc) do
    if MapSet.size(acc) == n,
      do: MapSet.to_list(acc),
      else: closed_ports(n, MapSet.put(acc, RedisServer.free_port()))
  end

  # Counts every process's calls to Connection.start_link/3, by port.
  defp trace_connects do
    counter =
      spawn_link(fn ->
        count = fn count, acc ->
          receive do
            {:trace, _pid, :call, {Connection, :start_link, [_host, port, _opts]}} ->
              count.(count, Map.update(acc, port, 1, &(&1 + 1)))

            {:get, from} ->
              send(from, {:attempts, acc})
          end
        end

        count.(count, %{})
      end)

    :erlang.trace_pattern({Connection, :start_link, 3}, true, [:local])
    :erlang.trace(:all, true, [:call, {:tracer, counter}])

    on_exit(fn ->
      :erlang.trace(:all, false, [:call])
      :erlang.trace_pattern({Connection, :start_link, 3}, false, [:local])
    end)

    counter
  end

  defp stop_trace(counter) do
    :erlang.trace(:all, false, [:call])
    # every trace message is in the counter's mailbox before the question
    ref = :erlang.trace_delivered(:all)

    receive do
      {:trace_delivered, :all, ^ref} -> :ok
    end

    send(counter, {:get, self()})

    receive do
      {:attempts, attempts} -> attempts
    after
      5_000 -> flunk("the trace counter did not answer")
    end
  end
end
