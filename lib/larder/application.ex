# Starts what Larder shares between all its structures: the holder registry
# of Larder.Lock and its wait-for graph, and the deaths counter of
# Larder.LocalCopies.
defmodule Larder.Application do
  @moduledoc false

  use Application

  @impl true
  def start(_type, _args) do
    # Created here so that the table outlives a restart of its registry.
    :ok = Larder.Lock.Holders.create_table()
    :ok = Larder.Lock.Waits.create_table()
    :ok = Larder.LocalCopies.setup()

    Supervisor.start_link([Larder.Lock.Holders],
      strategy: :one_for_one,
      name: Larder.Supervisor
    )
  end
end
