defmodule Larder.Replica.ServerLoggingTest do
  # The replica's info lines, which tell a user without a telemetry handler
  # what a boot is doing: once caught up (how many entries, how long since
  # it started), and when it starts from its snapshot. Not async: one test
  # turns Larder's info lines off for the whole VM
  # (Logger.put_application_level/2), as a user would.
  use ExUnit.Case, async: false

  import ExUnit.CaptureLog

  alias Larder.Replica
  alias Larder.Test.PartitionedSource, as: Log
  alias Larder.Test.ReplicaLog

  setup ctx do
    token = Base.encode16(:crypto.strong_rand_bytes(8), case: :lower)
    dir = Path.join(System.tmp_dir!(), "larder-server-log-#{token}")
    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf(dir) end)
    log = Log.new(2)
    Log.produce(Log, log, for(k <- 1..25, do: {:put, k, k}))

    opts = [
      name: :"#{ctx.test} r",
      into: {Larder.Table, name: :"#{ctx.test} t", key: :id},
      source: {Log, table: log, name: "the-log"},
      apply: &ReplicaLog.apply_entry/1,
      batch_size: 10,
      block_ms: 50,
      snapshot: Path.join(dir, "r.snap")
    ]

    %{opts: opts, log: log}
  end

  # Started, awaited, then dropped once the replica has met the log's end
  # (its reader's first empty read, which may come just after the await).
  defp run(opts, fun) do
    capture_log([level: :info], fn ->
      {:ok, pid} = Replica.start_link(opts)
      fun.()
      Larder.Test.Eventually.eventually(fn -> :sys.get_state(pid).caught_up == :done end)
      :ok = Replica.drop(pid)
    end)
  end

  test "one line once caught up, and one when it starts from its snapshot", ctx do
    name = ctx.opts[:name]

    first = run(ctx.opts, fn -> :ok = Replica.await(name, :latest, 10_000) end)

    assert first =~
             ~r/Larder.Replica #{Regex.escape(inspect(name))} caught up with .*"the-log": 25 entries applied in \d+ ms since it started/

    assert length(String.split(first, "entries applied")) == 2
    refute first =~ "loaded its snapshot"

    # restarted from the snapshot its drop wrote, 5 entries more
    Log.produce(Log, ctx.log, for(k <- 26..30, do: {:put, k, k}))
    again = run(ctx.opts, fn -> :ok = Replica.await(name, :latest, 10_000) end)

    assert again =~
             ~r/Larder.Replica #{Regex.escape(inspect(name))} loaded its snapshot .*r\.snap in \d+ ms; reading the log from/

    assert again =~ ~r/caught up with .*: 5 entries applied/
  end

  # A source whose first read finds nothing though the log holds entries,
  # as a Kafka poll does before the first fetch came back.
  defmodule LateSource do
    @moduledoc false
    @behaviour Larder.Replica.Source

    alias Larder.Test.PartitionedSource, as: Log

    @impl true
    def read(conn, position, count, block_ms) do
      if Process.get(:late_source_read) do
        Log.read(conn, position, count, block_ms)
      else
        Process.put(:late_source_read, true)
        {:ok, [], position, conn}
      end
    end

    @impl true
    defdelegate validate!(opts), to: Log
    @impl true
    defdelegate identity(opts), to: Log
    @impl true
    defdelegate origin(opts), to: Log
    @impl true
    defdelegate cast_position(term), to: Log
    @impl true
    defdelegate advance(position, id), to: Log
    @impl true
    defdelegate reached?(position, target), to: Log
    @impl true
    defdelegate connect(opts), to: Log
    @impl true
    defdelegate latest(opts, timeout), to: Log
    @impl true
    defdelegate close(conn), to: Log
  end

  test "a first read that finds nothing before the log's end is not caught up", ctx do
    opts =
      Keyword.update!(ctx.opts, :source, fn {_, source_opts} -> {LateSource, source_opts} end)

    out = run(opts, fn -> :ok = Replica.await(opts[:name], :latest, 10_000) end)
    assert out =~ ~r/caught up with .*"the-log": 25 entries applied/
    assert length(String.split(out, "entries applied")) == 2
  end

  test "Logger.put_application_level(:larder, :warning) turns them off", ctx do
    Logger.put_application_level(:larder, :warning)
    on_exit(fn -> Logger.delete_application_level(:larder) end)

    out = run(ctx.opts, fn -> :ok = Replica.await(ctx.opts[:name], :latest, 10_000) end)
    refute out =~ "caught up"
  end
end
