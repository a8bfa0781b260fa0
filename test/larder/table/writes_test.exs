defmodule Larder.Table.WritesTest do
  # Larder.Table.Writes, what the writer does for each write: row ids for
  # keys that are not ones (reused once freed, never two keys on one id),
  # an exhausted id space failing a chunk whole, update/4's default.
  use ExUnit.Case, async: true

  import Larder.Test.TableCheck

  alias Larder.Table

  @direct_limit 0x80000000

  test "ids of deleted records are reused, so distinct keys do not exhaust them" do
    table = table()

    for i <- 1..20_000 do
      :ok = Table.insert(table, %{id: "key #{i}", a: i, tags: []})
      :ok = Table.delete(table, "key #{i}")
    end

    state = :sys.get_state(table.writer)
    assert state.next - @direct_limit <= 1
    assert Table.size(table) == 0
  end

  test "an exhausted id space fails the insert whole, and deletes make room" do
    table = table()
    # Four ids left for non-integer keys: the writer's next fresh id is
    # moved to four below the end of the u32 id space.
    :sys.replace_state(table.writer, &%{&1 | next: 0xFFFFFFFF - 3})

    for round <- 1..50 do
      :ok = Table.insert_many(table, for(i <- 1..4, do: %{id: {round, i}, a: i, tags: []}))

      assert_raise ArgumentError, ~r/out of row ids/, fn ->
        Table.insert_many(table, [
          %{id: 1, a: 9, tags: []},
          %{id: {:extra, round}, a: 9, tags: []}
        ])
      end

      # Nothing of the failed chunk was written, not even its integer key.
      assert Table.get(table, 1) == nil
      assert Table.search_keys(table, a: 9) == []
      for i <- 1..4, do: :ok = Table.delete(table, {round, i})
    end

    assert Table.size(table) == 0
  end

  test "get/3 never answers with a record of another key whose row took the id" do
    table = table()
    :ok = Table.insert(table, %{id: "a", a: 1, tags: []})
    :ok = Table.delete(table, "a")
    :ok = Table.insert(table, %{id: "b", a: 2, tags: []})
    assert Table.get(table, "a") == nil
    assert Table.get(table, "b").a == 2
  end

  test "an absent key takes the default as it is, as Map.update/4 does" do
    table = table()
    default = %{id: "k", a: 10, tags: [:new]}
    # A function that cannot take the default: it must not run on it.
    fun = fn %{a: n, tags: []} = r -> %{r | a: n + 1} end

    :ok = Table.update(table, "k", default, fun)
    assert Table.get(table, "k") == Map.update(%{}, "k", default, fun)["k"]
    assert Table.search_keys(table, m: :new) == ["k"]

    {:ok, _} = Table.merge(table, "k", %{tags: []})
    :ok = Table.update(table, "k", default, fun)
    assert Table.get(table, "k") == %{id: "k", a: 11, tags: []}
    assert consistent?(table, [10, 11, :new])
  end

  test "merge/3 re-indexes only what changed, and a delete frees the record's terms" do
    table = table()
    :ok = Table.insert(table, %{id: 1, a: 1, tags: [:x, :y]})
    {:ok, %{tags: [:y, :z]}} = Table.merge(table, 1, %{tags: [:y, :z]})
    assert Table.search_keys(table, m: :x) == []
    assert Table.search_keys(table, m: :y) == [1]
    assert Table.search_keys(table, m: :z) == [1]
    assert Table.search_keys(table, a: 1) == [1]
    assert Table.merge(table, :absent, %{a: 2}) == :error
    :ok = Table.delete(table, 1)
    assert Table.terms(table, :m) == [] and Table.terms(table, :a) == []
    assert consistent?(table, [1, :x, :y, :z])
  end
end
