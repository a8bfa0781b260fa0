defmodule Larder.Bag.SnapshotTest do
  # The log line of Larder.Bag.load/2 (written by Larder.Bag.Snapshot).
  # Not async: one test turns :larder's log level down, which would hide
  # other tests' lines meanwhile.
  use ExUnit.Case, async: false

  import ExUnit.CaptureLog

  alias Larder.Bag

  @moduletag :tmp_dir

  defp dumped(dir, file, pairs) do
    bag = Bag.new()
    :ok = Bag.insert_many(bag, pairs)
    path = Path.join(dir, file)
    :ok = Bag.dump(bag, path)
    :ok = Bag.drop(bag)
    path
  end

  test "a load logs one line at info: the bag, the path, its pairs, the file's bytes and the time",
       %{tmp_dir: dir} = ctx do
    path = dumped(dir, "roles.bag", for(k <- 1..100, v <- 1..3, do: {k, v}))
    bytes = File.stat!(path).size

    log = capture_log(fn -> {:ok, _} = Bag.load(path, name: ctx.test) end)
    assert [line] = String.split(log, "\n", trim: true)

    assert line =~
             ~r/\[info\] +Larder.Bag #{Regex.escape(inspect(ctx.test))} loaded from #{Regex.escape(inspect(path))}: 300 pairs, #{bytes} bytes, in \d+\.\d ms$/

    # Without a name, the handle; one pair is "1 pair".
    path = dumped(dir, "one.bag", [{:k, :v}])
    log = capture_log(fn -> {:ok, _} = Bag.load(path) end)
    assert log =~ ~r/#Larder.Bag<dedup: true> loaded from .*: 1 pair, \d+ bytes, in/

    # A failed load logs nothing.
    File.write!(path, "junk")
    assert capture_log(fn -> {:error, _} = Bag.load(path) end) == ""
  end

  test "Logger.put_application_level(:larder, :warning) turns it off", %{tmp_dir: dir} do
    path = dumped(dir, "quiet.bag", [{1, 2}])

    Logger.put_application_level(:larder, :warning)
    on_exit(fn -> Logger.delete_application_level(:larder) end)
    assert capture_log(fn -> {:ok, _} = Bag.load(path) end) == ""

    Logger.delete_application_level(:larder)
    assert capture_log(fn -> {:ok, _} = Bag.load(path) end) =~ "loaded from"
  end
end
