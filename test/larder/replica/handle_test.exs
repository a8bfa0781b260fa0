defmodule Larder.Replica.HandleTest do
  # What a caller reads of a replica without its process: the row's
  # position, a position reached in an epoch, await/4's answer from the row
  # alone, its timeout error naming the source's last error, and a replica
  # gone.
  use ExUnit.Case, async: true

  alias Larder.Replica.Handle
  alias Larder.Test.EmptySource

  # A handle whose row belongs to a process of its own, as a replica's.
  defp handle do
    me = self()

    pid =
      spawn(fn ->
        send(me, {:handle, Handle.new(:handle_test, EmptySource, [])})
        receive do: (:stop -> :ok)
      end)

    assert_receive {:handle, handle}
    {pid, handle}
  end

  test "the position the replica wrote, read without it; nil once it is gone" do
    {pid, handle} = handle()
    assert Handle.position(handle) == nil
    # the row is protected: only its process writes it
    assert_raise ArgumentError, fn -> Handle.put_position(handle, 3, 0, :t) end

    send(pid, :stop)
    Larder.Test.Eventually.eventually(fn -> not Process.alive?(pid) end)
    assert Handle.position(handle) == nil
    assert Handle.await(handle, 1, 0, 1_000) == {:error, Handle.stopped(:noproc)}
  end

  test "reached?/4: the position, and an epoch at least the one asked" do
    assert Handle.reached?(EmptySource, {5, 0}, 5, 0)
    refute Handle.reached?(EmptySource, {4, 0}, 5, 0)
    refute Handle.reached?(EmptySource, {5, 0}, 5, 1)
    assert Handle.reached?(EmptySource, {5, 2}, 3, 1)
  end

  test "await/4 answers from the row when reached, and a timeout names the source's last error" do
    handle = Handle.new(:handle_test, EmptySource, [])
    :ok = Handle.put_position(handle, 5, 0, :t)
    assert Handle.position(handle) == {5, 0, :t}
    assert Handle.await(handle, 5, 0, 0) == :ok

    assert {:error, %Larder.Error{reason: :timeout, details: %{offset: 5, id: 9}} = plain} =
             Handle.await(handle, 9, 0, 0)

    refute Map.has_key?(plain.details, :source_error)

    down = Larder.Error.new(:source_unavailable, "Redis did not answer")
    :ok = Handle.put_source_error(handle, down)

    assert {:error, %Larder.Error{details: %{source_error: ^down}} = error} =
             Handle.await(handle, 9, 0, 0)

    assert Exception.message(error) =~ "Redis did not answer"

    :ok = Handle.put_source_error(handle, nil)
    assert {:error, %Larder.Error{details: details}} = Handle.await(handle, 9, 0, 0)
    refute Map.has_key?(details, :source_error)
  end

  test "lookup/1 of a name or pid that runs no replica is nil" do
    assert Handle.lookup(self()) == nil
    assert Handle.lookup(:no_such_replica) == nil
  end
end
