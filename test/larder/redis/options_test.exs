defmodule Larder.Redis.OptionsTest do
  # The connection options every Redis user of Larder shares (the Cache's L2,
  # the Replica's stream source): :url taken apart into the keys it stands
  # for, and refused, naming the option, when it is not a redis:// url or
  # clashes with the keys it sets; then a cache and a replica that reach a
  # real server by a url with a user, a password and a database.
  use ExUnit.Case, async: true

  alias Larder.Redis.Options
  alias Larder.Test.RedisServer

  @defaults [timeout: 5_000, max_reply_bytes: 1_048_576]

  defp validate!(opts), do: Options.validate!(opts, "Larder.Test", [], @defaults)

  describe ":url" do
    test "gives the host, port, user, password (percent-decoded) and database" do
      opts = validate!(url: "redis://app:s%40cr%20et@10.0.0.7:6380/3", timeout: 100)

      assert Keyword.take(opts, [:host, :port, :username, :password, :database, :timeout])
             |> Enum.sort() ==
               Enum.sort(
                 host: "10.0.0.7",
                 port: 6380,
                 username: "app",
                 password: "s@cr et",
                 database: 3,
                 timeout: 100
               )

      refute Keyword.has_key?(opts, :url)
    end

    test "defaults: port 6379, database 0, no user; a password alone" do
      opts = validate!(url: "redis://:pw@cache.internal")
      assert {opts[:host], opts[:port], opts[:database]} == {"cache.internal", 6379, 0}
      assert {opts[:username], opts[:password]} == {nil, "pw"}
    end

    test "a bad url is an ArgumentError naming :url, without its password" do
      for bad <- [
            "http://h",
            "redis://",
            "redis://h/x",
            "redis://h/1?db=2",
            "h:6379",
            6379,
            ~c"redis://h"
          ] do
        error = assert_raise ArgumentError, fn -> validate!(url: bad) end
        assert error.message =~ "option :url"
      end

      error = assert_raise ArgumentError, fn -> validate!(url: "http://u:hunter2@h") end
      refute error.message =~ "hunter2"
    end

    test "rediss:// (TLS) is refused, saying so" do
      error = assert_raise ArgumentError, fn -> validate!(url: "rediss://h:6380") end
      assert error.message =~ "rediss:// (TLS) is not supported"
    end

    test "excludes the keys it sets, and :sentinel and :cluster" do
      for {key, value} <- [
            host: "h",
            port: 1,
            username: "u",
            password: "p",
            database: 1,
            sentinel: [],
            cluster: [{"h", 1}]
          ] do
        error =
          assert_raise ArgumentError, fn -> validate!([{:url, "redis://h"}, {key, value}]) end

        assert error.message =~ "option :url excludes #{inspect(key)}"
      end
    end

    test "is listed among the valid options when an unknown one is given" do
      error = assert_raise ArgumentError, fn -> validate!(uri: "redis://h") end
      assert error.message =~ ":url"
    end
  end

  test "options that are not a keyword list (improper, not pairs) are an ArgumentError" do
    for bad <- [[1, 2 | :improper], [{:url, "redis://h"} | :improper], [:url], [{"url", 1}]] do
      assert_raise ArgumentError, ~r/Larder.Test options to be a keyword list/, fn ->
        validate!(bad)
      end
    end
  end

  describe "a real server" do
    @describetag :redis
    @describetag :capture_log

    setup do
      server = Larder.Test.RedisSetup.start(RedisServer)
      "+OK\r\n" = RedisServer.command(server, ~w(ACL SETUSER app on >p@ss ~* &* +@all))
      "+OK\r\n" = RedisServer.command(server, ~w(ACL SETUSER default off))
      %{server: server, url: "redis://app:p%40ss@127.0.0.1:#{server.port}/5"}
    end

    test "a cache and a replica reach it by :url, logged in, on its database", ctx do
      cache = :"#{ctx.test} cache"
      start_supervised!({Larder.Cache, name: cache, l2: {Larder.Cache.Redis, url: ctx.url}})
      :ok = Larder.Cache.put(cache, :k, 1)

      # written in database 5, as the user
      auth = ["AUTH", "app", "p@ss"]
      assert {:ok, keys} = keys_in(ctx.server, auth, "5")
      assert keys =~ "k"
      assert {:ok, "*0\r\n"} = keys_in(ctx.server, auth, "0")

      # the stream is read from database 5 too
      xadd = ["SELECT", "5", "XADD", "s", "*", "id", "1"]
      {:ok, _} = send_commands(ctx.server, auth, [Enum.take(xadd, 2), Enum.drop(xadd, 2)])

      replica = :"#{ctx.test} replica"

      start_supervised!(
        {Larder.Replica,
         name: replica,
         into: {Larder.Bag, []},
         source: {Larder.Replica.RedisStream, redis: [url: ctx.url], stream: "s"},
         apply: fn %{"id" => id} -> {:insert, :id, id} end}
      )

      assert :ok = Larder.Replica.await(replica, :latest, 10_000)
      assert Larder.Bag.lookup(Larder.Replica.target(replica), :id) == ["1"]
    end
  end

  defp keys_in(server, auth, db), do: send_commands(server, auth, [["SELECT", db], ["KEYS", "*"]])

  # Sends each command on one connection, logged in; the last reply.
  defp send_commands(server, auth, commands) do
    {:ok, socket} = :gen_tcp.connect(~c"127.0.0.1", server.port, [:binary, active: false])

    try do
      Enum.reduce([auth | commands], nil, fn args, _ ->
        :ok =
          :gen_tcp.send(socket, [
            "*#{length(args)}\r\n" | Enum.map(args, &"$#{byte_size(&1)}\r\n#{&1}\r\n")
          ])

        {:ok, reply} = :gen_tcp.recv(socket, 0, 5_000)
        reply
      end)
      |> then(&{:ok, &1})
    after
      :gen_tcp.close(socket)
    end
  end
end
