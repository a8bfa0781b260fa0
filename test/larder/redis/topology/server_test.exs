defmodule Larder.Redis.Topology.ServerTest do
  # The topology of one server, on its own (no cache): its subscriber gets
  # the client's own messages, and stopping its manager stops every process
  # of it (the pool, its connections, the pub/sub connection) before the
  # stop returns.
  use ExUnit.Case, async: true

  alias Larder.Redis.{Table, Topology}
  alias Larder.Test.RedisServer

  @moduletag :redis

  import Larder.Test.RedisSetup, only: [redis_server: 1]

  setup_all :redis_server

  defp start(ctx, opts \\ []) do
    topology =
      Topology.new(
        [host: "127.0.0.1", port: ctx.server.port, timeout: 1_000, pool_size: 2] ++
          [reconnect_sleep: 50, max_message_bytes: 65_536, max_reply_bytes: 1_048_576] ++ opts
      )

    channel = "#{inspect(ctx.module)}.#{ctx.test}"
    {:ok, manager} = Topology.start_link(topology, self(), channel: channel)
    {topology, manager, channel}
  end

  test "the subscriber gets the topology's messages, in the client's own terms", ctx do
    {topology, manager, channel} = start(ctx)
    ref = topology.ref
    assert_receive {:larder_redis, ^manager, ^ref, :subscribed, %{}}, 5_000

    assert {:ok, "1"} = Topology.query(topology, ["PUBLISH", channel, "hello"]) |> integer()
    assert_receive {:larder_redis, ^manager, ^ref, :message, %{payload: "hello"}}

    RedisServer.command(ctx.server, ~w(CLIENT KILL TYPE pubsub))
    assert_receive {:larder_redis, ^manager, ^ref, :disconnected, %{reason: :closed}}
    assert_receive {:larder_redis, ^manager, ^ref, :subscribed, %{}}, 5_000
  end

  test "stopping the manager stops every process of the topology before it returns", ctx do
    {topology, manager, _channel} = start(ctx)
    assert_receive {:larder_redis, ^manager, _, :subscribed, _}, 5_000
    {:links, links} = Process.info(manager, :links)
    children = for pid <- links, is_pid(pid), pid != self(), do: pid
    connections = for slot <- 0..1, do: Table.get(topology.table, slot)
    assert length(children) == 2 and Enum.all?(connections, &is_pid/1)

    :ok = GenServer.stop(manager)
    for pid <- children ++ connections, do: refute(Process.alive?(pid))
  end

  defp integer({:ok, n}) when is_binary(n), do: {:ok, n}
  defp integer(other), do: other
end
