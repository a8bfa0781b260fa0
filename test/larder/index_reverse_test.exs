defmodule Larder.IndexReverseTest do
  # The id-to-terms map of `Larder.Index.new(reverse: true)`: PropEr runs
  # random batches against a model (id -> set of terms) and an index without
  # the map (whose terms_of/2 scans every term); terms_of/2 must agree with
  # both after every batch. Ids straddle the map's 64-id leaves and its
  # 64-way trie levels, up to the largest u32.
  use ExUnit.Case, async: true

  alias Larder.Index
  alias Larder.Test.Isolated
  alias Larder.Test.PropEr

  @far_ids [63, 64, 4_095, 4_096, 65_535, 65_536, 16_777_216, 0xFFFFFFFF]

  defp id_gen,
    do:
      :proper_types.frequency([
        {4, :proper_types.integer(0, 140)},
        {1, :proper_types.oneof(@far_ids)}
      ])

  defp term_gen,
    do:
      :proper_types.oneof([
        :proper_types.integer(0, 4),
        :proper_types.oneof([:a, :b, {:tag, 1}, "s"]),
        # One term on OTP 25 (0.0 === -0.0).
        :proper_types.oneof([0.0, -0.0, {:z, -0.0}, [0.0]])
      ])

  defp ids_gen, do: :proper_types.oneof([id_gen(), :proper_types.list(id_gen())])

  defp op_gen do
    :proper_types.oneof([
      {:proper_types.oneof([:add, :remove]), term_gen(), ids_gen()},
      {:proper_types.oneof([:add_terms, :remove_terms]), :proper_types.list(term_gen()),
       ids_gen()}
    ])
  end

  defp apply_model(model, {kind, terms, ids}) when kind in [:add_terms, :remove_terms] do
    single = if kind == :add_terms, do: :add, else: :remove
    Enum.reduce(terms, model, &apply_model(&2, {single, &1, ids}))
  end

  defp apply_model(model, {kind, term, ids}) do
    Enum.reduce(List.wrap(ids), model, fn id, model ->
      terms = Map.get(model, id, MapSet.new())
      terms = if kind == :add, do: MapSet.put(terms, term), else: MapSet.delete(terms, term)
      if MapSet.size(terms) == 0, do: Map.delete(model, id), else: Map.put(model, id, terms)
    end)
  end

  defp agree?(reverse, plain, model) do
    Enum.all?(Enum.to_list(0..140) ++ @far_ids, fn id ->
      want = model |> Map.get(id, MapSet.new()) |> Enum.sort()

      Enum.sort(Index.terms_of(reverse, id)) == want and
        Enum.sort(Index.terms_of(plain, id)) == want
    end)
  end

  test "terms_of/2 answers the model under random batches" do
    property =
      :proper.forall(:proper_types.list(:proper_types.list(op_gen())), fn batches ->
        reverse = Index.new(reverse: true)
        plain = Index.new()

        ok =
          Enum.reduce_while(batches, %{}, fn ops, model ->
            :ok = Index.batch(reverse, ops)
            :ok = Index.batch(plain, ops)
            model = Enum.reduce(ops, model, &apply_model(&2, &1))
            if agree?(reverse, plain, model), do: {:cont, model}, else: {:halt, false}
          end)

        ok != false and Enum.sort(Index.terms(reverse)) == Enum.sort(Index.terms(plain))
      end)

    PropEr.check(property, numtests: 200)
  end

  # {:set_terms, terms, ids}: a batch of ordinary ops and set_terms ops whose
  # ids appear in no other op of the batch (ids the ordinary ops name are
  # taken out of them, and an id named by an earlier set_terms out of the
  # later ones). The index without the map gets the same change as the
  # diff against the model, so its bitmaps are checked too.
  defp set_gen, do: {:set_terms, :proper_types.list(term_gen()), ids_gen()}

  defp disjoint(ops, sets) do
    {sets, named} =
      Enum.map_reduce(sets, MapSet.new(), fn {:set_terms, terms, ids}, named ->
        ids = ids |> List.wrap() |> Enum.uniq() |> Enum.reject(&MapSet.member?(named, &1))
        {{:set_terms, terms, ids}, MapSet.union(named, MapSet.new(ids))}
      end)

    ops =
      for {kind, terms, ids} <- ops,
          ids = Enum.reject(List.wrap(ids), &MapSet.member?(named, &1)),
          do: {kind, terms, ids}

    {ops, sets}
  end

  defp as_diff({:set_terms, terms, ids}, model) do
    Enum.flat_map(ids, fn id ->
      old = model |> Map.get(id, MapSet.new()) |> MapSet.to_list()
      [{:remove_terms, old, id}, {:add_terms, terms, id}]
    end)
  end

  defp apply_set(model, {:set_terms, terms, ids}) do
    Enum.reduce(ids, model, fn id, model ->
      if terms == [], do: Map.delete(model, id), else: Map.put(model, id, MapSet.new(terms))
    end)
  end

  test "{:set_terms, terms, ids} gives each id exactly its terms, under random batches" do
    batch_gen =
      {:proper_types.list(op_gen()), :proper_types.list(set_gen()), :proper_types.boolean()}

    property =
      :proper.forall(:proper_types.list(batch_gen), fn batches ->
        reverse = Index.new(reverse: true)
        plain = Index.new()

        ok =
          Enum.reduce_while(batches, %{}, fn {ops, sets, sets_first}, model ->
            {ops, sets} = disjoint(ops, sets)
            :ok = Index.batch(reverse, if(sets_first, do: sets ++ ops, else: ops ++ sets))
            :ok = Index.batch(plain, ops ++ Enum.flat_map(sets, &as_diff(&1, model)))
            model = Enum.reduce(ops, model, &apply_model(&2, &1))
            model = Enum.reduce(sets, model, &apply_set(&2, &1))
            if agree?(reverse, plain, model), do: {:cont, model}, else: {:halt, false}
          end)

        ok != false and Enum.sort(Index.terms(reverse)) == Enum.sort(Index.terms(plain)) and
          Enum.all?(Index.terms(reverse), &(Index.query(reverse, &1) == Index.query(plain, &1)))
      end)

    PropEr.check(property, numtests: 200)
  end

  test "{:set_terms, ...} needs the map, and ids in no other op of its batch" do
    plain = Index.new()
    :ok = Index.add(plain, :a, 1)

    assert_raise ArgumentError, ~r/needs an index made with reverse: true/, fn ->
      Index.batch(plain, [{:set_terms, [:b], 1}])
    end

    assert Index.query(plain, :a) == [1]
    index = Index.new(reverse: true)
    :ok = Index.add(index, :a, [1, 2])

    for ops <- [
          [{:set_terms, [:b], [1, 2]}, {:add, :c, 2}],
          [{:remove, :a, 1}, {:set_terms, [:b], 1}],
          [{:set_terms, [:b], 1}, {:set_terms, [:c], [3, 1]}]
        ] do
      assert_raise ArgumentError, ~r/the ids of :set_terms in no other op/, fn ->
        Index.batch(index, ops)
      end
    end

    assert {Index.query(index, :a), Index.terms(index)} == {[1, 2], [:a]}
    # The same id twice in one op is that id once.
    :ok = Index.batch(index, [{:set_terms, [:b, :b], [1, 1]}, {:set_terms, [], 2}])

    assert {Index.terms_of(index, 1), Index.terms_of(index, 2), Index.terms(index)} ==
             {[:b], [], [:b]}
  end

  test "a term removed and re-added in one batch keeps the right rows" do
    index = Index.new(reverse: true)
    :ok = Index.batch(index, [{:add, :a, [1, 2]}, {:add, :b, 2}])
    :ok = Index.batch(index, [{:remove, :a, [1, 2]}, {:add, :c, 1}, {:add, :a, 2}])
    assert Index.terms_of(index, 1) == [:c]
    assert Enum.sort(Index.terms_of(index, 2)) == [:a, :b]
  end

  test "reverse must be a boolean" do
    assert_raise ArgumentError, ~r/option :reverse to be a boolean/, fn ->
      Index.new(reverse: :yes)
    end
  end

  test "the map costs memory only with reverse: true, and gives it back" do
    ids = Enum.to_list(0..50_000)
    [reverse, plain] = [Index.new(reverse: true), Index.new()]
    empty = Index.memory(reverse)

    for index <- [reverse, plain] do
      :ok = Index.batch(index, for(t <- 1..4, do: {:add, {:t, t}, ids}))
    end

    assert Index.memory(reverse) > Index.memory(plain) + 4 * 4 * 50_000

    :ok = Index.batch(reverse, for(t <- 1..4, do: {:remove, {:t, t}, ids}))
    assert Index.memory(reverse) == empty
    assert Index.terms_of(reverse, 7) == []
  end

  test "removes and drops give the map's bytes back to the VM (isolated VM)" do
    result =
      Isolated.run(
        quote do
          before = Larder.Native.index_live_bytes()
          index = Larder.Index.new(reverse: true)
          ids = Enum.to_list(0..100_000//7) ++ [0xFFFFFFFF]

          for round <- 1..3 do
            :ok = Larder.Index.batch(index, for(t <- 1..5, do: {:add, {round, t}, ids}))
          end

          held = Larder.Native.index_live_bytes() - before

          for round <- 1..3 do
            :ok = Larder.Index.batch(index, for(t <- 1..5, do: {:remove, {round, t}, ids}))
          end

          removed = Larder.Native.index_live_bytes() - before
          :ok = Larder.Index.batch(index, [{:add_terms, [:x, :y], ids}])
          Larder.Index.drop(index)
          {held, removed, Larder.Native.index_live_bytes() - before}
        end
      )

    assert {:ok, {held, 0, 0}} = result
    assert held > 15 * 4 * 14_000
  end
end
