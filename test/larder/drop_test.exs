defmodule Larder.DropTest do
  # drop/1, the one verb that frees a structure, checked the same way for
  # every capability: idempotent by handle and by name, every other call
  # raises ArgumentError afterwards, and a supervised structure that was
  # dropped stays dropped (its child is :transient) while one that crashed
  # is restarted.
  use ExUnit.Case, async: true

  alias Larder.{Bag, Index, Register, Replica, Table}
  alias Larder.Test.PartitionedSource

  # {module, creates an unnamed one, creates one under a name, child spec
  #  options, a call that must raise once it is dropped}
  defp capabilities do
    [
      {Bag, fn -> Bag.new() end, &Bag.new(name: &1), &[name: &1], &Bag.size/1},
      {Register, fn -> Register.new() end, &Register.new(name: &1), &[name: &1],
       &Register.size/1},
      {Table, fn -> Table.new(key: :id) end, &Table.new(key: :id, name: &1),
       &[key: :id, name: &1], &Table.size/1}
    ]
  end

  defp name(ctx, mod), do: :"#{ctx.module}.#{ctx.test}.#{inspect(mod)}"

  test "drop/1 by handle is idempotent and leaves every other call raising" do
    for {mod, new, _named, _spec, use} <- capabilities() do
      handle = new.()
      assert mod.drop(handle) == :ok
      assert_raise ArgumentError, fn -> use.(handle) end
      assert mod.drop(handle) == :ok, "#{inspect(mod)}.drop/1 twice"
    end

    index = Index.new()
    assert Index.drop(index) == :ok
    assert_raise ArgumentError, fn -> Index.count(index, :a) end
    assert Index.drop(index) == :ok
  end

  test "drop/1 by name is idempotent; the name is free again", ctx do
    for {mod, _new, named, _spec, use} <- capabilities() do
      name = name(ctx, mod)
      handle = named.(name)
      assert mod.drop(name) == :ok
      assert_raise ArgumentError, fn -> use.(name) end
      assert mod.drop(name) == :ok
      assert mod.drop(handle) == :ok

      again = named.(name)
      assert use.(name) == 0
      assert mod.drop(again) == :ok
    end
  end

  test "drop/1 of something that is not a structure raises ArgumentError" do
    for {mod, _, _, _, _} <- capabilities(), bad <- ["x", 1, {:a}] do
      assert_raise ArgumentError, fn -> mod.drop(bad) end
    end
  end

  test "a supervised structure dropped stays dropped; one that crashed is restarted", ctx do
    for {mod, _new, _named, spec, use} <- capabilities() do
      name = name(ctx, mod)
      {:ok, sup} = Supervisor.start_link([{mod, spec.(name)}], strategy: :one_for_one)
      [{_, pid, _, _}] = Supervisor.which_children(sup)
      ref = Process.monitor(pid)

      Process.exit(pid, :kill)
      assert_receive {:DOWN, ^ref, :process, ^pid, :killed}
      Larder.Test.Eventually.eventually(fn -> restarted?(sup, pid) end)
      [{_, pid, _, _}] = Supervisor.which_children(sup)
      ref = Process.monitor(pid)
      Larder.Test.Eventually.eventually(fn -> match?(0, safe(fn -> use.(name) end)) end)

      assert mod.drop(name) == :ok
      assert_receive {:DOWN, ^ref, :process, ^pid, :normal}
      # Not restarted (the supervisor handles the exit after we see it).
      Larder.Test.Eventually.eventually(fn ->
        match?([{_, :undefined, _, _}], Supervisor.which_children(sup))
      end)

      refute_received {:DOWN, _, :process, _, _}
      assert_raise ArgumentError, fn -> use.(name) end
      assert mod.drop(name) == :ok
      :ok = Supervisor.stop(sup)
    end
  end

  describe "a replica stuck in an arity-2 apply" do
    # A replica whose apply is stuck (in a step of its own) ends it and
    # exits :normal; under a supervisor it is neither restarted nor
    # counted as a crash: with max_restarts: 0 a crash would take the
    # supervisor and its other children down.
    setup ctx do
      log = PartitionedSource.new(1)
      PartitionedSource.append(log, 0, %{"k" => "1"})
      me = self()

      apply = fn _fields, _into ->
        send(me, {:stuck, self()})
        Process.sleep(:infinity)
      end

      name = name(ctx, Replica)

      opts = [
        name: name,
        into: {Table, name: :"#{name}.table", key: :id},
        source: {PartitionedSource, table: log},
        apply: apply
      ]

      other = %{id: :other, start: {Agent, :start_link, [fn -> :other end]}}
      %{name: name, opts: opts, other: other}
    end

    test "under a Supervisor: dropped, not restarted, no crash counted", ctx do
      {:ok, sup} =
        Supervisor.start_link([{Replica, ctx.opts}, ctx.other],
          strategy: :one_for_one,
          max_restarts: 0
        )

      on_exit(fn -> if Process.alive?(sup), do: Process.exit(sup, :kill) end)
      assert_receive {:stuck, replica}, 10_000

      [{:other, other, _, _}] =
        Enum.filter(Supervisor.which_children(sup), &(elem(&1, 0) == :other))

      assert Replica.drop(ctx.name) == :ok
      refute Process.alive?(replica)
      assert Process.alive?(sup)
      assert Process.alive?(other)

      assert {{Replica, ctx.name}, :undefined, :worker, [Replica]} in Supervisor.which_children(
               sup
             )

      refute_receive {:stuck, _}, 500
      assert_raise ArgumentError, fn -> Replica.offset(ctx.name) end
      assert Replica.drop(ctx.name) == :ok
    end

    test "under a DynamicSupervisor: dropped, not restarted, no crash counted", ctx do
      {:ok, sup} = DynamicSupervisor.start_link(strategy: :one_for_one, max_restarts: 0)
      on_exit(fn -> if Process.alive?(sup), do: Process.exit(sup, :kill) end)
      {:ok, other} = DynamicSupervisor.start_child(sup, ctx.other)
      {:ok, replica} = DynamicSupervisor.start_child(sup, {Replica, ctx.opts})
      assert_receive {:stuck, step}, 10_000

      assert Replica.drop(replica) == :ok
      refute Process.alive?(step)
      refute Process.alive?(replica)
      assert Process.alive?(sup)
      assert [{:undefined, ^other, _, _}] = DynamicSupervisor.which_children(sup)
      refute_receive {:stuck, _}, 500
    end
  end

  defp restarted?(sup, old) do
    case Supervisor.which_children(sup) do
      [{_, pid, _, _}] when is_pid(pid) and pid != old -> true
      _ -> false
    end
  end

  defp safe(fun) do
    fun.()
  rescue
    ArgumentError -> :gone
  end
end
