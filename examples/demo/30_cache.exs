# Larder.Cache in `make demo`: a large term read through Redis + binary_to_term
# (what a service without an L1 pays), an L1 hit and a repeat hit by the same
# process; local-only when redis-server is not installed.
Code.require_file("../../test/support/redis_server.ex", __DIR__)

defmodule Larder.Demo.Cache do
  alias Larder.Bench
  alias Larder.Test.RedisServer

  @title "Larder.Cache: a term of 60k small maps"

  def run do
    bench = Bench.start("Larder.Cache (ETS L1 + Redis L2)", ["--quick"])

    # the same term as bench/cache_bench.exs: ~8.7 MB raw, ~1.2 MB compressed
    term =
      for i <- 1..60_000 do
        %{
          id: i,
          sku: "SKU-#{Integer.to_string(i, 36)}",
          price: rem(i * 7919, 100_000),
          stock: rem(i * 31, 977),
          name: "item #{rem(i * 131, 10_007)}",
          tags: [rem(i, 7), rem(i, 11)],
          category: "category-#{rem(i, 20)}",
          warehouse: "warehouse-#{rem(i, 5)}"
        }
      end

    if RedisServer.available?() do
      redis = RedisServer.start()

      try do
        with_redis(bench, term, redis)
      after
        RedisServer.stop(redis)
      end
    else
      IO.puts("redis-server is not installed: Redis was skipped, showing the local-only cache.")
      local_only(bench, term)
    end
  end

  defp with_redis(bench, term, redis) do
    l2 = {Larder.Cache.Redis, port: redis.port}

    plain =
      start(:demo_cache_plain, l2: l2, compression_level: 6, local_copy_min_bytes: :infinity)

    local = start(:demo_cache_local, l2: l2, compression_level: 6, namespace: "demo-local")
    :ok = Larder.Cache.put(plain, :catalogue, term)
    :ok = Larder.Cache.put(local, :catalogue, term)
    {:ok, client} = :eredis.start_link(~c"127.0.0.1", redis.port)
    bin = :erlang.term_to_binary(term, compressed: 6)
    {:ok, _} = :eredis.q(client, ["SET", "demo:catalogue", bin])

    bench =
      bench
      |> Bench.table(@title, ["Redis GET + binary_to_term", "L1 hit", "repeat hit, same process"])
      |> Bench.row(
        "read it (#{Float.round(byte_size(bin) / 1_000_000, 2)} MB in Redis)",
        %{
          "Redis GET + binary_to_term" => fn ->
            {:ok, got} = :eredis.q(client, ["GET", "demo:catalogue"], 10_000)
            :erlang.binary_to_term(got, [:safe])
          end,
          "L1 hit" => fn -> Larder.Cache.fetch!(plain, :catalogue, &no_load/0) end,
          "repeat hit, same process" => fn ->
            Larder.Cache.fetch!(local, :catalogue, &no_load/0)
          end
        },
        runs: 5
      )

    :eredis.stop(client)
    Enum.each([plain, local], &GenServer.stop/1)

    speedup = fn col ->
      1 /
        Bench.ratio(
          bench,
          @title,
          "read it (#{Float.round(byte_size(bin) / 1_000_000, 2)} MB in Redis)",
          col
        )
    end

    IO.puts(
      "L1 hit: #{Bench.fmt_ratio(speedup.("L1 hit"))}x faster than Redis + binary_to_term; " <>
        "repeat hit: #{Bench.fmt_ratio(speedup.("repeat hit, same process"))}x"
    )
  end

  defp local_only(bench, term) do
    plain = start(:demo_cache_plain, local_copy_min_bytes: :infinity)
    local = start(:demo_cache_local, [])
    :ok = Larder.Cache.put(plain, :catalogue, term)
    :ok = Larder.Cache.put(local, :catalogue, term)
    bin = :erlang.term_to_binary(term, compressed: 6)

    bench
    |> Bench.table(@title, ["binary_to_term (no Redis)", "L1 hit", "repeat hit, same process"])
    |> Bench.row(
      "read it",
      %{
        "binary_to_term (no Redis)" => fn -> :erlang.binary_to_term(bin, [:safe]) end,
        "L1 hit" => fn -> Larder.Cache.fetch!(plain, :catalogue, &no_load/0) end,
        "repeat hit, same process" => fn -> Larder.Cache.fetch!(local, :catalogue, &no_load/0) end
      },
      runs: 5
    )

    Enum.each([plain, local], &GenServer.stop/1)
  end

  defp start(name, opts) do
    {:ok, pid} = Larder.Cache.start_link([name: name] ++ opts)
    Process.unlink(pid)
    name
  end

  defp no_load, do: raise("not loaded in the demo")
end

Larder.Demo.Cache.run()
