# A Larder.Replica.Source whose log is empty and stays so: a replica can
# run on it with no server, for tests of its life cycle.
defmodule Larder.Test.EmptySource do
  @moduledoc false

  @behaviour Larder.Replica.Source

  @impl true
  def validate!(opts) when is_list(opts), do: opts

  @impl true
  def identity(_opts), do: "empty"

  @impl true
  def origin(_opts), do: 0

  @impl true
  def cast_id(id) when is_integer(id) and id >= 0, do: {:ok, id}
  def cast_id(_other), do: :error

  @impl true
  def compare(a, b) when a < b, do: :lt
  def compare(a, b) when a > b, do: :gt
  def compare(_a, _b), do: :eq

  @impl true
  def connect(_opts), do: {:ok, nil}

  @impl true
  def read(conn, _after_id, _count, block_ms) do
    receive do
    after
      min(block_ms, 50) -> {:ok, [], conn}
    end
  end

  @impl true
  def last_id(_opts, _timeout), do: {:ok, 0}

  @impl true
  def close(_conn), do: :ok
end
