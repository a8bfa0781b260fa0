defmodule Larder.Replica.Target.TableTest do
  # A replica's Table target on its own: the ops it takes, its writes in
  # order and in runs, each record checked once (by check/2, not again by
  # the table's public checks), its dump always concurrent, the cut taken
  # when the dump begins, and its options checked. Not async: one test
  # traces calls, and trace patterns are global.
  use ExUnit.Case, async: false

  alias Larder.Replica.Target

  @moduletag :capture_log
  alias Larder.Table

  setup do
    target = Target.new!({Table, key: :id, index: [:v]})
    %{target: target, table: Target.create(target)}
  end

  defp contents(table), do: table |> Table.stream() |> Map.new(&{&1.id, &1.v})

  test "check/2 takes inserts of maps holding the key and deletes, in a proper list", ctx do
    assert Target.check(ctx.target, [])
    assert Target.check(ctx.target, [{:insert, %{id: 1}}, {:delete, 2}, {:delete, %{any: :key}}])
    refute Target.check(ctx.target, [{:insert, %{no_id: 1}}])
    refute Target.check(ctx.target, [{:insert, [id: 1]}])
    refute Target.check(ctx.target, [{:insert, %{id: 1}, :extra}])
    refute Target.check(ctx.target, [{:delete, 1} | {:delete, 2}])
    refute Target.check(ctx.target, [{:upsert, %{id: 1}}])
  end

  test "write/2 applies the ops in order", ctx do
    ops = [
      {:insert, %{id: 1, v: 1}},
      {:insert, %{id: 2, v: 2}},
      {:delete, 1},
      {:delete, 3},
      {:insert, %{id: 1, v: 10}},
      {:insert, %{id: 2, v: 20}}
    ]

    assert Target.write(ctx.target, ctx.table, ops) == :ok
    assert contents(ctx.table) == %{1 => 10, 2 => 20}
    assert Table.search_keys(ctx.table, v: 20) == [2]
  end

  test "write/2 writes each run of inserts once, through the writer, without the public checks",
       ctx do
    test = self()
    tracer = spawn_link(fn -> forward(test) end)
    Code.ensure_loaded!(Table)
    Code.ensure_loaded!(Table.Requests)
    checks = :erlang.trace_pattern({Table, :records!, 3}, true, [:local])
    assert checks == 1
    1 = :erlang.trace_pattern({Table.Requests, :insert!, 3}, true, [:global])
    :erlang.trace(self(), true, [:call, {:tracer, tracer}])

    try do
      ops =
        for(i <- 1..50, do: {:insert, %{id: i, v: i}}) ++
          [{:delete, 1}, {:insert, %{id: 1, v: 0}}]

      :ok = Target.write(ctx.target, ctx.table, ops)
    after
      :erlang.trace(self(), false, [:call])
      :erlang.trace_pattern({Table, :records!, 3}, false, [:local])
      :erlang.trace_pattern({Table.Requests, :insert!, 3}, false, [:global])
    end

    assert_receive {:trace, _, :call, {Table.Requests, :insert!, [_, first, "insert_many/2"]}}
    assert length(first) == 50
    assert_receive {:trace, _, :call, {Table.Requests, :insert!, [_, [%{id: 1, v: 0}], _]}}
    refute_receive {:trace, _, :call, {Table, :records!, _}}, 200
    assert Table.size(ctx.table) == 50

    # the public API still checks its callers' records
    assert_raise ArgumentError, ~r/key field/, fn -> Table.insert_many(ctx.table, [%{no: 1}]) end
  end

  test "a snapshot dumps it concurrently: the cut is taken when the dump begins", ctx do
    assert Target.dump_mode(ctx.target, 1) == :concurrent
    assert Target.dump_mode(ctx.target, 2) == :concurrent

    path =
      Path.join(System.tmp_dir!(), "larder-target-table-#{System.unique_integer([:positive])}")

    on_exit(fn -> File.rm(path) end)
    :ok = Target.write(ctx.target, ctx.table, [{:insert, %{id: 1, v: 1}}])

    {:ok, cut} = Target.start_dump(ctx.target, ctx.table, path, self())
    :ok = Target.write(ctx.target, ctx.table, [{:insert, %{id: 2, v: 2}}, {:delete, 1}])
    assert Target.finish_dump(ctx.target, ctx.table, path, cut) == :ok

    assert {:ok, loaded} = Target.load(Target.new!({Table, key: :id, index: [:v]}), path)
    assert contents(loaded) == %{1 => 1}
    assert contents(ctx.table) == %{2 => 2}

    Table.drop(ctx.table)
    assert Target.start_dump(ctx.target, ctx.table, path, self()) == :gone
  end

  test "identity, and options checked naming :into" do
    target = Target.new!({Table, key: :id, name: :some_table})
    assert Target.identity(target, :replica) == {:table, :some_table}
    assert Target.identity(Target.new!({Table, key: :id}), :replica) == {:table, :replica}

    for bad <- [{Table, []}, {Table, [:key]}, {Table, :x}, {Larder.Register, []}, :table] do
      assert_raise ArgumentError, ~r/option :into/, fn -> Target.new!(bad) end
    end
  end

  defp forward(to) do
    receive do
      message -> send(to, message)
    end

    forward(to)
  end
end
