defmodule Larder.CacheTelemetryTest do
  # Every Larder.Cache event of Larder.Telemetry, through the test stand-in
  # for :telemetry (test/support/telemetry.ex), which forwards each event to
  # the test process. Events of other tests' caches are told apart by the
  # :cache metadata.
  use ExUnit.Case, async: true

  alias Larder.Cache
  alias Larder.Test.RedisServer
  alias Larder.Test.MemoryL2

  @events [
    [:larder, :cache, :fetch, :start],
    [:larder, :cache, :fetch, :stop],
    [:larder, :cache, :fetch, :exception],
    [:larder, :cache, :put, :start],
    [:larder, :cache, :put, :stop],
    [:larder, :cache, :put, :exception],
    [:larder, :cache, :delete, :start],
    [:larder, :cache, :delete, :stop],
    [:larder, :cache, :delete, :exception],
    [:larder, :cache, :eviction],
    [:larder, :cache, :invalidation, :sent],
    [:larder, :cache, :invalidation, :received],
    [:larder, :cache, :l2, :error],
    [:larder, :cache, :l2, :connected],
    [:larder, :cache, :l2, :disconnected]
  ]

  setup ctx do
    Larder.Test.TelemetryEvents.forward({__MODULE__, ctx.test}, @events)
  end

  defp start_cache(ctx, opts \\ []) do
    name = :"#{ctx.module}.#{ctx.test}.#{System.unique_integer([:positive])}"
    start_supervised!({Cache, Keyword.put(opts, :name, name)}, id: name)
    name
  end

  defp start_l2, do: start_supervised!(MemoryL2, id: {MemoryL2, make_ref()})

  # The stop event of one fetch of `key`, after its start event.
  defp assert_fetch(cache, key, result) do
    assert_receive {:event, [:larder, :cache, :fetch, :start], start,
                    %{cache: ^cache, key: ^key, telemetry_span_context: ctx}}

    assert is_integer(start.system_time) and is_integer(start.monotonic_time)

    assert_receive {:event, [:larder, :cache, :fetch, :stop], stop,
                    %{cache: ^cache, key: ^key, result: ^result, telemetry_span_context: ^ctx} =
                      meta}

    assert is_integer(stop.duration) and stop.duration >= 0
    meta
  end

  test ":telemetry is seen as loaded in the tests, and enabled?/1 honours false" do
    assert Larder.Telemetry.enabled?(true)
    refute Larder.Telemetry.enabled?(false)
  end

  describe "fetch span" do
    test "hit, load, miss and error, with the result in the stop metadata", ctx do
      cache = start_cache(ctx)

      assert Cache.fetch(cache, :k, fn -> {:ok, 1} end) == {:ok, 1}
      assert_fetch(cache, :k, :load)

      assert Cache.fetch(cache, :k, fn -> {:ok, 2} end) == {:ok, 1}
      assert_fetch(cache, :k, :hit)

      assert Cache.get(cache, :absent, :default) == :default
      assert_fetch(cache, :absent, :miss)

      assert {:error, error} = Cache.fetch(cache, :bad, fn -> {:error, :boom} end)
      assert %{error: ^error} = assert_fetch(cache, :bad, :error)
      assert error.reason == :loader_failed
    end

    test "an L2 hit", ctx do
      l2 = start_l2()
      a = start_cache(ctx, l2: {MemoryL2, server: l2})
      :ok = Cache.put(a, :k, :v)
      b = start_cache(ctx, l2: {MemoryL2, server: l2})
      assert Cache.fetch(b, :k, fn -> {:ok, :not_called} end) == {:ok, :v}
      assert_fetch(b, :k, :l2_hit)
    end

    test "a waiter answered by another process's load", ctx do
      cache = start_cache(ctx)
      me = self()

      loader = fn ->
        send(me, {:loading, self()})

        receive do
          :go -> {:ok, :loaded}
        end
      end

      leader = Task.async(fn -> Cache.fetch(cache, :k, loader) end)
      assert_receive {:loading, loading}
      waiter = Task.async(fn -> Cache.fetch(cache, :k, fn -> {:ok, :not_called} end) end)
      # the waiter has registered once its start event is out and the
      # waiters' table holds it; sending :go any time after is safe
      assert_receive {:event, [:larder, :cache, :fetch, :start], _, %{cache: ^cache, key: :k}}
      assert_receive {:event, [:larder, :cache, :fetch, :start], _, %{cache: ^cache, key: :k}}
      Larder.Test.Eventually.eventually(fn -> waiting?(cache) end)
      send(loading, :go)
      assert Task.await(leader) == {:ok, :loaded}
      assert Task.await(waiter) == {:ok, :loaded}

      results =
        for _ <- 1..2 do
          assert_receive {:event, [:larder, :cache, :fetch, :stop], _,
                          %{cache: ^cache, key: :k, result: result}}

          result
        end

      assert Enum.sort(results) == [:load, :waited]
    end

    test "a raise inside the span is an exception event", ctx do
      cache = start_cache(ctx)
      # fetch/3 for its own key from inside its loader raises ArgumentError
      # in the inner call; the outer load turns it into a loader error.
      inner = fn -> Cache.fetch(cache, :k, fn -> {:ok, :never} end) end
      assert {:error, %Larder.Error{reason: :loader_failed}} = Cache.fetch(cache, :k, inner)

      assert_receive {:event, [:larder, :cache, :fetch, :exception], measurements,
                      %{cache: ^cache, key: :k, kind: :error, reason: %ArgumentError{}}}

      assert is_integer(measurements.duration)

      assert_receive {:event, [:larder, :cache, :fetch, :stop], _,
                      %{cache: ^cache, key: :k, result: :error}}
    end
  end

  describe "put and delete spans" do
    test "ok", ctx do
      cache = start_cache(ctx)
      :ok = Cache.put(cache, :k, 1)
      assert_receive {:event, [:larder, :cache, :put, :start], _, %{cache: ^cache, key: :k}}

      assert_receive {:event, [:larder, :cache, :put, :stop], %{duration: _},
                      %{cache: ^cache, key: :k, result: :ok}}

      :ok = Cache.delete(cache, :k)
      assert_receive {:event, [:larder, :cache, :delete, :start], _, %{cache: ^cache, key: :k}}

      assert_receive {:event, [:larder, :cache, :delete, :stop], %{duration: _},
                      %{cache: ^cache, key: :k, result: :ok}}
    end

    test "an L2 failure is an :error result, an L2 error event, and no invalidation sent", ctx do
      l2 = start_l2()
      cache = start_cache(ctx, l2: {MemoryL2, server: l2})
      # the start published the generation it gave the new L2
      assert_receive {:event, [:larder, :cache, :invalidation, :sent], _,
                      %{cache: ^cache, message: {:all, _}}}

      :ok = MemoryL2.set_down(l2, true)

      assert {:error, error} = Cache.put(cache, :k, 1)

      assert_receive {:event, [:larder, :cache, :put, :stop], _,
                      %{cache: ^cache, key: :k, result: :error, error: ^error}}

      assert_receive {:event, [:larder, :cache, :l2, :error], %{count: 1},
                      %{cache: ^cache, reason: reason}}

      assert reason == error.reason

      assert {:error, _} = Cache.delete(cache, :k)

      assert_receive {:event, [:larder, :cache, :delete, :stop], _,
                      %{cache: ^cache, key: :k, result: :error}}

      refute_received {:event, [:larder, :cache, :invalidation, :sent], _, %{cache: ^cache}}
    end
  end

  test "eviction, after the evicted key's slot is released", ctx do
    cache = start_cache(ctx, max_entries: 1)
    :ok = Cache.put(cache, :old, 1)
    :ok = Cache.put(cache, :new, 2)

    assert_receive {:event, [:larder, :cache, :eviction], %{count: 1},
                    %{cache: ^cache, key: :old}}

    refute_received {:event, [:larder, :cache, :eviction], _, %{cache: ^cache, key: :new}}
  end

  test "an L2 value that fails its checks is an L2 error with reason :bad_value", ctx do
    l2 = start_l2()
    cache = start_cache(ctx, l2: {MemoryL2, server: l2})
    :ok = Cache.put(cache, :k, :v)
    [key] = MemoryL2.keys(l2) -- [Larder.Cache.Remote.generation_key(config(cache))]
    :ok = MemoryL2.raw_put(l2, key, "not a term")
    reader = start_cache(ctx, l2: {MemoryL2, server: l2})
    assert Cache.fetch(reader, :k, fn -> {:ok, :loaded} end) == {:ok, :loaded}

    assert_receive {:event, [:larder, :cache, :l2, :error], %{count: 1},
                    %{cache: ^reader, reason: :bad_value}}
  end

  test "invalidations sent by one node and received by the other", ctx do
    l2 = start_l2()
    a = start_cache(ctx, l2: {MemoryL2, server: l2})
    b = start_cache(ctx, l2: {MemoryL2, server: l2})

    :ok = Cache.put(a, :k, 1)

    assert_receive {:event, [:larder, :cache, :invalidation, :sent], %{count: 1},
                    %{cache: ^a, message: {:key, :k}}}

    assert_receive {:event, [:larder, :cache, :invalidation, :received], %{count: 1},
                    %{cache: ^b, message: {:key, :k}}}

    :ok = Cache.invalidate_all(a)
    g = :atomics.get(config(a).generation, 1)

    assert_receive {:event, [:larder, :cache, :invalidation, :sent], _,
                    %{cache: ^a, message: {:all, ^g}}}

    assert_receive {:event, [:larder, :cache, :invalidation, :received], _,
                    %{cache: ^b, message: {:all, ^g}}}

    # a node ignores its own messages
    refute_received {:event, [:larder, :cache, :invalidation, :received], _, %{cache: ^a}}
  end

  test "telemetry: false emits nothing", ctx do
    l2 = start_l2()
    a = start_cache(ctx, l2: {MemoryL2, server: l2}, telemetry: false, max_entries: 1)
    b = start_cache(ctx, l2: {MemoryL2, server: l2}, telemetry: false)

    {:ok, 1} = Cache.fetch(a, :k, fn -> {:ok, 1} end)
    {:ok, 1} = Cache.fetch(a, :k, fn -> {:ok, 2} end)
    :default = Cache.get(a, :absent, :default)
    :ok = Cache.put(a, :j, 2)
    :ok = Cache.delete(a, :j)
    :ok = Cache.invalidate_all(a)
    Larder.Test.Eventually.eventually(fn -> Cache.stats(b).invalidations >= 3 end)
    :ok = MemoryL2.set_down(l2, true)
    {:error, _} = Cache.put(a, :k, 3)

    refute_received {:event, _, _, %{cache: ^a}}
    refute_received {:event, _, _, %{cache: ^b}}
  end

  @tag :capture_log
  test "a dead L2 process is an L2 error and a disconnection, reason :process_died", ctx do
    l2 = start_l2()
    cache = start_cache(ctx, l2: {MemoryL2, server: l2})
    # What the cache's process gets when a process the L2 linked to it dies.
    send(Process.whereis(cache), {:EXIT, spawn(fn -> :ok end), :boom})

    assert_receive {:event, [:larder, :cache, :l2, :error], %{count: 1},
                    %{cache: ^cache, reason: :process_died}}

    assert_receive {:event, [:larder, :cache, :l2, :disconnected], %{system_time: _},
                    %{cache: ^cache, reason: :process_died}}
  end

  @tag :redis
  test "L2 connected and disconnected (Redis)", ctx do
    server = RedisServer.start()
    on_exit(fn -> RedisServer.stop(server) end)
    cache = start_cache(ctx, l2: {Larder.Cache.Redis, port: server.port})

    assert_receive {:event, [:larder, :cache, :l2, :connected], %{system_time: t},
                    %{cache: ^cache}}

    assert is_integer(t)
    RedisServer.stop(server)

    assert_receive {:event, [:larder, :cache, :l2, :disconnected], %{system_time: _},
                    %{cache: ^cache, reason: :connection_lost}}
  end

  defp config(cache), do: Larder.Cache.Runtime.get(cache)

  defp waiting?(cache), do: :ets.info(config(cache).waiters, :size) == 1
end
