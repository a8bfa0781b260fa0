# Expiry, above the Store: the coarse clock hits compare expiry times with
# (moved forward by a small process of its own per cache) and the periodic
# sweep, in slices, of what has expired or was left behind by dead
# processes. The owner runs the sweep.
defmodule Larder.Cache.Expiry do
  @moduledoc false

  alias Larder.Cache.{Runtime, Store}

  @tick_ms 10
  @sweep_ms 5_000
  # Rows a sweep slice looks at: every row of the slice matches one clause
  # of the sweep's match spec, so a slice scans exactly this many rows and
  # deletes at most this many.
  @slice_rows 1_000

  def now, do: System.monotonic_time(:millisecond)

  def sweep_ms, do: @sweep_ms

  def tick_ms, do: @tick_ms

  def new_clock, do: :atomics.new(1, signed: true)

  def tick(rt), do: :atomics.put(rt.clock, 1, now())

  def expires_at(:infinity), do: :infinity
  def expires_at(ttl), do: now() + ttl

  # Hits compare expiry with the clock, an atomic moved forward every tick:
  # reading the system clock on every hit cost more than the rest of the
  # hit, and a read of one atomic costs the same whoever writes it. It lags
  # real time by at most a tick plus the clock process's scheduling delay,
  # so an entry may be served that much past its ttl, never before.
  def live?(_rt, :infinity), do: true
  def live?(rt, expires), do: expires > :atomics.get(rt.clock, 1)

  ## The clock
  #
  # A process of its own, not the cache's process: that one sweeps, clears
  # and applies invalidations, and a tick queued behind them stopped the
  # clock (a sweep of 1M rows held it for half a second). It does nothing
  # but tick, at high priority so that a machine busy with normal work
  # still runs it on time. It is a child of the cache's supervisor
  # (Larder.Cache.Supervisor), started after the cache's process, which
  # starts another if it dies and stops it with the cache.

  # {:ok, pid}, linked to the caller (the cache's supervisor); the cache's
  # process has published its handle. A GenServer (Expiry.Clock), so that
  # :sys.get_state/1 and crash reports work on it as on the cache's other
  # processes.
  def start_clock(name) do
    %{clock: clock} = Runtime.get(name)
    GenServer.start_link(__MODULE__.Clock, clock)
  end

  defmodule Clock do
    @moduledoc false
    # The clock's process: puts the time into the atomic, then again every
    # tick. Its state is the atomic.
    use GenServer

    @impl true
    def init(clock) do
      Process.flag(:priority, :high)
      {:ok, tick(clock)}
    end

    @impl true
    def handle_info(:tick, clock), do: {:noreply, tick(clock)}

    defp tick(clock) do
      :atomics.put(clock, 1, Larder.Cache.Expiry.now())
      Process.send_after(self(), :tick, Larder.Cache.Expiry.tick_ms())
      clock
    end
  end

  ## The sweep
  #
  # Every @sweep_ms the cache's process deletes the rows whose time is up,
  # the loading markers of loaders that died (their waiters clear them too,
  # if any), repairs the slots whose holder died mid-write (the next writer
  # of the slot would, but it may never come), and evicts what a writer
  # that died before evicting left over the limits. The table is walked in
  # slices of @slice_rows rows (sweep/1 starts, sweep/2 goes on from a
  # continuation; each returns {:more, continuation} or :done), and the
  # cache's process handles its other messages between two slices; once
  # :done, it repairs the slots of dead writers and evicts.
  #
  # Between two slices the table changes (writes, this sweep's deletes). A
  # continuation over a :set that changed is not safe: one whose table
  # shrank meanwhile is refused (badarg), so the sweep fixes the table
  # (:ets.safe_fixtable/2) from its first slice to its last. That makes the
  # walk visit every row that was there at the start once (rows written
  # meanwhile may or may not be visited), at the price of keeping the rows
  # deleted during the sweep in memory until it ends. A row is deleted only
  # if the key still holds the version the slice saw, under the key's slot
  # (Store.delete_version/3), so a row replaced meanwhile is left alone.

  def sweep(rt) do
    Store.fix(rt, true)
    slice(rt, Store.stale(rt, now(), @slice_rows))
  end

  def sweep(rt, continuation), do: slice(rt, Store.stale(continuation))

  # (a slice short of @slice_rows rows is the last one: every row matches)
  defp slice(rt, {rows, continuation}) do
    Enum.each(rows, &sweep_row(rt, &1))
    if length(rows) < @slice_rows, do: finish(rt), else: {:more, continuation}
  end

  defp slice(rt, :"$end_of_table"), do: finish(rt)

  defp finish(rt) do
    Store.fix(rt, false)
    :done
  end

  defp sweep_row(_rt, false), do: :ok
  defp sweep_row(rt, {:expired, key, version}), do: Store.delete_version(rt, key, version)

  defp sweep_row(rt, {:loading, key, pid, ref}) do
    unless Process.alive?(pid), do: Store.unlock(rt, key, pid, ref)
  end
end
