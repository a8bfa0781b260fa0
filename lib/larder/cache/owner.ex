# The process behind a cache: owns its ETS tables and the L2's state (its
# processes run beside it, under the cache's supervisor), is the only writer of the local generation (checked
# against the L2's), applies the invalidations other nodes publish, repairs
# L2 writes whose outcome is unknown, and sweeps expired rows.
defmodule Larder.Cache.Owner do
  @moduledoc false

  use GenServer

  require Logger

  alias Larder.Cache.{Codec, Config, Expiry, LocalCopies, Remote, Stats, Store}
  alias Larder.{Instance, Telemetry}

  # Longest wait between two reads of a generation that keep failing.
  @generation_retry_max_ms 5_000
  # Pending invalidations: retried after 100 ms, doubling while the L2
  # stays away up to 400 ms (so a recovered L2 is noticed within that);
  # more keys than @max_pending_keys degrade to one invalidate-all.
  @repair_min_ms 100
  @repair_max_ms 400
  @max_pending_keys 1_000

  # The state: %{cfg: %Config{} (also in persistent_term, for callers),
  # subscribed_before, pending, sweeping (a sweep's slices are under
  # way), verify (true while a :verify_generation message is on its way to
  # us), retry_timer and retry_wait (a failed generation read, read again)}.

  # The name is claimed through Larder.Instance as the process starts; the
  # bare name is then registered too, as the cache's documented address.
  def start_link(opts), do: Instance.start_link(__MODULE__, opts, Larder.Cache, opts[:name])

  def config_key(name), do: Config.key(name)

  def max_pending_keys, do: @max_pending_keys

  @doc """
  Records that an L2 write of `item` (`{:key, key}` or `:all`) may or may
  not have happened, so that the owner deletes and publishes it once the
  L2 answers again. Asynchronous; never fails.
  """
  def pending(cfg, item) do
    send(cfg.owner, {:larder_cache_pending, item})
    :ok
  end

  @doc """
  The owner's part of `Larder.Cache.invalidate_all/1`, once the caller's
  INCR of the generation key returned (`:incremented`) or failed
  (`{:failed, reason}`, the reason of its `Larder.Error`), or for a
  local-only cache (`:local`). Returns once L1 is clear: `{:ok, generation,
  published?}` (published? when the owner found the L2's generation lost,
  wrote a fresh one and published it) or, when it could not read the L2's
  generation, `{:error, %Larder.Error{}}`.
  """
  def invalidate_all(cfg, how) do
    GenServer.call(cfg.owner, {:invalidate_all, how}, :infinity)
  catch
    :exit, _ -> Instance.unknown!(Larder.Cache, cfg.name)
  end

  @doc """
  Called by the L2 runner once the L2's processes run (at the cache's start,
  before start_link/1 returns, and after each restart): the owner reads the
  generation then. `restart?` is true after a restart, when invalidations
  may have been missed.
  """
  def l2_started(cfg, restart?), do: GenServer.call(cfg.owner, {:l2_started, restart?}, :infinity)

  @impl true
  def init(opts) do
    Instance.watch(nil)

    case Instance.address(opts[:name]) do
      :ok -> start(opts)
      {:error, reason} -> {:stop, reason}
    end
  end

  defp start(opts) do
    case Remote.start(Config.new(opts), opts[:l2]) do
      {:ok, cfg} ->
        Expiry.tick(cfg)
        Instance.publish(Larder.Cache, cfg.name, cfg)
        # an L2 with processes is read once they run (l2_started/2)
        if cfg.l2_child == nil, do: sync_generation(cfg)
        Process.send_after(self(), :sweep, Expiry.sweep_ms())

        state = %{
          cfg: cfg,
          subscribed_before: false,
          sweeping: false,
          pending: %{keys: %{}, all: nil, seq: 0, worker: nil, timer: nil, wait: @repair_min_ms},
          verify: false,
          retry_timer: nil,
          retry_wait: @repair_min_ms
        }

        {:ok, state}

      {:error, error} ->
        {:stop, error}
    end
  end

  @impl true
  def handle_call(:clear_l1, _from, state), do: {:reply, Store.clear(state.cfg), state}

  def handle_call({:l2_started, restart?}, _from, %{cfg: cfg} = state) do
    sync_generation(cfg)
    {:reply, :ok, %{state | subscribed_before: state.subscribed_before or restart?}}
  end

  def handle_call({:invalidate_all, how}, _from, %{cfg: cfg} = state) do
    before = local_generation(cfg)

    reply =
      case how do
        :local -> {:ok, adopt(cfg, min(before + 1, Codec.max_generation())), false}
        :incremented -> sync_generation(cfg)
        # Redis away: nothing to read, the pending repair will do it
        {:failed, :l2_unavailable} -> {:ok, before, false}
        # Redis answered, but not with a generation: check the key
        {:failed, _reason} -> sync_generation(cfg)
      end

    # a move cleared L1 already; a generation we had moved to still clears it
    if local_generation(cfg) == before, do: Store.clear(cfg)
    {:reply, reply, state}
  end

  @impl true
  def handle_info({:larder_cache_l2, :message, payload}, %{cfg: cfg} = state) do
    node_id = cfg.node_id

    case Codec.decode_message(payload, cfg.max_value_bytes) do
      {:ok, ^node_id, _message} ->
        {:noreply, state}

      {:ok, _other_node, {:key, key} = message} ->
        Stats.count(cfg, :invalidations)
        Store.delete(cfg, key)
        received(cfg, message)
        {:noreply, state}

      {:ok, _other_node, {:all, generation} = message} ->
        # a hint: the generation moves only to what the L2 holds
        Stats.count(cfg, :invalidations)
        received(cfg, message)
        {:noreply, verify_soon(state, generation)}

      :error ->
        Stats.count(cfg, :bad_messages)
        {:noreply, state}
    end
  end

  # Redis's own report of changed keys (invalidation: :tracking), from any
  # writer, this node included: untrusted like every message.
  def handle_info({:larder_cache_l2, :invalidated, keys}, %{cfg: cfg} = state) do
    tracked(cfg, keys)
    {:noreply, state}
  end

  def handle_info(:verify_generation, %{cfg: cfg} = state) do
    sync_generation(cfg)
    {:noreply, %{state | verify: false}}
  end

  # A generation read or renewal failed (sync_generation/1 said so): read
  # again after 100 ms, doubling up to 5 s while the L2 keeps failing, since
  # no other hint may come (a peer's message heard while our commands could
  # not reach Redis yet, after a restart).
  def handle_info(:generation_failed, %{retry_timer: nil} = state) do
    timer = Process.send_after(self(), :retry_generation, state.retry_wait)

    {:noreply,
     %{
       state
       | retry_timer: timer,
         retry_wait: min(state.retry_wait * 2, @generation_retry_max_ms)
     }}
  end

  def handle_info(:generation_failed, state), do: {:noreply, state}

  def handle_info(:retry_generation, %{cfg: cfg} = state) do
    state = %{state | retry_timer: nil}

    case sync_generation(cfg) do
      {:ok, _g, _published?} -> {:noreply, %{state | retry_wait: @repair_min_ms}}
      _failed_and_rescheduled -> {:noreply, state}
    end
  end

  def handle_info({:larder_cache_l2, :disconnected}, %{cfg: cfg} = state) do
    connection(cfg, :disconnected, %{reason: :connection_lost})
    # messages may be missed from now on (or were, before a first
    # subscription): the next subscription clears L1
    {:noreply, %{state | subscribed_before: true}}
  end

  def handle_info({:larder_cache_l2, :connected}, %{cfg: cfg} = state) do
    connection(cfg, :connected, %{})

    # Invalidations published while we were not subscribed (a Redis outage,
    # or Redis down when we started) never reach us, so L1 may hold keys
    # other nodes changed: drop it, and pick up any invalidate_all we
    # missed. The first subscription after a start during which Redis
    # answered everything closes a window of milliseconds; L1 stays.
    missed? = state.subscribed_before or Stats.get(cfg, :l2_errors) > 0

    if missed?, do: Store.clear(cfg)
    # Redis may also have lost the generation (restarted empty) meanwhile
    sync_generation(cfg)
    state = %{state | subscribed_before: true}
    {:noreply, repair(state)}
  end

  def handle_info({:larder_cache_pending, item}, state) when item == :all or is_tuple(item) do
    {:noreply, state |> add_pending(item) |> repair()}
  end

  def handle_info(:repair, state) do
    {:noreply, repair(put_in(state.pending.timer, nil))}
  end

  def handle_info({:larder_cache_repaired, pid, result}, %{pending: %{worker: {pid, _}}} = state) do
    {:noreply, repaired(state, result)}
  end

  def handle_info({:DOWN, ref, :process, pid, _reason}, %{pending: %{worker: {pid, ref}}} = state) do
    # the worker died before reporting: try again later
    {:noreply, schedule_repair(put_in(state.pending.worker, nil))}
  end

  # The sweep goes in slices, each a message to ourselves queued behind
  # whatever arrived meanwhile; the next sweep is due sweep_ms after one ends.
  def handle_info(:sweep, %{sweeping: false} = state),
    do: {:noreply, swept(state, Expiry.sweep(state.cfg))}

  def handle_info({:larder_cache_sweep, continuation}, %{sweeping: true} = state),
    do: {:noreply, swept(state, Expiry.sweep(state.cfg, continuation))}

  def handle_info({:EXIT, _pid, :normal}, state), do: {:noreply, state}

  def handle_info({:EXIT, pid, reason}, %{cfg: cfg} = state) do
    # A process an L2 linked to us in init/3 died (our supervisor's exit is
    # handled by GenServer itself): L2 processes belong in its child_spec/1,
    # which the cache's supervisor runs and restarts; this one is reported.
    Logger.warning(
      "Larder.Cache #{inspect(cfg.name)}: a process linked by the L2's init/3 " <>
        "(#{inspect(pid)}) exited (#{inspect(reason, limit: 10, printable_limit: 200)})"
    )

    Remote.process_died(cfg)
    {:noreply, state}
  end

  def handle_info(_other, state), do: {:noreply, state}

  defp swept(state, {:more, continuation}) do
    send(self(), {:larder_cache_sweep, continuation})
    %{state | sweeping: true}
  end

  defp swept(state, :done) do
    Process.send_after(self(), :sweep, Expiry.sweep_ms())
    %{state | sweeping: false}
  end

  # FLUSHDB or FLUSHALL: nothing L1 holds is in Redis any more.
  defp tracked(cfg, :all) do
    Stats.count(cfg, :invalidations)
    Store.clear(cfg)
    received(cfg, :flush)
  end

  defp tracked(cfg, keys) when is_list(keys) do
    bad? =
      Enum.reduce(keys, false, fn l2_key, bad? ->
        case is_binary(l2_key) && Remote.tracked_key(cfg, l2_key) do
          {:ok, key} ->
            Stats.count(cfg, :invalidations)
            Store.delete(cfg, key)
            received(cfg, {:key, key})
            bad?

          :other ->
            bad?

          _bad ->
            true
        end
      end)

    if bad?, do: Stats.count(cfg, :bad_messages)
    :ok
  end

  defp tracked(cfg, _bad), do: Stats.count(cfg, :bad_messages)

  defp received(cfg, message) do
    Telemetry.execute(cfg.telemetry, [:larder, :cache, :invalidation, :received], %{count: 1}, %{
      cache: cfg.name,
      message: message
    })
  end

  defp connection(cfg, event, meta) do
    Telemetry.execute(
      cfg.telemetry,
      [:larder, :cache, :l2, event],
      %{system_time: System.system_time()},
      Map.put(meta, :cache, cfg.name)
    )
  end

  @impl true
  def terminate(_reason, %{cfg: cfg}) do
    Instance.release(Larder.Cache, cfg.name, cfg, self())
    Remote.stop(cfg)
    LocalCopies.died(cfg)
  end

  ## The generation
  #
  # The L2's generation key is the truth, and this process is the only
  # writer of the local copy (the atomic every L2 key is built from), so
  # checks and moves never interleave. A hint that the generation may have
  # changed (a peer's {:all, g}, this node's INCR, a (re)subscription, the
  # start, a repaired invalidate-all) makes it GET the key and adopt what
  # the L2 holds; a GET returns a value at least as new as any INCR already
  # published, so a delayed older message cannot pull a node back. A key
  # that is missing, not a generation, or below the local value means the
  # L2 lost it (FLUSHALL, a restart with no data, another program): the
  # node writes a fresh generation above every one it has used, max(local
  # + 1, the system time in ms), with SET NX if the key was missing (so
  # nodes that find it missing together agree), reads it back, adopts it and
  # publishes it so that the other nodes check too. Going back to a lower
  # value instead would reach generations whose L2 keys were written before
  # the loss. Every move clears L1, whose rows belong to the old generation.
  # An L2 error leaves the local value (counted) and the read is tried again
  # after a backoff (or at the next hint, whichever comes first).

  # {:ok, generation, published?} or {:error, %Larder.Error{}}.
  defp sync_generation(%{l2: nil} = cfg), do: {:ok, local_generation(cfg), false}

  defp sync_generation(cfg) do
    local = local_generation(cfg)

    case Remote.read_generation(cfg) do
      {:ok, g} when g >= local -> {:ok, adopt(cfg, g), false}
      {:ok, _lower} -> renew(cfg, local, :always, 2)
      :none -> renew(cfg, local, :new, 2)
      :bad -> renew(cfg, local, :always, 2)
      error -> l2_error(error)
    end
    |> retry_on_error()
  end

  defp retry_on_error({:ok, _g, _published?} = ok), do: ok

  defp retry_on_error(error) do
    send(self(), :generation_failed)
    error
  end

  defp renew(cfg, local, mode, attempts) do
    fresh = min(max(local + 1, System.os_time(:millisecond)), Codec.max_generation())

    with :ok <- Remote.write_generation(cfg, fresh, mode),
         {:ok, g} when g >= local <- Remote.read_generation(cfg) do
      adopt(cfg, g)

      # the other nodes check too; if they cannot hear it now, the pending
      # invalidate-all makes them (an INCR and a publish, once the L2 answers)
      if Remote.publish(cfg, {:all, g}) != :ok, do: send(self(), {:larder_cache_pending, :all})
      {:ok, g, true}
    else
      # another node wrote a lower value, or removed it again, meanwhile
      {:ok, _lower} when attempts > 1 -> renew(cfg, local, :always, attempts - 1)
      :none when attempts > 1 -> renew(cfg, local, :new, attempts - 1)
      :bad when attempts > 1 -> renew(cfg, local, :always, attempts - 1)
      {:error, %Larder.Error{}} = error -> error
      other -> l2_error(other)
    end
  end

  defp l2_error({:error, %Larder.Error{}} = error), do: error

  defp l2_error(other) do
    {:error,
     Larder.Error.new(:l2_failed, "the L2 generation could not be read or renewed", got: other)}
  end

  defp adopt(cfg, generation) do
    if generation != local_generation(cfg) do
      :atomics.put(cfg.generation, 1, generation)
      Store.clear(cfg)
    end

    generation
  end

  defp local_generation(cfg), do: :atomics.get(cfg.generation, 1)

  # A peer's {:all, g}: one check for however many hints are already queued
  # (the :verify_generation message goes behind them), none when g is ours.
  defp verify_soon(%{verify: true} = state, _generation), do: state

  defp verify_soon(%{cfg: cfg} = state, generation) do
    if generation == local_generation(cfg) do
      state
    else
      send(self(), :verify_generation)
      %{state | verify: true}
    end
  end

  ## Pending invalidations
  #
  # A put/4, delete/2 or invalidate_all/1 whose L2 write failed (a timeout
  # or a dropped connection: it may still land) leaves other nodes serving
  # what they hold. The caller records the key (or :all) here, and a worker
  # process repairs it once the L2 answers: for a key, DEL then PUBLISH; for
  # :all, INCR the generation then PUBLISH it. Each item carries the sequence
  # number of its latest failure, so a failure recorded while a repair is
  # running is not lost when that repair reports.

  defp add_pending(%{pending: p} = state, item) do
    seq = p.seq + 1

    p =
      case item do
        :all ->
          %{p | all: seq, keys: %{}, seq: seq}

        {:key, _key} when p.all != nil ->
          # an invalidate-all is pending: it covers every key
          %{p | seq: seq}

        {:key, key} when map_size(p.keys) >= @max_pending_keys ->
          if Map.has_key?(p.keys, key),
            do: %{p | keys: Map.put(p.keys, key, seq), seq: seq},
            else: %{p | all: seq, keys: %{}, seq: seq}

        {:key, key} ->
          %{p | keys: Map.put(p.keys, key, seq), seq: seq}

        _other ->
          p
      end

    %{state | pending: p}
  end

  defp repair(%{pending: %{worker: nil, keys: keys, all: all}, cfg: %{l2: {_, _}} = cfg} = state)
       when all != nil or map_size(keys) > 0 do
    %{pending: p} = state
    snapshot = %{all: all, keys: Map.to_list(keys)}
    owner = self()
    {pid, ref} = spawn_monitor(fn -> send(owner, run_repair(cfg, snapshot)) end)
    %{state | pending: %{p | worker: {pid, ref}}}
  end

  defp repair(state), do: state

  defp schedule_repair(%{pending: %{timer: nil} = p} = state) do
    if p.all != nil or map_size(p.keys) > 0 do
      timer = Process.send_after(self(), :repair, p.wait)
      %{state | pending: %{p | timer: timer, wait: min(p.wait * 2, @repair_max_ms)}}
    else
      state
    end
  end

  defp schedule_repair(state), do: state

  # Runs in the worker: stops at the first failure (the L2 is still away).
  defp run_repair(cfg, %{all: all, keys: keys}) do
    all_result =
      case all do
        nil ->
          :none

        seq ->
          case Remote.repair_all(cfg) do
            {:done, g} -> {:done, seq, g}
            {:failed, reason} -> {:failed, seq, reason}
            other -> other
          end
      end

    done =
      if all_result in [:none] or match?({:done, _, _}, all_result) do
        Enum.reduce_while(keys, [], fn {key, seq}, done ->
          if Remote.repair_key(cfg, key),
            do: {:cont, [{key, seq} | done]},
            else: {:halt, done}
        end)
      else
        []
      end

    {:larder_cache_repaired, self(), %{all: all_result, keys: done}}
  end

  defp repaired(%{pending: p, cfg: cfg} = state, %{all: all_result, keys: done}) do
    {_pid, ref} = p.worker
    Process.demonitor(ref, [:flush])

    all =
      case all_result do
        {:done, seq, _g} ->
          sync_generation(cfg)
          if p.all == seq, do: nil, else: p.all

        {:generation, _g} ->
          sync_generation(cfg)
          p.all

        {:failed, seq, reason} when reason != :l2_unavailable ->
          # Redis refused the INCR (a key that holds no generation): a
          # renewed generation, published, does what the repair was for
          case sync_generation(cfg) do
            {:ok, _g, true} when p.all == seq -> nil
            _other -> p.all
          end

        _ ->
          p.all
      end

    keys =
      Enum.reduce(done, p.keys, fn {key, seq}, keys ->
        if Map.get(keys, key) == seq, do: Map.delete(keys, key), else: keys
      end)

    # a generation that moved clears L1 here; L1 was cleared at the call too
    # progress (or nothing left) resets the backoff
    wait = if done != [] or match?({:done, _, _}, all_result), do: @repair_min_ms, else: p.wait

    schedule_repair(%{state | pending: %{p | all: all, keys: keys, worker: nil, wait: wait}})
  end
end
