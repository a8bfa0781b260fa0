defmodule Larder.SnapshotFileTest do
  # Larder.SnapshotFile: a whole file read in the caller; a write that is
  # atomic (a temporary file renamed over the target) and durable (the file
  # and then its directory fsynced), that leaves no temporary file when it
  # fails, raises or is killed (the next write of the path sweeps what a
  # killed one left, and only that); and delete_siblings/2. Most of it is
  # seen through Larder.Bag.dump/2, a writer of such files.
  use ExUnit.Case, async: true

  # Each load logs a line at info (checked in Larder.Bag.SnapshotTest).
  @moduletag :capture_log

  alias Larder.Bag
  alias Larder.SnapshotFile

  defp tmp_path(context) do
    dir =
      Path.join(System.tmp_dir!(), "larder_snapfile_test_#{System.unique_integer([:positive])}")

    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf!(dir) end)
    Path.join(dir, "#{context.test}.bag" |> String.replace(~r/[^\w.]+/, "_"))
  end

  describe "read/1" do
    test "reads a whole file; a missing one is a file_error naming the path", context do
      path = tmp_path(context)
      data = :crypto.strong_rand_bytes(200_000)
      File.write!(path, data)
      assert SnapshotFile.read(path) == {:ok, data}
      File.write!(path, "")
      assert SnapshotFile.read(path) == {:ok, ""}

      missing = path <> ".missing"

      assert {:error,
              %Larder.Error{reason: :file_error, details: %{path: ^missing, posix: :enoent}}} =
               SnapshotFile.read(missing)

      assert {:error, %Larder.Error{details: %{posix: :eisdir}}} =
               SnapshotFile.read(Path.dirname(path))
    end

    test "the bytes are read in the caller, not by the file server", context do
      path = tmp_path(context)
      File.write!(path, :crypto.strong_rand_bytes(100_000))
      server = Process.whereis(:file_server_2)
      me = self()
      :erlang.trace(server, true, [:receive])

      try do
        assert {:ok, _} = SnapshotFile.read(path)
        # (Other tests, run meanwhile, may call the server: only this
        # process's calls count.)
        refute_received {:trace, ^server, :receive, {:"$gen_call", {^me, _}, _}}
      after
        :erlang.trace(server, false, [:receive])
      end
    end
  end

  describe "write/3" do
    test "writes what the function appends, renames it over the path, leaves nothing else",
         context do
      path = tmp_path(context)
      File.write!(path, "old")

      assert SnapshotFile.write(path, "test", fn append ->
               :ok = append.("new ")
               append.(["io", ?d, "ata"])
             end) == :ok

      assert File.read!(path) == "new iodata"
      assert File.ls!(Path.dirname(path)) == [Path.basename(path)]
    end

    test "an error or a raise in the function leaves the old file and no temporary one",
         context do
      path = tmp_path(context)
      File.write!(path, "old")
      error = {:error, Larder.Error.new(:file_error, "refused")}

      assert SnapshotFile.write(path, "test", fn append ->
               :ok = append.("partial")
               error
             end) == error

      assert_raise RuntimeError, "boom", fn ->
        SnapshotFile.write(path, "test", fn append ->
          :ok = append.("partial")
          raise "boom"
        end)
      end

      catch_throw(SnapshotFile.write(path, "test", fn _ -> throw(:away) end))
      assert File.read!(path) == "old"
      assert File.ls!(Path.dirname(path)) == [Path.basename(path)]
    end

    test "a directory that is not there is a file_error; nothing is created", context do
      path = Path.join([tmp_path(context) <> ".d", "sub", "file"])

      assert {:error, %Larder.Error{reason: :file_error, details: %{path: ^path}}} =
               SnapshotFile.write(path, "test", fn append -> append.("x") end)

      refute File.exists?(Path.dirname(path))
    end
  end

  test "delete_siblings/2 deletes the files named <basename>.<suffix> the function picks",
       context do
    path = tmp_path(context)
    dir = Path.dirname(path)
    base = Path.basename(path)

    for name <- [base, base <> ".a", base <> ".b", base <> "x.a", "other.a"],
        do: File.write!(Path.join(dir, name), "")

    assert SnapshotFile.delete_siblings(path, &(&1 == "a")) == :ok
    assert Enum.sort(File.ls!(dir)) == Enum.sort([base, base <> ".b", base <> "x.a", "other.a"])
    # A directory that cannot be listed is left alone.
    assert SnapshotFile.delete_siblings(Path.join([dir, "none", "x"]), fn _ -> true end) == :ok
  end

  describe "durable dumps" do
    test "sync_dir/1 fsyncs a directory and reports a missing one as a Larder.Error",
         context do
      dir = Path.dirname(tmp_path(context))
      assert Larder.SnapshotFile.sync_dir(dir) == :ok

      File.rm_rf!(dir)

      assert {:error, %Larder.Error{reason: :file_error, details: %{posix: :enoent}}} =
               Larder.SnapshotFile.sync_dir(dir)

      assert {:error, %Larder.Error{reason: :file_error, details: %{posix: :enotdir}}} =
               Larder.SnapshotFile.sync_dir(Path.join(File.cwd!(), "mix.exs"))
    end

    test "a synced dump loads back; a dump into a removed directory leaves nothing", context do
      path = tmp_path(context)
      bag = Bag.new()
      Bag.insert_many(bag, for(k <- 1..50, v <- 1..50, do: {k, v}))
      assert Bag.dump(bag, path) == :ok
      assert Bag.size(Bag.load!(path)) == 2_500
      assert File.ls!(Path.dirname(path)) == [Path.basename(path)]

      File.rm_rf!(Path.dirname(path))
      assert {:error, %Larder.Error{reason: :file_error}} = Bag.dump(bag, path)
      refute File.exists?(Path.dirname(path))
    end

    # A dump killed mid-write (its temporary file already has bytes, the
    # rename not done) leaves the file; the next dump of the path deletes it.
    test "a dump killed mid-write leaves no temporary file past the next dump", context do
      path = tmp_path(context)
      dir = Path.dirname(path)
      bag = Bag.new(dedup: false)
      Bag.insert_many(bag, for(k <- 1..150_000, do: {k, {k, "padding to make the file larger"}}))

      left =
        for _round <- 1..6 do
          {pid, ref} = spawn_monitor(fn -> Bag.dump(bag, path) end)
          wait_for_bytes(dir, pid)
          for _ <- 1..:rand.uniform(200), do: :erlang.yield()
          Process.exit(pid, :kill)
          assert_receive {:DOWN, ^ref, :process, ^pid, _}
          left = temp_files(dir)

          assert Bag.dump(Bag.new(), path) == :ok
          assert temp_files(dir) == []
          assert Bag.size(Bag.load!(path)) == 0
          length(left)
        end

      # The kills did land mid-write.
      assert Enum.sum(left) > 0
    end

    test "concurrent dumps of one path all succeed and leave no temporary file", context do
      path = tmp_path(context)
      bag = Bag.new()
      Bag.insert_many(bag, for(k <- 1..2_000, do: {k, k}))

      for _round <- 1..30 do
        tasks = for _ <- 1..3, do: Task.async(fn -> Bag.dump(bag, path) end)
        assert Enum.map(tasks, &Task.await(&1, 60_000)) == [:ok, :ok, :ok]
        assert temp_files(Path.dirname(path)) == []
        assert Bag.size(Bag.load!(path)) == 2_000
      end
    end

    test "a dump deletes the temporary files of its path whose writers are gone", context do
      path = tmp_path(context)
      dir = Path.dirname(path)
      token = "0123456789abcdef"
      # An OS process that has exited, and one still running.
      {dead, 0} = System.cmd("sh", ["-c", "echo $$"])
      dead = String.trim(dead)
      live = Port.open({:spawn_executable, System.find_executable("sleep")}, args: ["60"])
      {:os_pid, live_pid} = Port.info(live, :os_pid)
      [{:token, mine}] = :ets.lookup(Larder.SnapshotFile, :token)
      n = System.unique_integer([:positive])

      stale = [
        "#{path}.#{dead}.#{token}-1.tmp",
        # A previous VM with this VM's OS pid.
        "#{path}.#{System.pid()}.#{token}-2.tmp",
        # This VM, a number no live dump holds.
        "#{path}.#{System.pid()}.#{mine}-#{n}.tmp"
      ]

      kept = [
        "#{path}.#{live_pid}.#{token}-3.tmp",
        # Other paths' files, and names that are not a dump's.
        "#{path}x.#{dead}.#{token}-4.tmp",
        "#{path}.1.#{dead}.#{token}-5.tmp",
        "#{path}.#{dead}.#{token}-6.tmp.keep",
        "#{path}.tmp-7"
      ]

      for file <- stale ++ kept, do: File.write!(file, "x")
      assert Bag.dump(Bag.new(), path) == :ok
      Port.close(live)

      assert Enum.sort(File.ls!(dir)) ==
               Enum.sort([Path.basename(path) | Enum.map(kept, &Path.basename/1)])
    end

    # Seen by the kernel: fsync of the temporary file before the rename, then
    # fsync of the directory. Needs strace and ptrace rights; skipped otherwise.
    @tag :strace
    test "dump fsyncs the file, renames it, then fsyncs the directory", context do
      strace = System.find_executable("strace")
      path = tmp_path(context)
      trace = Path.join(System.tmp_dir!(), "larder_strace_#{System.unique_integer([:positive])}")
      on_exit(fn -> File.rm(trace) end)

      if strace == nil do
        IO.puts("skipped: strace is not installed")
      else
        port =
          Port.open({:spawn_executable, strace}, [
            :binary,
            :stderr_to_stdout,
            :exit_status,
            args: ~w(-f -e trace=openat,fsync,fdatasync,rename -o #{trace} -p #{System.pid()})
          ])

        {:os_pid, os_pid} = Port.info(port, :os_pid)
        on_exit(fn -> System.cmd("kill", [to_string(os_pid)], stderr_to_stdout: true) end)
        marker = path <> ".marker"
        threads = length(File.ls!("/proc/#{System.pid()}/task"))

        if all_attached?(port, threads, "") and attached?(marker, trace, 2_000) do
          bag = Bag.new()
          Bag.insert(bag, :a, 1)
          assert Bag.dump(bag, path) == :ok
          # The dump's syscalls are in the trace once a later marker is.
          assert attached?(marker <> "2", trace, 2_000)
          System.cmd("kill", [to_string(os_pid)])

          calls =
            trace
            |> File.read!()
            |> String.split("\n")
            |> Enum.filter(&(&1 =~ Path.dirname(path) or &1 =~ ~r/fd?a?t?a?sync\(/))

          assert_order(calls, path)
        else
          IO.puts("skipped: strace cannot attach to this VM")
        end
      end
    end
  end

  defp temp_files(dir), do: dir |> File.ls!() |> Enum.filter(&String.ends_with?(&1, ".tmp"))

  # Waits until a temporary file in `dir` has bytes while `pid` still runs.
  defp wait_for_bytes(dir, pid) do
    has_bytes? =
      Enum.any?(temp_files(dir), fn name ->
        match?({:ok, %{size: size}} when size > 0, File.stat(Path.join(dir, name)))
      end)

    cond do
      has_bytes? -> :ok
      Process.alive?(pid) -> Process.sleep(1) && wait_for_bytes(dir, pid)
      true -> flunk("the dump ended before its temporary file had bytes")
    end
  end

  # Whether strace reports every thread of the VM attached ("Process N
  # attached with T threads", or one line per thread).
  defp all_attached?(port, threads, seen) do
    if seen =~ "attached with" or length(String.split(seen, " attached")) > threads do
      true
    else
      receive do
        {^port, {:data, data}} -> all_attached?(port, threads, seen <> data)
        {^port, {:exit_status, _}} -> false
      after
        5_000 -> false
      end
    end
  end

  # Opens `marker` (which does not exist) until its openat shows up in the
  # strace output, proving the tracer is attached.
  defp attached?(marker, trace, tries) do
    File.read(marker)

    cond do
      File.exists?(trace) and File.read!(trace) =~ marker -> true
      tries == 0 -> false
      true -> Process.sleep(1) || attached?(marker, trace, tries - 1)
    end
  end

  # The trace holds, in this order: the temporary file's open, an fsync, the
  # rename over `path`, the directory's open, an fsync.
  defp assert_order(calls, path) do
    dir = Regex.escape(Path.dirname(path))
    tmp = Regex.escape(path) <> "\\.\\d+\\.[0-9a-f]{16}-\\d+\\.tmp\""

    kinds =
      Enum.flat_map(calls, fn line ->
        cond do
          line =~ ~r/rename\(\"#{tmp}, \"#{Regex.escape(path)}\"/ -> [:rename]
          line =~ ~r/openat\(.*\"#{tmp}/ -> [:open_tmp]
          line =~ ~r/openat\(.*\"#{dir}\", O_RDONLY\|O_DIRECTORY/ -> [:open_dir]
          line =~ ~r/ f(data)?sync\(/ -> [:fsync]
          true -> []
        end
      end)

    expected = [:open_tmp, :fsync, :rename, :open_dir, :fsync]
    assert subsequence?(expected, kinds), inspect(calls, pretty: true)
  end

  defp subsequence?([], _), do: true

  defp subsequence?(_, []), do: false

  defp subsequence?([x | want], [x | got]), do: subsequence?(want, got)

  defp subsequence?(want, [_ | got]), do: subsequence?(want, got)
end
