# Larder.Cache against its anchors, measured side by side in one run:
#   * a large term: Redis GET + binary_to_term vs an L1 hit vs a repeat hit
#     by the same process;
#   * a 1 KB map: hit latency and throughput (1 and 16 runners) vs a raw ETS
#     lookup;
#   * a miss storm: 1,000 processes fetch one cold key (loader calls);
#   * Redis down: hits and misses vs a raw ETS lookup; and the cross-node
#     invalidation latency while Redis is up;
#   * a lost generation: how long two nodes take to agree again after a
#     FLUSHALL (then invalidate_all/1) and after Redis restarts empty (then
#     a new node starts), on a redis-server of its own.
#
#   mix run bench/cache_bench.exs [--quick] [--json PATH] [--only NAME,...]
#
# --only runs the named workloads (large, hits, storm, down, invalidation,
# generation_loss) and skips the others.
#
# Starts its own redis-server on a free loopback port (skips the Redis
# workloads, saying so, if none is installed).

defmodule Larder.CacheBench do
  alias Larder.Bench
  alias Larder.Cache
  alias Larder.Test.RedisServer

  # A map of ~1 KB (external size).
  def small_map(i) do
    Map.new(1..24, fn f ->
      {"field_#{f}", "value-#{f}-#{rem(i, 10)}" <> String.duplicate("x", 15)}
    end)
  end

  def run(argv) do
    bench = Bench.start("Larder.Cache: ETS L1 + Redis L2", argv)
    workloads = workloads!(argv)
    redis = if RedisServer.available?(), do: RedisServer.start()

    unless redis do
      IO.puts("\nredis-server is not installed: the Redis workloads are skipped.")
    end

    try do
      bench
      |> only(workloads, "large", &large(&1, redis))
      |> only(workloads, "hits", &small_hits/1)
      |> only(workloads, "storm", &storm/1)
      |> only(workloads, "down", &redis_down(&1, redis))
      |> only(workloads, "invalidation", &invalidation(&1, redis))
      |> only(workloads, "generation_loss", &generation_loss(&1, redis))
      |> Bench.finish()
    after
      if redis, do: RedisServer.stop(redis)
    end
  end

  @workloads ~w(large hits storm down invalidation generation_loss)

  # The workloads --only names (all of them without it).
  defp workloads!(argv) do
    {opts, _rest, _invalid} = OptionParser.parse(argv, switches: [only: :string])
    names = if opts[:only], do: String.split(opts[:only], ",", trim: true), else: @workloads

    for name <- names, name not in @workloads do
      raise ArgumentError,
            "unknown workload #{inspect(name)}, expected one of #{inspect(@workloads)}"
    end

    names
  end

  defp only(bench, workloads, workload, run),
    do: if(workload in workloads, do: run.(bench), else: bench)

  defp start_cache(name, opts) do
    {:ok, pid} = Cache.start_link([name: name] ++ opts)
    Process.unlink(pid)
    name
  end

  defp redis_l2(redis, opts \\ []),
    do: {Larder.Cache.Redis, Keyword.merge([port: redis.port, timeout: 1_000], opts)}

  ## Large term

  @large_title "Large term (60k maps)"

  def large(bench, nil), do: bench

  def large(bench, redis) do
    runs = Bench.pick(bench, 5, 15)

    # one cache keeps no process-local copy (every hit copies from ETS),
    # the other keeps it for values >= 64 KB (the default)
    plain =
      start_cache(:bench_large_plain,
        l2: redis_l2(redis),
        compression_level: 6,
        local_copy_min_bytes: :infinity
      )

    local =
      start_cache(:bench_large_local,
        l2: redis_l2(redis),
        compression_level: 6,
        namespace: "local"
      )

    raw = :ets.new(:bench_large_raw, [:set, :public, read_concurrency: true])
    {:ok, client} = Larder.Redis.Connection.start_link(~c"127.0.0.1", redis.port)

    # Built and stored by another process, so that this one (which measures)
    # does not carry the term in its heap through every garbage collection.
    {maps, raw_size, bin_size} =
      Task.await(
        Task.async(fn ->
          term = Larder.Bench.Cache.large_term()
          :ok = Cache.put(plain, :catalogue, term)
          :ok = Cache.put(local, :catalogue, term)
          :ets.insert(raw, {:catalogue, term})
          bin = :erlang.term_to_binary(term, compressed: 6)

          {:ok, "OK"} = Larder.Redis.Connection.q(client, ["SET", "bench:large", bin], 10_000)

          {length(term), :erlang.external_size(term), byte_size(bin)}
        end),
        60_000
      )

    redis_get = fn ->
      {:ok, got} = Larder.Redis.Connection.q(client, ["GET", "bench:large"], 10_000)
      :erlang.binary_to_term(got, [:safe])
    end

    IO.puts(
      "\nterm: #{maps} maps, #{Float.round(raw_size / 1_000_000, 2)} MB raw, " <>
        "#{Float.round(bin_size / 1_000_000, 2)} MB compressed (level 6)"
    )

    # The repeat hits run in a process of their own, which keeps its copy
    # of the term between runs (that is the point); kept in this process,
    # that copy would be copied by every garbage collection of the other
    # columns. Its figure includes a message round trip.
    reader =
      Larder.Bench.Cache.start_reader(fn ->
        {:ok, _} = Cache.fetch(local, :catalogue, &__MODULE__.unreachable/0)
      end)

    bench =
      bench
      |> Bench.table(@large_title, [
        "Redis GET + binary_to_term",
        "raw ETS lookup",
        "L1 hit",
        "repeat hit, same process"
      ])
      |> Bench.row(
        "read the term",
        %{
          "Redis GET + binary_to_term" => redis_get,
          "raw ETS lookup" => fn -> [{_, _}] = :ets.lookup(raw, :catalogue) end,
          "L1 hit" => fn ->
            {:ok, _} = Cache.fetch(plain, :catalogue, &__MODULE__.unreachable/0)
          end,
          "repeat hit, same process" => fn -> Larder.Bench.Cache.ask(reader) end
        },
        warmup: 1,
        runs: runs,
        interleave: true
      )

    Larder.Bench.Cache.stop_reader(reader)
    GenServer.stop(client)
    :ets.delete(raw)
    GenServer.stop(plain)
    GenServer.stop(local)
    speedup = fn col -> 1 / Bench.ratio(bench, @large_title, "read the term", col) end

    bench
    |> Bench.target(
      "large-term L1 hit: times faster than Redis GET + binary_to_term",
      speedup.("L1 hit"),
      :>=,
      8
    )
    |> Bench.target(
      "repeat hit, same process: times faster than Redis",
      speedup.("repeat hit, same process"),
      :>=,
      100
    )
  end

  # A hit loop that missed would get {:error, _} back and fail its match:
  # the hit columns measure hits only. Given as a remote capture, which is
  # a literal: a local capture or a closure is built on every call, and on
  # OTP 25 each one also bumps a reference count shared by every scheduler
  # (see "Performance" in Larder.Cache), a cost of the caller's.
  @doc false
  def unreachable, do: raise("the loader should not run on a hit")

  # A key in 1..keys for a lookup timed on its own: a cheap BIF, the same in
  # every column.
  defp any_key(keys), do: rem(:erlang.unique_integer([:positive]), keys) + 1

  # Calls fun.(n) for n in n..1 and drops the results, so that neither side
  # pays for keeping them alive through garbage collections.
  defp repeat(0, _fun), do: :ok

  defp repeat(n, fun) do
    fun.(n)
    repeat(n - 1, fun)
  end

  ## 1 KB map hits

  @small_title "1 KB map hits (per lookup)"

  def small_hits(bench) do
    keys = 1_000
    ops = Bench.pick(bench, 20_000, 100_000)
    runs = Bench.pick(bench, 5, 15)
    raw = :ets.new(:bench_raw, [:set, :public, read_concurrency: true])
    name = start_cache(:bench_small, [])
    # the same, with a ttl: every hit also reads the clock
    ttl_name = start_cache(:bench_small_ttl, ttl: :timer.hours(1))
    # What a caller keeps (Larder.Cache.handle/1); by name, each call looks
    # the cache up first.
    cache = Cache.handle(name)
    ttl_cache = Cache.handle(ttl_name)

    for i <- 1..keys do
      :ets.insert(raw, {i, small_map(i)})
      :ok = Cache.put(cache, i, small_map(i))
      :ok = Cache.put(ttl_cache, i, small_map(i))
    end

    loop = fn fetch ->
      fn _state, r -> repeat(ops, fn n -> fetch.(rem(n + r, keys) + 1) end) end
    end

    loops = %{
      "raw ETS lookup" => loop.(fn k -> [_] = :ets.lookup(raw, k) end),
      "hit by handle" =>
        loop.(fn k -> {:ok, _} = Cache.fetch(cache, k, &__MODULE__.unreachable/0) end),
      "hit by handle, ttl set" =>
        loop.(fn k -> {:ok, _} = Cache.fetch(ttl_cache, k, &__MODULE__.unreachable/0) end),
      "hit by name" =>
        loop.(fn k -> {:ok, _} = Cache.fetch(name, k, &__MODULE__.unreachable/0) end)
    }

    columns = ["raw ETS lookup", "hit by handle", "hit by handle, ttl set", "hit by name"]
    IO.puts("\nvalue: #{:erlang.external_size(small_map(1))} bytes (external size), #{keys} keys")

    bench =
      bench
      |> Bench.table(@small_title, columns, per_op: true)
      |> Bench.row("1 runner", loops, ops: ops, runs: runs, interleave: true)
      |> Bench.row("16 runners", loops,
        ops: div(ops, 4),
        runs: runs,
        parallel: 16,
        interleave: true
      )
      # Every lookup timed on its own (each:), so its p99 is a tail latency,
      # not the slowest of a few batch means. Each sample includes one clock
      # read, alike in every column.
      |> Bench.row(
        "1 runner, each lookup timed",
        %{
          "raw ETS lookup" => fn -> [_] = :ets.lookup(raw, any_key(keys)) end,
          "hit by handle" => fn ->
            {:ok, _} = Cache.fetch(cache, any_key(keys), &__MODULE__.unreachable/0)
          end,
          "hit by handle, ttl set" => fn ->
            {:ok, _} = Cache.fetch(ttl_cache, any_key(keys), &__MODULE__.unreachable/0)
          end,
          "hit by name" => fn ->
            {:ok, _} = Cache.fetch(name, any_key(keys), &__MODULE__.unreachable/0)
          end
        },
        each: ops,
        runs: runs,
        interleave: true
      )

    print_throughput(bench, @small_title)

    # Garbage collections are counted, not timed, so this line is the same
    # on a busy machine: a hit's few words on the caller's heap beside the
    # copied value bring collections sooner, and each copies the last value.
    IO.puts(
      "garbage collections per #{ops} lookups, 1 runner: " <>
        Enum.map_join(columns, ", ", fn col -> "#{col} #{gcs(fn -> loops[col].(nil, 0) end)}" end)
    )

    :ok = Cache.drop(name)
    :ok = Cache.drop(ttl_name)
    :ets.delete(raw)

    for {row, runners} <- [{"1 runner", "1 runner"}, {"16 runners", "16 runners"}],
        {col, what} <- [
          {"hit by handle", "1 KB L1 hit"},
          {"hit by handle, ttl set", "1 KB L1 hit with a ttl"}
        ],
        reduce: bench do
      bench ->
        Bench.target(
          bench,
          "#{what} by handle vs raw ETS lookup, #{runners} (ratio)",
          Bench.ratio(bench, @small_title, row, col),
          :<=,
          1.1
        )
    end
  end

  # The garbage collections of a fresh process while it runs loop (traced,
  # so counted exactly; the trace messages come in before its :done).
  defp gcs(loop) do
    parent = self()

    pid =
      spawn_link(fn ->
        receive do
          :go -> loop.()
        end

        :erlang.trace(self(), false, [:garbage_collection])
        send(parent, {:done, self()})
      end)

    :erlang.trace(pid, true, [:garbage_collection])
    send(pid, :go)
    count_gcs(pid, 0)
  end

  defp count_gcs(pid, n) do
    receive do
      {:trace, ^pid, :gc_minor_start, _} -> count_gcs(pid, n + 1)
      {:trace, ^pid, :gc_major_start, _} -> count_gcs(pid, n + 1)
      {:trace, ^pid, _, _} -> count_gcs(pid, n)
      {:done, ^pid} -> n
    end
  end

  defp print_throughput(bench, title) do
    table = Enum.find(bench.tables, &(&1.title == title))

    for row <- table.rows, {col, %{ops_per_s: ops}} <- Enum.sort(row.results) do
      IO.puts(
        "throughput  #{String.pad_trailing(row.label, 12)} #{String.pad_trailing(col, 18)} #{round(ops / 1_000)}k lookups/s"
      )
    end
  end

  ## Miss storm

  @storm_title "Miss storm: 1,000 processes fetch one cold key"

  def storm(bench) do
    processes = 1_000
    runs = Bench.pick(bench, 3, 10)
    load_ms = 20
    cache = start_cache(:bench_storm, [])
    naive = :ets.new(:bench_naive, [:set, :public, read_concurrency: true])
    calls = :counters.new(2, [:write_concurrency])

    loader = fn slot ->
      fn ->
        :counters.add(calls, slot, 1)
        Process.sleep(load_ms)
        {:ok, small_map(0)}
      end
    end

    # what a hand-rolled read-through does: look up, else load and insert
    naive_fetch = fn key ->
      case :ets.lookup(naive, key) do
        [{_, v}] ->
          {:ok, v}

        [] ->
          {:ok, v} = loader.(1).()
          :ets.insert(naive, {key, v})
          {:ok, v}
      end
    end

    setup = fn -> System.unique_integer([:positive]) end

    bench =
      bench
      |> Bench.table(@storm_title, ["ETS read-through, no collapsing", "Larder.Cache"])
      |> Bench.row(
        "wall time (loader sleeps #{load_ms} ms)",
        %{
          "ETS read-through, no collapsing" => fn key, _r -> {:ok, _} = naive_fetch.(key) end,
          "Larder.Cache" => fn key, _r -> {:ok, _} = Cache.fetch(cache, key, loader.(2)) end
        },
        parallel: processes,
        setup: setup,
        runs: runs,
        warmup: 0
      )

    per_storm = fn slot -> :counters.get(calls, slot) / runs end

    bench =
      Bench.row(bench, "loader calls per storm", %{
        "ETS read-through, no collapsing" => Bench.value(per_storm.(1), "calls"),
        "Larder.Cache" => Bench.value(per_storm.(2), "calls")
      })

    GenServer.stop(cache)
    :ets.delete(naive)
    calls_per_storm = per_storm.(2)

    bench
    |> Bench.target(
      "miss storm: loader calls per storm (want exactly 1)",
      calls_per_storm,
      :<=,
      1
    )
    |> Bench.target(
      "miss storm: loader calls per storm (want exactly 1)",
      calls_per_storm,
      :>=,
      1
    )
  end

  ## Redis down

  @down_title "Redis down (killed before the run)"

  def redis_down(bench, nil), do: bench

  def redis_down(bench, _redis) do
    # a server of our own, killed: the cache keeps its L1 and its loader
    down = RedisServer.start()
    cache = start_cache(:bench_down, l2: redis_l2(down, timeout: 200))
    keys = 1_000
    for i <- 1..keys, do: Cache.put(cache, i, small_map(i))
    RedisServer.stop(down)
    {:error, %Larder.Error{}} = Cache.put(cache, :probe, 1)

    raw = :ets.new(:bench_raw_down, [:set, :public, read_concurrency: true])
    for i <- 1..keys, do: :ets.insert(raw, {i, small_map(i)})
    ops = Bench.pick(bench, 20_000, 100_000)
    miss_ops = Bench.pick(bench, 1_000, 5_000)
    runs = Bench.pick(bench, 5, 15)
    errors_before = Cache.stats(cache).l2_errors

    bench =
      bench
      |> Bench.table(@down_title, ["raw ETS lookup", "Larder.Cache"], per_op: true)
      |> Bench.row(
        "hit, 1 KB map",
        %{
          "raw ETS lookup" => fn ->
            repeat(ops, fn n -> [_] = :ets.lookup(raw, rem(n, keys) + 1) end)
          end,
          "Larder.Cache" => fn ->
            repeat(ops, fn n ->
              {:ok, _} = Cache.fetch(cache, rem(n, keys) + 1, &__MODULE__.unreachable/0)
            end)
          end
        },
        ops: ops,
        runs: runs,
        interleave: true
      )
      |> Bench.row(
        "hit, 1 KB map, each lookup timed",
        %{
          "raw ETS lookup" => fn -> [_] = :ets.lookup(raw, any_key(keys)) end,
          "Larder.Cache" => fn ->
            {:ok, _} = Cache.fetch(cache, any_key(keys), &__MODULE__.unreachable/0)
          end
        },
        each: ops,
        runs: runs,
        interleave: true
      )
      |> Bench.row(
        "miss: L2 error + loader + L1 write",
        %{
          "Larder.Cache" =>
            {fn base ->
               repeat(miss_ops, fn n -> Cache.fetch(cache, {base, n}, fn -> {:ok, n} end) end)
             end, setup: fn -> System.unique_integer() end}
        },
        ops: miss_ops,
        runs: runs
      )

    IO.puts("L2 errors counted while down: #{Cache.stats(cache).l2_errors - errors_before}")
    GenServer.stop(cache)
    :ets.delete(raw)

    Bench.target(
      bench,
      "hit with Redis down vs raw ETS lookup (ratio)",
      Bench.ratio(bench, @down_title, "hit, 1 KB map", "Larder.Cache"),
      :<=,
      1.2
    )
  end

  ## Cross-node invalidation

  @inval_title "Cross-node invalidation through Redis pub/sub"

  def invalidation(bench, nil), do: bench

  def invalidation(bench, redis) do
    a = start_cache(:bench_node_a, l2: redis_l2(redis), namespace: "inval")
    b = start_cache(:bench_node_b, l2: redis_l2(redis), namespace: "inval")
    wait_subscribed(a, b)
    runs = Bench.pick(bench, 20, 100)

    # put on a, then spin until b's L1 no longer holds the old value
    setup = fn ->
      :ok = Cache.put(b, :k, :old)
      :old = Cache.get(b, :k)
      Cache.stats(b).invalidations
    end

    propagate = fn seen ->
      :ok = Cache.put(a, :k, :new)
      wait_invalidation(b, seen)
    end

    bench =
      bench
      |> Bench.table(@inval_title, ["put on node A until node B evicts"])
      |> Bench.row("latency", %{"put on node A until node B evicts" => propagate},
        setup: setup,
        runs: runs,
        warmup: 2
      )

    table = Enum.find(bench.tables, &(&1.title == @inval_title))
    [%{results: %{"put on node A until node B evicts" => result}}] = table.rows
    GenServer.stop(a)
    GenServer.stop(b)
    # A sample is one invalidation, but there are only `runs` of them: their
    # slowest is what they can say about the tail.
    Bench.target(
      bench,
      "cross-node invalidation, max of #{result.runs} runs (ms)",
      result.max_us / 1_000,
      :<=,
      100
    )
  end

  ## A lost generation

  @loss_title "Generation lost: until two nodes agree again"
  @loss_col "until the nodes agree"

  def generation_loss(bench, nil), do: bench

  # On a redis-server of its own, which this workload restarts.
  def generation_loss(bench, _redis) do
    server = RedisServer.start()
    Process.put(:loss_server, server)

    try do
      bench
      |> Bench.table(@loss_title, [@loss_col])
      |> flushall_row()
      |> empty_restart_row()
    after
      RedisServer.stop(Process.get(:loss_server))
    end
  end

  # FLUSHALL, then invalidate_all/1 on A: timed from the call until B no
  # longer serves the value it held (its L1 cleared, its generation A's).
  defp flushall_row(bench) do
    server = Process.get(:loss_server)
    a = start_cache(:bench_loss_a, l2: redis_l2(server), namespace: "loss")
    b = start_cache(:bench_loss_b, l2: redis_l2(server), namespace: "loss")
    wait_subscribed(a, b)

    setup = fn ->
      :ok = Cache.put(a, :k, :old)
      wait_until(fn -> Cache.get(b, :k) == :old end)
      "+OK\r\n" = RedisServer.command(server, ["FLUSHALL"])
    end

    converge = fn _ ->
      :ok = Cache.invalidate_all(a)
      wait_until(fn -> Cache.get(b, :k) == nil end)
    end

    bench =
      Bench.row(
        bench,
        "FLUSHALL, invalidate_all on A",
        %{@loss_col => converge},
        setup: setup,
        runs: Bench.pick(bench, 5, 30),
        warmup: 1
      )

    GenServer.stop(a)
    GenServer.stop(b)
    bench
  end

  # Redis killed and restarted empty: timed from the restarted server's
  # first answer, through a new node C's start, until a key C writes is read
  # by the old node A from L2 (A resubscribed and both use one generation).
  defp empty_restart_row(bench) do
    server = Process.get(:loss_server)
    a = start_cache(:bench_restart_a, l2: redis_l2(server), namespace: "restart")
    :ok = Cache.invalidate_all(a)

    setup = fn ->
      # A is back on the previous run's server
      wait_until(fn -> Cache.put(a, :k, :old) == :ok or Process.sleep(10) end)
      :ok = RedisServer.kill(Process.get(:loss_server))
      server = RedisServer.restart(Process.get(:loss_server))
      Process.put(:loss_server, server)
      :"bench_restart_c#{System.unique_integer([:positive])}"
    end

    converge = fn c ->
      start_cache(c, l2: redis_l2(Process.get(:loss_server)), namespace: "restart")
      wait_agree(a, c, 0)
    end

    bench =
      Bench.row(
        bench,
        "restarted empty, new node C",
        %{@loss_col => converge},
        setup: setup,
        teardown: fn c -> GenServer.stop(c) end,
        runs: Bench.pick(bench, 3, 15),
        warmup: 1
      )

    GenServer.stop(a)
    bench
  end

  # C writes a new key until A reads it from L2.
  defp wait_agree(a, c, i) do
    key = {:probe, i}

    unless Cache.put(c, key, i) == :ok and Cache.get(a, key) == i do
      Process.sleep(1)
      wait_agree(a, c, i + 1)
    end
  end

  defp wait_until(fun) do
    unless fun.(), do: wait_until(fun)
  end

  defp wait_subscribed(a, b) do
    seen = Cache.stats(b).invalidations
    :ok = Cache.delete(a, :probe)
    Process.sleep(20)
    if Cache.stats(b).invalidations == seen, do: wait_subscribed(a, b)
  end

  defp wait_invalidation(b, seen) do
    if Cache.stats(b).invalidations == seen, do: wait_invalidation(b, seen)
  end
end

Larder.CacheBench.run(System.argv())
