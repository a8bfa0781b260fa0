# Starts what Larder shares between all its structures: the holder registry
# of Larder.Lock, the register-deaths counter of Larder.Register, and the
# table of live Larder.Bag dumps.
defmodule Larder.Application do
  @moduledoc false

  use Application

  @impl true
  def start(_type, _args) do
    # Created here so that the table outlives a restart of its registry.
    :ok = Larder.Lock.Holders.create_table()
    :ok = Larder.Register.Local.setup()
    :ok = Larder.Bag.Snapshot.create_table()

    Supervisor.start_link([Larder.Lock.Holders],
      strategy: :one_for_one,
      name: Larder.Supervisor
    )
  end
end
