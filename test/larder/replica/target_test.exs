defmodule Larder.Replica.TargetTest do
  # The structure a replica creates: a name still held by a live structure
  # (a predecessor's) is waited for; any other ArgumentError is the
  # caller's at once. Not async: one test traces calls, and trace patterns
  # are global.
  use ExUnit.Case, async: false

  alias Larder.{Bag, Table}
  alias Larder.Replica.Target

  defp name(ctx), do: :"#{ctx.module}.#{ctx.test}"

  test "a name held by a live table is waited for, then the table is created", ctx do
    name = name(ctx)
    test = self()

    holder =
      spawn(fn ->
        Table.new(key: :id, name: name)
        send(test, :holding)
        receive do: (:let_go -> :ok)
      end)

    assert_receive :holding, 5_000
    # The table belongs to the task that creates it.
    task =
      Task.async(fn ->
        table = Target.create(Target.new!({Table, key: :id, name: name}))
        {Table.size(name), Table.drop(table)}
      end)

    refute Task.yield(task, 200), "created while the name was held"
    send(holder, :let_go)
    assert Task.await(task, 10_000) == {0, :ok}
  end

  test "an ArgumentError that is not a taken name is raised at the first try", ctx do
    # The message holds the words "already exists", which a check of the
    # message would take for a taken name and retry for seconds.
    spec = {Bag, name: name(ctx), dedup: "already exists"}

    # A process cannot be its own tracer: this one forwards the traces.
    test = self()
    tracer = spawn_link(fn -> forward(test) end)
    Code.ensure_loaded!(Bag)
    1 = :erlang.trace_pattern({Bag, :new, 1}, true, [:global])
    :erlang.trace(self(), true, [:call, {:tracer, tracer}])

    try do
      assert_raise ArgumentError, ~r/:dedup/, fn -> Target.create(Target.new!(spec)) end
    after
      :erlang.trace(self(), false, [:call])
      :erlang.trace_pattern({Bag, :new, 1}, false, [:global])
    end

    # Trace messages come asynchronously; the call is over, so all of them
    # are on their way.
    assert_receive {:trace, _, :call, {Bag, :new, _}}, 5_000
    refute_receive {:trace, _, :call, {Bag, :new, _}}, 500, "Larder.Bag.new/1 was tried again"
  end

  defp forward(to) do
    receive do
      message -> send(to, message)
    end

    forward(to)
  end
end
