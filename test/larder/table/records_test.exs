defmodule Larder.Table.RecordsTest do
  # A build's index ops (Records.write/2, terms grouped by the NIF) against a
  # plain model: a map from each term to the ids of the records that have it.
  use ExUnit.Case, async: true

  import :proper_types

  alias Larder.Table
  alias Larder.Table.Records
  alias Larder.Test.PropEr

  # Values that are equal (==) but not identical (===), a float zero of
  # either sign, nested terms, lists, binaries past 64 bytes and a bitstring.
  defp value do
    oneof([
      integer(-3, 3),
      oneof([1.0, 0.0, -0.0, 2.5]),
      oneof([:a, :b, nil]),
      oneof(["x", "y", :binary.copy("z", 100), <<1::3>>]),
      tuple([integer(0, 2), oneof([:a, "x"])]),
      list(integer(0, 2))
    ])
  end

  defp record, do: {integer(0, 300), value(), list(value())}

  defp table(test) do
    Table.new(
      name: test,
      key: :id,
      index: [:v, {:many, fn record -> record.many end}],
      store: [:id, :v]
    )
  end

  defp ids(ids) when is_binary(ids), do: for(<<id::32-little <- ids>>, do: id)

  defp model(records) do
    Enum.reduce(records, %{}, fn %{id: id, v: v, many: many}, model ->
      Enum.reduce([{:v, v} | Enum.map(many, &{:many, &1})], model, fn term, model ->
        Map.update(model, term, MapSet.new([id]), &MapSet.put(&1, id))
      end)
    end)
  end

  test "a build's ops index each record under each of its terms, once per distinct term",
       context do
    table = table(context.test)

    property =
      :proper.forall(list(record()), fn records ->
        records =
          records
          |> Enum.map(fn {id, v, many} -> %{id: id, v: v, many: many} end)
          |> Map.new(&{&1.id, &1})
          |> Map.values()
          # Two records at least (one alone is written as {:add_terms, terms, id}).
          |> Enum.concat([%{id: 1_000, v: :a, many: [0]}, %{id: 1_001, v: :b, many: []}])

        {rows, ops, [], _span} = Records.write(table, records)
        terms = for {:add, term, _} <- ops, do: term

        grouped =
          Enum.reduce(ops, %{}, fn {:add, term, packed}, acc ->
            Map.update(
              acc,
              term,
              MapSet.new(ids(packed)),
              &MapSet.union(&1, MapSet.new(ids(packed)))
            )
          end)

        length(terms) == length(Enum.uniq(terms)) and grouped == model(records) and
          Enum.sort(rows) == Enum.sort(for r <- records, do: {r.id, Map.take(r, [:id, :v])})
      end)

    PropEr.check(property, numtests: 300)
  end

  test "a small build of small terms is grouped on a normal scheduler, others on a dirty one" do
    # A replica following a log writes small batches: {name, {char, value}}
    # terms of a hundred records stay on the normal scheduler.
    flat =
      Enum.flat_map(0..99, fn id -> [id, {:char, {"Term", "#{rem(id, 3)}"}}, {:spec, "MRC"}] end)

    assert [{:add, _, _} | _] = Larder.Native.index_group(flat)
    assert Larder.Native.index_group([1, {:v, [1, 2]}]) == :dirty
    assert Larder.Native.index_group([1, {:v, Enum.reduce(1..40, :x, &{&1, &2})}]) == :dirty
    assert Larder.Native.index_group([1, List.to_tuple(Enum.to_list(1..100))]) == :dirty
    assert Larder.Native.index_group(Enum.flat_map(0..9_999, &[&1, {:v, :a}])) == :dirty
  end

  test "the NIF refuses a malformed list with an error, not a crash" do
    for group <- [&Larder.Native.index_group/1, &Larder.Native.index_group_dirty/1] do
      assert group.([{:v, 1}]) == {:error, :bad_op}
      assert group.([1, {:v, 1} | :tail]) == {:error, :bad_op}
      assert group.([-1, {:v, 1}]) == {:error, :bad_ids}
      assert group.([2 ** 32, {:v, 1}]) == {:error, :bad_ids}
      assert group.(:not_a_list) == {:error, :bad_op}
      assert group.([]) == []
      assert group.([1, 2]) == []
    end
  end

  test "a build whose terms take more than a normal scheduler's share is grouped whole",
       context do
    table = table(context.test)
    deep = Enum.reduce(1..10_000, :x, fn _, e -> {e} end)
    # A chunk small enough to try the normal scheduler first, and a large one.
    for last <- [99, 4_999] do
      records = for id <- 0..last, do: %{id: id, v: deep, many: [rem(id, 7), "s#{rem(id, 3)}"]}

      {_rows, ops, [], {0, ^last}} = Records.write(table, records)
      grouped = Map.new(ops, fn {:add, term, packed} -> {term, MapSet.new(ids(packed))} end)

      assert grouped == model(records)
    end
  end
end
