defmodule Larder.Replica.SnapshotLockTest do
  # A replica claims its :snapshot path at start: a path that cannot hold
  # snapshots (its directory missing, not a directory, not writable) is
  # refused there, and the lock file `<path>.lock` is written only when it
  # is one: a symbolic link there, or a file that is not a lock file (such
  # as another replica's manifest), is refused and left as it was.
  use ExUnit.Case, async: true

  alias Larder.Replica
  alias Larder.Test.ReplicaLog, as: Log

  import Larder.Test.RedisSetup, only: [redis_server: 1]

  @moduletag :redis
  @moduletag :capture_log

  setup_all :redis_server

  setup ctx do
    dir = Path.join(System.tmp_dir!(), "larder-replica-lock-#{Base.encode16(:rand.bytes(6))}")
    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf(dir) end)
    id = System.unique_integer([:positive])
    redis = Log.connect(ctx.server.port)
    stream = "lock-#{id}"
    Log.add(redis, stream, for(k <- 1..10, do: {:put, k, k}))

    %{dir: dir, redis: redis, stream: stream, id: id}
  end

  defp opts(ctx, i, path) do
    Log.opts(
      :"replica_lock_#{ctx.id}_#{i}",
      :"replica_lock_t#{ctx.id}_#{i}",
      ctx.server.port,
      ctx.stream,
      snapshot: path,
      snapshot_every: 86_400_000
    )
  end

  # A replica at `path` that wrote its snapshot and stopped; its manifest's bytes.
  defp snapshotted(ctx, i, path) do
    {:ok, replica} = Replica.start_link(opts(ctx, i, path))
    assert Replica.await(replica, :latest, 10_000) == :ok
    assert {:ok, offset} = Replica.dump(replica)
    :ok = Replica.drop(replica)
    {offset, File.read!(path)}
  end

  # Refused as a user sees it: an error value, no process left, the name free.
  defp refused(opts) do
    assert {:error, %Larder.Error{} = error} = Replica.start_link(opts)
    refute Process.whereis(opts[:name])
    assert_raise ArgumentError, ~r/unknown Larder.Replica/, fn -> Replica.offset(opts[:name]) end
    error
  end

  describe "the lock file" do
    test "a symbolic link there (to another replica's manifest) is refused and not followed",
         ctx do
      other = Path.join(ctx.dir, "other.snap")
      {offset, manifest} = snapshotted(ctx, 1, other)
      path = Path.join(ctx.dir, "r.snap")
      File.ln_s!(other, path <> ".lock")

      error = refused(opts(ctx, 2, path))
      assert %{reason: :file_error, details: %{option: :snapshot, posix: :eloop}} = error
      assert Exception.message(error) =~ "symbolic link"
      assert Exception.message(error) =~ path <> ".lock"

      # untouched: the link, and the other replica's manifest, which it restarts from
      assert {:ok, ^other} = File.read_link(path <> ".lock")
      assert File.read!(other) == manifest
      {:ok, replica} = Replica.start_link(opts(ctx, 1, other))
      assert Replica.offset(replica) == offset
      :ok = Replica.drop(replica)

      # a link to nothing is refused too (never created through)
      File.ln_s!(Path.join(ctx.dir, "nowhere"), Path.join(ctx.dir, "s.snap.lock"))
      assert %{details: %{posix: :eloop}} = refused(opts(ctx, 3, Path.join(ctx.dir, "s.snap")))
      refute File.exists?(Path.join(ctx.dir, "nowhere"))
    end

    test "a file there that is not a lock file is refused and left as it was", ctx do
      path = Path.join(ctx.dir, "r.snap")

      for content <- ["LARDERREP" <> :crypto.strong_rand_bytes(100), "hello\n", "12345"] do
        File.write!(path <> ".lock", content)
        error = refused(opts(ctx, 1, path))
        assert %{reason: :file_error, details: %{option: :snapshot, lock_file: lock}} = error
        assert lock == path <> ".lock"
        assert Exception.message(error) =~ "not a lock file"
        assert File.read!(path <> ".lock") == content
      end

      # a lock file a killed holder left (its note, or cut short, or empty) is reused
      for content <- ["#{System.pid()} nonode@nohost :gone\n", "123 nono", ""] do
        File.write!(path <> ".lock", content)
        {:ok, replica} = Replica.start_link(opts(ctx, 1, path))
        assert Replica.await(replica, :latest, 10_000) == :ok
        assert File.read!(path <> ".lock") =~ ~r/\A#{System.pid()} /
        :ok = Replica.drop(replica)
        refute File.exists?(path <> ".lock")
      end
    end
  end

  describe "a directory that cannot hold snapshots" do
    test "missing: refused at start, naming :snapshot and the directory", ctx do
      dir = Path.join(ctx.dir, "typo")
      error = refused(opts(ctx, 1, Path.join(dir, "r.snap")))

      assert %{reason: :file_error, details: %{option: :snapshot, dir: ^dir, posix: :enoent}} =
               error

      assert Exception.message(error) =~ "#{dir} of the :snapshot path does not exist"
      refute File.exists?(dir)
    end

    test "a file, not a directory: refused at start", ctx do
      file = Path.join(ctx.dir, "file")
      File.write!(file, "x")
      error = refused(opts(ctx, 1, Path.join(file, "r.snap")))
      assert %{reason: :file_error, details: %{option: :snapshot, dir: ^file}} = error
      assert File.read!(file) == "x"
    end

    test "not writable: refused at start", ctx do
      # /proc/self is read-only even for root (who may write a 0o555 directory)
      error = refused(opts(ctx, 1, "/proc/self/r.snap"))
      assert %{reason: :file_error, details: %{option: :snapshot, posix: :eacces}} = error
      assert Exception.message(error) =~ "not writable"

      # mode 0o555, for a user that is not root
      {uid, 0} = System.cmd("id", ["-u"])

      if String.trim(uid) != "0" do
        dir = Path.join(ctx.dir, "ro")
        File.mkdir_p!(dir)
        File.chmod!(dir, 0o555)
        on_exit(fn -> File.chmod(dir, 0o755) end)
        assert %{details: %{posix: :eacces}} = refused(opts(ctx, 2, Path.join(dir, "r.snap")))
      end
    end
  end
end
