# Moves a test process's scheduling point: yields the scheduler `n` times,
# so that a race is tried at varying interleavings.
defmodule Larder.Test.Scheduler do
  @moduledoc false

  @doc "Yields the scheduler `n` times (`n` >= 0)."
  def yields(0), do: :ok

  def yields(n) do
    :erlang.yield()
    yields(n - 1)
  end
end
