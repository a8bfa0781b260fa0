# The owner of a register: creates its table and publishes its handle; marks
# the register dead and drops the table on drop/1, owner exit or shutdown
# (see Larder.Instance for the life cycle every structure shares).
defmodule Larder.Register.Server do
  @moduledoc false

  use GenServer

  alias Larder.Instance
  alias Larder.Register.Store

  @impl true
  def init({opts, caller}) do
    Instance.watch(caller)
    reg = Store.create(opts, self())
    Instance.publish(Larder.Register, reg.name, reg)
    {:ok, %{reg: reg, caller: caller}}
  end

  @impl true
  def handle_call(:handle, _from, state), do: {:reply, state.reg, state}

  def handle_call({Instance, :drop}, _from, state) do
    shutdown(state.reg)
    {:stop, :normal, :ok, %{state | reg: nil}}
  end

  @impl true
  def handle_info({:DOWN, _ref, :process, caller, _reason}, %{caller: caller} = state) do
    {:stop, :normal, state}
  end

  def handle_info(_msg, state), do: {:noreply, state}

  @impl true
  def terminate(_reason, %{reg: nil}), do: :ok
  def terminate(_reason, %{reg: reg}), do: shutdown(reg)

  # Marks the register dead before its table goes, so that no process-local
  # copy can be served after drop/1 returns.
  defp shutdown(reg) do
    Store.kill(reg)
    Instance.release(Larder.Register, reg.name, reg, self())
  end
end
