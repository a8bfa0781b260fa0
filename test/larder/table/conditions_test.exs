defmodule Larder.Table.ConditionsTest do
  # Larder.Table.Conditions: a search's conditions (a map or a list of
  # {index, value}, {:in, values} for alternatives) as one Larder.Index
  # expression; any other shape, or a name without an index, an
  # ArgumentError that says which.
  use ExUnit.Case, async: true

  alias Larder.Table
  alias Larder.Table.Conditions
  alias Larder.Test.PropEr

  defp catalogue_like do
    Table.new(
      key: :idx,
      index: [:offering_id, :spec, {:char, fn r -> Enum.map(r.chars, &{&1.char, &1.value}) end}]
    )
  end

  test "a condition on a field without an index names it and lists the indexed ones" do
    table = catalogue_like()

    assert_raise ArgumentError,
                 ~r/no index named :group_id.*\[:offering_id, :spec, :char\]/,
                 fn ->
                   Table.search(table, group_id: "g1")
                 end

    assert_raise ArgumentError, ~r/no index named :nope/, fn ->
      Table.count(table, %{nope: 1})
    end

    assert_raise ArgumentError, ~r/each condition/, fn -> Table.search(table, [:spec]) end
  end

  test "expr!/2: an :and of one term per condition; {:in, values} an :or" do
    table = Table.new(key: :id, index: [:a, :b])
    assert Conditions.expr!(table, a: 1, b: 2) == {:and, [a: 1, b: 2]}
    assert Conditions.expr!(table, %{a: 1}) == {:and, [a: 1]}
    assert Conditions.expr!(table, a: {:in, [1, 2]}) == {:and, [{:or, [a: 1, a: 2]}]}
    assert Conditions.expr!(table, a: {:in, []}) == {:and, [{:or, []}]}
    # A value of any shape is a term to look for, {:in, _} with a list aside.
    assert Conditions.expr!(table, a: {:in, :x}) == {:and, [a: {:in, :x}]}
    assert Conditions.expr!(table, []) == {:and, []}
    assert Conditions.empty?([]) and Conditions.empty?(%{})
    refute Conditions.empty?(a: 1)
  end

  test "exprs!/2 compiles each search in order; anything but a list raises" do
    table = Table.new(key: :id, index: [:a])
    assert Conditions.exprs!(table, [[a: 1], %{a: 2}]) == [{:and, [a: 1]}, {:and, [a: 2]}]

    assert_raise ArgumentError, ~r/searches must be a list/, fn ->
      Conditions.exprs!(table, :x)
    end

    assert_raise ArgumentError, ~r/searches must be a list/, fn ->
      Conditions.exprs!(table, [[a: 1] | :x])
    end
  end

  test "bad shapes raise ArgumentError naming what was given" do
    table = Table.new(key: :id, index: [:a])

    for {conditions, message} <- [
          {:a, ~r/conditions must be a map or a list/},
          {[{:a, 1} | :tail], ~r/conditions must be a map or a list/},
          {[{:a, 1, 2}], ~r/each condition must be \{index, value\}/},
          {[a: {:in, [1 | 2]}], ~r/\{:in, values\} for :a in conditions needs a list/},
          {[b: 1], ~r/no index named :b in conditions; indexed fields: \[:a\]/}
        ] do
      assert_raise ArgumentError, message, fn -> Conditions.expr!(table, conditions) end
    end
  end

  test "property: any term as conditions compiles or raises ArgumentError, nothing else" do
    table = Table.new(key: :id, index: [:a, :b])
    name = :proper_types.oneof([:a, :b, :c, :proper_types.any()])

    value =
      :proper_types.oneof([:proper_types.any(), {:in, :proper_types.list(:proper_types.any())}])

    condition = :proper_types.oneof([{name, value}, :proper_types.any()])

    gen =
      :proper_types.oneof([
        :proper_types.list(condition),
        :proper_types.bind(:proper_types.list({name, value}), &Map.new/1, false),
        Larder.Test.Hostile.term()
      ])

    PropEr.check(
      PropEr.forall(gen, fn conditions ->
        conditions = Larder.Test.Hostile.build(conditions)

        try do
          match?({:and, list} when is_list(list), Conditions.expr!(table, conditions))
        rescue
          ArgumentError -> true
        end
      end),
      max_size: 20
    )
  end
end
