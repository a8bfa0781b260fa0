defmodule Larder.Redis.PubSubTest do
  # One pub/sub connection, on a real redis-server and on servers that
  # refuse, do not resolve or answer garbage: it subscribes and reports in
  # its own messages, reconnects on its own after a loss or a failure, logs
  # one warning per run of failures naming the server, the failure in words
  # and what it does next, and reports Redis's refusal of a step.
  use ExUnit.Case, async: true

  import ExUnit.CaptureLog

  alias Larder.Redis.PubSub
  alias Larder.Test.{GarbageServer, RedisServer}

  @moduletag :redis

  defp start(node, opts \\ []) do
    {:ok, pid} =
      PubSub.start_link(
        Keyword.merge(
          [
            owner: self(),
            ref: :ref,
            node: node,
            channels: ["ch"],
            timeout: 1_000,
            max_message_bytes: 65_536,
            backoff: {50, 400},
            label: ~s(the pub/sub connection of channel "ch")
          ],
          opts
        )
      )

    pid
  end

  test "a refused connection: one warning that names the server, says why and what next" do
    port = RedisServer.free_port()

    log =
      capture_log(fn ->
        pid = start({"127.0.0.1", port})
        reason = {:tcp_error, :econnrefused}
        assert_receive {:larder_redis, ^pid, :ref, :failed, %{reason: ^reason}}
        # tried again, without another warning
        assert_receive {:larder_redis, ^pid, :ref, :failed, %{reason: ^reason}}
        PubSub.stop(pid)
      end)

    assert log =~
             ~r/Larder.Redis: the pub\/sub connection of channel "ch" failed at 127\.0\.0\.1:#{port} \(connection refused\); connecting again in \d+ ms, backing off to 400 ms, until it subscribes/

    # (other tests log too: count this server's)
    assert length(Regex.scan(~r/failed at 127\.0\.0\.1:#{port} /, log)) == 1
  end

  test "a host name that does not resolve: the warning says so" do
    log =
      capture_log(fn ->
        pid = start({"no-such-host.invalid", 6379})
        assert_receive {:larder_redis, ^pid, :ref, :failed, %{reason: {:tcp_error, _}}}, 5_000
        PubSub.stop(pid)
      end)

    assert log =~
             ~r/the pub\/sub connection of channel "ch" failed at no-such-host\.invalid:6379 \(the host name does not resolve\); connecting again in \d+ ms/
  end

  @tag :capture_log
  test "subscribes, delivers messages, and after a lost connection subscribes again" do
    server = Larder.Test.RedisSetup.start(RedisServer)
    pid = start({"127.0.0.1", server.port}, channels: ["ch", "other"], client_id: true)
    assert_receive {:larder_redis, ^pid, :ref, :subscribed, %{client_id: id}}, 5_000
    assert {_, ""} = Integer.parse(id)

    ":1\r\n" = RedisServer.command(server, ["PUBLISH", "ch", "hello"])
    assert_receive {:larder_redis, ^pid, :ref, :message, %{channel: "ch", payload: "hello"}}
    ":1\r\n" = RedisServer.command(server, ["PUBLISH", "other", "x"])
    assert_receive {:larder_redis, ^pid, :ref, :message, %{channel: "other", payload: "x"}}

    ":1\r\n" = RedisServer.command(server, ~w(CLIENT KILL TYPE pubsub))
    assert_receive {:larder_redis, ^pid, :ref, :disconnected, %{reason: :closed}}
    assert_receive {:larder_redis, ^pid, :ref, :subscribed, %{client_id: id2}}, 5_000
    assert id2 != id
    ":1\r\n" = RedisServer.command(server, ["PUBLISH", "ch", "again"])
    assert_receive {:larder_redis, ^pid, :ref, :message, %{payload: "again"}}
  end

  @tag :capture_log
  test "a step of the handshake refused: reported with the command and Redis's reply" do
    server = Larder.Test.RedisSetup.start(RedisServer)
    "+OK\r\n" = RedisServer.command(server, ~w(ACL SETUSER nosub on >pw ~* &* +@all -subscribe))
    auth = [["AUTH", "nosub", "pw"]]
    pid = start({"127.0.0.1", server.port}, auth: auth)

    assert_receive {:larder_redis, ^pid, :ref, :failed,
                    %{reason: {:refused, "SUBSCRIBE", "NOPERM" <> _}}},
                   5_000

    # allowed again: it subscribes on its own
    "+OK\r\n" = RedisServer.command(server, ~w(ACL SETUSER nosub +subscribe))
    assert_receive {:larder_redis, ^pid, :ref, :subscribed, _}, 5_000
  end

  @tag :capture_log
  test "garbage, and a message above :max_message_bytes: failures, never a crash" do
    for mode <- [:random, :wrong_types, :close_mid_reply] do
      garbage = GarbageServer.start(mode)
      pid = start({"127.0.0.1", garbage.port})
      assert_receive {:larder_redis, ^pid, :ref, :failed, _}, 5_000
      assert Process.alive?(pid)
      PubSub.stop(pid)
      GarbageServer.stop(garbage)
    end

    server = Larder.Test.RedisSetup.start(RedisServer)
    pid = start({"127.0.0.1", server.port}, max_message_bytes: 1_024)
    assert_receive {:larder_redis, ^pid, :ref, :subscribed, _}, 5_000
    RedisServer.command(server, ["PUBLISH", "ch", String.duplicate("x", 2_000)])
    assert_receive {:larder_redis, ^pid, :ref, :disconnected, %{reason: :reply_too_large}}
    assert_receive {:larder_redis, ^pid, :ref, :subscribed, _}, 5_000
  end

  @tag :capture_log
  test "move/2 subscribes on the new node at once, whatever backoff was under way" do
    server = Larder.Test.RedisSetup.start(RedisServer)
    pid = start({"127.0.0.1", RedisServer.free_port()}, backoff: {60_000, 60_000})
    assert_receive {:larder_redis, ^pid, :ref, :failed, _}
    :ok = PubSub.move(pid, {"127.0.0.1", server.port})
    assert_receive {:larder_redis, ^pid, :ref, :subscribed, %{node: {"127.0.0.1", port}}}, 5_000
    assert port == server.port
    :ok = PubSub.move(pid, nil)
    refute_receive {:larder_redis, ^pid, :ref, _, _}, 200
  end

  test "it goes with its owner" do
    server = Larder.Test.RedisSetup.start(RedisServer)
    parent = self()

    owner =
      spawn(fn ->
        send(parent, {:pubsub, start({"127.0.0.1", server.port})})
        Process.sleep(:infinity)
      end)

    assert_receive {:pubsub, pid}
    ref = Process.monitor(pid)
    Process.exit(owner, :kill)
    assert_receive {:DOWN, ^ref, :process, ^pid, _}
  end
end
