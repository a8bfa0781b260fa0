defmodule Larder.Replica.RedisStreamTest do
  # The Redis Stream source on its own, against a real redis-server: the
  # Source contract's conformance suite, on a stream of its own per test
  # (one part: ids increase; a trim is XTRIM), and the read it sends ahead
  # after a full batch, taken when the next read asks for it and dropped
  # when it asks for another position.
  use ExUnit.Case, async: true
  use Larder.Test.SourceConformance, source: Larder.Replica.RedisStream

  alias Larder.Replica.RedisStream
  alias Larder.Test.RedisServer
  alias Larder.Test.ReplicaLog, as: Log

  @moduletag :redis

  setup do
    server = RedisServer.start()
    on_exit(fn -> RedisServer.stop(server) end)
    redis = Log.connect(server.port)
    ids = Log.add(redis, "s", for(k <- 1..10, do: {:put, k, k}))
    opts = RedisStream.validate!(stream: "s", redis: [port: server.port, timeout: 5_000])
    {:ok, conn} = RedisStream.connect(opts)
    on_exit(fn -> RedisStream.close(conn) end)
    %{redis: redis, ids: ids, conn: conn, server: server}
  end

  # The conformance suite's log: a stream of its own.
  setup ctx do
    stream = "conformance-#{System.unique_integer([:positive])}"
    redis = ctx.redis

    %{
      source_opts: [stream: stream, redis: [port: ctx.server.port, timeout: 5_000]],
      bad_opts: [
        [stream: ""],
        [stream: stream, redis: [port: 0]],
        [stream: stream, redis: [port: 1, cluster: [{"127.0.0.1", 2}]]],
        [redis: [port: ctx.server.port]]
      ],
      append: fn values ->
        for value <- values,
            do: {:ok, _id} = Log.command(redis, ["XADD", stream, "*", "v", value])

        :ok
      end,
      value: fn fields -> fields["v"] end,
      part: fn _id -> :stream end,
      trim: fn ->
        {:ok, _} = Log.command(redis, ["XTRIM", stream, "MAXLEN", "1"])
        :ok
      end
    }
  end

  # The ids read, checking the position after them (Source contract v2):
  # the last id, as a stream's position is the last entry applied.
  defp ids({:ok, entries, position_after, conn}) do
    ids = Enum.map(entries, &elem(&1, 0))
    assert position_after == List.last(ids)
    {ids, conn}
  end

  test "the reads sent ahead after full batches follow the stream to its end", ctx do
    {first, conn} = ids(RedisStream.read(ctx.conn, "0-0", 4, 0))
    {second, conn} = ids(RedisStream.read(conn, List.last(first), 4, 0))
    {third, conn} = ids(RedisStream.read(conn, List.last(second), 4, 0))
    assert first ++ second ++ third == ctx.ids
    last = List.last(third)
    assert {:ok, [], ^last, _conn} = RedisStream.read(conn, last, 4, 0)
  end

  test "a read for another position than the one sent ahead reads that position", ctx do
    {first, conn} = ids(RedisStream.read(ctx.conn, "0-0", 4, 0))
    assert first == Enum.take(ctx.ids, 4)

    # Ahead: after the 4th entry. Asked: after the 2nd, then with another count.
    {again, conn} = ids(RedisStream.read(conn, Enum.at(ctx.ids, 1), 4, 0))
    assert again == Enum.slice(ctx.ids, 2, 4)
    {rest, conn} = ids(RedisStream.read(conn, List.last(again), 100, 0))
    assert rest == Enum.drop(ctx.ids, 6)

    # The connection is in step: a command after these reads gets its own reply.
    last = List.last(rest)
    assert {:ok, [], ^last, _conn} = RedisStream.read(conn, last, 100, 0)
  end

  test "a stream trimmed after a read was sent ahead is reported as trimmed", ctx do
    {first, conn} = ids(RedisStream.read(ctx.conn, "0-0", 2, 0))
    assert first == Enum.take(ctx.ids, 2)
    {:ok, _} = Log.command(ctx.redis, ["XTRIM", "s", "MAXLEN", "3"])
    # The read sent ahead may have run before the trim (entries 3 and 4, and
    # the trim seen by the next read) or after it (the trim seen now):
    # either way no entry is skipped silently.
    case RedisStream.read(conn, List.last(first), 2, 0) do
      {:ok, entries, _position_after, conn} ->
        assert Enum.map(entries, &elem(&1, 0)) == Enum.slice(ctx.ids, 2, 2)
        assert {:trimmed, _resume, _conn} = RedisStream.read(conn, Enum.at(ctx.ids, 3), 2, 0)

      other ->
        assert {:trimmed, _resume, _conn} = other
    end
  end
end
