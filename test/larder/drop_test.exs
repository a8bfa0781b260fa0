defmodule Larder.DropTest do
  # drop/1, the one verb that frees a structure, checked the same way for
  # every capability: idempotent by handle and by name, every other call
  # raises ArgumentError afterwards, and a supervised structure that was
  # dropped stays dropped (its child is :transient) while one that crashed
  # is restarted.
  use ExUnit.Case, async: true

  alias Larder.{Bag, Index, Register, Table}

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
