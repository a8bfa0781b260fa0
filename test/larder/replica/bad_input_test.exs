defmodule Larder.Replica.BadInputTest do
  # PropEr throws arbitrary terms at every option of Larder.Replica's
  # start_link/1 and child_spec/1 (one option at a time in otherwise valid
  # options, and whole option lists) and at every argument of offset/1,
  # target/1, dump/1 and await/3: only a result, an ArgumentError or
  # {:error, %Larder.Error{}} may come back, and the replica under test
  # keeps its table.
  use ExUnit.Case, async: true

  alias Larder.Replica
  alias Larder.Test.RedisServer
  alias Larder.Test.{BadCall, Hostile, PropEr}
  alias Larder.Test.ReplicaLog, as: Log

  import :proper_types, only: [oneof: 1, frequency: 1, list: 1, tuple: 1, integer: 2]

  @moduletag :redis
  @moduletag :capture_log

  @options [
    :name,
    :into,
    :source,
    :apply,
    :snapshot,
    :snapshot_every,
    :batch_size,
    :block_ms,
    :on_trimmed,
    :on_error,
    :telemetry
  ]

  defp nasty do
    Hostile.term([
      {2, oneof([nil, :infinity, -1, 0, 1, 100_001, 2 ** 64, "", "x\0y", :stop, :skip])},
      {1, oneof([{Larder.Table, []}, {Larder.Table, [key: 1, bogus: 2]}, {Larder.Bag, [:x]}])},
      {1, oneof([{Larder.Replica.RedisStream, []}, {Larder.Replica.RedisStream, [stream: 1]}])},
      {1,
       oneof([{Larder.Replica.RedisStream, [stream: "s", redis: [port: 70_000]]}, {Enum, []}])},
      {1, oneof([fn -> :ok end, fn _, _, _ -> :ok end, &Log.apply_entry/1])},
      {1, list(tuple([oneof(@options ++ [:bogus]), :proper_types.any()]))}
    ])
  end

  defp call do
    name = frequency([{3, :replica}, {1, nasty()}])

    oneof([
      tuple([:start_link, tuple([:option, oneof(@options), nasty()])]),
      tuple([:child_spec, tuple([:option, oneof(@options), nasty()])]),
      tuple([:start_link, tuple([nasty()])]),
      tuple([:offset, tuple([name])]),
      tuple([:target, tuple([name])]),
      tuple([:dump, tuple([name])]),
      tuple([:await, tuple([name, nasty(), oneof([integer(0, 20), nasty()])])])
    ])
  end

  defp run(ctx, {fun, {:option, key, value}}) do
    # another replica of another table (one of the same table would wait for
    # the name, as a restarted replica waits for its predecessor's)
    base =
      Keyword.put(
        ctx.base,
        :into,
        {Larder.Table, name: :"#{ctx.test}-other", key: :id, index: [:v]}
      )

    opts = Keyword.put(base, key, in_dir(ctx, key, Hostile.build(value)))
    opts = Keyword.put(opts, :name, if(key == :name, do: value, else: :"#{ctx.test}-other"))
    run(ctx, {fun, {opts}})
  end

  defp run(ctx, {fun, args}) do
    args =
      args
      |> Tuple.to_list()
      |> Enum.map(&if(&1 == :replica, do: ctx.replica, else: Hostile.build(&1)))

    # (arbitrary options that happen to be valid start a replica: stopped)
    BadCall.run(Replica, fun, args)
  end

  defp allowed?(_fun, :argument_error), do: true
  defp allowed?(_fun, {:error, %Larder.Error{}}), do: true
  defp allowed?(:offset, id), do: is_binary(id)
  defp allowed?(:target, _handle), do: true
  defp allowed?(:dump, {:ok, id}), do: is_binary(id)
  defp allowed?(:child_spec, %{id: _, start: _}), do: true
  defp allowed?(_fun, :ok), do: true
  defp allowed?(_fun, _other), do: false

  test "arbitrary arguments get a result, an ArgumentError or a Larder.Error", ctx do
    server = RedisServer.start()
    on_exit(fn -> RedisServer.stop(server) end)
    redis = Log.connect(server.port)
    stream = "bad-input"
    Log.add(redis, stream, for(k <- 1..20, do: {:put, k, k}))
    table = :"#{ctx.test}-table"
    base = Log.opts(:"#{ctx.test}", table, server.port, stream)
    replica = start_supervised!({Replica, base})
    :ok = Replica.await(replica, :latest, 10_000)
    dir = Path.join(System.tmp_dir!(), "larder-replica-bad-#{System.unique_integer([:positive])}")
    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf(dir) end)
    ctx = Map.merge(ctx, %{base: base, replica: replica, dir: dir})

    property =
      :proper.forall(list(call()), fn calls ->
        Enum.all?(calls, fn {fun, _args} = call ->
          result = run(ctx, call)

          allowed?(fun, result) or
            (IO.puts("#{fun} returned #{inspect(result, limit: 20)}") && false)
        end) and Log.contents(table) == Map.new(1..20, &{&1, &1})
      end)

    PropEr.check(property, numtests: 200)
  end

  # A relative :snapshot path that happens to be valid would write in the
  # project's folder: it goes in the test's own.
  defp in_dir(ctx, :snapshot, path) when is_binary(path) do
    if Path.type(path) == :relative, do: Path.join(ctx.dir, path), else: path
  end

  defp in_dir(_ctx, _key, value), do: value
end
