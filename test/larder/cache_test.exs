defmodule Larder.CacheTest do
  use ExUnit.Case, async: true

  alias Larder.Cache
  alias Larder.Test.MemoryL2

  import Larder.Test.Eventually

  require Larder.Instance

  doctest Larder.Cache

  defp start_cache(ctx, opts \\ []) do
    name = :"#{ctx.module}.#{ctx.test}.#{System.unique_integer([:positive])}"
    start_supervised!({Cache, Keyword.put(opts, :name, name)}, id: name)
    name
  end

  defp start_l2(_ctx), do: start_supervised!(MemoryL2, id: {MemoryL2, make_ref()})

  # Two nodes (caches) over one MemoryL2: {l2, a, b}.
  defp two_nodes(ctx) do
    l2 = start_l2(ctx)
    [a, b] = for _ <- 1..2, do: start_cache(ctx, l2: {MemoryL2, server: l2})
    {l2, a, b}
  end

  defp counting_loader(value, delay \\ 0) do
    counter = :counters.new(1, [])

    loader = fn ->
      :counters.add(counter, 1, 1)
      Process.sleep(delay)
      {:ok, value}
    end

    {loader, fn -> :counters.get(counter, 1) end}
  end

  describe "start_link/1 options" do
    test "unknown options raise ArgumentError listing the valid ones" do
      assert_raise ArgumentError, ~r/unknown Larder.Cache options \[:bogus\].*:max_entries/, fn ->
        Cache.start_link(name: :x, bogus: 1)
      end
    end

    test "invalid values raise ArgumentError naming the option" do
      assert_raise ArgumentError, ~r/option :name to be an atom/, fn -> Cache.start_link([]) end

      assert_raise ArgumentError, ~r/option :ttl/, fn -> Cache.start_link(name: :x, ttl: 0) end

      assert_raise ArgumentError, ~r/option :compression_level/, fn ->
        Cache.start_link(name: :x, compression_level: 10)
      end

      assert_raise ArgumentError, ~r/implement Larder.Cache.L2/, fn ->
        Cache.start_link(name: :x, l2: {String, []})
      end
    end
  end

  describe "start_link/1 with a name in use" do
    # Calls start_link/1 in a fresh process that does not trap exits and is
    # not linked to the test; the process then waits for :stop (so that a
    # cache it started keeps running). Returns {pid, monitor ref}; the
    # process sends {:started, pid, result}.
    defp plain_starter(opts, go \\ nil) do
      test = self()

      spawn_monitor(fn ->
        if go, do: receive(do: (^go -> :ok))
        send(test, {:started, self(), Cache.start_link(opts)})
        receive do: (:stop -> :ok)
      end)
    end

    # The processes started by `pid` (directly or below) that still run.
    defp descendants(pid) do
      for p <- Process.list(),
          {:dictionary, dict} <- [Process.info(p, :dictionary)],
          pid in Keyword.get(dict, :"$ancestors", []),
          do: p
    end

    defp assert_alive_with_no_trace(pid, ref) do
      refute_received {:DOWN, ^ref, _, _, _}
      assert Process.alive?(pid)
      assert {:links, []} = Process.info(pid, :links)
      assert {:messages, []} = Process.info(pid, :messages)
      assert descendants(pid) == []
    end

    test "a second cache of the same name: {:error, {:already_started, owner}}, the caller lives",
         ctx do
      name = :"#{ctx.test}"
      {:ok, _sup} = Cache.start_link(name: name)
      owner = Process.whereis(name)

      {pid, ref} = plain_starter(name: name)
      assert_receive {:started, ^pid, {:error, {:already_started, ^owner}}}, 5_000
      assert_alive_with_no_trace(pid, ref)
      assert Process.whereis(name) == owner
      assert :ok = Cache.put(name, :k, 1)
      send(pid, :stop)
    end

    test "a name another process holds: {:error, {:already_started, holder}}, the caller lives",
         ctx do
      name = :"#{ctx.test}"
      holder = spawn_link(fn -> receive do: (:stop -> :ok) end)
      Process.register(holder, name)

      {pid, ref} = plain_starter(name: name)
      assert_receive {:started, ^pid, {:error, {:already_started, ^holder}}}, 5_000
      assert_alive_with_no_trace(pid, ref)
      assert Process.whereis(name) == holder

      # the failed start let the name's claim go: once the name is free,
      # a cache of that name starts
      send(holder, :stop)
      send(pid, :stop)
      eventually(fn -> Process.whereis(name) == nil end)
      {:ok, sup} = Cache.start_link(name: name)
      assert Cache.fetch(name, :k, fn -> {:ok, 1} end) == {:ok, 1}
      Supervisor.stop(sup)
    end

    test "many processes start one name at once: one wins, the others get its owner", ctx do
      name = :"#{ctx.test}"
      go = make_ref()
      starters = for _ <- 1..50, do: plain_starter([name: name], go)
      for {pid, _} <- starters, do: send(pid, go)

      results =
        for {pid, _} <- starters do
          assert_receive {:started, ^pid, result}, 10_000
          {pid, result}
        end

      assert [{winner, {:ok, sup}}] = Enum.filter(results, &match?({_, {:ok, _}}, &1))
      owner = Process.whereis(name)
      assert Larder.Cache.Supervisor.child(name, :owner) == owner
      assert {:links, [^sup]} = Process.info(winner, :links)

      for {pid, ref} <- starters, pid != winner do
        assert {^pid, {:error, {:already_started, ^owner}}} = List.keyfind(results, pid, 0)
        assert_alive_with_no_trace(pid, ref)
      end

      # the winner's tree is whole (a cache without an L2 runs no L2
      # process) and works
      ids = for {id, p, _, _} <- Supervisor.which_children(sup), is_pid(p), do: id
      assert Enum.sort(ids) == [:clock, :owner]
      assert :ok = Cache.put(name, :k, 1)
      assert Cache.get(name, :k) == 1

      for {pid, _} <- starters, do: send(pid, :stop)
    end
  end

  describe "unknown caches" do
    test "a name that was never started raises a clear ArgumentError", ctx do
      assert_raise ArgumentError,
                   ~r/^unknown Larder.Cache :nope_#{ctx.line}: it was never created/,
                   fn ->
                     Cache.fetch(:"nope_#{ctx.line}", :k, fn -> {:ok, 1} end)
                   end
    end

    test "a stopped cache raises a clear ArgumentError, not a bare badarg", ctx do
      name = start_cache(ctx)
      :ok = stop_supervised(name)

      for fun <- [
            fn -> Cache.get(name, :k) end,
            fn -> Cache.put(name, :k, 1) end,
            fn -> Cache.delete(name, :k) end,
            fn -> Cache.stats(name) end,
            fn -> Cache.invalidate_all(name) end
          ] do
        assert_raise ArgumentError, ~r/unknown Larder.Cache #{inspect(name)}/, fun
      end
    end

    # With telemetry off a read goes through Loader.read/3's hit clause,
    # with it on through the traced one: both turn ETS's badarg from the
    # freed tables into the unknown-cache error.
    test "a killed cache raises a clear ArgumentError", ctx do
      for telemetry <- [true, false] do
        name = :"#{ctx.test} #{telemetry}"

        reads = [
          fn -> Cache.fetch(name, :k, fn -> {:ok, 1} end) end,
          fn -> Cache.fetch!(name, :k, fn -> {:ok, 1} end) end,
          fn -> Cache.get(name, :k) end
        ]

        # the cache's supervisor killed: its owner ends with it (a linked
        # exit, so a moment later)
        {:ok, pid} = Cache.start_link(name: name, telemetry: telemetry)
        Process.unlink(pid)
        owner = Process.whereis(name)
        refs = for p <- [pid, owner], do: Process.monitor(p)
        Process.exit(pid, :kill)
        for ref <- refs, do: assert_receive({:DOWN, ^ref, _, _, _})

        # (the owner stopped in order, as in a stop: its config is gone too)
        for read <- reads do
          assert_raise ArgumentError, ~r/unknown Larder.Cache #{inspect(name)}/, read
        end

        # the owner killed: the supervisor ends the cache (the owner is not
        # restarted, its tables are gone, its handle is still published)
        {:ok, pid} = Cache.start_link(name: name, telemetry: telemetry)
        Process.unlink(pid)
        :ok = Cache.put(name, :k, 1)
        ref = Process.monitor(pid)
        Process.exit(Process.whereis(name), :kill)
        assert_receive {:DOWN, ^ref, _, _, :shutdown}

        for read <- reads do
          assert_raise ArgumentError,
                       ~r/unknown Larder.Cache #{inspect(name)}: .*owned it exited/,
                       read
        end
      end
    end
  end

  describe "handle/1" do
    test "every call takes the handle as it takes the name", ctx do
      name = start_cache(ctx, l2: {MemoryL2, server: start_l2(ctx)})
      cache = Cache.handle(name)

      assert Cache.fetch(cache, :k, fn -> {:ok, 1} end) == {:ok, 1}
      assert Cache.get(cache, :k) == 1
      assert Cache.fetch!(cache, :k, fn -> {:error, :not_called} end) == 1
      assert :ok = Cache.put(cache, :k, 2)
      assert Cache.get(name, :k) == 2
      assert :ok = Cache.delete(cache, :k)
      assert Cache.get(cache, :k, :none) == :none
      assert :ok = Cache.invalidate_all(cache)
      assert %{l1_hits: hits} = Cache.stats(cache)
      assert hits >= 2
      assert Cache.handle(cache) == cache
    end

    test "a handle kept across a restart of its cache reads and writes the running one", ctx do
      name = start_cache(ctx)
      old = Cache.handle(name)
      :ok = Cache.put(old, :k, :before)

      :ok = stop_supervised(name)
      start_supervised!({Cache, name: name}, id: {name, 2})
      refute Cache.handle(name) == old

      assert Cache.get(old, :k, :none) == :none
      assert :ok = Cache.put(old, :k, :after)
      assert Cache.get(name, :k) == :after
      assert Cache.fetch(old, :k, fn -> {:error, :not_called} end) == {:ok, :after}
      assert Cache.stats(old).l1_hits >= 1
    end

    test "a handle of a cache that is gone, a name that runs none, a bad term", ctx do
      name = start_cache(ctx)
      cache = Cache.handle(name)
      :ok = Cache.drop(cache)

      for call <- [
            fn -> Cache.fetch(cache, :k, fn -> {:ok, 1} end) end,
            fn -> Cache.get(cache, :k) end,
            fn -> Cache.put(cache, :k, 1) end,
            fn -> Cache.stats(cache) end
          ] do
        assert_raise ArgumentError, ~r/unknown Larder.Cache/, call
      end

      assert :ok = Cache.drop(cache)

      assert_raise ArgumentError, ~r/unknown Larder.Cache :never_started/, fn ->
        Cache.handle(:never_started)
      end

      assert_raise ArgumentError, ~r/Larder.Cache/, fn -> Cache.handle("cache") end
    end
  end

  describe "drop/1" do
    defp tree_pids(name) do
      owner = Process.whereis(name)
      {:parent, sup} = Process.info(owner, :parent)
      children = for {_, pid, _, _} <- Supervisor.which_children(sup), is_pid(pid), do: pid
      [sup | children]
    end

    test "by name or by pid: stops the whole tree and frees the tables, idempotently", ctx do
      for by <- [:name, :pid] do
        name = :"#{ctx.test} #{by}"
        {:ok, sup} = Cache.start_link(name: name)
        :ok = Cache.put(name, :k, 1)
        rt = Larder.Instance.lookup(Cache, name)
        pids = tree_pids(name)
        assert Process.whereis(name) in pids and length(pids) >= 3

        assert Cache.drop(if(by == :name, do: name, else: sup)) == :ok
        for pid <- pids, do: refute(Process.alive?(pid))
        assert :ets.info(rt.data) == :undefined
        assert_raise ArgumentError, ~r/unknown Larder.Cache/, fn -> Cache.get(name, :k) end

        assert Cache.drop(name) == :ok
        assert Cache.drop(sup) == :ok

        # the name is free again
        {:ok, again} = Cache.start_link(name: name)
        assert Cache.get(name, :k) == nil
        assert Cache.drop(Process.whereis(name)) == :ok
        refute Process.alive?(again)
      end
    end

    test "a term that is neither a name nor a pid raises ArgumentError" do
      for bad <- ["x", 1, {:a}, nil] do
        assert_raise ArgumentError, ~r/expected a Larder.Cache/, fn -> Cache.drop(bad) end
      end

      # a pid or name that runs no cache: already dropped
      assert Cache.drop(self()) == :ok
      assert Cache.drop(:no_such_cache_here) == :ok
    end

    test "from the linked caller that started it, which does not trap exits", ctx do
      test = self()

      caller =
        spawn(fn ->
          {:ok, sup} = Cache.start_link(name: ctx.test)
          result = Cache.drop(ctx.test)
          send(test, {:dropped, result, sup, Process.info(self(), :trap_exit)})
          receive do: (:done -> :ok)
        end)

      assert_receive {:dropped, :ok, sup, {:trap_exit, false}}, 10_000
      refute Process.alive?(sup)
      assert Process.alive?(caller)
      send(caller, :done)
    end

    test "under a supervisor it stays dropped; a crashed cache is restarted", ctx do
      parent =
        start_supervised!(%{
          id: :parent,
          start: {Supervisor, :start_link, [[{Cache, name: ctx.test}], [strategy: :one_for_one]]},
          type: :supervisor
        })

      # a crash (its owner killed) is restarted, as before
      old = Process.whereis(ctx.test)
      Process.exit(old, :kill)
      assert eventually(fn -> Process.whereis(ctx.test) not in [nil, old] end)

      assert Cache.drop(ctx.test) == :ok
      assert [{{Cache, _}, :undefined, :supervisor, _}] = Supervisor.which_children(parent)
      assert Process.whereis(ctx.test) == nil
      assert_raise ArgumentError, fn -> Cache.get(ctx.test, :k) end

      dynamic = start_supervised!({DynamicSupervisor, strategy: :one_for_one})
      {:ok, sup} = DynamicSupervisor.start_child(dynamic, {Cache, name: ctx.test})
      assert Cache.drop(sup) == :ok
      assert DynamicSupervisor.which_children(dynamic) == []
      assert Process.whereis(ctx.test) == nil
    end

    test "calls racing a drop complete or raise the unknown-cache error", ctx do
      l2 = start_l2(ctx)

      for round <- 1..20 do
        name = :"#{ctx.test} #{round}"
        {:ok, sup} = Cache.start_link(name: name, l2: {MemoryL2, server: l2})
        test = self()

        users =
          for i <- 1..4 do
            spawn_link(fn ->
              send(test, {:result, self(), use_until_gone(name, i, 0)})
            end)
          end

        Process.sleep(rem(round, 5))
        assert Cache.drop(if(rem(round, 2) == 0, do: name, else: sup)) == :ok
        refute Process.alive?(sup)

        for user <- users do
          assert_receive {:result, ^user, result}, 10_000
          assert {:gone, %ArgumentError{message: message}, calls} = result
          assert message =~ ~r/^unknown Larder.Cache/, message
          assert calls >= 0
        end
      end
    end
  end

  defp ok_or_stopped({:ok, _} = ok), do: ok
  defp ok_or_stopped({:error, %Larder.Error{reason: :cache_stopped}} = error), do: error

  # Calls `name` until one raises: {:gone, exception, calls that returned}.
  defp use_until_gone(name, i, calls) do
    key = rem(calls, 7)

    case rem(calls + i, 6) do
      # a fetch under way when the cache stops gets this documented error
      0 -> {_, _} = Cache.fetch(name, key, fn -> {:ok, calls} end) |> ok_or_stopped()
      1 -> :ok = Cache.put(name, key, calls)
      2 -> Cache.get(name, key)
      3 -> :ok = Cache.delete(name, key)
      4 -> %{} = Cache.stats(name)
      5 -> :ok = Cache.invalidate_all(name)
    end

    use_until_gone(name, i, calls + 1)
  rescue
    e in ArgumentError -> {:gone, e, calls}
  end

  describe "fetch/3 and friends, local only" do
    test "fetch loads once, then hits", ctx do
      cache = start_cache(ctx)
      {loader, calls} = counting_loader(:v)
      assert Cache.fetch(cache, :k, loader) == {:ok, :v}
      assert Cache.fetch(cache, :k, loader) == {:ok, :v}
      assert calls.() == 1
      assert %{l1_hits: 1, l1_misses: 1, loads: 1} = Cache.stats(cache)
    end

    test "a failing loader is an error, not cached, and counted", ctx do
      cache = start_cache(ctx)

      assert {:error, %Larder.Error{reason: :loader_failed, details: %{reason: :nope}}} =
               Cache.fetch(cache, :k, fn -> {:error, :nope} end)

      assert {:error, %Larder.Error{reason: :loader_failed}} =
               Cache.fetch(cache, :k, fn -> raise "boom" end)

      assert {:error, %Larder.Error{reason: :loader_failed}} =
               Cache.fetch(cache, :k, fn -> :not_a_tuple end)

      assert Cache.fetch(cache, :k, fn -> {:ok, 1} end) == {:ok, 1}
      assert %{load_errors: 3, loads: 4} = Cache.stats(cache)
    end

    test "fetch! returns the value or raises the error", ctx do
      cache = start_cache(ctx)
      assert Cache.fetch!(cache, :k, fn -> {:ok, 1} end) == 1

      assert_raise Larder.Error, ~r/loader_failed/, fn ->
        Cache.fetch!(cache, :other, fn -> {:error, :x} end)
      end
    end

    test "a loader must be a 0-arity function", ctx do
      cache = start_cache(ctx)
      assert_raise ArgumentError, ~r/loader/, fn -> Cache.fetch(cache, :k, :nope) end
    end

    test "a loader fetching its own key raises instead of deadlocking", ctx do
      cache = start_cache(ctx)

      assert {:error, %Larder.Error{details: %{reason: %ArgumentError{}}}} =
               Cache.fetch(cache, :k, fn -> Cache.fetch(cache, :k, fn -> {:ok, 1} end) end)
    end

    test "get, put, delete", ctx do
      cache = start_cache(ctx)
      assert Cache.get(cache, :k) == nil
      assert Cache.get(cache, :k, :default) == :default
      assert Cache.put(cache, :k, 1) == :ok
      assert Cache.get(cache, :k) == 1
      assert Cache.put(cache, :k, 2) == :ok
      assert Cache.get(cache, :k) == 2
      assert Cache.delete(cache, :k) == :ok
      assert Cache.get(cache, :k) == nil
      assert %{entries: 0, bytes: 0} = Cache.stats(cache)
    end

    test "put/4 validates its options", ctx do
      cache = start_cache(ctx)
      assert_raise ArgumentError, ~r/ttl/, fn -> Cache.put(cache, :k, 1, ttl: -1) end
      assert_raise ArgumentError, ~r/ttl/, fn -> Cache.put(cache, :k, 1, bogus: 1) end
    end

    test "entries expire after their ttl", ctx do
      cache = start_cache(ctx, ttl: 30)
      :ok = Cache.put(cache, :short, 1)
      :ok = Cache.put(cache, :long, 1, ttl: :infinity)
      assert Cache.get(cache, :short) == 1
      # past the ttl plus the owner's clock tick, with room for a busy machine
      Process.sleep(100)
      assert Cache.get(cache, :short) == nil
      assert Cache.get(cache, :long) == 1
    end

    test "the periodic sweep removes expired entries nobody reads", ctx do
      cache = start_cache(ctx)
      :ok = Cache.put(cache, :short, 1, ttl: 10)
      :ok = Cache.put(cache, :long, :binary.copy("x", 100))
      Process.sleep(30)
      send(Process.whereis(cache), :sweep)
      # a call after the message: the sweep has run when it returns
      :sys.get_state(cache)

      assert %{entries: 1, bytes: bytes} = Cache.stats(cache)
      assert bytes == :erlang.external_size(:binary.copy("x", 100))
    end

    test "max_entries evicts the oldest writes", ctx do
      cache = start_cache(ctx, max_entries: 3)
      for i <- 1..5, do: :ok = Cache.put(cache, i, i)
      assert Enum.map(1..5, &Cache.get(cache, &1)) == [nil, nil, 3, 4, 5]
      assert %{evictions: 2, entries: 3} = Cache.stats(cache)
    end

    test "max_bytes evicts until the values fit", ctx do
      cache = start_cache(ctx, max_bytes: 3_000)
      value = :binary.copy("x", 900)
      size = :erlang.external_size(value)
      for i <- 1..5, do: :ok = Cache.put(cache, i, value)
      stats = Cache.stats(cache)
      assert stats.bytes <= 3_000
      assert stats.entries == div(3_000, size)
      assert Cache.get(cache, 5) == value
      assert Cache.get(cache, 1) == nil
    end

    test "overwrites do not count twice towards max_entries", ctx do
      cache = start_cache(ctx, max_entries: 2)
      for _ <- 1..10, do: :ok = Cache.put(cache, :a, 1)
      :ok = Cache.put(cache, :b, 2)
      assert Cache.get(cache, :a) == 1
      assert %{evictions: 0, entries: 2} = Cache.stats(cache)
    end

    test "invalidate_all clears everything", ctx do
      cache = start_cache(ctx)
      for i <- 1..10, do: Cache.put(cache, i, i)
      assert Cache.invalidate_all(cache) == :ok
      assert Enum.all?(1..10, &(Cache.get(cache, &1) == nil))
      assert %{entries: 0} = Cache.stats(cache)
    end

    test "a compressed L1 returns the same values", ctx do
      cache = start_cache(ctx, compressed: true)
      value = %{list: Enum.to_list(1..1000), text: String.duplicate("abc", 100)}
      :ok = Cache.put(cache, :k, value)
      assert Cache.get(cache, :k) == value
    end
  end

  describe "large values" do
    test "a repeat hit is served from the process, and sees every change", ctx do
      cache = start_cache(ctx, local_copy_min_bytes: 1_000)
      big = Enum.to_list(1..1_000)
      :ok = Cache.put(cache, :big, big)
      assert Cache.get(cache, :big) == big
      assert {_version, ^big} = Process.get(local_copy_key(cache, :big))
      assert Cache.get(cache, :big) == big

      # another process changes it: the next hit here sees the new value
      Task.await(Task.async(fn -> Cache.put(cache, :big, [:new | big]) end))
      assert Cache.get(cache, :big) == [:new | big]

      Task.await(Task.async(fn -> Cache.delete(cache, :big) end))
      assert Cache.get(cache, :big) == nil
    end

    test "small values are not kept in the process", ctx do
      cache = start_cache(ctx, local_copy_min_bytes: 1_000)
      :ok = Cache.put(cache, :small, [1, 2, 3])
      assert Cache.get(cache, :small) == [1, 2, 3]
      assert Process.get(local_copy_key(cache, :small)) == nil
    end

    defp local_copy_key(cache, key) do
      {Larder.Cache.Runtime.get(cache).data, key}
    end
  end

  describe "miss collapsing" do
    test "1,000 concurrent misses on one key run the loader once", ctx do
      cache = start_cache(ctx)
      {loader, calls} = counting_loader(:v, 50)

      results =
        1..1_000
        |> Enum.map(fn _ -> Task.async(fn -> Cache.fetch(cache, :k, loader) end) end)
        |> Task.await_many(10_000)

      assert Enum.uniq(results) == [{:ok, :v}]
      assert calls.() == 1
    end

    test "waiters get the loader's error", ctx do
      cache = start_cache(ctx)

      loader = fn ->
        Process.sleep(50)
        {:error, :down}
      end

      results =
        1..20
        |> Enum.map(fn _ -> Task.async(fn -> Cache.fetch(cache, :k, loader) end) end)
        |> Task.await_many()

      assert Enum.all?(results, &match?({:error, %Larder.Error{reason: :loader_failed}}, &1))
      assert Cache.stats(cache).loads == 1
    end

    test "a slow key does not hold up other keys", ctx do
      cache = start_cache(ctx)
      slow = blocked_load(cache, :slow, :slow)
      assert Cache.fetch(cache, :fast, fn -> {:ok, :fast} end) == {:ok, :fast}
      send(slow.pid, :go)
      assert Task.await(slow) == {:ok, :slow}
    end

    test "waiters send nothing to the loading process's mailbox", ctx do
      cache = start_cache(ctx)
      loading = blocked_load(cache, :k, :v)

      waiters =
        for _ <- 1..50, do: Task.async(fn -> Cache.fetch(cache, :k, fn -> {:ok, :other} end) end)

      Process.sleep(50)
      send(loading.pid, :go)
      assert Task.await(loading) == {:ok, :v}
      assert_receive {:loaded, :k, {:message_queue_len, 0}}
      assert Enum.uniq(Task.await_many(waiters)) == [{:ok, :v}]
    end

    test "waiters recover when the loading process is killed", ctx do
      cache = start_cache(ctx)
      parent = self()

      loading =
        spawn(fn ->
          Cache.fetch(cache, :k, fn ->
            send(parent, :loading)
            Process.sleep(:infinity)
          end)
        end)

      assert_receive :loading

      waiters =
        for _ <- 1..10, do: Task.async(fn -> Cache.fetch(cache, :k, fn -> {:ok, :second} end) end)

      Process.sleep(20)
      Process.exit(loading, :kill)
      assert Enum.uniq(Task.await_many(waiters)) == [{:ok, :second}]
      assert Cache.stats(cache).loads == 2
    end
  end

  describe "backfill guard" do
    test "a load that started before a put does not overwrite it", ctx do
      cache = start_cache(ctx)
      loading = blocked_load(cache, :k, :stale)
      :ok = Cache.put(cache, :k, :fresh)
      send(loading.pid, :go)
      # the loader's caller gets what it loaded; the cache keeps the put
      assert Task.await(loading) == {:ok, :stale}
      assert Cache.get(cache, :k) == :fresh
    end

    test "a load that started before a delete does not bring the value back", ctx do
      l2 = start_l2(ctx)
      cache = start_cache(ctx, l2: {MemoryL2, server: l2})
      loading = blocked_load(cache, :k, :stale)
      :ok = Cache.delete(cache, :k)
      send(loading.pid, :go)
      assert Task.await(loading) == {:ok, :stale}
      assert Cache.get(cache, :k) == nil
    end
  end

  describe "with an L2" do
    test "an L2 hit backfills L1 and does not call the loader", ctx do
      l2 = start_l2(ctx)
      a = start_cache(ctx, l2: {MemoryL2, server: l2})
      :ok = Cache.put(a, :k, %{v: 1})
      # b starts after the put, so a's invalidation of :k cannot reach b
      # late and evict the value b backfills (that would only cost a second
      # L2 read, but would make the counts below racy).
      b = start_cache(ctx, l2: {MemoryL2, server: l2})
      {loader, calls} = counting_loader(:never)
      assert Cache.fetch(b, :k, loader) == {:ok, %{v: 1}}
      assert Cache.fetch(b, :k, loader) == {:ok, %{v: 1}}
      assert calls.() == 0
      assert %{l2_hits: 1, l1_hits: 1, l1_misses: 1} = Cache.stats(b)
    end

    test "an L2 replaced by a server holding older values (:replaced): no node reads them",
         ctx do
      {l2, a, b} = two_nodes(ctx)
      :ok = Cache.put(a, :k, 2)
      assert Cache.get(b, :k) == 2
      rt = Larder.Cache.Runtime.get(a)
      before = :atomics.get(rt.generation, 1)

      # the server now holds what a promoted replica would: the older value
      # under the same key, the newer put lost
      MemoryL2.raw_put(l2, Larder.Cache.Remote.l2_key(rt, :k), :erlang.term_to_binary(1))
      send(Process.whereis(a), {:larder_cache_l2, :replaced})

      # a moves to a new generation there (L1 cleared; its reader makes
      # the L2 calls, not the cache's process), and tells b
      eventually(fn -> :atomics.get(rt.generation, 1) > before end)
      assert Cache.get(a, :k) == nil

      eventually(fn ->
        :atomics.get(Larder.Cache.Runtime.get(b).generation, 1) ==
          :atomics.get(rt.generation, 1)
      end)

      assert Cache.get(b, :k) == nil
      :ok = Cache.put(b, :k, 3)
      assert Cache.get(a, :k) == 3
    end

    test "an L2 replaced while it does not answer: the new generation is written once it does",
         ctx do
      {l2, a, _b} = two_nodes(ctx)
      :ok = Cache.put(a, :k, 2)
      rt = Larder.Cache.Runtime.get(a)
      before = :atomics.get(rt.generation, 1)
      :ok = MemoryL2.set_down(l2, true)
      send(Process.whereis(a), {:larder_cache_l2, :replaced})
      _ = :sys.get_state(Process.whereis(a))
      assert Cache.get(a, :k) == nil
      :ok = MemoryL2.set_down(l2, false)
      eventually(fn -> :atomics.get(rt.generation, 1) > before end)
    end

    test "a loaded value is written to L2 for the other nodes", ctx do
      {_l2, a, b} = two_nodes(ctx)
      assert Cache.fetch(a, :k, fn -> {:ok, :loaded} end) == {:ok, :loaded}
      assert Cache.get(b, :k) == :loaded
    end

    test "put and delete on one node evict the key from the other's L1", ctx do
      {_l2, a, b} = two_nodes(ctx)
      :ok = Cache.put(a, :k, 1)
      assert Cache.get(b, :k) == 1
      :ok = Cache.put(a, :k, 2)
      eventually(fn -> Cache.get(b, :k) == 2 end, 50, 10)
      :ok = Cache.delete(b, :k)
      eventually(fn -> Cache.get(a, :k) == nil end, 50, 10)
      assert Cache.stats(a).invalidations >= 1
    end

    test "invalidate_all on one node clears every node", ctx do
      {l2, a, b} = two_nodes(ctx)
      :ok = Cache.put(a, :k, 1)
      assert Cache.get(b, :k) == 1
      :ok = Cache.invalidate_all(a)
      assert Cache.get(a, :k) == nil
      eventually(fn -> Cache.get(b, :k) == nil end, 50, 10)
      # a node started later reads the current generation
      c = start_cache(ctx, l2: {MemoryL2, server: l2})
      :ok = Cache.put(a, :k2, 2)
      assert Cache.get(c, :k2) == 2
    end

    test "a key that holds a fun is refused by every call of an L2-backed cache", ctx do
      {_l2, a, b} = two_nodes(ctx)
      # other nodes refuse an invalidation that carries a fun: refused here
      key = {:k, [fn -> :x end]}

      for call <- [
            fn -> Cache.put(a, key, 1) end,
            fn -> Cache.delete(a, key) end,
            fn -> Cache.fetch(a, key, fn -> {:ok, 1} end) end,
            fn -> Cache.get(a, key) end
          ] do
        assert_raise ArgumentError, ~r/expected key to hold no fun/, call
      end

      assert Cache.stats(a).entries == 0
      assert Cache.fetch(a, :k, fn -> {:ok, :still_works} end) == {:ok, :still_works}

      # pids, refs and ports travel
      port = Port.open({:spawn, "cat"}, [])
      on_exit(fn -> if Port.info(port), do: Port.close(port) end)
      key = {self(), make_ref(), port}
      :ok = Cache.put(a, key, 1)
      assert Cache.get(b, key) == 1
      :ok = Cache.put(a, key, 2)
      eventually(fn -> Cache.get(b, key) == 2 end, 50, 10)

      # a local-only cache sends nothing: any key
      local = start_cache(ctx)
      fun_key = {:k, fn -> :x end}
      :ok = Cache.put(local, fun_key, 1)
      assert Cache.get(local, fun_key) == 1
    end

    test "different namespaces and versions do not share keys", ctx do
      l2 = start_l2(ctx)
      a = start_cache(ctx, l2: {MemoryL2, server: l2}, namespace: "a")
      b = start_cache(ctx, l2: {MemoryL2, server: l2}, namespace: "b")
      a2 = start_cache(ctx, l2: {MemoryL2, server: l2}, namespace: "a", version: 2)
      :ok = Cache.put(a, :k, 1)
      assert Cache.get(b, :k) == nil
      assert Cache.get(a2, :k) == nil
    end

    test "corrupt or foreign bytes in L2 are a miss plus an error, never a crash", ctx do
      l2 = start_l2(ctx)
      writer = start_cache(ctx, l2: {MemoryL2, server: l2})
      :ok = Cache.put(writer, :k, :original)
      gen_key = Larder.Cache.Remote.generation_key(Larder.Cache.Runtime.get(writer))
      [key] = MemoryL2.keys(l2) -- [gen_key]

      # corrupt bytes
      :ok = MemoryL2.raw_put(l2, key, <<131, 0, 1, 2, 3>>)
      reader = start_cache(ctx, l2: {MemoryL2, server: l2})
      assert Cache.fetch(reader, :k, fn -> {:ok, :reloaded} end) == {:ok, :reloaded}
      assert %{decode_errors: 1, l2_errors: 1, loads: 1} = Cache.stats(reader)
      # the load repaired L2
      assert {:ok, bin} = MemoryL2.get(l2, key)
      assert :erlang.binary_to_term(bin) == :reloaded

      # a term naming an atom this node has never seen is refused by [:safe]
      name = "larder_test_unknown_atom_#{System.unique_integer([:positive])}"
      :ok = MemoryL2.raw_put(l2, key, <<131, 119, byte_size(name)>> <> name)
      other = start_cache(ctx, l2: {MemoryL2, server: l2})
      assert Cache.fetch(other, :k, fn -> {:ok, :again} end) == {:ok, :again}
      assert %{decode_errors: 1, l2_errors: 1} = Cache.stats(other)
      assert_raise ArgumentError, fn -> String.to_existing_atom(name) end
    end

    test "an L2 that is down: L1 still serves, the loader runs, errors are counted", ctx do
      l2 = start_l2(ctx)
      cache = start_cache(ctx, l2: {MemoryL2, server: l2})
      :ok = Cache.put(cache, :cached, 1)
      :ok = MemoryL2.set_down(l2, true)
      assert Cache.fetch(cache, :cached, fn -> {:ok, :never} end) == {:ok, 1}
      assert Cache.fetch(cache, :new, fn -> {:ok, 2} end) == {:ok, 2}
      assert {:error, %Larder.Error{reason: :l2_unavailable}} = Cache.put(cache, :p, 3)
      assert Cache.get(cache, :p) == 3
      assert {:error, %Larder.Error{reason: :l2_unavailable}} = Cache.invalidate_all(cache)
      assert Cache.stats(cache).l2_errors >= 3
      :ok = MemoryL2.set_down(l2, false)
      assert :ok = Cache.put(cache, :p, 4)
    end
  end

  # A fetch of key whose loader has started and waits for :go to return
  # {:ok, value}.
  # A fetch of `key` whose loader waits for :go, then loads `value`; the
  # task then tells how many messages it has left (waiters send none).
  defp blocked_load(cache, key, value) do
    parent = self()

    loading =
      Task.async(fn ->
        result =
          Cache.fetch(cache, key, fn ->
            send(parent, {:loading, key})

            receive do
              :go -> {:ok, value}
            end
          end)

        send(parent, {:loaded, key, Process.info(self(), :message_queue_len)})
        result
      end)

    assert_receive {:loading, ^key}
    loading
  end
end
