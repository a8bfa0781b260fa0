# Read-through on an L1 miss: one loader per key at a time (an ETS insert_new
# loading marker), the L2 then the loader function run in the caller, and waiters that
# register in an ETS bag and monitor the loading process instead of queueing
# behind a shared one.
defmodule Larder.Cache.Loader do
  @moduledoc false

  alias Larder.Cache.{Remote, Stats, Store}
  alias Larder.Lock.Waits

  # Set in the process dictionary while the process runs a loader: only
  # then can another process be waiting for it, so only then can a wait of
  # its own close a cycle (Larder.Lock.Waits).
  @in_loader {__MODULE__, :in_loader}

  # {:ok, value} | {:error, %Larder.Error{}} | :none (get/3, nothing found).
  # The hit path is the same as traced/3's, without the source tag.
  def fetch(cfg, key, fun) do
    case Store.lookup(cfg, key) do
      {:hit, value} ->
        Stats.count(cfg, :l1_hits)
        {:ok, value}

      other ->
        elem(missed(cfg, key, fun, other), 1)
    end
  end

  # fetch/3 that also says where the result came from: {source, result},
  # source being :hit, :l2_hit, :load, :waited, :miss or :error.
  def traced(cfg, key, fun) do
    case Store.lookup(cfg, key) do
      {:hit, value} ->
        Stats.count(cfg, :l1_hits)
        {:hit, {:ok, value}}

      other ->
        case missed(cfg, key, fun, other) do
          {_source, {:error, _}} = error -> put_elem(error, 0, :error)
          {_source, :none} = none -> put_elem(none, 0, :miss)
          tagged -> tagged
        end
    end
  end

  defp missed(cfg, key, fun, lookup) do
    # before the loading marker: a key the L2 refuses raises ArgumentError
    Remote.check_key!(cfg, key)
    Stats.count(cfg, :l1_misses)

    try do
      miss(cfg, key, fun, lookup)
    rescue
      e in ArgumentError ->
        if stopped?(cfg), do: {:error, stopped(cfg, key)}, else: reraise(e, __STACKTRACE__)
    end
  end

  # The owner took the tables with it: ETS calls on them raise badarg.
  defp stopped?(cfg), do: :ets.info(cfg.data, :id) == :undefined

  defp stopped(cfg, key) do
    {:error,
     Larder.Error.new(:cache_stopped, "the cache stopped during the call",
       cache: cfg.name,
       key: key
     )}
  end

  defp miss(cfg, key, fun, :miss) do
    ref = make_ref()

    if Store.lock(cfg, key, ref) do
      lead(cfg, key, ref, fun)
    else
      retry(cfg, key, fun)
    end
  end

  defp miss(_cfg, key, _fun, {:loading, pid, _ref}) when pid == self() do
    raise ArgumentError,
          "Larder.Cache.fetch/3 called for key #{inspect(key)} from inside its own loader"
  end

  defp miss(cfg, key, fun, {:loading, pid, ref}), do: wait(cfg, key, fun, pid, ref)

  defp retry(cfg, key, fun) do
    case Store.lookup(cfg, key) do
      {:hit, value} -> {:hit, {:ok, value}}
      other -> miss(cfg, key, fun, other)
    end
  end

  ## The loading process

  # {source, result}
  defp lead(cfg, key, ref, fun) do
    {_source, result} =
      tagged =
      try do
        load(cfg, key, ref, fun)
      catch
        kind, reason ->
          if stopped?(cfg) do
            {:error, stopped(cfg, key)}
          else
            Store.unlock(cfg, key, self(), ref)
            Stats.count(cfg, :load_errors)

            {:error,
             {:error,
              Larder.Error.new(:loader_failed, "the loader raised",
                kind: kind,
                reason: reason,
                key: key
              )}}
          end
      end

    reply_waiters(cfg, ref, result)
    tagged
  end

  defp load(cfg, key, ref, fun) do
    case Remote.get(cfg, key) do
      {:ok, value} ->
        Store.fill(cfg, key, ref, value, cfg.ttl)
        {:l2_hit, {:ok, value}}

      l2_state ->
        {:load, run_loader(cfg, key, ref, fun, l2_state)}
    end
  end

  # get/3 reads through the levels without a loader.
  defp run_loader(cfg, key, ref, nil, _l2_state) do
    Store.unlock(cfg, key, self(), ref)
    :none
  end

  defp run_loader(cfg, key, ref, fun, l2_state) do
    Stats.count(cfg, :loads)

    case call_loader(fun) do
      {:ok, value} when cfg.codec == :raw and not is_binary(value) ->
        Store.unlock(cfg, key, self(), ref)
        Stats.count(cfg, :load_errors)

        {:error,
         Larder.Error.new(
           :loader_failed,
           "the loader must return a binary value (the cache's codec is :raw)",
           returned: {:ok, value},
           key: key
         )}

      {:ok, value} ->
        # Only the load that still holds its lock writes, to L1 then to L2:
        # a put or delete that came in between has the last word.
        # SET NX on a miss, so a concurrent put's SET is never overwritten;
        # a corrupt value is replaced; an unreachable L2 is left alone.
        if Store.fill(cfg, key, ref, value, cfg.ttl) do
          case l2_state do
            :miss -> Remote.put(cfg, key, value, cfg.ttl, :new)
            :corrupt -> Remote.put(cfg, key, value, cfg.ttl, :always)
            _none_or_error -> :ok
          end
        end

        {:ok, value}

      {:error, reason} ->
        Store.unlock(cfg, key, self(), ref)
        Stats.count(cfg, :load_errors)

        {:error,
         Larder.Error.new(:loader_failed, "the loader returned an error", reason: reason, key: key)}

      other ->
        Store.unlock(cfg, key, self(), ref)
        Stats.count(cfg, :load_errors)

        {:error,
         Larder.Error.new(
           :loader_failed,
           "the loader must return {:ok, value} or {:error, reason}",
           returned: other,
           key: key
         )}
    end
  end

  defp call_loader(fun) do
    outer = Process.put(@in_loader, true)

    try do
      fun.()
    after
      if outer == nil, do: Process.delete(@in_loader)
    end
  end

  # Waiters registered themselves under our ref; take them all at once
  # (after the lock row changed) and send each the result.
  defp reply_waiters(cfg, ref, result) do
    for {_ref, pid} <- :ets.take(cfg.waiters, ref) do
      send(pid, {:"$larder_cache_loaded", ref, result})
    end

    :ok
  end

  ## Waiting for another process's load

  # Register, then check that the marker is still there: if it is, the
  # loader has not taken its waiters yet (it changes the marker row first),
  # so the result will come. No message goes to the loading process's
  # mailbox. Waiters also watch the owner: a cache that stops mid-load
  # answers them {:error, :cache_stopped}.
  #
  # A waiter that is itself running a loader could be waited for, so its
  # wait could close a cycle of loaders waiting for each other (in this
  # cache or across caches): once it knows it registered in time, it
  # records its wait in Larder.Lock.Waits (a record that holds while its
  # registration is in the waiters table, i.e. until the loader takes it to
  # answer), and answers {:error, :load_cycle} instead of waiting when the
  # chain of waits comes back to it.
  defp wait(cfg, key, fun, pid, ref) do
    loader = Process.monitor(pid)
    owner = Process.monitor(cfg.owner)
    watched? = Process.get(@in_loader) == true

    outcome =
      try do
        :ets.insert(cfg.waiters, {ref, self()})

        case Store.lookup(cfg, key) do
          {:loading, ^pid, ^ref} ->
            # Registered before the loader took its waiters: our wait is
            # real until it answers, and can be recorded as such.
            if watched? and Waits.wait_for(pid, cfg.waiters, ref) == :cycle do
              if unregister(cfg, ref), do: :cycle, else: await(ref, loader, owner)
            else
              await(ref, loader, owner)
            end

          _changed ->
            # false: the loader took us already, its result is on the way
            if unregister(cfg, ref), do: :retry, else: await(ref, loader, owner)
        end
      after
        if watched?, do: Waits.done()
        Process.demonitor(loader, [:flush])
        Process.demonitor(owner, [:flush])
      end

    case outcome do
      {:done, result} ->
        {:waited, result}

      :retry ->
        retry(cfg, key, fun)

      :loader_down ->
        # The loading process died mid-load (a reply sent before it died
        # would have arrived first): clear its marker and start over.
        unregister(cfg, ref)
        Store.unlock(cfg, key, pid, ref)
        retry(cfg, key, fun)

      :owner_down ->
        {:error, stopped(cfg, key)}

      :cycle ->
        {:error,
         {:error,
          Larder.Error.new(
            :load_cycle,
            "this loader waits for a load that waits, through other loads, for this one",
            cache: cfg.name,
            key: key
          )}}
    end
  end

  defp await(ref, loader, owner) do
    receive do
      # The loading process had no loader (get/3): load ourselves.
      {:"$larder_cache_loaded", ^ref, :none} -> :retry
      {:"$larder_cache_loaded", ^ref, result} -> {:done, result}
      {:DOWN, ^loader, :process, _, _} -> :loader_down
      {:DOWN, ^owner, :process, _, _} -> :owner_down
    end
  end

  defp unregister(cfg, ref) do
    :ets.select_delete(cfg.waiters, [{{ref, self()}, [], [true]}]) == 1
  end
end
