defmodule Larder.Register.LocalTest do
  # Larder.Register.Local, the per-process copy of a register: the very
  # term while unchanged, refreshed after a write elsewhere, bounded by
  # :max_cached, dropped by forget/1, drop/1 and the register's death.
  use ExUnit.Case, async: true

  alias Larder.LocalCopies
  alias Larder.Register
  alias Larder.Register.Local

  require Larder.LocalCopies

  # The local copies this process holds, per register: %{key => entry} maps
  # under each register's integer key (Larder.LocalCopies.key?/1).
  defp local_copies do
    for {id, copies} when LocalCopies.key?(id) and is_map(copies) <- Process.get(),
        into: %{},
        do: {id, copies}
  end

  test "an unchanged value is returned as the very same term, without growing the heap" do
    reg = Register.new()
    value = Enum.to_list(1..100)
    :ok = Register.put(reg, :k, value)
    Register.forget(reg)
    first = Register.get(reg, :k)
    assert first == value
    assert :erts_debug.same(first, Register.get(reg, :k))

    # The put kept the writer's own term as its copy.
    :ok = Register.put(reg, :k2, value)
    assert :erts_debug.same(Register.get(reg, :k2), value)

    # After a write elsewhere the copy is refreshed, then shared again.
    parent = self()
    spawn_link(fn -> send(parent, Register.put(reg, :k, [0 | value])) end)
    assert_receive :ok
    fresh = Register.get(reg, :k)
    assert fresh == [0 | value]
    refute :erts_debug.same(fresh, first)
    assert :erts_debug.same(fresh, Register.get(reg, :k))
  end

  test "copies are bounded by :max_cached and released by forget/1" do
    reg = Register.new(max_cached: 8)
    for i <- 1..100, do: :ok = Register.put(reg, i, i)
    for i <- 1..100, do: assert(Register.get(reg, i) == i)
    [copies] = Map.values(local_copies())
    assert map_size(copies) in 1..8
    assert Register.forget(reg) == :ok
    assert local_copies() == %{}
    assert Register.get(reg, 5) == 5
  end

  test "drop/1 releases this process's copies" do
    reg = Register.new()
    :ok = Register.put(reg, :k, 1)
    assert Register.get(reg, :k) == 1
    assert local_copies() != %{}
    :ok = Register.drop(reg)
    assert local_copies() == %{}
  end

  test "remember/3 keeps at most max_cached keys: a new key when full starts over" do
    reg = Register.new(max_cached: 3)
    for k <- 1..3, do: Local.remember(reg, k, {1, 0})
    assert Process.get(reg.local) |> Map.keys() |> Enum.sort() == [1, 2, 3]
    # A key it has is updated in place.
    Local.remember(reg, 2, {1, 5})
    assert Process.get(reg.local) == %{1 => {1, 0}, 2 => {1, 5}, 3 => {1, 0}}
    # A fourth key drops the others.
    Local.remember(reg, 4, {1, 0})
    assert Process.get(reg.local) == %{4 => {1, 0}}
    assert Local.drop(reg.local) == :ok
    assert Process.get(reg.local) == nil
  end

  test "live?/1 is false once the register is dropped; its copies go at the next sweep" do
    reg = Register.new()
    :ok = Register.put(reg, :k, 1)
    assert Register.get(reg, :k) == 1
    assert Local.live?({reg.versions, reg.tab})

    # Dropped by another process: this one still holds copies until it sweeps.
    Task.await(Task.async(fn -> Register.drop(reg) end))
    refute Local.live?({reg.versions, reg.tab})
    assert Map.has_key?(local_copies(), reg.local)
    LocalCopies.reclaim(reg.deaths)
    refute Map.has_key?(local_copies(), reg.local)
  end
end
