defmodule Larder.Replica.ReadLoopTest do
  # The read loop every source is read by, step by step on a scripted
  # source (Larder.Test.ScriptedSource): what each reply becomes, the waits
  # after errors, one warning per outage and one line once it recovers,
  # halving on :batch_too_large (a reason, whatever the source), the
  # committed position told to each connection before its first read, and
  # a source that breaks the contract counted as an error, not a crash.
  use ExUnit.Case, async: true

  import ExUnit.CaptureLog

  alias Larder.Replica.ReadLoop
  alias Larder.Test.ScriptedSource, as: S

  @moduletag :capture_log

  # the log is global (other async tests' replicas log too): a name of
  # this module's own, and each line matched with it
  @name __MODULE__
  @failed "Larder.Replica #{inspect(@name)}: the source failed"
  @answers "Larder.Replica #{inspect(@name)}: the source answers again"

  setup do
    script = S.new()
    %{script: script, loop: ReadLoop.new(S, S.validate!(script: script), 0, 8, 50, @name)}
  end

  defp unavailable, do: Larder.Error.new(:source_unavailable, "down")

  test "connects, tells the committed position, reads; each reply classified", ctx do
    S.script(ctx.script, :read, [
      {:ok, S.entries(0, 3), 3, ctx.script},
      {:ok, [], 3, ctx.script},
      {:ok, [], 9, ctx.script},
      {:trimmed, 20, ctx.script},
      {:stop, Larder.Error.new(:partitions_changed, "no"), ctx.script}
    ])

    assert {:connected, loop} = ReadLoop.step(ctx.loop)
    assert {{:batch, [{1, _}, {2, _}, {3, _}], 3}, loop} = ReadLoop.step(loop)
    assert loop.position == 3
    assert {:empty, loop} = ReadLoop.step(loop)
    # no entries, but the position moved (a gap): a batch of none
    assert {{:batch, [], 9}, loop} = ReadLoop.step(loop)
    assert {{:trimmed, 20}, loop} = ReadLoop.step(loop)
    assert loop.position == 9
    loop = ReadLoop.resume(loop, 20)
    assert {{:stop, %Larder.Error{reason: :partitions_changed}}, _loop} = ReadLoop.step(loop)

    me = self()

    assert [
             {:connect, ^me, _},
             {:committed, ^me, [_, 0]},
             {:read, ^me, [_, 0, 8, 50]},
             {:read, ^me, [_, 3, 8, 50]},
             {:read, ^me, [_, 3, 8, 50]},
             {:read, ^me, [_, 9, 8, 50]},
             {:read, ^me, [_, 20, 8, 50]}
           ] = S.calls(ctx.script)
  end

  test "after an error: the connection closed, waits of 100 ms doubling to 1 s, " <>
         "one warning per outage and one line once the source answers",
       ctx do
    S.script(ctx.script, :connect, List.duplicate({:error, unavailable()}, 6))

    {waits, log} =
      with_log(fn ->
        Enum.map_reduce(1..6, ctx.loop, fn _, loop ->
          {{:error, %Larder.Error{reason: :source_unavailable}, wait}, loop} = ReadLoop.step(loop)
          {wait, loop}
        end)
      end)

    {waits, loop} = waits
    assert waits == [100, 200, 400, 800, 1_000, 1_000]
    assert ReadLoop.failing?(loop)
    assert length(String.split(log, @failed)) == 2

    # a read error closes the connection, still one outage
    S.script(ctx.script, :read, [{:error, unavailable(), ctx.script}])

    log =
      capture_log(fn ->
        assert {:connected, loop} = ReadLoop.step(loop)
        assert {{:error, _, 1_000}, loop} = ReadLoop.step(loop)
        refute loop.connected
        assert {:connected, loop} = ReadLoop.step(loop)
        assert {:empty, loop} = ReadLoop.step(loop)
        refute ReadLoop.failing?(loop)
        send(self(), {:loop, loop})
      end)

    refute log =~ @failed
    assert length(String.split(log, @answers)) == 2
    assert [_] = S.calls(ctx.script, :close)

    # a new outage warns again, and waits from 100 ms again
    assert_received {:loop, loop}
    S.script(ctx.script, :read, [{:error, unavailable(), ctx.script}])
    log = capture_log(fn -> assert {{:error, _, 100}, _} = ReadLoop.step(loop) end)
    assert log =~ @failed
  end

  test ":batch_too_large halves the batch, down to one entry", ctx do
    too_large = Larder.Error.new(:batch_too_large, "too large")
    S.script(ctx.script, :read, List.duplicate({:error, too_large, ctx.script}, 5))

    {counts, _log} =
      with_log(fn ->
        Enum.map_reduce(1..5, ctx.loop, fn _, loop ->
          {:connected, loop} = ReadLoop.step(loop)
          {{:error, %Larder.Error{reason: :batch_too_large}, _}, loop} = ReadLoop.step(loop)
          {loop.count, loop}
        end)
      end)

    assert elem(counts, 0) == [4, 2, 1, 1, 1]

    assert for({_pid, [_, _, count, _]} <- S.calls(ctx.script, :read), do: count) == [
             8,
             4,
             2,
             1,
             1
           ]

    # any other error leaves the batch size as it is
    loop = ReadLoop.new(S, S.validate!(script: ctx.script), 0, 8, 50, :loop)
    {:connected, loop} = ReadLoop.step(loop)
    S.script(ctx.script, :read, [{:error, Larder.Error.new(:source_bad_reply, "bad"), :conn}])
    capture_log(fn -> assert {{:error, _, _}, %{count: 8}} = ReadLoop.step(loop) end)
  end

  test "a committed position is told before the next read, and to every new connection",
       ctx do
    {:connected, loop} = ReadLoop.step(ctx.loop)
    {:empty, loop} = ReadLoop.step(loop)
    loop = ReadLoop.committed(loop, 7)
    {:empty, loop} = ReadLoop.step(loop)
    {:empty, loop} = ReadLoop.step(loop)

    # a committed position whose call fails: told again after the reconnect
    loop = ReadLoop.committed(loop, 9)
    S.script(ctx.script, :committed, [{:error, unavailable(), ctx.script}])
    {{{:error, _, _}, loop}, _log} = with_log(fn -> ReadLoop.step(loop) end)
    refute loop.connected
    {:connected, loop} = ReadLoop.step(loop)
    {:empty, _loop} = ReadLoop.step(loop)

    assert Enum.map(S.calls(ctx.script), fn {callback, _pid, args} ->
             {callback, if(callback == :committed, do: List.last(args))}
           end) == [
             {:connect, nil},
             {:committed, 0},
             {:read, nil},
             {:committed, 7},
             {:read, nil},
             {:read, nil},
             {:committed, 9},
             {:close, nil},
             {:connect, nil},
             {:committed, 9},
             {:read, nil}
           ]
  end

  test "a source without committed/2 is not asked" do
    loop = ReadLoop.new(Larder.Test.EmptySource, [], 0, 8, 10, :loop)
    assert {:connected, loop} = ReadLoop.step(loop)
    assert {:empty, _loop} = ReadLoop.step(ReadLoop.committed(loop, 3))
  end

  test "a source that raises or returns another shape fails as a value, with its connection closed",
       ctx do
    S.script(ctx.script, :connect, [fn _ -> raise "boom" end, :nonsense])
    S.script(ctx.script, :read, [fn _, _, _, _ -> exit(:gone) end, {:ok, :not_a_list}])

    capture_log(fn ->
      assert {{:error, %Larder.Error{reason: :source_failed} = raised, _}, loop} =
               ReadLoop.step(ctx.loop)

      assert raised.details.reason == {:error, %RuntimeError{message: "boom"}}
      assert {{:error, %Larder.Error{reason: :source_bad_reply}, _}, loop} = ReadLoop.step(loop)
      assert {:connected, loop} = ReadLoop.step(loop)
      assert {{:error, %Larder.Error{reason: :source_failed}, _}, loop} = ReadLoop.step(loop)
      refute loop.connected
      assert {:connected, loop} = ReadLoop.step(loop)
      assert {{:error, %Larder.Error{reason: :source_bad_reply}, _}, _loop} = ReadLoop.step(loop)
    end)

    assert length(S.calls(ctx.script, :close)) == 2
  end

  test "notify/2: armed, ready, or an error as a read's", ctx do
    loop = ReadLoop.new(S.Notifying, S.validate!(script: ctx.script), 0, 8, 0, :loop)
    assert ReadLoop.notifies?(S.Notifying)
    refute ReadLoop.notifies?(S)
    {:connected, loop} = ReadLoop.step(loop)

    S.script(ctx.script, :notify, [
      {:armed, ctx.script},
      {:ready, ctx.script},
      {:error, unavailable(), ctx.script}
    ])

    assert {:armed, loop} = ReadLoop.await_notice(loop, self())
    assert {:ready, loop} = ReadLoop.await_notice(loop, self())

    capture_log(fn ->
      assert {{:error, %Larder.Error{reason: :source_unavailable}, 100}, loop} =
               ReadLoop.await_notice(loop, self())

      refute loop.connected
    end)
  end
end
