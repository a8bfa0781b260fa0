# The process behind Larder.Bag.start_link/1: it creates a named bag and owns
# it, so the bag lives as long as this process rather than its users.
defmodule Larder.Bag.Owner do
  @moduledoc false

  use GenServer

  @spec start_link(keyword()) :: GenServer.on_start()
  def start_link(opts), do: GenServer.start_link(__MODULE__, opts)

  @impl true
  def init(opts) do
    {:ok, Larder.Bag.create(opts)}
  rescue
    e in ArgumentError -> {:stop, e}
  end
end
