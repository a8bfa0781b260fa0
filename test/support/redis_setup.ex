# Starts the real Redis servers of an integration test (a server, a
# Sentinel set, a cluster) from its setup or setup_all, and stops them when
# the test, or the test module, is done.
defmodule Larder.Test.RedisSetup do
  @moduledoc false

  import ExUnit.Callbacks, only: [on_exit: 1]

  alias Larder.Test.{RedisCluster, RedisSentinel, RedisServer}

  # In a test module: `import Larder.Test.RedisSetup`, then `setup_all
  # :redis_server` (or `setup [:redis_server, :test_prefix]`), or
  # `RedisSetup.start(RedisSentinel, opts)` in a setup block.

  @doc """
  Starts `mod` (`Larder.Test.RedisServer`, `RedisSentinel` or
  `RedisCluster`) with `opts`, and stops it on exit of the test (or, from
  `setup_all`, of the module). Returns its handle.
  """
  def start(mod, opts \\ []) do
    handle = mod.start(opts)
    on_exit(fn -> mod.stop(handle) end)
    handle
  end

  @doc "A setup callback: `%{server: server}`, a redis-server."
  def redis_server(_ctx), do: %{server: start(RedisServer)}

  @doc "A setup callback: `%{set: set}`, a Sentinel set and its data nodes."
  def redis_sentinel(_ctx), do: %{set: start(RedisSentinel)}

  @doc "A setup callback: `%{cluster: cluster}`, a Redis Cluster."
  def redis_cluster(_ctx), do: %{cluster: start(RedisCluster)}

  @doc "A setup callback: `%{prefix: prefix}`, a name unique to the test."
  def test_prefix(ctx), do: %{prefix: "#{inspect(ctx.module)}.#{ctx.test}"}
end
