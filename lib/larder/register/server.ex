# The owner of a register: creates its table and publishes its name; marks
# the register dead and drops the table on drop/1, owner exit or
# shutdown.
defmodule Larder.Register.Server do
  @moduledoc false

  use GenServer

  alias Larder.Register.Store

  @spec start({keyword(), pid() | nil}) :: GenServer.on_start()
  def start({opts, _owner} = arg), do: GenServer.start(__MODULE__, arg, gen_opts(opts))

  @spec start_link(keyword()) :: GenServer.on_start()
  def start_link(opts), do: GenServer.start_link(__MODULE__, {opts, nil}, gen_opts(opts))

  defp gen_opts(opts) do
    case Keyword.fetch!(opts, :name) do
      nil -> []
      name -> [name: name]
    end
  end

  @impl true
  def init({opts, owner}) do
    Process.flag(:trap_exit, true)
    if owner, do: Process.monitor(owner)

    reg = Store.create(opts, self())

    if name = Keyword.fetch!(opts, :name) do
      :persistent_term.put({Larder.Register, name}, reg)
    end

    {:ok, %{reg: reg, owner: owner}}
  end

  @impl true
  def handle_call(:handle, _from, state), do: {:reply, state.reg, state}

  def handle_call(:drop, _from, state) do
    shutdown(state.reg)
    {:stop, :normal, :ok, %{state | reg: nil}}
  end

  @impl true
  def handle_info({:DOWN, _ref, :process, owner, _reason}, %{owner: owner} = state) do
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
    if name = reg.name, do: :persistent_term.erase({Larder.Register, name})
    :ok
  end
end
