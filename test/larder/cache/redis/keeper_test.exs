defmodule Larder.Cache.Redis.KeeperTest do
  # The keeper's handling of command connections that end, on a real
  # redis-server: each end is counted and replaced, and a storm of them
  # is one warning, not one per end.
  use ExUnit.Case, async: true

  alias Larder.Cache.Redis
  alias Larder.Cache.Redis.Keeper

  import ExUnit.CaptureLog
  import Larder.Test.Eventually

  @moduletag :redis

  import Larder.Test.RedisSetup, only: [redis_server: 1]

  setup_all :redis_server

  test "a storm of ended connections: each counted and replaced, one warning", ctx do
    channel = "#{inspect(ctx.module)}.#{ctx.test}"
    opts = [port: ctx.server.port, pool_size: 2, reconnect_sleep: 1]
    {:ok, state} = Larder.Test.L2Process.start(Redis, opts, self(), channel)
    rounds = 40

    log =
      capture_log(fn ->
        for round <- 1..rounds do
          slot = rem(round, 2)
          eventually(fn -> client(state, slot) != nil end, 250)
          pid = client(state, slot)
          Process.exit(pid, :kill)
          # replaced by a new connection
          eventually(fn -> client(state, slot) not in [nil, pid] end, 250)
        end

        # which works

        eventually(fn -> Enum.all?(0..1, &(client(state, &1) != nil)) end, 250)
        assert Redis.put(state, "k", "v", :infinity, :always) == :ok
        assert Redis.get(state, "k") == {:ok, "v"}
      end)

    assert Keeper.ended_connections(state) == rounds
    ended = ~r/command connection \S+ of channel #{Regex.escape(inspect(channel))} ended/
    assert length(Regex.scan(ended, log)) == 1
    Redis.stop(state)
  end

  defp client(state, slot) do
    case :ets.lookup(state.table, slot) do
      [{^slot, pid}] when is_pid(pid) -> pid
      _ -> nil
    end
  end
end
