defmodule Larder.Redis.BoundaryTest do
  # lib/larder/redis/ is the Redis client under the Cache's L2 and the
  # Replica's stream source: it names neither of them, nor their messages
  # or error reasons, and of Larder it uses only Larder.Options,
  # Larder.Error and Larder.Backoff (and itself). Checked on the source and
  # on the compiled modules' references.
  use ExUnit.Case, async: true

  @dir Path.expand("../../../lib/larder/redis", __DIR__)

  # What belongs to the layers above: their modules, the messages they
  # send each other, and their error reasons.
  @above [
    "Larder.Cache",
    "Larder.Replica",
    "larder_cache",
    "larder_replica",
    ":replica_",
    ":l2_",
    ":source_"
  ]

  defp files, do: Path.wildcard(Path.join(@dir, "**/*.ex"))

  test "no source file under lib/larder/redis/ names the Cache, the Replica or their messages" do
    assert files() != []

    for file <- files(), text = File.read!(file), name <- @above do
      refute String.contains?(text, name),
             "#{Path.relative_to_cwd(file)} names #{inspect(name)}"
    end
  end

  test "the client's modules call nothing of Larder but the client, Larder.Options, " <>
         "Larder.Error and Larder.Backoff" do
    modules = client_modules()

    # the client's pieces, each checked here
    for mod <- [
          Larder.Redis.Socket,
          Larder.Redis.Options,
          Larder.Redis.Connection,
          Larder.Redis.Pool,
          Larder.Redis.PubSub,
          Larder.Redis.Table,
          Larder.Redis.Sentinel,
          Larder.Redis.Cluster,
          Larder.Redis.ClusterRouter,
          Larder.Redis.Tracking,
          Larder.Redis.Topology,
          Larder.Redis.Topology.Server,
          Larder.Redis.Topology.Cluster
        ] do
      assert mod in modules, "#{inspect(mod)} is not under lib/larder/redis/"
    end

    for mod <- modules do
      Code.ensure_loaded!(mod)

      {:ok, {^mod, [imports: imports]}} = :beam_lib.chunks(:code.which(mod), [:imports])

      for {callee, _fun, _arity} <- imports,
          name = Atom.to_string(callee),
          String.starts_with?(name, "Elixir.Larder.") do
        assert String.starts_with?(name, "Elixir.Larder.Redis.") or
                 callee in [Larder.Options, Larder.Error, Larder.Backoff],
               "#{inspect(mod)} calls #{inspect(callee)}"
      end
    end
  end

  defp client_modules do
    for file <- files(),
        [_, name] <- Regex.scan(~r/^defmodule ([\w.]+) do/m, File.read!(file)),
        do: Module.concat([name])
  end
end
