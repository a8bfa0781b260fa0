# Larder.Cache in `make demo`: a large term read through Redis + binary_to_term
# (what a service without an L1 pays), an L1 hit and a repeat hit by the same
# process; local-only when redis-server is not installed.

defmodule Larder.Demo.Cache do
  alias Larder.Bench
  alias Larder.Cache
  alias Larder.Test.RedisServer

  @title "Larder.Cache: a term of 60k small maps"

  def run do
    bench = Bench.start("Larder.Cache (ETS L1 + Redis L2)", ["--quick"])
    redis = if RedisServer.available?(), do: RedisServer.start()

    unless redis do
      IO.puts("redis-server is not installed: Redis was skipped, showing the local-only cache.")
    end

    l2 = if redis, do: [l2: {Cache.Redis, port: redis.port}], else: []
    # one cache copies the term out of ETS on every hit; the other lets the
    # reading process keep its copy while the value is unchanged
    plain =
      start(:demo_cache_plain, l2 ++ [compression_level: 6, local_copy_min_bytes: :infinity])

    local = start(:demo_cache_local, l2 ++ [compression_level: 6, namespace: "demo-local"])

    try do
      bin = Task.await(Task.async(fn -> store(plain, local) end), 60_000)
      anchor = anchor(redis, bin)
      # repeat hits run in a process of their own that keeps its copy; in
      # this one, the copy would weigh on the other columns' collections
      reader =
        Larder.Bench.Cache.start_reader(fn -> Cache.fetch!(local, :catalogue, &no_load/0) end)

      label = "read it (#{Float.round(byte_size(bin) / 1_000_000, 2)} MB compressed)"

      bench =
        bench
        |> Bench.table(@title, [elem(anchor, 0), "L1 hit", "repeat hit, same process"])
        |> Bench.row(
          label,
          %{
            elem(anchor, 0) => elem(anchor, 1),
            "L1 hit" => fn -> Cache.fetch!(plain, :catalogue, &no_load/0) end,
            "repeat hit, same process" => fn -> Larder.Bench.Cache.ask(reader) end
          },
          runs: 5,
          interleave: true
        )

      Larder.Bench.Cache.stop_reader(reader)
      elem(anchor, 2).()
      speedup = fn col -> 1 / Bench.ratio(bench, @title, label, col) end

      IO.puts(
        "L1 hit: #{Bench.fmt_ratio(speedup.("L1 hit"))}x faster than #{elem(anchor, 0)}; " <>
          "repeat hit: #{Bench.fmt_ratio(speedup.("repeat hit, same process"))}x"
      )
    after
      Enum.each([plain, local], &GenServer.stop/1)
      if redis, do: RedisServer.stop(redis)
    end
  end

  defp store(plain, local) do
    term = Larder.Bench.Cache.large_term()
    :ok = Cache.put(plain, :catalogue, term)
    :ok = Cache.put(local, :catalogue, term)
    :erlang.term_to_binary(term, compressed: 6)
  end

  defp anchor(nil, bin) do
    {"binary_to_term (no Redis)", fn -> :erlang.binary_to_term(bin, [:safe]) end, fn -> :ok end}
  end

  defp anchor(redis, bin) do
    {:ok, client} = Larder.Redis.Connection.start_link(~c"127.0.0.1", redis.port)
    {:ok, _} = Larder.Redis.Connection.q(client, ["SET", "demo:catalogue", bin], 10_000)

    {"Redis GET + binary_to_term",
     fn ->
       {:ok, got} = Larder.Redis.Connection.q(client, ["GET", "demo:catalogue"], 10_000)
       :erlang.binary_to_term(got, [:safe])
     end, fn -> GenServer.stop(client) end}
  end

  defp start(name, opts) do
    {:ok, pid} = Cache.start_link([name: name] ++ opts)
    Process.unlink(pid)
    name
  end

  defp no_load, do: raise("not loaded in the demo")
end

Task.await(Task.async(&Larder.Demo.Cache.run/0), :infinity)
