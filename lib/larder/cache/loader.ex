# The read action (fetch/3 and get/3): an L1 hit (the Store's row, checked
# against the expiry clock, a large value from the reading process's own
# copy), then read-through on a miss: one loader per key at a time (an ETS
# insert_new loading marker), the L2 then the loader function run in the
# caller, and waiters that register in an ETS bag and monitor the loading
# process instead of queueing behind a shared one.
defmodule Larder.Cache.Loader do
  @moduledoc false

  alias Larder.Cache.{Eviction, Expiry, LocalCopies, Remote, Runtime, Stats, Store}
  alias Larder.Instance
  alias Larder.Lock.Waits
  alias Larder.Telemetry

  # Set in the process dictionary while the process runs a loader: only
  # then can another process be waiting for it, so only then can a wait of
  # its own close a cycle (Larder.Lock.Waits).
  @in_loader {__MODULE__, :in_loader}

  @l1_hits Stats.index(:l1_hits)

  # {:ok, value} | {:error, %Larder.Error{}} | :none (get/3: fun is nil,
  # and nothing was found), inside a [:larder, :cache, :fetch] span unless
  # the cache's telemetry is off.
  #
  # Without telemetry, a small value's hit is this clause alone: one key
  # of the handle matched (its hit tuple: the data table, the clock, the
  # counters; see Larder.Cache.Runtime), one ETS lookup matched against the
  # Store's small value row ({key, version, expires_at, size, value}, see
  # Larder.Cache.Store), the clock's atomic read only for a row with an
  # expiry time (Expiry.live?/2, written out), one counter, and no tuple
  # but the result. Every other row (a large value, a loading marker, an
  # expired or absent row) goes the general way, fetch/3, which looks
  # again. The general way costs a hit four calls, two tuples and four
  # reads of the handle's fields more (bench/cache_bench.exs compares the
  # hit with a raw ETS lookup). Larder.Cache.fetch/3 and get/3 call this
  # with no frame of their own around it.
  #
  # A read on a cache that went away meanwhile (its tables with it) raises
  # the unknown-cache ArgumentError, never ETS's bare badarg; any other
  # ArgumentError (a key the L2 refuses) goes through as it is.
  def read(%{hit: {data, clock, stats}} = rt, key, fun) do
    case :ets.lookup(data, key) do
      [{_, _, :infinity, size, value}] when is_integer(size) ->
        :counters.add(stats, @l1_hits, 1)
        {:ok, value}

      [{_, _, expires, size, value}] when is_integer(size) and is_integer(expires) ->
        if expires > :atomics.get(clock, 1) do
          :counters.add(stats, @l1_hits, 1)
          {:ok, value}
        else
          fetch(rt, key, fun)
        end

      _other ->
        fetch(rt, key, fun)
    end
  rescue
    e in ArgumentError -> stopped(rt, e, __STACKTRACE__, key, fun)
  end

  def read(rt, key, fun) do
    meta = %{cache: rt.name, key: key}

    Telemetry.span(true, [:larder, :cache, :fetch], meta, fn ->
      {source, result} = traced(rt, key, fun)
      {result, outcome(meta, source, result)}
    end)
  rescue
    e in ArgumentError -> stopped(rt, e, __STACKTRACE__, key, fun)
  end

  # A read whose cache stopped meanwhile: given a handle a caller kept
  # (Larder.Cache.handle/1), the cache of that name may run again, with new
  # tables: the read goes to it. Otherwise the unknown-cache error.
  defp stopped(rt, e, stacktrace, key, fun) do
    cond do
      not Runtime.stopped?(rt) ->
        reraise(e, stacktrace)

      (current = Runtime.get(rt.name)) && current != rt && not Runtime.stopped?(current) ->
        read(current, key, fun)

      true ->
        Instance.unknown!(Larder.Cache, rt.name)
    end
  end

  defp outcome(meta, :error, {:error, error}),
    do: Map.merge(meta, %{result: :error, error: error})

  defp outcome(meta, source, _result), do: Map.put(meta, :result, source)

  # The hit path is the same as traced/3's, without the source tag.
  defp fetch(rt, key, fun) do
    case l1(rt, key) do
      {:hit, value} ->
        Stats.count(rt, :l1_hits)
        {:ok, value}

      other ->
        elem(missed(rt, key, fun, other), 1)
    end
  end

  # fetch/3 that also says where the result came from: {source, result},
  # source being :hit, :l2_hit, :load, :waited, :miss or :error.
  defp traced(rt, key, fun) do
    case l1(rt, key) do
      {:hit, value} ->
        Stats.count(rt, :l1_hits)
        {:hit, {:ok, value}}

      other ->
        case missed(rt, key, fun, other) do
          {_source, {:error, _}} = error -> put_elem(error, 0, :error)
          {_source, :none} = none -> put_elem(none, 0, :miss)
          tagged -> tagged
        end
    end
  end

  # {:hit, value} | :miss | {:loading, pid, ref}. A hit on a row with an
  # expiry time compares it with the clock; an expired row is deleted (if it is still that
  # version). A large value lives in its own table under {key, version}:
  # the reading process keeps the copy it made (LocalCopies) and reuses it
  # while the version holds.
  defp l1(rt, key) do
    case Store.lookup(rt, key) do
      {:hit, _value} = hit ->
        hit

      {:value, version, expires, value} ->
        if Expiry.live?(rt, expires), do: {:hit, value}, else: expire(rt, key, version)

      {:large, version, expires, size} ->
        if Expiry.live?(rt, expires),
          do: large_hit(rt, key, version, size),
          else: expire(rt, key, version)

      :none ->
        LocalCopies.drop(rt, key)
        :miss

      loading ->
        LocalCopies.drop(rt, key)
        loading
    end
  end

  defp expire(rt, key, version) do
    LocalCopies.drop(rt, key)
    Store.delete_version(rt, key, version)
    :miss
  end

  defp large_hit(rt, key, version, size) do
    case LocalCopies.get(rt, key) do
      {^version, value} ->
        {:hit, value}

      _ ->
        case Store.large(rt, key, version) do
          {:ok, value} ->
            LocalCopies.keep(rt, key, version, size, value)
            {:hit, value}

          :none ->
            # replaced or deleted since we read the row
            l1(rt, key)
        end
    end
  end

  defp missed(rt, key, fun, lookup) do
    # before the loading marker: a key the L2 refuses raises ArgumentError
    Remote.check_key!(rt, key)
    Stats.count(rt, :l1_misses)
    LocalCopies.reclaim(rt)

    try do
      miss(rt, key, fun, lookup)
    rescue
      e in ArgumentError ->
        if Runtime.stopped?(rt), do: {:error, stopped(rt, key)}, else: reraise(e, __STACKTRACE__)
    end
  end

  # The owner took the tables with it: ETS calls on them raise badarg.
  defp stopped(rt, key) do
    {:error,
     Larder.Error.new(:cache_stopped, "the cache stopped during the call",
       cache: rt.name,
       key: key
     )}
  end

  defp miss(rt, key, fun, :miss) do
    ref = make_ref()

    if Store.lock(rt, key, ref) do
      lead(rt, key, ref, fun)
    else
      retry(rt, key, fun)
    end
  end

  defp miss(_cfg, key, _fun, {:loading, pid, _ref}) when pid == self() do
    raise ArgumentError,
          "Larder.Cache.fetch/3 called for key #{inspect(key)} from inside its own loader"
  end

  defp miss(rt, key, fun, {:loading, pid, ref}), do: wait(rt, key, fun, pid, ref)

  defp retry(rt, key, fun) do
    case l1(rt, key) do
      {:hit, value} -> {:hit, {:ok, value}}
      other -> miss(rt, key, fun, other)
    end
  end

  ## The loading process

  # {source, result}
  defp lead(rt, key, ref, fun) do
    {_source, result} =
      tagged =
      try do
        load(rt, key, ref, fun)
      catch
        kind, reason ->
          if Runtime.stopped?(rt) do
            {:error, stopped(rt, key)}
          else
            Store.unlock(rt, key, self(), ref)
            Stats.count(rt, :load_errors)

            {:error,
             {:error,
              Larder.Error.new(:loader_failed, "the loader raised",
                kind: kind,
                reason: reason,
                key: key
              )}}
          end
      end

    reply_waiters(rt, ref, result)
    tagged
  end

  # The L2 read and the load's L2 write share one deadline (the loader's
  # own time is not counted: Remote.pause/1 and resume/2).
  defp load(rt, key, ref, fun) do
    rt = Remote.begin(rt)

    case Remote.get(rt, key) do
      {:ok, value} ->
        fill(rt, key, ref, value)
        {:l2_hit, {:ok, value}}

      l2_state ->
        {:load, run_loader(rt, key, ref, fun, l2_state)}
    end
  end

  # get/3 reads through the levels without a loader.
  defp run_loader(rt, key, ref, nil, _l2_state) do
    Store.unlock(rt, key, self(), ref)
    :none
  end

  defp run_loader(rt, key, ref, fun, l2_state) do
    Stats.count(rt, :loads)
    left = Remote.pause(rt)
    result = call_loader(fun)
    rt = Remote.resume(rt, left)

    case result do
      {:ok, value} when rt.codec == :raw and not is_binary(value) ->
        Store.unlock(rt, key, self(), ref)
        Stats.count(rt, :load_errors)

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
        if fill(rt, key, ref, value) do
          case l2_state do
            :miss -> Remote.put(rt, key, value, rt.ttl, :new)
            :corrupt -> Remote.put(rt, key, value, rt.ttl, :always)
            _none_or_error -> :ok
          end
        end

        {:ok, value}

      {:error, reason} ->
        Store.unlock(rt, key, self(), ref)
        Stats.count(rt, :load_errors)

        {:error,
         Larder.Error.new(:loader_failed, "the loader returned an error", reason: reason, key: key)}

      other ->
        Store.unlock(rt, key, self(), ref)
        Stats.count(rt, :load_errors)

        {:error,
         Larder.Error.new(
           :loader_failed,
           "the loader must return {:ok, value} or {:error, reason}",
           returned: other,
           key: key
         )}
    end
  end

  # Writes the value in place of our loading marker, if it is still there,
  # and evicts if it did: true then; :off when the marker was still there
  # but the L1 is off (nothing written to L1; the L2 write goes ahead);
  # false when a put, delete or invalidation removed it.
  defp fill(rt, key, ref, value) do
    filled? = Store.fill(rt, key, ref, value, Expiry.expires_at(rt.ttl))
    if filled? == true, do: Eviction.evict(rt)
    filled?
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
  defp reply_waiters(rt, ref, result) do
    for {_ref, pid} <- :ets.take(rt.waiters, ref) do
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
  defp wait(rt, key, fun, pid, ref) do
    loader = Process.monitor(pid)
    owner = Process.monitor(rt.owner)
    watched? = Process.get(@in_loader) == true

    outcome =
      try do
        :ets.insert(rt.waiters, {ref, self()})

        case l1(rt, key) do
          {:loading, ^pid, ^ref} ->
            # Registered before the loader took its waiters: our wait is
            # real until it answers, and can be recorded as such.
            if watched? and Waits.wait_for(pid, rt.waiters, ref) == :cycle do
              if unregister(rt, ref), do: :cycle, else: await(ref, loader, owner)
            else
              await(ref, loader, owner)
            end

          _changed ->
            # false: the loader took us already, its result is on the way
            if unregister(rt, ref), do: :retry, else: await(ref, loader, owner)
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
        retry(rt, key, fun)

      :loader_down ->
        # The loading process died mid-load (a reply sent before it died
        # would have arrived first): clear its marker and start over.
        unregister(rt, ref)
        Store.unlock(rt, key, pid, ref)
        retry(rt, key, fun)

      :owner_down ->
        {:error, stopped(rt, key)}

      :cycle ->
        {:error,
         {:error,
          Larder.Error.new(
            :load_cycle,
            "this loader waits for a load that waits, through other loads, for this one",
            cache: rt.name,
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

  defp unregister(rt, ref) do
    :ets.select_delete(rt.waiters, [{{ref, self()}, [], [true]}]) == 1
  end
end
