# The process behind Larder.Bag.start_link/1: it holds a named bag's name
# and owns its table, so the bag outlives the processes that use it (see
# Larder.Instance for the life cycle every structure shares).
defmodule Larder.Bag.Owner do
  @moduledoc false

  use GenServer

  alias Larder.Bag.Store
  alias Larder.Instance

  @impl true
  def init(opts) do
    Instance.watch(nil)
    {:ok, Store.create(opts, self())}
  end

  @impl true
  def handle_call({Instance, :drop}, _from, bag) do
    Store.destroy(bag)
    {:stop, :normal, :ok, bag}
  end

  @impl true
  def handle_info(_other, bag), do: {:noreply, bag}

  @impl true
  def terminate(_reason, bag), do: Store.destroy(bag)
end
