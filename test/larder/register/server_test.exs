defmodule Larder.Register.ServerTest do
  # Larder.Register.Server, a register's owner process: it dies with the
  # process that called new/1, on drop/1 and on a shutdown, and marks the
  # register dead before its table goes.
  use ExUnit.Case, async: true

  import Larder.Test.Eventually

  alias Larder.Register

  test "a register made with new/1 dies with its owner" do
    parent = self()

    owner =
      spawn(fn ->
        send(parent, {:reg, Register.new()})
        Process.sleep(:infinity)
      end)

    assert_receive {:reg, reg}
    :ok = Register.put(reg, :k, 1)
    assert Register.get(reg, :k) == 1
    ref = Process.monitor(owner)
    Process.exit(owner, :kill)
    assert_receive {:DOWN, ^ref, _, _, _}
    # The register notices its owner died asynchronously; allow for a loaded machine.
    eventually(fn -> raises_argument_error?(fn -> Register.put(reg, :k, 2) end) end, 250)
    assert_raise ArgumentError, ~r/unknown Larder.Register/, fn -> Register.get(reg, :k) end
  end

  test "the server answers the handle, and a drop stops it normally", context do
    name = :"#{inspect(__MODULE__)}.#{context.test}"
    {:ok, pid} = Register.start_link(name: name)
    reg = GenServer.call(pid, :handle)
    assert reg.server == pid
    :ok = Register.put(name, :k, 1)
    ref = Process.monitor(pid)
    assert Register.drop(name) == :ok
    assert_receive {:DOWN, ^ref, :process, ^pid, :normal}
    assert :atomics.get(reg.versions, 1) == -1
    assert :ets.info(reg.tab) == :undefined
  end

  test "a shutdown marks the register dead and frees its table and name", context do
    name = :"#{inspect(__MODULE__)}.#{context.test}"
    pid = start_supervised!({Register, name: name})
    reg = GenServer.call(pid, :handle)
    stop_supervised!({Register, name})
    assert :atomics.get(reg.versions, 1) == -1
    assert :ets.info(reg.tab) == :undefined
    assert Larder.Instance.whereis(Register, name) == nil
  end

  test "stray messages change nothing", context do
    name = :"#{inspect(__MODULE__)}.#{context.test}"
    pid = start_supervised!({Register, name: name})
    :ok = Register.put(name, :k, 1)
    send(pid, :stray)
    send(pid, {:DOWN, make_ref(), :process, self(), :normal})
    _ = :sys.get_state(pid)
    assert Register.get(name, :k) == 1
  end
end
