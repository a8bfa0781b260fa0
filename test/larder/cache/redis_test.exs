defmodule Larder.Cache.RedisTest do
  use ExUnit.Case, async: true
  use Larder.Cache.L2Conformance

  alias Larder.Test.RedisServer

  @moduletag :redis

  setup_all do
    server = RedisServer.start()
    on_exit(fn -> RedisServer.stop(server) end)
    %{server: server}
  end

  setup %{server: server} do
    %{l2_module: Larder.Cache.Redis, l2_opts: [port: server.port, timeout: 500]}
  end

  test "unknown and invalid options raise ArgumentError naming them" do
    assert_raise ArgumentError, ~r/unknown Redis options \[:bogus\].*:host/, fn ->
      Larder.Cache.Redis.init([bogus: 1], self(), "ch")
    end

    assert_raise ArgumentError, ~r/:port to be a TCP port/, fn ->
      Larder.Cache.Redis.init([port: "x"], self(), "ch")
    end
  end

  @tag :capture_log
  test "calls to a server that is down return :l2_unavailable within the timeout" do
    port = RedisServer.free_port()
    {:ok, state} = Larder.Cache.Redis.init([port: port, timeout: 200], self(), "ch")

    assert {:error, %Larder.Error{reason: :l2_unavailable}} = Larder.Cache.Redis.get(state, "k")

    assert {:error, %Larder.Error{reason: :l2_unavailable}} =
             Larder.Cache.Redis.put(state, "k", "v", :infinity, :always)

    Larder.Cache.Redis.stop(state)
  end
end
