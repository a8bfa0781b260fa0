defmodule Larder.Table.IndexFailureTest do
  # Larder.Table.IndexFailure: how an index function's raise, throw or exit
  # on a record is told (the index, the key, and what it did as Elixir
  # prints it), which Larder.Table turns into its caller's ArgumentError.
  use ExUnit.Case, async: true

  alias Larder.Table
  alias Larder.Table.IndexFailure

  defp failure(kind, reason, key \\ 7) do
    %IndexFailure{index: :tags, key: key, kind: kind, reason: reason, stacktrace: []}
  end

  test "the message names the index and the key, then the banner" do
    message = Exception.message(failure(:error, %KeyError{key: :x, term: %{}}))
    assert message =~ "the index function of :tags failed on the record with key 7: "
    assert message =~ "** (KeyError) key :x not found in: %{}"
  end

  test "the banner of a raise, a throw and an exit is Elixir's" do
    assert IndexFailure.banner(failure(:error, %RuntimeError{message: "boom"})) ==
             "** (RuntimeError) boom"

    assert IndexFailure.banner(failure(:throw, :ball)) == "** (throw) :ball"
    assert IndexFailure.banner(failure(:exit, :bye)) == "** (exit) :bye"
  end

  test "a huge key is cut short in the message" do
    message = Exception.message(failure(:throw, :x, Enum.to_list(1..10_000)))
    assert byte_size(message) < 200
  end

  test "a table's caller gets it as an ArgumentError with the original's message" do
    table = Table.new(key: :id, index: [{:tags, fn %{tags: tags} -> tags end}])

    error = assert_raise ArgumentError, fn -> Table.insert(table, %{id: 1}) end

    assert error.message =~ "the index function of :tags raised on the record with key 1"
    assert error.message =~ "** (FunctionClauseError) no function clause matching"
  end
end
