defmodule Larder.Cache.RedisAclTest do
  # :username (a Redis 6 ACL user) on a real redis-server whose default
  # user is off: every connection, the command connections and the pub/sub
  # connection, logs in as that user, on every reconnect too; a password
  # with quotes, spaces and backslashes is sent as it is.
  use ExUnit.Case, async: true

  import Larder.Test.Eventually

  alias Larder.Cache
  alias Larder.Test.RedisServer

  @moduletag :redis
  @moduletag :capture_log

  @password ~s(s3cr"et \\x41 pass)

  setup do
    server = Larder.Test.RedisSetup.start(RedisServer)

    "+OK\r\n" =
      RedisServer.command(server, ~w(ACL SETUSER app on) ++ [">" <> @password] ++ ~w(~* &* +@all))

    "+OK\r\n" = RedisServer.command(server, ~w(ACL SETUSER default off))
    %{server: server}
  end

  defp start_nodes(ctx, suffixes, opts) do
    for suffix <- suffixes do
      name = :"#{ctx.module}.#{ctx.test}.#{suffix}"
      l2 = {Cache.Redis, [port: ctx.server.port, timeout: 1_000] ++ opts}
      start_supervised!({Cache, name: name, l2: l2, namespace: "acl"}, id: name)
      name
    end
  end

  test "a cache with :username and :password writes, reads and hears invalidations", ctx do
    [a, b] = start_nodes(ctx, [:a, :b], username: "app", password: @password)

    eventually(fn -> Enum.all?([a, b], &:sys.get_state(Process.whereis(&1)).subscribed_before) end)

    :ok = Cache.put(a, :k, 1)
    assert Cache.get(b, :k) == 1
    :ok = Cache.put(a, :k, 2)
    eventually(fn -> Cache.get(b, :k) == 2 end)
    assert Cache.stats(a).l2_errors == 0

    # every connection killed: the new ones log in as the user again
    {:ok, socket} = :gen_tcp.connect(~c"127.0.0.1", ctx.server.port, [:binary, active: false])
    auth = ["AUTH", "app", @password]
    kill = ~w(CLIENT KILL TYPE normal SKIPME yes)

    :ok =
      :gen_tcp.send(
        socket,
        for(args <- [auth, kill], do: Larder.Redis.RESP.command(args))
      )

    eventually(fn -> Cache.put(a, :k, 3) == :ok and Cache.get(b, :k) == 3 end)
    :gen_tcp.close(socket)
  end

  test "without the username the same password is refused: the L2 fails, L1 serves", ctx do
    [a] = start_nodes(ctx, [:a], password: @password)
    assert {:error, %Larder.Error{}} = Cache.put(a, :k, 1)
    assert Cache.get(a, :k) == 1
  end

  test ":username is checked" do
    for bad <- ["", 1, String.duplicate("u", 256)] do
      assert_raise ArgumentError, ~r/:username/, fn ->
        Cache.start_link(name: :acl_opts, l2: {Cache.Redis, username: bad})
      end
    end
  end
end
