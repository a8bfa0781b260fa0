# An L2 used on its own, outside a cache (the conformance suite, the Redis
# tests): init/3 in the caller, then the child spec it returned under a supervisor
# linked to the caller, as the cache's tree would run it.
defmodule Larder.Test.L2Process do
  @moduledoc false

  @doc "`{:ok, state}` of `mod`, with its processes running, linked to the caller."
  def start(mod, opts, subscriber, channel) do
    case mod.init(opts, subscriber, channel) do
      {:ok, state} ->
        {:ok, state}

      {:ok, state, child_spec} ->
        {:ok, _sup} = Supervisor.start_link([child_spec], strategy: :one_for_one)
        {:ok, state}
    end
  end
end
