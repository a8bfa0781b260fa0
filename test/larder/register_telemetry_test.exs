defmodule Larder.RegisterTelemetryTest do
  # The Larder.Register event of Larder.Telemetry, through the test stand-in
  # for :telemetry (test/support/telemetry.ex).
  use ExUnit.Case, async: true

  alias Larder.Register

  @takeover [:larder, :register, :lock, :takeover]

  setup ctx do
    Larder.Test.TelemetryEvents.forward({__MODULE__, ctx.test}, [@takeover])
  end

  # White box, as in register_test.exs: the slot held by the holder id of a
  # process that is gone, and a record it left uncommitted.
  defp leave_dead_holder(reg) do
    %{tab: tab, lock: lock, versions: versions} = reg
    dead_id = Task.await(Task.async(&Larder.Lock.Holders.id/0))
    :ets.insert(tab, {:a, :atomics.get(versions, 1) + 1, :new})
    :atomics.put(lock.atomics, 1, dead_id)
  end

  test "a writer that takes over a dead holder's slot emits the takeover, named", ctx do
    name = :"#{__MODULE__}.#{ctx.test}"
    reg = Register.new(slots: 1, name: name)
    :ok = Register.put(reg, :a, :old)
    leave_dead_holder(reg)

    :ok = Register.put(reg, :b, 1)

    assert_receive {:event, @takeover, %{count: 1}, %{register: ^name, slot: 1}}
    assert Register.get(reg, :a) == :new
    # one takeover, one event: the next write takes a free slot
    :ok = Register.put(reg, :b, 2)
    refute_received {:event, @takeover, _, %{register: ^name}}
    :ok = Register.drop(reg)
  end

  test "a reader commits a dead writer's record without taking its slot; unnamed: the handle" do
    reg = Register.new(slots: 1)
    :ok = Register.put(reg, :a, :old)
    leave_dead_holder(reg)

    # readers never take a lock: the record is committed, the slot is still
    # the dead holder's, and no event is emitted until a writer takes it
    assert Task.await(Task.async(fn -> Register.get(reg, :a) end)) == :new
    assert Register.get(reg, :a) == :new
    refute_received {:event, @takeover, _, %{register: ^reg}}
    assert Larder.Lock.holder(reg.lock, 1) == :dead

    :ok = Register.put(reg, :b, 1)
    assert_receive {:event, @takeover, %{count: 1}, %{register: ^reg, slot: 1}}
    assert Register.get(reg, :a) == :new
    :ok = Register.drop(reg)
  end

  test "telemetry: false emits nothing" do
    reg = Register.new(slots: 1, telemetry: false)
    :ok = Register.put(reg, :a, :old)
    leave_dead_holder(reg)
    :ok = Register.put(reg, :b, 1)
    assert Register.get(reg, :a) == :new
    refute_received {:event, @takeover, _, %{register: ^reg}}
    :ok = Register.drop(reg)
  end

  test "the :telemetry option is checked" do
    assert_raise ArgumentError, ~r/:telemetry to be a boolean/, fn ->
      Register.new(telemetry: :yes)
    end
  end
end
