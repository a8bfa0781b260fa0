# The process behind a cache: owns its ETS tables, starts the L2 (and starts
# it again if it dies), applies the invalidations other nodes publish,
# repairs L2 writes whose outcome is unknown, and sweeps expired rows.
defmodule Larder.Cache.Owner do
  @moduledoc false

  use GenServer

  require Logger

  alias Larder.Cache.{Codec, Store}

  @sweep_ms 5_000
  # L2 restart backoff after one of its processes died: doubles up to the max.
  @l2_restart_min_ms 100
  @l2_restart_max_ms 5_000
  # Pending invalidations: retried after 100 ms, doubling while the L2
  # stays away up to 400 ms (so a recovered L2 is noticed within that);
  # more keys than @max_pending_keys degrade to one invalidate-all.
  @repair_min_ms 100
  @repair_max_ms 400
  @max_pending_keys 1_000

  # Keys of the owner's state that are not part of the config callers read
  # from persistent_term.
  @runtime_keys [:subscribed_before, :l2_backoff, :l2_spec, :l2_restart, :pending]

  def start_link(opts), do: GenServer.start_link(__MODULE__, opts, name: opts[:name])

  def config_key(name), do: {Larder.Cache, name}

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

  @impl true
  def init(opts) do
    Process.flag(:trap_exit, true)
    name = opts[:name]

    # read_concurrency without write_concurrency: adding write_concurrency
    # measurably slowed every lookup, and a cache is read-heavy.
    table_opts =
      [:set, :public, read_concurrency: true] ++
        if(opts[:compressed], do: [:compressed], else: [])

    data = :ets.new(:larder_cache, table_opts)

    index = :ets.new(:larder_cache_index, [:ordered_set, :public, write_concurrency: true])

    large = :ets.new(:larder_cache_large, table_opts)

    waiters = :ets.new(:larder_cache_waiters, [:duplicate_bag, :public, write_concurrency: true])

    cfg = %{
      name: name,
      owner: self(),
      data: data,
      index: index,
      large: large,
      waiters: waiters,
      meta: Store.new_meta(),
      lock: Store.new_lock(),
      local_copy_max_bytes: opts[:local_copy_max_bytes],
      stats: Store.new_counters(),
      seq: :atomics.new(1, signed: true),
      generation: :atomics.new(1, signed: true),
      clock: :atomics.new(1, signed: true),
      node_id: :crypto.strong_rand_bytes(16),
      prefix: Codec.prefix(opts[:namespace], opts[:version]),
      ttl: opts[:ttl],
      max_entries: opts[:max_entries],
      max_bytes: opts[:max_bytes],
      compression_level: opts[:compression_level],
      local_copy_min_bytes: opts[:local_copy_min_bytes],
      max_value_bytes: opts[:max_value_bytes],
      l2: nil
    }

    case start_l2(cfg, opts[:l2]) do
      {:ok, cfg} ->
        Store.tick(cfg)
        :persistent_term.put(config_key(name), cfg)
        read_generation(cfg)
        Process.send_after(self(), :sweep, @sweep_ms)
        Process.send_after(self(), :tick, Store.tick_ms())

        state =
          Map.merge(cfg, %{
            subscribed_before: false,
            l2_backoff: @l2_restart_min_ms,
            l2_spec: opts[:l2],
            l2_restart: nil,
            pending: %{keys: %{}, all: nil, seq: 0, worker: nil, timer: nil, wait: @repair_min_ms}
          })

        {:ok, state}

      {:error, error} ->
        {:stop, error}
    end
  end

  defp start_l2(cfg, nil), do: {:ok, cfg}

  defp start_l2(cfg, {mod, l2_opts}) do
    case mod.init(l2_opts, self(), Codec.channel(cfg)) do
      {:ok, state} ->
        {:ok, %{cfg | l2: {mod, state}}}

      other ->
        {:error, Larder.Error.new(:l2_failed, "the L2 did not start", returned: other)}
    end
  catch
    kind, reason ->
      {:error, Larder.Error.new(:l2_failed, "the L2 did not start", kind: kind, reason: reason)}
  end

  @impl true
  def handle_call(:clear_l1, _from, cfg), do: {:reply, Store.clear(cfg), cfg}

  @impl true
  def handle_info({:larder_cache_l2, :message, payload}, cfg) do
    node_id = cfg.node_id

    case Codec.decode_message(payload, cfg.max_value_bytes) do
      {:ok, ^node_id, _message} ->
        :ok

      {:ok, _other_node, {:key, key}} ->
        Store.count(cfg, :invalidations)
        Store.delete(cfg, key)

      {:ok, _other_node, {:all, generation}} ->
        Store.count(cfg, :invalidations)
        set_generation(cfg, generation)

      :error ->
        Store.count(cfg, :bad_messages)
    end

    {:noreply, cfg}
  end

  def handle_info({:larder_cache_l2, :connected}, cfg) do
    # Invalidations published while we were not subscribed (a Redis outage,
    # or Redis down when we started) never reach us, so L1 may hold keys
    # other nodes changed: drop it, and pick up any invalidate_all we
    # missed. The first subscription after a start during which Redis
    # answered everything closes a window of milliseconds; L1 stays.
    missed? = cfg.subscribed_before or :counters.get(cfg.stats, Store.stat_index(:l2_errors)) > 0

    if missed?, do: Store.clear(cfg)
    read_generation(cfg)
    cfg = %{cfg | subscribed_before: true}
    {:noreply, repair(cfg)}
  end

  def handle_info({:larder_cache_pending, item}, cfg) when item == :all or is_tuple(item) do
    {:noreply, cfg |> add_pending(item) |> repair()}
  end

  def handle_info(:repair, cfg) do
    {:noreply, repair(put_in(cfg.pending.timer, nil))}
  end

  def handle_info({:larder_cache_repaired, pid, result}, %{pending: %{worker: {pid, _}}} = cfg) do
    {:noreply, repaired(cfg, result)}
  end

  def handle_info({:DOWN, ref, :process, pid, _reason}, %{pending: %{worker: {pid, ref}}} = cfg) do
    # the worker died before reporting: try again later
    {:noreply, schedule_repair(put_in(cfg.pending.worker, nil))}
  end

  def handle_info(:tick, cfg) do
    Store.tick(cfg)
    Process.send_after(self(), :tick, Store.tick_ms())
    {:noreply, cfg}
  end

  def handle_info(:sweep, cfg) do
    Store.sweep(cfg)
    Process.send_after(self(), :sweep, @sweep_ms)
    {:noreply, cfg}
  end

  def handle_info(:restart_l2, cfg), do: {:noreply, restart_l2(%{cfg | l2_restart: nil})}

  def handle_info({:EXIT, _pid, :normal}, cfg), do: {:noreply, cfg}

  def handle_info({:EXIT, pid, reason}, cfg) do
    # A process the L2 linked to us died (our supervisor's exit is handled
    # by GenServer itself). L1 keeps serving; the L2 is stopped and started
    # again after a backoff, its calls failing with an error meanwhile.
    Logger.warning(
      "Larder.Cache #{inspect(cfg.name)}: L2 process #{inspect(pid)} exited " <>
        "(#{inspect(reason, limit: 10, printable_limit: 200)}); restarting the L2"
    )

    Store.count(cfg, :l2_errors)

    if cfg.l2_restart == nil do
      # one restart for however many of its processes went down
      stop_l2(cfg)
      Process.send_after(self(), :restart_l2, cfg.l2_backoff)
      {:noreply, %{cfg | l2_restart: :scheduled}}
    else
      {:noreply, cfg}
    end
  end

  def handle_info(_other, cfg), do: {:noreply, cfg}

  @impl true
  def terminate(_reason, cfg) do
    :persistent_term.erase(config_key(cfg.name))
    stop_l2(cfg)
  end

  defp stop_l2(%{l2: {mod, state}}) do
    mod.stop(state)
  catch
    _, _ -> :ok
  end

  defp stop_l2(_cfg), do: :ok

  defp restart_l2(cfg) do
    case start_l2(cfg, cfg.l2_spec) do
      {:ok, cfg} ->
        :persistent_term.put(config_key(cfg.name), Map.drop(cfg, @runtime_keys))
        read_generation(cfg)
        %{cfg | l2_backoff: @l2_restart_min_ms, subscribed_before: true}

      {:error, error} ->
        Logger.warning("Larder.Cache #{inspect(cfg.name)}: #{Exception.message(error)}")
        backoff = min(cfg.l2_backoff * 2, @l2_restart_max_ms)
        Process.send_after(self(), :restart_l2, backoff)
        %{cfg | l2_backoff: backoff, l2_restart: :scheduled}
    end
  end

  defp read_generation(%{l2: nil}), do: :ok

  defp read_generation(%{l2: {mod, state}} = cfg) do
    case mod.get(state, Codec.generation_key(cfg)) do
      {:ok, bin} ->
        case Codec.parse_generation(bin) do
          {:ok, generation} -> set_generation(cfg, generation)
          :error -> Store.count(cfg, :decode_errors)
        end

      :miss ->
        :ok

      _error ->
        Store.count(cfg, :l2_errors)
    end
  end

  # Generations only move forward; moving clears L1, whose rows belong to
  # the old one. Values outside 0..max_generation are ignored (callers
  # check them first; this is the last guard before the atomic).
  def set_generation(cfg, generation)
      when is_integer(generation) and generation >= 0 do
    if generation <= Codec.max_generation() and generation > :atomics.get(cfg.generation, 1) do
      :atomics.put(cfg.generation, 1, generation)
      Store.clear(cfg)
    end

    :ok
  end

  def set_generation(_cfg, _generation), do: :ok

  ## Pending invalidations
  #
  # A put/4, delete/2 or invalidate_all/1 whose L2 write failed (a timeout
  # or a dropped connection: it may still land) leaves other nodes serving
  # what they hold. The caller records the key (or :all) here, and a worker
  # process repairs it once the L2 answers: for a key, DEL then PUBLISH; for
  # :all, INCR the generation then PUBLISH it. Each item carries the sequence
  # number of its latest failure, so a failure recorded while a repair is
  # running is not lost when that repair reports.

  defp add_pending(%{pending: p} = cfg, item) do
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

    %{cfg | pending: p}
  end

  defp repair(%{pending: %{worker: nil, keys: keys, all: all}, l2: {_, _}} = cfg)
       when all != nil or map_size(keys) > 0 do
    %{pending: p} = cfg
    snapshot = %{all: all, keys: Map.to_list(keys)}
    owner = self()
    worker_cfg = Map.drop(cfg, @runtime_keys)
    {pid, ref} = spawn_monitor(fn -> send(owner, run_repair(worker_cfg, snapshot)) end)
    %{cfg | pending: %{p | worker: {pid, ref}}}
  end

  defp repair(cfg), do: cfg

  defp schedule_repair(%{pending: %{timer: nil} = p} = cfg) do
    if p.all != nil or map_size(p.keys) > 0 do
      timer = Process.send_after(self(), :repair, p.wait)
      %{cfg | pending: %{p | timer: timer, wait: min(p.wait * 2, @repair_max_ms)}}
    else
      cfg
    end
  end

  defp schedule_repair(cfg), do: cfg

  # Runs in the worker: stops at the first failure (the L2 is still away).
  defp run_repair(%{l2: {mod, state}} = cfg, %{all: all, keys: keys}) do
    channel = Codec.channel(cfg)

    publish = fn message ->
      mod.publish(state, channel, Codec.encode_message(cfg.node_id, message))
    end

    all_result =
      case all do
        nil ->
          :none

        seq ->
          with {:ok, g} <- mod.incr(state, Codec.generation_key(cfg)),
               {:ok, g} <- Codec.parse_generation(g) do
            if publish.({:all, g}) == :ok, do: {:done, seq, g}, else: {:generation, g}
          else
            _ -> :failed
          end
      end

    done =
      if all_result in [:none] or match?({:done, _, _}, all_result) do
        Enum.reduce_while(keys, [], fn {key, seq}, done ->
          with :ok <- mod.delete(state, Codec.l2_key(cfg, key)),
               :ok <- publish.({:key, key}) do
            {:cont, [{key, seq} | done]}
          else
            _ -> {:halt, done}
          end
        end)
      else
        []
      end

    {:larder_cache_repaired, self(), %{all: all_result, keys: done}}
  end

  defp repaired(%{pending: p} = cfg, %{all: all_result, keys: done}) do
    {_pid, ref} = p.worker
    Process.demonitor(ref, [:flush])

    all =
      case all_result do
        {:done, seq, g} ->
          set_generation(cfg, g)
          if p.all == seq, do: nil, else: p.all

        {:generation, g} ->
          set_generation(cfg, g)
          p.all

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

    schedule_repair(%{cfg | pending: %{p | all: all, keys: keys, worker: nil, wait: wait}})
  end
end
