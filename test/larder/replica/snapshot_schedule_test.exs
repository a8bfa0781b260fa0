defmodule Larder.Replica.SnapshotScheduleTest do
  # When snapshots are written, with this process as the replica and as
  # its reader: in a process of their own or in the caller by the target's
  # dump mode, one at a time, none while a step applies a batch, none when
  # the offset has not moved, none at a position a restart cannot read on
  # from (a source's copy); the reader told of each commit once the
  # manifest names it, and of no failed one; on a stop, the running one
  # awaited and a last one written, or killed.
  use ExUnit.Case, async: true

  alias Larder.Replica.Snapshot
  alias Larder.Replica.SnapshotSchedule
  alias Larder.Replica.Target

  @moduletag :capture_log

  setup ctx do
    token = Base.encode16(:crypto.strong_rand_bytes(8), case: :lower)
    dir = Path.join(System.tmp_dir!(), "larder-schedule-#{token}")
    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf(dir) end)
    %{path: Path.join(dir, "s.snap"), name: ctx.test}
  end

  defp schedule(ctx, into, arity, extra \\ []) do
    target = Target.new!(into)
    {source, extra} = Keyword.pop(extra, :source, Larder.Test.EmptySource)

    identity = %{
      source: source,
      log: "empty",
      target: Target.identity(target, ctx.name)
    }

    schedule =
      [
        path: ctx.path,
        every: 86_400_000,
        identity: identity,
        target: target,
        arity: arity,
        name: ctx.name,
        telemetry: false,
        committed: 0
      ]
      |> Keyword.merge(extra)
      |> SnapshotSchedule.new()
      |> SnapshotSchedule.start(self())

    {schedule, target, Target.create(target), identity}
  end

  defp now(handle, offset, busy \\ false), do: %{handle: handle, offset: offset, busy: busy}

  defp caller, do: {self(), make_ref()}

  defp manifest_offset(ctx, identity) do
    case Snapshot.read(ctx.path, identity) do
      {:ok, %{offset: offset}} -> offset
      :none -> :none
    end
  end

  test "a Table: dumped by a process of its own; the reader told once the manifest names it",
       ctx do
    {s, target, table, identity} = schedule(ctx, {Larder.Table, key: :id}, 2)
    :ok = Target.write(target, table, [{:insert, %{id: 1}}])
    {pid, tag} = from = caller()

    s = SnapshotSchedule.request(s, [from], now(table, 5))
    assert %{pid: dumper} = s.running
    assert dumper != pid

    # one at a time: the next request waits for the one after
    {_, next_tag} = next = caller()
    s = SnapshotSchedule.request(s, [next], now(table, 6))
    refute_received {^next_tag, _}

    assert_receive {Snapshot, ^dumper, :ok}
    s = SnapshotSchedule.done(s, :ok, now(table, 6))
    assert_received {^tag, {:ok, 5}}
    assert_received {:replica_committed, 5}
    assert manifest_offset(ctx, identity) == 5

    # the next one began for the caller that waited
    assert %{pid: second} = s.running
    assert_receive {Snapshot, ^second, :ok}
    _s = SnapshotSchedule.done(s, :ok, now(table, 6))
    assert_received {^next_tag, {:ok, 6}}
    assert_received {:replica_committed, 6}
  end

  test "a Bag fed by an arity-2 function: dumped in the caller", ctx do
    {s, _target, bag, identity} = schedule(ctx, {Larder.Bag, []}, 2)
    {_, tag} = from = caller()
    s = SnapshotSchedule.request(s, [from], now(bag, 3))
    assert s.running == nil
    assert_received {^tag, {:ok, 3}}
    assert_received {:replica_committed, 3}
    assert manifest_offset(ctx, identity) == 3
  end

  test "not while a step applies a batch, nor when the offset has not moved", ctx do
    {s, _target, bag, _identity} = schedule(ctx, {Larder.Bag, []}, 2)
    {_, tag} = from = caller()

    s = SnapshotSchedule.request(s, [from], now(bag, 0))
    assert_received {^tag, {:ok, 0}}
    refute_received {:replica_committed, _}

    s = SnapshotSchedule.request(s, [from], now(bag, 4, true))
    refute_received {^tag, _}
    _s = SnapshotSchedule.between_batches(s, now(bag, 4))
    assert_received {^tag, {:ok, 4}}
    assert_received {:replica_committed, 4}
  end

  test "none at a position a restart cannot read on from: the timer's and dump/1's wait for " <>
         "a batch that ends at one it can; a clean stop there writes none",
       ctx do
    # positions 1 to 99 are a copy's
    source = Larder.Test.ScriptedSource.Copying

    for into <- [{Larder.Table, key: :id}, {Larder.Bag, []}] do
      File.rm_rf!(ctx.path)
      {s, _target, handle, identity} = schedule(ctx, into, 1, source: source)
      {_, tag} = from = caller()

      s = SnapshotSchedule.request(s, [from], now(handle, 5))
      s = SnapshotSchedule.timer(s, now(handle, 6))
      s = SnapshotSchedule.between_batches(s, now(handle, 99))
      assert s.running == nil
      refute_received {^tag, _}
      refute_received {:replica_committed, _}
      assert manifest_offset(ctx, identity) == :none

      # a clean stop inside the copy: none
      assert SnapshotSchedule.stop(s, now(handle, 42), true).running == nil
      assert manifest_offset(ctx, identity) == :none

      # the first batch past the copy: one snapshot, for both
      s = SnapshotSchedule.between_batches(s, now(handle, 100))

      s =
        case s.running do
          %{pid: pid} ->
            assert_receive {Larder.Replica.Snapshot, ^pid, :ok}
            SnapshotSchedule.done(s, :ok, now(handle, 101))

          nil ->
            s
        end

      assert_received {^tag, {:ok, 100}}
      assert_received {:replica_committed, 100}
      refute_received {:replica_committed, _}
      assert manifest_offset(ctx, identity) == 100
      assert s.deferred == nil
    end
  end

  test "a failed snapshot: its callers get the error, the reader is told nothing", ctx do
    ctx = %{ctx | path: Path.join([ctx.path <> ".missing", "s.snap"])}
    {s, _target, bag, _identity} = schedule(ctx, {Larder.Bag, []}, 2)
    {_, tag} = from = caller()
    _s = SnapshotSchedule.request(s, [from], now(bag, 2))
    assert_received {^tag, {:error, %Larder.Error{reason: :file_error}}}
    refute_received {:replica_committed, _}
  end

  test "no path: :no_snapshot_path, and nothing on a stop", ctx do
    {s, _target, bag, _identity} = schedule(ctx, {Larder.Bag, []}, 1, path: nil)
    {_, tag} = from = caller()
    s = SnapshotSchedule.request(s, [from], now(bag, 2))
    assert_received {^tag, {:error, %Larder.Error{reason: :no_snapshot_path}}}
    assert SnapshotSchedule.stop(s, now(bag, 2), true) == s
    refute File.exists?(ctx.path)
  end

  test "a clean stop awaits the running snapshot and writes a last one; off/1 or a crash, none",
       ctx do
    {s, _target, table, identity} = schedule(ctx, {Larder.Table, key: :id}, 1)
    s = SnapshotSchedule.request(s, [], now(table, 1))
    assert %{pid: _} = s.running
    s = SnapshotSchedule.stop(s, now(table, 2), true)
    assert s.running == nil
    assert manifest_offset(ctx, identity) == 2

    # the running one ended (killed, or done just before), and no last
    # one written (it would name 4)
    s = SnapshotSchedule.request(s, [], now(table, 3))
    %{pid: dumper} = s.running
    monitor = Process.monitor(dumper)
    s = SnapshotSchedule.stop(SnapshotSchedule.off(s), now(table, 4), false)
    assert s.running == nil
    assert_receive {:DOWN, ^monitor, :process, ^dumper, _reason}
    assert manifest_offset(ctx, identity) in [2, 3]
  end
end
