defmodule Larder.Redis.ConnectionTest do
  # The command connections (Larder.Redis.Connection) under a Cache L2 against fake servers: an
  # error reply that arrives in two TCP sends is an error; a reply that
  # declares more than :max_reply_bytes, or bytes that are not RESP, close
  # the connection and fail every waiting caller at once; the keeper then
  # replaces the connection.
  use ExUnit.Case, async: true

  import Larder.Test.Eventually

  alias Larder.Cache
  alias Larder.Redis.Connection
  alias Larder.Test.GarbageServer

  @moduletag :capture_log

  defp start_l2(port, opts) do
    {:ok, state} =
      Larder.Test.L2Process.start(
        Cache.Redis,
        [port: port, pool_size: 1] ++ opts,
        self(),
        "ch"
      )

    state
  end

  defp client(state) do
    [{0, pid}] = :ets.lookup(state.table, 0)
    pid
  end

  test "an error reply in two TCP sends is an error, never a value" do
    garbage =
      GarbageServer.start(fn _request ->
        {:chunks, ["-WRONGTYPE Operation against a key", " holding the wrong kind of value\r\n"]}
      end)

    on_exit(fn -> GarbageServer.stop(garbage) end)
    state = start_l2(garbage.port, timeout: 5_000)

    for _ <- 1..3 do
      assert {:error, %Larder.Error{reason: :l2_failed, details: %{error: error}}} =
               Cache.Redis.get(state, "k")

      assert error == "WRONGTYPE Operation against a key holding the wrong kind of value"
    end
  end

  test "a reply declaring more than :max_reply_bytes fails the caller at once, unbuffered" do
    # the header of a 2 MB bulk string, then nothing: only the declared
    # length can fail the call before its (long) timeout
    garbage = GarbageServer.start(fn _request -> "$2000000\r\n" end)
    on_exit(fn -> GarbageServer.stop(garbage) end)
    state = start_l2(garbage.port, timeout: 120_000, max_reply_bytes: 1_048_576)
    first = client(state)

    assert {:error, %Larder.Error{reason: :l2_unavailable, details: %{error: :reply_too_large}}} =
             Cache.Redis.get(state, "k")

    refute Process.alive?(first)
    # the keeper connects again
    eventually(fn -> is_pid(client(state)) and client(state) != first end)
  end

  test "every caller waiting on a connection gets the failure of an oversized reply at once" do
    {:ok, listen} = :gen_tcp.listen(0, [:binary, ip: {127, 0, 0, 1}, active: false])
    {:ok, port} = :inet.port(listen)
    callers = 5

    server =
      spawn_link(fn ->
        {:ok, socket} = :gen_tcp.accept(listen)
        # answer once every caller's command is in
        wait_commands(socket, callers, "")
        :ok = :gen_tcp.send(socket, "$999999999\r\n")
        Process.sleep(:infinity)
      end)

    {:ok, conn} =
      Connection.start_link(~c"127.0.0.1", port,
        timeout: 1_000,
        auth: [],
        max_reply_bytes: 1_048_576
      )

    Process.unlink(conn)
    ref = Process.monitor(conn)

    tasks = for _ <- 1..callers, do: Task.async(fn -> Connection.q(conn, ["PING"], 120_000) end)

    assert Enum.map(tasks, &Task.await(&1, 120_000)) ==
             List.duplicate({:error, :reply_too_large}, callers)

    assert_receive {:DOWN, ^ref, :process, ^conn, {:shutdown, :reply_too_large}}
    assert Connection.q(conn, ["PING"], 1_000) == {:error, :no_connection}
    Process.exit(server, :kill)
  end

  defp wait_commands(socket, n, seen) do
    if length(:binary.matches(seen, "PING")) >= n do
      :ok
    else
      {:ok, data} = :gen_tcp.recv(socket, 0)
      wait_commands(socket, n, seen <> data)
    end
  end

  test "bytes that are not RESP fail the waiting callers and the connection is replaced" do
    garbage = GarbageServer.start(fn _request -> "hello, this is not Redis\r\n" end)
    on_exit(fn -> GarbageServer.stop(garbage) end)
    state = start_l2(garbage.port, timeout: 120_000)
    first = client(state)

    assert {:error, %Larder.Error{reason: :l2_unavailable, details: %{error: :bad_reply}}} =
             Cache.Redis.get(state, "k")

    refute Process.alive?(first)
    eventually(fn -> is_pid(client(state)) and client(state) != first end)
    second = client(state)

    assert {:error, %Larder.Error{reason: :l2_unavailable, details: %{error: :bad_reply}}} =
             Cache.Redis.put(state, "k", "v", :infinity, :always)

    refute Process.alive?(second)
  end

  test "a reply nobody asked for closes the connection" do
    {:ok, listen} = :gen_tcp.listen(0, [:binary, ip: {127, 0, 0, 1}, active: false])
    {:ok, port} = :inet.port(listen)

    server =
      spawn_link(fn ->
        {:ok, socket} = :gen_tcp.accept(listen)
        :ok = :gen_tcp.send(socket, "+unasked\r\n")
        Process.sleep(:infinity)
      end)

    {:ok, conn} =
      Connection.start_link(~c"127.0.0.1", port, timeout: 1_000, auth: [], max_reply_bytes: 4096)

    Process.unlink(conn)
    ref = Process.monitor(conn)
    assert_receive {:DOWN, ^ref, :process, ^conn, {:shutdown, :bad_reply}}
    Process.exit(server, :kill)
  end
end
