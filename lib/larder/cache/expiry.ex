# Expiry: the coarse clock hits compare expiry times with (moved forward by
# the cache's process every tick) and the periodic sweep of what has
# expired or was left behind by dead processes.
defmodule Larder.Cache.Expiry do
  @moduledoc false

  alias Larder.Cache.{Eviction, Store}

  @sweep_ms 5_000

  def now, do: System.monotonic_time(:millisecond)

  # Hits compare expiry with the owner's clock, an atomic it moves forward
  # every tick: reading the system clock on every hit cost more than the
  # rest of the hit. It lags real time by at most a tick (and the owner's
  # scheduling delay), so an entry may be served that much past its ttl,
  # never before.
  def tick_ms, do: 10

  def sweep_ms, do: @sweep_ms

  def new_clock, do: :atomics.new(1, signed: true)

  def tick(cfg), do: :atomics.put(cfg.clock, 1, now())

  def expires_at(:infinity), do: :infinity
  def expires_at(ttl), do: now() + ttl

  def live?(_cfg, :infinity), do: true
  def live?(cfg, expires), do: expires > :atomics.get(cfg.clock, 1)

  # Called every @sweep_ms by the owner: deletes the rows whose time is up,
  # the loading markers of loaders that died (their waiters clear them too,
  # if any), repairs the slots whose holder died mid-write (the next writer
  # of the slot would, but it may never come), and evicts what a writer
  # that died before evicting left over the limits.
  def sweep(cfg) do
    now = now()

    expired = [
      {{:"$1", :"$2", :"$3", :_, :_}, [{:is_integer, :"$2"}, {:"=<", :"$3", now}],
       [{{:"$1", :"$2"}}]}
    ]

    for {key, version} <- :ets.select(cfg.data, expired),
        do: Store.delete_version(cfg, key, version)

    loading = [{{:"$1", :loading, :"$2", :"$3", :_}, [], [{{:"$1", :"$2", :"$3"}}]}]

    for {key, pid, ref} <- :ets.select(cfg.data, loading), not Process.alive?(pid) do
      Store.unlock(cfg, key, pid, ref)
    end

    Store.repair_dead_writers(cfg)
    Eviction.evict(cfg)
  end
end
