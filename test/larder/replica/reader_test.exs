defmodule Larder.Replica.ReaderTest do
  # The reader on a scripted source (Larder.Test.ScriptedSource), with this
  # process as its server: every callback that takes the connection runs
  # in the reader, the process that connected; batches are handed over
  # with at most one more than the one being applied; a source that
  # notifies is read with no wait and then waits for its notice; a trim
  # and a stop wait for the batches before them; the committed position
  # is told between reads.
  use ExUnit.Case, async: true

  alias Larder.Replica.Reader
  alias Larder.Test.ScriptedSource, as: S

  @moduletag :capture_log

  defp start(script, extra \\ []) do
    source = Keyword.get(extra, :source, S)

    Reader.start_link(
      Keyword.merge(
        [
          source: source,
          source_opts: S.validate!(script: script),
          position: 0,
          batch_size: 10,
          block_ms: 50,
          prepare: nil,
          name: :reader_test
        ],
        extra
      )
    )
  end

  # A read of one entry after the position.
  defp one(conn, position, _count, _block),
    do: {:ok, S.entries(position, position + 1), position + 1, conn}

  defp reads(script), do: length(S.calls(script, :read))

  test "connects, reads and hands over batches in its own process, at most two unacknowledged" do
    script = S.new()
    S.script(script, :read, List.duplicate(&one/4, 5))
    reader = start(script)

    assert_receive {:replica_batch, ^reader, [{1, _}], 1}
    assert_receive {:replica_batch, ^reader, [{2, _}], 2}
    # the third is read, and held until an acknowledgement
    Larder.Test.Eventually.eventually(fn -> reads(script) == 3 end)
    refute_receive {:replica_batch, ^reader, _, _}, 200
    assert reads(script) == 3

    send(reader, :replica_ack)
    assert_receive {:replica_batch, ^reader, [{3, _}], 3}
    send(reader, :replica_ack)
    send(reader, :replica_ack)
    assert_receive {:replica_batch, ^reader, [{4, _}], 4}
    assert_receive {:replica_batch, ^reader, [{5, _}], 5}

    assert [{:connect, ^reader, _}, {:committed, ^reader, [_, 0]} | reads] = S.calls(script)
    assert Enum.all?(reads, &match?({:read, ^reader, _}, &1))
  end

  test "a prepare function runs in the reader over each batch" do
    script = S.new()
    S.script(script, :read, [fn conn, 0, _, _ -> {:ok, S.entries(0, 2), 2, conn} end])

    reader =
      start(script,
        prepare: fn entries -> {:prepared, self(), for({id, f} <- entries, do: {id, f["n"]})} end
      )

    assert_receive {:replica_batch, ^reader, prepared, 2}
    assert prepared == {:prepared, reader, [{1, 1}, {2, 2}]}
  end

  test "a notifying source is read with no wait; once empty, on its notice or after block_ms" do
    script = S.new()
    reader = start(script, source: S.Notifying, block_ms: 400)

    Larder.Test.Eventually.eventually(fn -> length(S.calls(script, :notify)) == 1 end)
    assert [{^reader, [_, 0, 10, 0]}] = S.calls(script, :read)
    assert [{^reader, [_, ^reader]}] = S.calls(script, :notify)

    # no read while waiting for the notice
    Process.sleep(100)
    assert reads(script) == 1

    send(reader, :larder_source_ready)
    Larder.Test.Eventually.eventually(fn -> length(S.calls(script, :notify)) == 2 end)
    assert reads(script) == 2

    # no notice: a read after block_ms
    Larder.Test.Eventually.eventually(fn -> reads(script) == 3 end)
    {latest, calls} = Enum.split_with(S.calls(script), &(elem(&1, 0) == :latest))
    assert Enum.all?(calls, &(elem(&1, 1) == reader))
    # the log's end for the caught-up line, asked once, by a process of its own
    assert [{:latest, asker, _}] = latest
    assert asker != reader
  end

  test "a committed position is told between two reads, at once when waiting for a notice" do
    script = S.new()
    reader = start(script, source: S.Notifying, block_ms: 60_000)
    Larder.Test.Eventually.eventually(fn -> length(S.calls(script, :notify)) == 1 end)

    send(reader, {:replica_committed, 7})
    Larder.Test.Eventually.eventually(fn -> length(S.calls(script, :notify)) == 2 end)

    # (latest/2, for the caught-up line, is asked by a process of its own)
    assert [:connect, :committed, :read, :notify, :committed, :read, :notify] =
             for({name, _pid, _args} <- S.calls(script), name != :latest, do: name)

    assert [{^reader, [_, 0]}, {^reader, [_, 7]}] = S.calls(script, :committed)
  end

  test "a trim waits for the batches before it, and reading for :replica_resume" do
    script = S.new()
    S.script(script, :read, [&one/4, fn conn, 1, _, _ -> {:trimmed, 10, conn} end])
    reader = start(script)

    assert_receive {:replica_batch, ^reader, [{1, _}], 1}
    refute_receive {:replica_trimmed, ^reader, _}, 200
    send(reader, :replica_ack)
    assert_receive {:replica_trimmed, ^reader, 10}
    Process.sleep(100)
    assert reads(script) == 2

    S.script(script, :read, [fn conn, 10, _, _ -> {:ok, S.entries(10, 11), 11, conn} end])
    send(reader, {:replica_resume, 10})
    assert_receive {:replica_batch, ^reader, [{11, _}], 11}
  end

  test "a stop waits for the batches before it; nothing is read after it" do
    script = S.new()
    error = Larder.Error.new(:partitions_changed, "no")
    S.script(script, :read, [&one/4, fn conn, 1, _, _ -> {:stop, error, conn} end])
    reader = start(script)

    assert_receive {:replica_batch, ^reader, [{1, _}], 1}
    refute_receive {:replica_source_stop, ^reader, _}, 200
    send(reader, :replica_ack)
    assert_receive {:replica_source_stop, ^reader, ^error}
    Process.sleep(200)
    assert reads(script) == 2
  end

  test "errors are reported and retried after a wait; the first read after them reports recovery" do
    script = S.new()
    down = Larder.Error.new(:source_unavailable, "down")
    S.script(script, :connect, [{:error, down}, {:error, down}])
    reader = start(script)

    assert_receive {:replica_source_error, ^reader, ^down}
    assert_receive {:replica_source_error, ^reader, ^down}
    assert_receive {:replica_source_ok, ^reader}
    assert length(S.calls(script, :connect)) == 3
    refute_received {:replica_source_error, ^reader, _}
  end
end
