# The process behind a cache: builds and owns its ETS tables and the L2's
# state (its processes run beside it, under the cache's supervisor), and
# runs what must happen in one place: the generation (Generation), the
# invalidations heard from the L2 (Invalidations), the repair of L2 writes
# whose outcome is unknown (Repairs), clears, and the sweep (Expiry).
defmodule Larder.Cache.Owner do
  @moduledoc false

  use GenServer

  require Logger

  alias Larder.Cache.{Eviction, Expiry, Generation, Invalidations, LocalCopies}
  alias Larder.Cache.{Remote, Repairs, Runtime, Stats, Store}
  alias Larder.Instance

  # Longest wait between two reads of a generation that keep failing.
  @generation_retry_max_ms 5_000
  @generation_retry_min_ms 100
  # While the L2 refuses tracking or the subscription (no L1), the
  # generation is read this often: the subscription may be refused too, so
  # other nodes' invalidate_all/1 may not reach this one.
  @untracked_read_ms 1_000

  # The state: %{rt: %Runtime{} (also published, for callers),
  # subscribed_before, pending (Repairs), reader (Generation's reader of
  # the L2's generation), sweeping (a sweep's slices are under way), verify
  # (true while a :verify_generation message is on its way to us),
  # retry_timer and retry_wait (a failed generation read, read again),
  # untracked (the %Larder.Error{} of an L2 that refuses to report
  # changes, or the subscription, while the L1 is off; nil)}.
  #
  # The owner makes no L2 call of its own (but once at start, for an L2
  # without processes): what needs one runs in another process (the
  # generation's reader, the repairs' worker, the caller of
  # invalidate_all/1) and reports to it. So a slow or stopped Redis never
  # holds up the clears, invalidations and repairs it runs.

  # The name is claimed through Larder.Instance as the process starts; the
  # bare name is then registered too, as the cache's documented address.
  def start_link(opts), do: Instance.start_link(__MODULE__, opts, Larder.Cache, opts[:name])

  @doc """
  The owner's part of `Larder.Cache.invalidate_all/1`, once the caller has
  done the L2's: moves to `generation` (the L2's, as the caller's INCR or
  read gave it) if that is newer, and clears L1 either way; `nil` when
  the caller could not get it; `:local` for a cache without an L2 (the
  next generation). Returns `:ok` once L1 is clear. No L2 call.
  """
  def invalidate_all(rt, generation) do
    GenServer.call(rt.owner, {:invalidate_all, generation}, :infinity)
  catch
    :exit, _ -> Instance.unknown!(Larder.Cache, rt.name)
  end

  @doc """
  Called by the L2 runner once the L2's processes run (at the cache's start,
  before start_link/1 returns, and after each restart): returns once the
  generation was read (by the owner's reader) and adopted, or the read
  failed (the owner reads again later). `restart?` is true after a
  restart, when invalidations may have been missed.
  """
  def l2_started(rt, restart?), do: GenServer.call(rt.owner, {:l2_started, restart?}, :infinity)

  @impl true
  def init(opts) do
    Instance.watch(nil)

    case Instance.address(opts[:name]) do
      :ok -> start(opts)
      {:error, reason} -> {:stop, reason}
    end
  end

  defp start(opts) do
    # The tables are this process's: they live and die with it.
    rt =
      Runtime.new(
        opts,
        Store.new(opts[:compressed])
        |> Map.merge(Repairs.new_inbox())
        |> Map.merge(%{
          stats: Stats.new(),
          clock: Expiry.new_clock(),
          prefix: Remote.prefix(opts[:namespace], opts[:version])
        })
      )

    case Remote.start(rt, opts[:l2]) do
      {:ok, rt} ->
        Expiry.tick(rt)
        Runtime.publish(rt)
        # an L2 with processes is read once they run (l2_started/2); one
        # without, now, before start_link/1 returns
        if rt.l2_child == nil, do: read_now(rt)
        Process.send_after(self(), :sweep, Expiry.sweep_ms())

        state = %{
          rt: rt,
          subscribed_before: false,
          sweeping: false,
          pending: Repairs.new(),
          reader: Generation.new_reader(),
          verify: false,
          untracked: nil,
          retry_timer: nil,
          retry_wait: @generation_retry_min_ms
        }

        {:ok, state}

      {:error, error} ->
        {:stop, error}
    end
  end

  @impl true
  def handle_call({:l2_started, restart?}, from, %{rt: rt} = state) do
    # answered once the read is done (Generation.reported/4)
    reader = Generation.sync(state.reader, rt, from)
    {:noreply, %{state | reader: reader, subscribed_before: state.subscribed_before or restart?}}
  end

  def handle_call({:invalidate_all, :local}, _from, %{rt: rt} = state) do
    if Generation.next_local(rt) == :same, do: Store.clear(rt)
    {:reply, :ok, state}
  end

  def handle_call({:invalidate_all, generation}, _from, %{rt: rt} = state) do
    # a move clears L1; a generation we had moved to already still clears it
    unless is_integer(generation) and Generation.adopt(rt, generation) == :moved,
      do: Store.clear(rt)

    {:reply, :ok, state}
  end

  @impl true
  def handle_info({:larder_cache_l2, :message, payload}, %{rt: rt} = state) do
    case Invalidations.message(rt, payload) do
      # a hint: the generation moves only to what the L2 holds
      {:all, generation} -> {:noreply, verify_soon(state, generation)}
      _applied_or_ignored -> {:noreply, state}
    end
  end

  def handle_info({:larder_cache_l2, :invalidated, keys}, %{rt: rt} = state) do
    Invalidations.tracked(rt, keys)
    {:noreply, state}
  end

  def handle_info(:verify_generation, state),
    do: {:noreply, %{sync(state) | verify: false}}

  # The reader read (or advanced) the generation, or died doing so.
  def handle_info(
        {:larder_cache_generation, pid, how, result},
        %{reader: %{worker: {pid, _}}} = state
      ),
      do: {:noreply, generation_read(state, how, result)}

  def handle_info({:DOWN, ref, :process, pid, _reason}, %{reader: %{worker: {pid, ref}}} = state),
    do: {:noreply, generation_read(state, :read, :died)}

  # A generation read or renewal failed: read again after 100 ms, doubling
  # up to 5 s while the L2 keeps failing, since no other hint may come (a
  # peer's message heard while our commands could not reach Redis yet,
  # after a restart).
  def handle_info(:generation_failed, %{retry_timer: nil} = state) do
    timer = Process.send_after(self(), :retry_generation, state.retry_wait)
    wait = min(state.retry_wait * 2, @generation_retry_max_ms)
    {:noreply, %{state | retry_timer: timer, retry_wait: wait}}
  end

  def handle_info(:generation_failed, state), do: {:noreply, state}

  def handle_info(:retry_generation, state),
    do: {:noreply, sync(%{state | retry_timer: nil})}

  # The L2 moved to another server that may hold values older than the
  # ones acknowledged (a Sentinel failover): L1 goes now, and a new
  # generation there (Generation.advance/1, run by the reader).
  def handle_info({:larder_cache_l2, :replaced}, %{rt: rt} = state) do
    Store.clear(rt)
    {:noreply, %{state | reader: Generation.sync(state.reader, rt, nil, :advance)}}
  end

  # The L2 says that Redis refuses to report changes (with invalidation:
  # :tracking, an ACL without CLIENT TRACKING, a server that lacks it) or
  # to deliver the other nodes' invalidations (an ACL without the channel
  # or SUBSCRIBE): what L1 holds would never be invalidated, so it holds
  # nothing until the L2 says it reports again (:connected).
  # (:tracking_refused is the older name of :refused.)
  def handle_info({:larder_cache_l2, why, error}, %{rt: rt} = state)
      when why in [:refused, :tracking_refused] do
    if state.untracked == nil do
      Store.off(rt)
      Remote.tracking_refused(rt, error)

      Logger.error(
        "Larder.Cache #{inspect(rt.name)}: " <>
          message(error) <>
          ". Until Redis allows it again, the cache keeps nothing in its L1: every read " <>
          "goes to Redis or the loader"
      )

      Process.send_after(self(), :untracked_read, @untracked_read_ms)
      {:noreply, %{state | untracked: error}}
    else
      {:noreply, state}
    end
  end

  def handle_info(:untracked_read, %{untracked: nil} = state), do: {:noreply, state}

  def handle_info(:untracked_read, state) do
    Process.send_after(self(), :untracked_read, @untracked_read_ms)
    {:noreply, sync(state)}
  end

  def handle_info({:larder_cache_l2, :disconnected}, %{rt: rt} = state) do
    Invalidations.connection(rt, :disconnected, %{reason: :connection_lost})
    # messages may be missed from now on (or were, before a first
    # subscription): the next subscription clears L1
    {:noreply, %{state | subscribed_before: true}}
  end

  def handle_info({:larder_cache_l2, :connected}, %{rt: rt} = state) do
    Invalidations.connection(rt, :connected, %{})

    # Invalidations published while we were not subscribed (a Redis outage,
    # or Redis down when we started) never reach us, so L1 may hold keys
    # other nodes changed: drop it, and pick up any invalidate_all we
    # missed. The first subscription after a start during which Redis
    # answered everything closes a window of milliseconds; L1 stays.
    missed? = state.subscribed_before or Stats.get(rt, :l2_errors) > 0

    if missed?, do: Store.clear(rt)
    state = tracking_on(state)
    # Redis may also have lost the generation (restarted empty) meanwhile
    state = %{sync(state) | subscribed_before: true}
    {:noreply, %{state | pending: Repairs.now(state.pending, rt)}}
  end

  # Writers recorded failures in the inbox (one wake-up for any number).
  def handle_info(:larder_cache_pending, state) do
    {:noreply, %{state | pending: Repairs.drain(state.pending, state.rt)}}
  end

  def handle_info(:repair, state) do
    {:noreply, %{state | pending: Repairs.retry(state.pending, state.rt)}}
  end

  def handle_info({:larder_cache_repaired, pid, result}, %{pending: %{worker: {pid, _}}} = state) do
    {:noreply, %{state | pending: Repairs.reported(state.pending, state.rt, result)}}
  end

  def handle_info({:DOWN, ref, :process, pid, _reason}, %{pending: %{worker: {pid, ref}}} = state) do
    {:noreply, %{state | pending: Repairs.worker_down(state.pending)}}
  end

  # The sweep goes in slices, each a message to ourselves queued behind
  # whatever arrived meanwhile; the next sweep is due sweep_ms after one ends.
  def handle_info(:sweep, %{sweeping: false} = state),
    do: {:noreply, swept(state, Expiry.sweep(state.rt))}

  def handle_info({:larder_cache_sweep, continuation}, %{sweeping: true} = state),
    do: {:noreply, swept(state, Expiry.sweep(state.rt, continuation))}

  def handle_info({:EXIT, _pid, :normal}, state), do: {:noreply, state}

  def handle_info({:EXIT, pid, reason}, %{rt: rt} = state) do
    # A process an L2 linked to us in init/3 died (our supervisor's exit is
    # handled by GenServer itself): L2 processes belong in its child_spec/1,
    # which the cache's supervisor runs and restarts; this one is reported.
    Logger.warning(
      "Larder.Cache #{inspect(rt.name)}: a process linked by the L2's init/3 " <>
        "(#{inspect(pid)}) exited (#{inspect(reason, limit: 10, printable_limit: 200)})"
    )

    Remote.process_died(rt)
    {:noreply, state}
  end

  def handle_info(_other, state), do: {:noreply, state}

  # The L2 reports changes again (:connected after a refusal): L1 is used
  # again, from empty.
  defp tracking_on(%{untracked: nil} = state), do: state

  defp tracking_on(%{rt: rt} = state) do
    Store.on(rt)
    Logger.info("Larder.Cache #{inspect(rt.name)}: Redis reports changes again; L1 in use")
    %{state | untracked: nil}
  end

  defp message(%Larder.Error{message: message}) when is_binary(message), do: message
  defp message(%Larder.Error{} = error), do: Exception.message(error)
  defp message(other), do: inspect(other, limit: 10, printable_limit: 500)

  # A hint that the L2's generation may have moved: the reader reads it.
  defp sync(state), do: %{state | reader: Generation.sync(state.reader, state.rt)}

  defp generation_read(%{rt: rt} = state, how, result) do
    {reader, outcome} = Generation.reported(state.reader, rt, how, result)
    state = %{state | reader: reader}

    case outcome do
      :ok ->
        %{state | retry_wait: @generation_retry_min_ms}

      :failed ->
        send(self(), :generation_failed)
        state

      :pending ->
        %{state | pending: Repairs.add(state.pending, rt, :all)}
    end
  end

  # At start, for an L2 without processes: the read in the owner itself.
  defp read_now(rt) do
    case Generation.read(rt) do
      {:ok, g, _published?} -> Generation.adopt(rt, g)
      _error -> send(self(), :generation_failed)
    end
  end

  defp swept(state, {:more, continuation}) do
    send(self(), {:larder_cache_sweep, continuation})
    %{state | sweeping: true}
  end

  # The sweep's end: the slots of writers that died mid-write are
  # repaired (the next writer of the slot would, but it may never come),
  # and what a writer that died before evicting left over the limits goes.
  defp swept(%{rt: rt} = state, :done) do
    Store.repair_dead_writers(rt)
    Eviction.evict(rt)
    Process.send_after(self(), :sweep, Expiry.sweep_ms())
    %{state | sweeping: false}
  end

  # A peer's {:all, g}: one check for however many hints are already queued
  # (the :verify_generation message goes behind them), none when g is ours.
  defp verify_soon(%{verify: true} = state, _generation), do: state

  defp verify_soon(%{rt: rt} = state, generation) do
    if generation == Generation.local(rt) do
      state
    else
      send(self(), :verify_generation)
      %{state | verify: true}
    end
  end

  @impl true
  def terminate(_reason, %{rt: rt}) do
    Runtime.withdraw(rt)
    Remote.stop(rt)
    LocalCopies.died(rt)
  end
end
