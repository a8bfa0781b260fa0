# The process behind a cache: owns its ETS tables, starts the L2, applies the
# invalidations other nodes publish, and sweeps expired rows.
defmodule Larder.Cache.Owner do
  @moduledoc false

  use GenServer

  require Logger

  alias Larder.Cache.{Codec, Store}

  @sweep_ms 5_000

  def start_link(opts), do: GenServer.start_link(__MODULE__, opts, name: opts[:name])

  def config_key(name), do: {Larder.Cache, name}

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
      l2: nil
    }

    cfg =
      case opts[:l2] do
        nil ->
          cfg

        {mod, l2_opts} ->
          {:ok, state} = mod.init(l2_opts, self(), Codec.channel(cfg))
          %{cfg | l2: {mod, state}}
      end

    Store.tick(cfg)
    :persistent_term.put(config_key(name), cfg)
    read_generation(cfg)
    Process.send_after(self(), :sweep, @sweep_ms)
    Process.send_after(self(), :tick, Store.tick_ms())
    {:ok, cfg}
  end

  @impl true
  def handle_call(:clear_l1, _from, cfg), do: {:reply, Store.clear(cfg), cfg}

  @impl true
  def handle_info({:larder_cache_l2, :message, payload}, cfg) do
    node_id = cfg.node_id

    case Codec.decode_message(payload) do
      {:ok, ^node_id, _message} ->
        :ok

      {:ok, _other_node, {:key, key}} ->
        Store.count(cfg, :invalidations)
        Store.delete(cfg, key)

      {:ok, _other_node, {:all, generation}} ->
        Store.count(cfg, :invalidations)
        set_generation(cfg, generation)

      :error ->
        Store.count(cfg, :decode_errors)
    end

    {:noreply, cfg}
  end

  def handle_info({:larder_cache_l2, :connected}, cfg) do
    # Invalidations published while we were not subscribed (a Redis outage,
    # or Redis down when we started) never reach us, so L1 may hold keys
    # other nodes changed: drop it, and pick up any invalidate_all we
    # missed. The first subscription after a start during which Redis
    # answered everything closes a window of milliseconds; L1 stays.
    missed? =
      Map.get(cfg, :subscribed_before, false) or
        :counters.get(cfg.stats, Store.stat_index(:l2_errors)) > 0

    if missed?, do: Store.clear(cfg)
    read_generation(cfg)
    {:noreply, Map.put(cfg, :subscribed_before, true)}
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

  def handle_info({:EXIT, _pid, reason}, cfg) do
    # Something the L2 linked to us died: stop, and let our supervisor start
    # a fresh cache (the L2 clients reconnect on their own, so this is rare).
    {:stop, reason, cfg}
  end

  def handle_info(_other, cfg), do: {:noreply, cfg}

  @impl true
  def terminate(_reason, cfg) do
    :persistent_term.erase(config_key(cfg.name))

    case cfg.l2 do
      {mod, state} -> mod.stop(state)
      nil -> :ok
    end
  end

  defp read_generation(%{l2: nil}), do: :ok

  defp read_generation(%{l2: {mod, state}} = cfg) do
    case mod.get(state, Codec.generation_key(cfg)) do
      {:ok, bin} ->
        case Integer.parse(bin) do
          {generation, ""} -> set_generation(cfg, generation)
          _ -> Store.count(cfg, :decode_errors)
        end

      :miss ->
        :ok

      {:error, _} ->
        Store.count(cfg, :l2_errors)
    end
  end

  # Generations only move forward; moving clears L1, whose rows belong to
  # the old one.
  def set_generation(cfg, generation) do
    if generation > :atomics.get(cfg.generation, 1) do
      :atomics.put(cfg.generation, 1, generation)
      Store.clear(cfg)
    end

    :ok
  end
end
