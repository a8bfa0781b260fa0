# Starts what Larder shares between all its structures: the holder registry
# of Larder.Lock and its wait-for graph, the deaths counter of
# Larder.LocalCopies, the table of live snapshot dumps, and the name
# claims of Larder.Instance.
defmodule Larder.Application do
  @moduledoc false

  use Application

  @impl true
  def start(_type, _args) do
    # Tables created here live as long as the application, whatever
    # happens to the processes that use them.
    :ok = Larder.Lock.Holders.create_table()
    :ok = Larder.Lock.Waits.create_table()
    :ok = Larder.LocalCopies.setup()
    :ok = Larder.SnapshotFile.create_table()
    :ok = Larder.Instance.create_table()

    # The only child, the holder janitor, is :temporary: killing it never
    # counts towards this supervisor's restart intensity, so it cannot stop
    # the application (see Larder.Lock.Holders).
    Supervisor.start_link([Larder.Lock.Holders],
      strategy: :one_for_one,
      name: Larder.Supervisor
    )
  end
end
