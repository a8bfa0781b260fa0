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

  test "Logger.put_application_level(:larder, :warning) turns them off", ctx do
    Logger.put_application_level(:larder, :warning)
    on_exit(fn -> Logger.delete_application_level(:larder) end)

    out = run(ctx.opts, fn -> :ok = Replica.await(ctx.opts[:name], :latest, 10_000) end)
    refute out =~ "caught up"
  end
end
