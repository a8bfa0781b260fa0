defmodule Larder.Table.RequestsTest do
  # The caller's side of a table's writer, as Larder.Table and a replica's
  # Table target use it: insert!/3 takes records already checked and writes
  # them in chunks, a later record of a key replacing an earlier one; an index
  # function that fails names the public call and what was written.
  use ExUnit.Case, async: true

  alias Larder.Table
  alias Larder.Table.Requests

  test "insert!/3 writes checked records in chunks, later records replacing earlier ones" do
    table = Table.new(key: :id, index: [:v])
    records = for(i <- 1..12_000, do: %{id: i, v: rem(i, 3)}) ++ [%{id: 5, v: :last}]

    assert Requests.insert!(table, records, "insert_many/2") == :ok
    assert Table.size(table) == 12_000
    assert Table.get(table, 5) == %{id: 5, v: :last}
    assert Table.count(table, v: 2) == 4_000 - 1
    assert Table.search_keys(table, v: :last) == [5]
  end

  test "insert!/3 on a dropped table raises the table's unknown error" do
    table = Table.new(key: :id)
    Table.drop(table)

    assert_raise ArgumentError, ~r/unknown Larder.Table/, fn ->
      Requests.insert!(table, [%{id: 1}], "insert_many/2")
    end
  end

  test "an index function that fails: the chunks before it are written, and the error says so" do
    table =
      Table.new(key: :id, index: [{:bad, fn %{id: id} -> if id == 6_000, do: raise("no") end}])

    records = for i <- 1..7_000, do: %{id: i}

    error =
      assert_raise ArgumentError, fn -> Requests.insert!(table, records, "insert_many/2") end

    assert error.message =~ "insert_many/2"
    assert error.message =~ "its first 5000 records were written"
    assert Table.size(table) == 5_000
  end
end
