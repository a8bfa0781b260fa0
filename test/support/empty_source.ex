# A Larder.Replica.Source whose log is empty and stays so: a replica can
# run on it with no server, for tests of its life cycle.
defmodule Larder.Test.EmptySource do
  @moduledoc false

  @behaviour Larder.Replica.Source

  @impl true
  def validate!(opts), do: Larder.Options.validate!(opts, [], inspect(__MODULE__))

  @impl true
  def identity(_opts), do: "empty"

  @impl true
  def origin(_opts), do: 0

  @impl true
  def cast_position(position) when is_integer(position) and position >= 0, do: {:ok, position}
  def cast_position(_other), do: :error

  @impl true
  def advance(_position, id), do: id

  @impl true
  def reached?(position, target), do: position >= target

  @impl true
  def connect(_opts), do: {:ok, nil}

  @impl true
  def read(conn, position, _count, block_ms) do
    receive do
    after
      min(block_ms, 50) -> {:ok, [], position, conn}
    end
  end

  @impl true
  def latest(_opts, _timeout), do: {:ok, 0}

  @impl true
  def close(_conn), do: :ok
end
