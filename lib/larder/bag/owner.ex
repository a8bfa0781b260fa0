# The process behind Larder.Bag.start_link/1: it creates a named bag and owns
# it, so the bag lives as long as this process rather than its users.
defmodule Larder.Bag.Owner do
  @moduledoc false

  use GenServer

  @spec start_link(keyword()) :: GenServer.on_start()
  def start_link(opts), do: GenServer.start_link(__MODULE__, opts)

  @doc """
  Called by `Larder.Bag.drop/1` with the owner of the table it deleted:
  when that is a process of this module, it exits normally (its child is
  `:transient`, so it stays gone). Other owners (callers of `new/1`) get
  no message.
  """
  @spec dropped(pid()) :: :ok
  def dropped(owner) do
    with {__MODULE__, :init, _} <- :proc_lib.initial_call(owner), do: send(owner, :dropped)
    :ok
  end

  @impl true
  def init(opts) do
    {:ok, Larder.Bag.create(opts)}
  rescue
    e in ArgumentError -> {:stop, e}
  end

  @impl true
  def handle_info(:dropped, bag), do: {:stop, :normal, bag}
  def handle_info(_other, bag), do: {:noreply, bag}
end
