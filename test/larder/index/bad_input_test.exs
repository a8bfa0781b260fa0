defmodule Larder.Index.BadInputTest do
  # PropEr throws arbitrary terms (deep, improper and huge expressions and
  # ops, ids, forged handles) at every argument of every public function of
  # Larder.Index: only ArgumentError may come back, and the index keeps its
  # data.
  use ExUnit.Case, async: true

  alias Larder.Index
  alias Larder.Test.{Hostile, PropEr}

  describe "bad input (PropEr)" do
    # Every public function with arbitrary, deep, improper, huge and forged
    # arguments: only ArgumentError comes back, and the index still answers
    # for a term no generated call can name.
    test "only ArgumentError comes back and the index keeps its data" do
      holds_its_data(Index.new(), [1, 2, 70_000])
    end

    # With the id-to-terms map, {:set_terms, ...} reaches the NIF's diff too.
    # Its sentinel ids are above every id a generated call names: a
    # set_terms may rightly take any term from an id it names.
    test "the same with an id-to-terms map (reverse: true)" do
      holds_its_data(Index.new(reverse: true), [300_001, 300_002, 370_000])
    end

    defp holds_its_data(index, [_, _, last] = ids) do
      sentinel = make_ref()
      :ok = Index.add(index, {:term, sentinel}, ids)

      PropEr.check(
        :proper.forall(bad_call(), fn {fun, use_index?, args} ->
          args = Hostile.build(args)
          args = if use_index? and fun not in [:new, :drop], do: [index | tl(args)], else: args

          outcome =
            try do
              apply(Index, fun, args)
              :ok
            rescue
              ArgumentError -> :ok
              other -> {:unexpected, other}
            end

          outcome == :ok and
            Index.query(index, {:term, {:term, sentinel}}) == ids and
            Index.count(index, {:and, [{:term, {:term, sentinel}}, {:not, :nothing}]}) == 3 and
            {:term, sentinel} in Index.terms_of(index, last)
        end),
        numtests: 200
      )

      assert Index.query(index, {:term, {:term, sentinel}}) == ids
    end
  end

  @calls [
    new: 1,
    add: 3,
    remove: 3,
    batch: 2,
    query: 2,
    query_many: 2,
    count: 2,
    terms: 1,
    terms_of: 2,
    memory: 1,
    drop: 1
  ]

  defp bad_call do
    :proper_types.bind(
      :proper_types.oneof(Enum.map(@calls, &:proper_types.exactly/1)),
      fn {fun, arity} ->
        :proper_types.tuple([
          :proper_types.exactly(fun),
          :proper_types.boolean(),
          :proper_types.vector(arity, bad_arg())
        ])
      end,
      false
    )
  end

  # Larder.Test.Hostile's terms (built before each call), and the index's
  # own: deep, improper and huge expressions and ops, ids, forged handles.
  defp bad_arg do
    Hostile.term([
      {4, deep()},
      {4, improper()},
      {2, huge()},
      {4, ops()},
      {4, ids()},
      {2, :proper_types.exactly(%Index{ref: make_ref()})},
      {2, :proper_types.exactly(%Index{ref: :atomics.new(1, [])})}
    ])
  end

  defp deep do
    :proper_types.bind(
      :proper_types.tuple([
        :proper_types.oneof([:not, :and, :or, :tuple, :list]),
        :proper_types.range(90, 3_000)
      ]),
      fn
        {:not, n} -> Enum.reduce(1..n, :a, fn _, e -> {:not, e} end)
        {:and, n} -> Enum.reduce(1..n, :a, fn _, e -> {:and, [e, :b]} end)
        {:or, n} -> Enum.reduce(1..n, :a, fn _, e -> {:or, [:b, e]} end)
        {:tuple, n} -> Enum.reduce(1..n, :a, fn _, e -> {e, 1} end)
        {:list, n} -> Enum.reduce(1..n, [], fn _, e -> [e] end)
      end,
      false
    )
  end

  defp improper do
    :proper_types.bind(
      :proper_types.tuple([
        :proper_types.non_empty(
          :proper_types.list(:proper_types.oneof([ops(), :proper_types.any()]))
        ),
        :proper_types.oneof([:proper_types.atom(), :proper_types.integer()])
      ]),
      fn {list, tail} -> list ++ tail end,
      false
    )
  end

  defp huge do
    :proper_types.bind(
      :proper_types.tuple([
        :proper_types.oneof([:ids, :binary, :ops, :sets, :exprs]),
        :proper_types.range(0, 50_000)
      ]),
      fn
        {:ids, n} ->
          Enum.to_list(0..n)

        {:binary, n} ->
          :binary.copy("x", n * 10)

        {:ops, n} ->
          List.duplicate({:add_terms, [:h, {:h, n}], [n, 5]}, n)

        # One set_terms of n + 1 ids (past the normal scheduler's budget),
        # then none, one or two that name an id of it again (refused).
        {:sets, n} ->
          [
            {:set_terms, [:h, {:h, n}], Enum.to_list(0..n)}
            | List.duplicate({:set_terms, [:h], [n]}, rem(n, 3))
          ]

        {:exprs, n} ->
          List.duplicate({:and, [:h, {:not, :x}]}, n)
      end,
      false
    )
  end

  defp ops do
    kind =
      :proper_types.oneof([
        :add,
        :remove,
        :add_terms,
        :remove_terms,
        :set_terms,
        :proper_types.atom()
      ])

    :proper_types.list(
      :proper_types.oneof([
        :proper_types.tuple([kind, :proper_types.any(), ids()]),
        :proper_types.tuple([kind, :proper_types.list(:proper_types.any()), ids()]),
        :proper_types.any()
      ])
    )
  end

  defp ids do
    id =
      :proper_types.oneof([
        :proper_types.range(0, 200_000),
        :proper_types.exactly(4_294_967_295),
        :proper_types.exactly(4_294_967_296),
        :proper_types.exactly(-1),
        :proper_types.exactly(2 ** 64),
        :proper_types.float()
      ])

    :proper_types.oneof([id, :proper_types.list(id)])
  end
end
