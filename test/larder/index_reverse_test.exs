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
