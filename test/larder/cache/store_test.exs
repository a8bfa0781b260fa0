defmodule Larder.Cache.StoreTest do
  # The L1 under hostile keys, races, kills and stops: keys that look like
  # match patterns, many writers on one key, writers killed mid-write, a
  # cache stopped during a load, and the bound on process-local copies.
  # Not async: the concurrency tests measure the VM's ETS memory.
  use ExUnit.Case, async: false

  import Larder.Test.Eventually

  alias Larder.Cache

  @pattern_keys [
    :_,
    :"$1",
    :"$$",
    {:_, :"$2"},
    [:_ | :"$3"],
    [:_, {:"$1"}],
    %{:_ => :"$1"},
    {:"$1", :loading, :_, :_, :_}
  ]

  defp start_cache(ctx, opts \\ []) do
    name = :"#{ctx.test}"
    {:ok, pid} = Cache.start_link([name: name] ++ opts)
    Process.unlink(pid)
    on_exit(fn -> stop(pid) end)
    name
  end

  # A test that stops the cache's owner stops the cache (the owner is a
  # significant child), which may still be shutting down here: whatever
  # reason the stop then exits with, the cache must be gone.
  defp stop(pid) do
    GenServer.stop(pid)
  catch
    :exit, reason -> if Process.alive?(pid), do: exit(reason), else: :ok
  end

  defp cfg(cache), do: Larder.Cache.Runtime.get(cache)

  # Runs the owner's periodic sweep now (it repairs slots whose holder died)
  # and waits for it.
  defp sweep(cache) do
    owner = cfg(cache).owner
    send(owner, :sweep)
    :sys.get_state(owner)
  end

  # The L1's tables agree with each other and with stats/1: one data row per
  # key (a set), an index row per value row and nothing else, a large row
  # per large value row and nothing else, no journal left, no marker of a
  # dead loader.
  defp assert_consistent(cache) do
    cfg = cfg(cache)
    data = :ets.tab2list(cfg.data)

    values =
      for {key, version, _, size, _} <- data, is_integer(version) do
        {version, key, with({:large, s} <- size, do: s)}
      end

    assert Enum.sort(:ets.tab2list(cfg.index)) == Enum.sort(values)

    large = for {key, version, _, {:large, _}, _} <- data, do: {key, version}
    assert Enum.sort(for {kv, _} <- :ets.tab2list(cfg.large), do: kv) == Enum.sort(large)

    for {_key, :loading, pid, _, _} <- data, do: assert(Process.alive?(pid))
    assert [bytes_row] = :ets.tab2list(cfg.meta)
    [:bytes, total | slots] = Tuple.to_list(bytes_row)

    stats = Cache.stats(cache)
    assert stats.entries == length(values)
    assert stats.bytes == Enum.sum(for {_, _, size} <- values, do: size)
    assert total == stats.bytes
    assert Enum.sum(slots) == total
    values
  end

  # A process that writes `keys` forever: puts of a large value (`big`) and
  # of a small one, deletes and loads in turn, the i-th writer starting at
  # key i and the op `shift`.
  defp spawn_writer(cache, keys, big, i, shift) do
    spawn(fn ->
      for n <- Stream.iterate(0, &(&1 + 1)) do
        key = Enum.at(keys, rem(n + i, 3))

        case rem(n + shift, 4) do
          0 -> Cache.put(cache, key, [n | big])
          1 -> Cache.put(cache, key, n)
          2 -> Cache.delete(cache, key)
          3 -> Cache.fetch(cache, key, fn -> {:ok, [:loaded | big]} end)
        end
      end
    end)
  end

  defp ets_memory(cache) do
    cfg = cfg(cache)

    [cfg.data, cfg.index, cfg.large, cfg.meta, cfg.waiters]
    |> Enum.map(&(:ets.info(&1, :memory) * :erlang.system_info(:wordsize)))
    |> Enum.sum()
  end

  describe "keys that look like match patterns" do
    test "deleting one leaves every other key, its index and its bytes", ctx do
      cache = start_cache(ctx)

      for key <- @pattern_keys do
        for i <- 1..5, do: :ok = Cache.put(cache, {:other, i}, i)
        :ok = Cache.put(cache, key, :value)
        before = Cache.stats(cache)
        :ok = Cache.delete(cache, key)

        assert Cache.get(cache, key) == nil
        for i <- 1..5, do: assert(Cache.get(cache, {:other, i}) == i)
        assert Cache.stats(cache).entries == before.entries - 1
        assert length(assert_consistent(cache)) == 5
      end
    end

    test "put, fetch and get treat them as plain keys", ctx do
      cache = start_cache(ctx)
      :ok = Cache.put(cache, :plain, 0)

      for {key, i} <- Enum.with_index(@pattern_keys, 1) do
        assert Cache.fetch(cache, key, fn -> {:ok, i} end) == {:ok, i}
        assert Cache.fetch(cache, key, fn -> {:ok, :not_called} end) == {:ok, i}
        :ok = Cache.put(cache, key, -i)
        assert Cache.get(cache, key) == -i
      end

      assert Cache.get(cache, :plain) == 0
      assert length(assert_consistent(cache)) == length(@pattern_keys) + 1
    end

    test "eviction goes on working after one is deleted", ctx do
      cache = start_cache(ctx, max_entries: 3)

      for key <- @pattern_keys do
        :ok = Cache.put(cache, key, 1)
        :ok = Cache.delete(cache, key)
        for i <- 1..10, do: :ok = Cache.put(cache, {:n, i}, i)
        assert Cache.stats(cache).entries == 3
        assert for(i <- 8..10, do: Cache.get(cache, {:n, i})) == [8, 9, 10]
        assert_consistent(cache)
      end
    end

    test "large values under them are read, replaced and deleted without spinning", ctx do
      cache = start_cache(ctx, local_copy_min_bytes: 0)
      big = Enum.to_list(1..1_000)

      for key <- @pattern_keys do
        :ok = Cache.put(cache, {:other, key}, big)
        :ok = Cache.put(cache, key, big)
        :ok = Cache.delete(cache, key)

        reader = Task.async(fn -> Cache.get(cache, {:other, key}) end)
        assert Task.await(reader, 30_000) == big
        assert Cache.fetch(cache, key, fn -> {:ok, [:loaded | big]} end) == {:ok, [:loaded | big]}
        :ok = Cache.put(cache, key, [:put | big])
        assert Cache.get(cache, key) == [:put | big]
      end

      assert_consistent(cache)
    end
  end

  describe "many writers on one key" do
    defp hammer(cache, keys, ms) do
      deadline = System.monotonic_time(:millisecond) + ms
      big = Enum.to_list(1..500)

      1..16
      |> Enum.map(fn i ->
        Task.async(fn ->
          Stream.repeatedly(fn -> :ok end)
          |> Enum.reduce_while(0, fn _, n ->
            key = Enum.at(keys, rem(n + i, length(keys)))

            case rem(n * 7 + i, 6) do
              0 -> Cache.put(cache, key, {i, n})
              1 -> Cache.put(cache, key, [i | big])
              2 -> Cache.delete(cache, key)
              3 -> Cache.fetch(cache, key, fn -> {:ok, {:loaded, i}} end)
              4 -> Cache.fetch(cache, key, fn -> {:ok, [:loaded | big]} end)
              5 -> Cache.get(cache, key)
            end

            if System.monotonic_time(:millisecond) < deadline,
              do: {:cont, n + 1},
              else: {:halt, n}
          end)
        end)
      end)
      |> Task.await_many(60_000)
    end

    test "16 writers doing put, delete and fetch on one key leave one version and no orphans",
         ctx do
      cache = start_cache(ctx, local_copy_min_bytes: 1_000)
      baseline = ets_memory(cache)
      vm_baseline = :erlang.memory(:ets)

      hammer(cache, [:hot], 1_500)

      assert length(assert_consistent(cache)) <= 1
      :ok = Cache.delete(cache, :hot)
      assert assert_consistent(cache) == []
      assert ets_memory(cache) - baseline < 64 * 1024
      assert :erlang.memory(:ets) - vm_baseline < 4 * 1024 * 1024
    end

    test "with eviction, invalidations and clears in between", ctx do
      cache = start_cache(ctx, local_copy_min_bytes: 1_000, max_entries: 2, max_bytes: 20_000)
      keys = [:hot, :_, {:"$1"}]
      cfg = cfg(cache)

      # (an L1-only cache's invalidate_all/1 is the owner's clear of L1,
      # holding every slot)
      invalidator =
        Task.async(fn ->
          for n <- 1..400 do
            if rem(n, 50) == 0,
              do: :ok = Cache.invalidate_all(cache),
              else: Larder.Cache.Store.delete(cfg, Enum.random(keys))

            Process.sleep(1)
          end
        end)

      hammer(cache, keys, 1_500)
      Task.await(invalidator, 60_000)

      values = assert_consistent(cache)
      assert length(values) <= 2
      assert values |> Enum.map(&elem(&1, 1)) |> Enum.uniq() |> length() == length(values)
    end

    test "writers killed mid-write leave nothing half done once their slots are repaired",
         ctx do
      cache = start_cache(ctx, local_copy_min_bytes: 1_000, max_entries: 2)
      keys = [:hot, :_, {:a, 1}]
      baseline = ets_memory(cache)
      big = Enum.to_list(1..2_000)

      for round <- 1..300 do
        pids = for i <- 1..4, do: spawn_writer(cache, keys, big, i, round)

        Process.sleep(rem(round, 3))
        Enum.each(pids, &Process.exit(&1, :kill))
      end

      sweep(cache)
      values = assert_consistent(cache)
      assert length(values) <= 2

      # every key still works
      for key <- keys do
        :ok = Cache.put(cache, key, :after)
        assert Cache.get(cache, key) == :after
        :ok = Cache.delete(cache, key)
      end

      assert assert_consistent(cache) == []
      assert ets_memory(cache) - baseline < 64 * 1024
    end

    test "writers killed inside a journalled step are repaired by the next holder", ctx do
      # (no max_entries: a process is suspended at its next scheduling point,
      # and eviction's ets:info(index, :size) would be nearly all of them)
      cache = start_cache(ctx, local_copy_min_bytes: 1_000)
      cfg = cfg(cache)
      keys = [:hot, :_, {:a, 1}]
      big = Enum.to_list(1..5_000)

      writer = &spawn_writer(cache, keys, big, &1, 0)

      # Suspend the writers until one is caught with its journal row in
      # place (inside a step), and kill them there; let them run a moment
      # between tries.
      caught =
        for round <- 1..40, reduce: 0 do
          caught ->
            pids = [writer.(round), writer.(round + 1)]

            hit? =
              Enum.reduce_while(1..1_000, false, fn _, false ->
                Enum.each(pids, &:erlang.suspend_process/1)

                if :ets.info(cfg.meta, :size) > 1 do
                  {:halt, true}
                else
                  Enum.each(pids, &:erlang.resume_process/1)
                  Enum.each(1..:rand.uniform(3_000), fn _ -> :ok end)
                  {:cont, false}
                end
              end)

            Enum.each(pids, &Process.exit(&1, :kill))
            if hit?, do: caught + 1, else: caught
        end

      assert caught > 0

      # the next write to each key repairs the slot it lands on
      for key <- keys, do: :ok = Cache.put(cache, key, :after)
      sweep(cache)
      assert length(assert_consistent(cache)) == 3
      for key <- keys, do: assert(Cache.get(cache, key) == :after)
      for key <- keys, do: :ok = Cache.delete(cache, key)
      assert assert_consistent(cache) == []
    end
  end

  describe "a cache stopped during a load" do
    defp load_and_wait(cache) do
      parent = self()

      loader =
        Task.async(fn ->
          Cache.fetch(cache, :slow, fn ->
            send(parent, :loading)
            Process.sleep(300)
            {:ok, :late}
          end)
        end)

      assert_receive :loading, 5_000

      waiters =
        for _ <- 1..5, do: Task.async(fn -> Cache.fetch(cache, :slow, fn -> {:ok, :w} end) end)

      # the waiters register behind the loading marker
      cfg = cfg(cache)
      eventually(fn -> :ets.info(cfg.waiters, :size) == 5 end, 1_000, 5)
      [loader | waiters]
    end

    test "GenServer.stop gives the loader and its waiters :cache_stopped", ctx do
      cache = start_cache(ctx)
      tasks = load_and_wait(cache)
      :ok = GenServer.stop(cache)

      for result <- Task.await_many(tasks, 10_000) do
        assert {:error, %Larder.Error{reason: :cache_stopped}} = result
      end
    end

    test "a kill gives the loader and its waiters :cache_stopped", ctx do
      cache = start_cache(ctx)
      tasks = load_and_wait(cache)
      owner = Process.whereis(cache)
      ref = Process.monitor(owner)
      Process.exit(owner, :kill)
      assert_receive {:DOWN, ^ref, _, _, _}

      for result <- Task.await_many(tasks, 10_000) do
        assert {:error, %Larder.Error{reason: :cache_stopped}} = result
      end

      assert_raise ArgumentError, ~r/unknown Larder.Cache #{inspect(cache)}/, fn ->
        Cache.get(cache, :slow)
      end
    end
  end

  describe "process-local copies of large values" do
    defp copies(cache) do
      data = cfg(cache).data
      for {{^data, _key}, {_version, value}} <- Process.get(), do: :erlang.external_size(value)
    end

    defp heap_bytes do
      :erlang.garbage_collect()
      {:memory, bytes} = Process.info(self(), :memory)
      bytes
    end

    test "are bounded per process, and dropped when the key is found gone", ctx do
      max = 200_000
      cache = start_cache(ctx, local_copy_min_bytes: 1_000, local_copy_max_bytes: max)
      keys = for i <- 1..100, do: {:big, i}
      for key <- keys, do: :ok = Cache.put(cache, key, Enum.to_list(1..(2_000 + key_n(key))))

      baseline = heap_bytes()
      for key <- keys, do: assert(length(Cache.get(cache, key)) > 2_000)
      assert Enum.sum(copies(cache)) <= max
      assert length(copies(cache)) > 1
      full = heap_bytes()
      assert full > baseline

      # a repeat hit still comes from the copy
      [last | _] = Enum.reverse(keys)
      assert Cache.get(cache, last) == Enum.to_list(1..(2_000 + key_n(last)))

      for key <- keys, do: :ok = Cache.delete(cache, key)
      for key <- keys, do: assert(Cache.get(cache, key) == nil)
      assert copies(cache) == []
      assert heap_bytes() < full - div(max, 2)
    end

    test "a value above the bound is not kept", ctx do
      cache = start_cache(ctx, local_copy_min_bytes: 100, local_copy_max_bytes: 1_000)
      :ok = Cache.put(cache, :big, Enum.to_list(1..1_000))
      assert length(Cache.get(cache, :big)) == 1_000
      assert copies(cache) == []
    end

    defp key_n({:big, n}), do: n

    # A process that reads `key` of the cache it is told about twice (a
    # copy, then a repeat hit), and reports its memory after a collection
    # and the number of its process-dictionary entries.
    defp reader do
      parent = self()

      spawn_link(fn ->
        reader_loop(parent)
      end)
    end

    defp reader_loop(parent) do
      receive do
        {:read, cache, key} ->
          value = Cache.get(cache, key)
          ^value = Cache.get(cache, key)
          :erlang.garbage_collect()
          {:memory, memory} = Process.info(self(), :memory)
          send(parent, {:read, length(value), memory, length(Process.get())})
          reader_loop(parent)

        {:register, reg, key} ->
          send(parent, {:register, Larder.Register.get(reg, key)})
          reader_loop(parent)

        {:get, cache, key} ->
          send(parent, {:get, Cache.get(cache, key)})
          reader_loop(parent)

        {:copies, data} ->
          send(parent, {:copies, for({{^data, _}, _} <- Process.get(), do: :copy)})
          reader_loop(parent)
      end
    end

    defp read_in(reader, cache, key) do
      send(reader, {:read, cache, key})
      assert_receive {:read, 20_000, memory, entries}, 10_000
      {memory, entries}
    end

    # Issue 16, item 6: copies were keyed by an incarnation's data table,
    # never visited again once it stopped, and the bound held only per
    # incarnation: a reader's heap grew by one copy per restart.
    test "of a cache that stopped or was killed are reclaimed across 200 restarts", ctx do
      name = :"#{ctx.test}"
      big = Enum.to_list(1..20_000)
      reader = reader()

      readings =
        for i <- 1..200 do
          {:ok, pid} = Cache.start_link(name: name, local_copy_min_bytes: 1_000)
          Process.unlink(pid)
          :ok = Cache.put(name, :big, big)
          reading = read_in(reader, name, :big)
          ref = Process.monitor(pid)
          # half stop normally, half are killed (the cache's process, so
          # no terminate/2; the cache's supervisor then ends)
          if rem(i, 2) == 0,
            do: GenServer.stop(pid),
            else: Process.exit(Process.whereis(name), :kill)

          assert_receive {:DOWN, ^ref, :process, _, _}
          reading
        end

      {memory_early, entries_early} = Enum.at(readings, 9)
      {memory_late, entries_late} = List.last(readings)
      # One copy of `big` is about 320 KB: 200 kept would be 64 MB.
      assert memory_late < memory_early + 1_000_000
      assert entries_late <= entries_early
      unlink(reader)
    end

    test "of a cache that stopped are reclaimed at the process's next Register miss", ctx do
      cache = start_cache(ctx, local_copy_min_bytes: 1_000)
      data = cfg(cache).data
      :ok = Cache.put(cache, :big, Enum.to_list(1..20_000))
      reader = reader()
      read_in(reader, cache, :big)
      send(reader, {:copies, data})
      assert_receive {:copies, [:copy]}

      GenServer.stop(cfg(cache).owner)
      reg = Larder.Register.new()
      :ok = Larder.Register.put(reg, :k, :v)
      send(reader, {:register, reg, :k})
      assert_receive {:register, :v}
      send(reader, {:copies, data})
      assert_receive {:copies, []}
      :ok = Larder.Register.drop(reg)
      unlink(reader)
    end

    # Issue 20: the Register reclaimed on every miss, the cache only at a
    # new copy of a large value: a process that went on reading small
    # values or missing kept its copies of a stopped cache for ever.
    test "of a cache that stopped are reclaimed at the process's next miss on any cache", ctx do
      cache = start_cache(ctx, local_copy_min_bytes: 1_000)
      other = start_cache(%{test: :"#{ctx.test} other"})
      data = cfg(cache).data
      :ok = Cache.put(cache, :big, Enum.to_list(1..20_000))
      :ok = Cache.put(other, :small, :v)
      reader = reader()
      read_in(reader, cache, :big)
      send(reader, {:copies, data})
      assert_receive {:copies, [:copy]}

      GenServer.stop(cfg(cache).owner)
      # a hit keeps the hit path as it is: the copies stay
      send(reader, {:get, other, :small})
      assert_receive {:get, :v}
      send(reader, {:copies, data})
      assert_receive {:copies, [:copy]}

      send(reader, {:get, other, :missing})
      assert_receive {:get, nil}
      send(reader, {:copies, data})
      assert_receive {:copies, []}
      unlink(reader)
    end

    defp unlink(pid) do
      Process.unlink(pid)
      Process.exit(pid, :kill)
    end
  end

  describe "a binary cut from a larger one" do
    # Issue 16: a 100-byte part of a 20 MB binary kept the 20 MB alive in
    # the L1, and stats/1 counted 100 bytes.
    test "is stored alone, small or large, put or loaded, and counted as such", ctx do
      cache = start_cache(ctx, local_copy_min_bytes: 1_000)
      big = :binary.copy(<<7>>, 1_000_000)

      :ok = Cache.put(cache, :small, binary_part(big, 10, 100))
      :ok = Cache.put(cache, :large, binary_part(big, 0, 2_000))
      loaded = binary_part(big, 5, 300)
      assert Cache.fetch(cache, :loaded, fn -> {:ok, loaded} end) == {:ok, loaded}

      for {key, size} <- [small: 100, large: 2_000, loaded: 300] do
        stored = Cache.get(cache, key)
        assert byte_size(stored) == size
        assert :binary.referenced_byte_size(stored) == size
      end

      assert Cache.stats(cache).bytes < 3_000
      assert_consistent(cache)
    end
  end

  describe "numeric options have upper bounds" do
    test "values above them raise ArgumentError naming the option" do
      for {opt, value} <- [
            ttl: 3_153_600_000_001,
            max_bytes: 1_125_899_906_842_625,
            max_entries: 1_099_511_627_777,
            local_copy_min_bytes: 1_099_511_627_777,
            local_copy_max_bytes: 1_099_511_627_777,
            local_copy_max_bytes: -1,
            version: 9_223_372_036_854_775_808,
            version: String.duplicate("v", 1_025),
            namespace: String.duplicate("n", 1_025)
          ] do
        assert_raise ArgumentError, ~r/option #{inspect(opt)}/, fn ->
          Cache.start_link([{:name, :bounded}, {opt, value}])
        end
      end
    end

    test "put/4's ttl too", ctx do
      cache = start_cache(ctx)

      assert_raise ArgumentError, ~r/ttl/, fn ->
        Cache.put(cache, :k, 1, ttl: 3_153_600_000_001)
      end

      assert :ok = Cache.put(cache, :k, 1, ttl: 3_153_600_000_000)
    end
  end
end
