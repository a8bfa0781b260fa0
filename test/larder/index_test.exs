defmodule Larder.IndexTest do
  use ExUnit.Case, async: true

  alias Larder.{Index, Native}
  alias Larder.Test.{Isolated, PropEr}

  doctest Larder.Index

  describe "queries" do
    test "and intersects, or unites, not subtracts" do
      index = Index.new()
      :ok = Index.add(index, :a, [1, 2, 3, 100_000])
      :ok = Index.add(index, :b, [2, 3, 4, 100_000])
      :ok = Index.add(index, :c, [3, 5])

      assert Index.query(index, {:and, [:a, :b]}) == [2, 3, 100_000]
      assert Index.query(index, {:and, [:a, :b, {:not, :c}]}) == [2, 100_000]
      assert Index.query(index, {:or, [:a, :c]}) == [1, 2, 3, 5, 100_000]
      assert Index.query(index, {:not, :a}) == [4, 5]
      assert Index.query(index, {:and, [:a, :missing]}) == []
      assert Index.query(index, {:and, []}) == [1, 2, 3, 4, 5, 100_000]
      assert Index.count(index, {:and, [:a, :b]}) == 3
    end

    test "an and of terms agrees with sets over dense and sparse chunks, after removals" do
      # Dense runs (bitmap containers), sparse strides (arrays) and a narrow
      # range, over several 64Ki-id chunks; removals move each chunk's first
      # and last ids, which bound the ids an and tries.
      sets = %{
        run: Enum.to_list(70_000..79_999),
        wide: Enum.to_list(0..300_000//3),
        sparse: Enum.to_list(5..300_000//29),
        narrow: Enum.to_list(74_000..74_999),
        edges: [0, 65_535, 65_536, 74_001, 131_071, 131_072, 299_999]
      }

      index = Index.new()
      :ok = Index.batch(index, for({term, ids} <- sets, do: {:add, term, ids}))
      removed = %{run: [70_000, 70_001, 79_999], narrow: [74_000, 74_999], sparse: [74_001]}
      :ok = Index.batch(index, for({term, ids} <- removed, do: {:remove, term, ids}))
      sets = Map.merge(sets, removed, fn _term, ids, gone -> ids -- gone end)

      terms = Map.keys(sets)

      for a <- terms, b <- terms, c <- [nil | terms] do
        and_of = Enum.reject([a, b, c], &is_nil/1)

        expected =
          and_of
          |> Enum.map(&MapSet.new(sets[&1]))
          |> Enum.reduce(&MapSet.intersection/2)
          |> Enum.sort()

        assert Index.query(index, {:and, and_of}) == expected, inspect(and_of)
        assert Index.query_many(index, [{:and, and_of}]) == [expected]
      end
    end

    test "an and of terms, looked up without a plan, agrees with the planned forms" do
      # `{:and, [terms]}` is looked up directly; an operator among the terms,
      # an improper list or an empty and go through the plan instead.
      index = Index.new()
      :ok = Index.add(index, :a, [1, 2, 3, 70_000])
      :ok = Index.add(index, :b, [2, 3, 70_000])
      :ok = Index.add(index, {:and, [:a]}, [3])

      assert Index.query(index, {:and, [:a]}) == [1, 2, 3, 70_000]
      assert Index.query(index, {:and, [:a, :a]}) == [1, 2, 3, 70_000]
      assert Index.query(index, {:and, [:a, :b]}) == [2, 3, 70_000]
      assert Index.query(index, {:and, [:a, {:term, :b}]}) == [2, 3, 70_000]
      assert Index.query(index, {:and, [:a, :b, :missing]}) == []
      assert Index.query(index, {:and, [:a, {:term, {:and, [:a]}}]}) == [3]
      assert Index.query(index, {:and, [:a, :b, {:not, {:term, {:and, [:a]}}}]}) == [2, 70_000]
      assert Index.query(index, {:and, [:a, {:or, [:b]}]}) == [2, 3, 70_000]
      assert Index.query(index, {:and, []}) == [1, 2, 3, 70_000]

      assert Index.query_many(index, [{:and, [:a, :b]}, {:and, [:b, {:not, :a}]}, :a]) ==
               [[2, 3, 70_000], [], [1, 2, 3, 70_000]]

      assert_raise ArgumentError, ~r/^expr must/, fn ->
        Index.query(index, {:and, [:a, :b | :c]})
      end

      assert_raise ArgumentError, ~r/^exprs must/, fn ->
        Index.query_many(index, [{:and, [:a | :b]}])
      end
    end

    test "an and of terms in blocks (ids that come in runs) leapfrogs to the right ids" do
      # Nested blocks like the price catalogue's: a term per block of 1,000,
      # of 100 inside it, of 10 inside that, and every other id; the answer
      # is one id per combination, and a large answer (every other id)
      # intersects whole containers.
      ids = 0..199_999
      index = Index.new()

      ops =
        for id <- ids,
            term <- [
              {:k, div(id, 1000)},
              {:h, rem(div(id, 100), 10)},
              {:t, rem(div(id, 10), 10)},
              {:p, rem(id, 2)}
            ],
            do: {:add, term, id}

      :ok = Index.batch(index, ops)

      for k <- [0, 65, 66, 131, 199], h <- [0, 5, 9], t <- [0, 9], p <- [0, 1] do
        expected =
          for id <- ids,
              div(id, 1000) == k and rem(div(id, 100), 10) == h and rem(div(id, 10), 10) == t and
                rem(id, 2) == p,
              do: id

        exprs = [
          {:and, [{:k, k}, {:h, h}, {:t, t}, {:p, p}]},
          {:and, [{:p, p}, {:t, t}, {:k, k}, {:h, h}]}
        ]

        assert Index.query_many(index, exprs) == [expected, expected]
        assert Index.count(index, hd(exprs)) == length(expected)
      end

      assert Index.query(index, {:and, [{:p, 0}, {:t, 4}]}) ==
               for(id <- ids, rem(id, 2) == 0 and rem(div(id, 10), 10) == 4, do: id)
    end

    test "{:term, t} matches a term that looks like an operator" do
      index = Index.new()
      :ok = Index.add(index, {:not, :x}, [9])
      :ok = Index.add(index, :x, [1])
      assert Index.query(index, {:term, {:not, :x}}) == [9]
      assert Index.query(index, {:not, :x}) == [9]
    end

    test "terms are matched by ===" do
      index = Index.new()
      :ok = Index.add(index, 1, [1])
      :ok = Index.add(index, 1.0, [2])
      assert Index.query(index, 1) == [1]
      assert Index.query(index, 1.0) == [2]
    end

    test "every kind of term round-trips through terms/1 and terms_of/2" do
      index = Index.new()

      terms = [
        fn x -> x end,
        &Enum.map/2,
        %{a: [1 | 2]},
        self(),
        make_ref(),
        2 ** 100,
        -(2 ** 70),
        1.5,
        <<1::3>>,
        "bin",
        [],
        {},
        [1, [2, {3}] | "t"],
        ~c"chars"
      ]

      for {term, id} <- Enum.with_index(terms), do: :ok = Index.add(index, term, [id, 100])
      assert Enum.sort(Index.terms(index)) == Enum.sort(terms)
      assert Enum.sort(Index.terms_of(index, 100)) == Enum.sort(terms)

      for {term, id} <- Enum.with_index(terms),
          do: assert(Index.query(index, {:term, term}) == [id, 100])
    end

    test "large answers take the dirty scheduler path and stay correct" do
      index = Index.new()
      :ok = Index.add(index, :all, Enum.to_list(0..199_999))
      :ok = Index.add(index, :even, Enum.to_list(0..199_999//2))
      assert Index.count(index, {:and, [:all, {:not, :even}]}) == 100_000
      assert length(Index.query(index, :all)) == 200_000
      assert [evens, _] = Index.query_many(index, [:even, :all])
      assert length(evens) == 100_000
    end
  end

  describe "writes" do
    test "removing the last id drops the term" do
      index = Index.new()
      :ok = Index.add(index, :a, 1)
      assert Index.terms(index) == [:a]
      :ok = Index.remove(index, :a, [1, 2])
      assert Index.terms(index) == []
      assert Index.terms_of(index, 1) == []
    end

    test "add_terms and remove_terms apply to each term of a list" do
      index = Index.new()
      :ok = Index.batch(index, [{:add_terms, [:a, :b, :a], [1, 2]}, {:remove_terms, [:b], 2}])
      assert {Index.query(index, :a), Index.query(index, :b)} == {[1, 2], [1]}

      assert_raise ArgumentError, ~r/ops must be/, fn ->
        Index.batch(index, [{:add_terms, :a, 1}])
      end
    end

    test "memory grows with the bitmaps" do
      index = Index.new()
      empty = Index.memory(index)
      :ok = Index.add(index, :a, Enum.to_list(0..10_000))
      assert Index.memory(index) > empty
    end

    test "a batch is never seen half-applied by concurrent readers" do
      index = Index.new()
      ids = Enum.to_list(0..999)
      :ok = Index.add(index, :left, ids)

      writer =
        Task.async(fn ->
          for round <- 1..200 do
            {from, to} = if rem(round, 2) == 1, do: {:left, :right}, else: {:right, :left}
            :ok = Index.batch(index, [{:remove, from, ids}, {:add, to, ids}])
          end
        end)

      readers =
        for _ <- 1..3 do
          Task.async(fn ->
            for _ <- 1..300, do: Index.count(index, {:or, [:left, :right]})
          end)
        end

      Task.await(writer, 30_000)
      counts = readers |> Enum.flat_map(&Task.await(&1, 30_000)) |> Enum.uniq()
      assert counts == [1000]
    end
  end

  describe "readers never wait for writers" do
    # A normal-scheduler write answers :dirty while another write holds the
    # writers' mutex: a read that completes between two such answers ran
    # while the long write was in progress, without waiting for it.
    test "a query completes while a long write holds the writers' mutex" do
      index = Index.new()
      ref = index.ref
      :ok = Index.add(index, :other, [1, 2])
      ids = Enum.to_list(0..199_999)
      terms = for t <- 1..150, do: {:big, t}
      writer = Task.async(fn -> Index.batch(index, [{:add_terms, terms, ids}]) end)

      overlapped =
        Enum.reduce_while(1..2_000_000, false, fn _, _ ->
          before = Native.index_apply(ref, [{:add, :probe, 1}])
          answer = Native.index_query(ref, :other)
          later = Native.index_apply(ref, [{:add, :probe, 1}])

          cond do
            before == :dirty and later == :dirty and answer == [1, 2] -> {:halt, true}
            Process.info(writer.pid) == nil -> {:halt, false}
            true -> {:cont, false}
          end
        end)

      assert Task.await(writer, 60_000) == :ok
      assert overlapped
      assert Index.count(index, {:big, 150}) == 200_000
    end
  end

  describe "drop/1" do
    test "frees the index while handles live; later calls raise ArgumentError" do
      index = Index.new()
      :ok = Index.add(index, :a, Enum.to_list(0..10_000))
      other = %Index{} = index
      assert Index.drop(index) == :ok
      assert Index.drop(other) == :ok

      for call <- [
            fn -> Index.query(other, :a) end,
            fn -> Index.count(other, :a) end,
            fn -> Index.query_many(other, [:a]) end,
            fn -> Index.add(other, :a, 1) end,
            fn -> Index.terms(other) end,
            fn -> Index.terms_of(other, 1) end,
            fn -> Index.memory(other) end
          ] do
        assert_raise ArgumentError, "unknown Larder.Index: it was dropped", call
      end
    end
  end

  describe "bad input" do
    test "raises ArgumentError naming the argument" do
      index = Index.new()

      assert_raise ArgumentError, ~r/ids must be/, fn -> Index.add(index, :a, [-1]) end
      assert_raise ArgumentError, ~r/ids must be/, fn -> Index.add(index, :a, 2 ** 32) end
      assert_raise ArgumentError, ~r/ops must be/, fn -> Index.batch(index, [{:put, :a, 1}]) end
      assert_raise ArgumentError, ~r/expr must/, fn -> Index.query(index, {:and, :a}) end
      assert_raise ArgumentError, ~r/expr must/, fn -> Index.count(index, {:or, 1}) end

      assert_raise ArgumentError, ~r/index must be a Larder.Index/, fn ->
        Index.query(:nope, :a)
      end

      assert_raise ArgumentError,
                   ~r/unknown Larder.Index options \[:size\]; valid options are: \[:reverse\]/,
                   fn -> Index.new(size: 1) end
    end

    test "forged handles raise ArgumentError naming the index, never a bare :badarg" do
      for forged <- [%Index{ref: make_ref()}, %Index{ref: :atomics.new(1, [])}] do
        for call <- [
              fn -> Index.query(forged, :a) end,
              fn -> Index.count(forged, :a) end,
              fn -> Index.query_many(forged, [:a]) end,
              fn -> Index.add(forged, :a, 1) end,
              fn -> Index.batch(forged, []) end,
              fn -> Index.terms(forged) end,
              fn -> Index.terms_of(forged, 1) end,
              fn -> Index.memory(forged) end,
              fn -> Index.drop(forged) end
            ] do
          assert_raise ArgumentError, ~r/index must be a Larder.Index/, call
        end
      end
    end

    test "improper lists raise ArgumentError naming the argument" do
      index = Index.new()
      :ok = Index.add(index, :a, [1, 2])

      assert_raise ArgumentError, ~r/^ops must be/, fn ->
        Index.batch(index, [{:add, :d, 1} | :x])
      end

      assert_raise ArgumentError, ~r/^ops must be/, fn ->
        Index.batch(index, [{:add_terms, [:d | :e], 1}])
      end

      assert_raise ArgumentError, ~r/^ids must be/, fn -> Index.add(index, :d, [1 | 2]) end
      assert_raise ArgumentError, ~r/^ids must be/, fn -> Index.remove(index, :a, [1, 2 | 3]) end
      assert_raise ArgumentError, ~r/^expr must/, fn -> Index.query(index, {:and, [:a | :b]}) end
      assert_raise ArgumentError, ~r/^expr must/, fn -> Index.count(index, {:or, [:a | :b]}) end
      assert_raise ArgumentError, ~r/^exprs must/, fn -> Index.query_many(index, [:a | :b]) end

      assert_raise ArgumentError, ~r/^exprs must/, fn ->
        Index.query_many(index, [{:and, [:a | :b]}])
      end

      # A batch long enough to go to the dirty scheduler at once: the same
      # errors.
      long = for id <- 1..600, do: {:add, :d, id}

      assert_raise ArgumentError, ~r/^ops must be/, fn ->
        Index.batch(index, long ++ [{:add, :d, 601} | :x])
      end

      assert_raise ArgumentError, ~r/^ops must be/, fn ->
        Index.batch(index, long ++ [{:add_terms, [:d | :e], 1}])
      end

      # Nothing was applied by the failed writes.
      assert Index.terms(index) == [:a]
      assert Index.query(index, :a) == [1, 2]

      :ok = Index.batch(index, long ++ [{:remove, :a, 1}])
      assert Index.query(index, :d) == Enum.to_list(1..600)
      assert Index.query(index, :a) == [2]
    end

    test "ids outside the u32 range raise ArgumentError" do
      index = Index.new()

      for ids <- [-1, 2 ** 32, [0, 2 ** 64], [1.0], :one] do
        assert_raise ArgumentError, ~r/^ids must be/, fn -> Index.add(index, :a, ids) end
      end

      assert_raise ArgumentError, ~r/^id must be/, fn -> Index.terms_of(index, 2 ** 32) end
      assert Index.terms(index) == []
    end

    test "ids packed in a binary are the same ids; a binary of another length raises" do
      index = Index.new()
      ids = [0, 1, 70_000, 2 ** 32 - 1]
      :ok = Index.batch(index, [{:add, :a, for(id <- ids, into: <<>>, do: <<id::32-little>>)}])
      :ok = Index.batch(index, [{:add_terms, [:b, :c], <<7::32-little>>}, {:add, :d, <<>>}])
      :ok = Index.remove(index, :a, <<1::32-little>>)

      assert Index.query(index, :a) == [0, 70_000, 2 ** 32 - 1]
      assert Index.query(index, {:and, [:b, :c]}) == [7]
      assert Index.terms(index) |> Enum.sort() == [:a, :b, :c]

      for ids <- [<<1, 2, 3>>, <<1::32-little, 9>>, <<1::33>>] do
        assert_raise ArgumentError, ~r/^ids must be/, fn -> Index.add(index, :e, ids) end
      end

      assert Index.query(index, :e) == []
    end

    test "an expression deeper than 100 levels raises ArgumentError; 99 levels answer" do
      index = Index.new()
      :ok = Index.add(index, :a, [1, 2])
      :ok = Index.add(index, :b, [3])
      nots = fn n -> Enum.reduce(1..n, :a, fn _, e -> {:not, e} end) end
      assert Index.query(index, nots.(99)) == [3]
      assert Index.query(index, nots.(98)) == [1, 2]

      assert_raise ArgumentError, ~r/deeper than 100 levels/, fn ->
        Index.query(index, nots.(100))
      end
    end

    test "a missing library explains what to run" do
      failure = {:error, {:load_failed, ~c"cannot open shared object file"}}
      assert {:error, message} = Larder.Native.explain(failure, "/nonexistent/liblarder_native")
      assert message =~ "cannot open shared object file"
      assert message =~ "mix compile"
      assert message =~ "/nonexistent/liblarder_native"
    end
  end

  describe "deep terms (isolated VM)" do
    # Each of these recursed on the scheduler's stack and killed the VM.
    test "deep :not, :and and :or chains raise ArgumentError" do
      result =
        Isolated.run(
          quote do
            index = Larder.Index.new()
            :ok = Larder.Index.add(index, :a, [1, 2])

            exprs = [
              Enum.reduce(1..2_000, :a, fn _, e -> {:not, e} end),
              Enum.reduce(1..200_000, :a, fn _, e -> {:and, [e]} end),
              Enum.reduce(1..200_000, :a, fn _, e -> {:or, [:b, e]} end)
            ]

            calls = [
              &Larder.Index.query(index, &1),
              &Larder.Index.count(index, &1),
              &Larder.Index.query_many(index, [:a, &1])
            ]

            for expr <- exprs, call <- calls do
              try do
                {:answered, call.(expr)}
              rescue
                error in ArgumentError -> {:argument_error, error.message =~ "deeper than"}
              end
            end
            |> Enum.uniq()
            |> Kernel.++([Larder.Index.query(index, :a)])
          end
        )

      assert result == {:ok, [{:argument_error, true}, [1, 2]]}
    end

    test "deep tuples and lists are index terms like any other" do
      result =
        Isolated.run(
          quote do
            index = Larder.Index.new()
            tuple = Enum.reduce(1..1_000_000, :x, fn _, e -> {e} end)
            list = Enum.reduce(1..300_000, [], fn _, e -> [e] end)
            long = [Enum.to_list(1..300_000) | :improper]

            :ok = Larder.Index.add(index, tuple, [1, 2])
            :ok = Larder.Index.batch(index, [{:add, list, 2}, {:add_terms, [long, tuple], [3]}])

            {
              Larder.Index.query(index, {:term, tuple}),
              Larder.Index.query(index, {:and, [list, {:term, long}]}),
              Larder.Index.count(index, {:or, [tuple, list]}),
              Larder.Index.terms_of(index, 3) |> Enum.sort() == Enum.sort([long, tuple]),
              Larder.Index.terms(index) |> Enum.sort() == Enum.sort([tuple, list, long]),
              Larder.Index.query_many(index, [{:term, list}, {:term, tuple}])
            }
          end,
          120_000
        )

      assert result == {:ok, {[1, 2, 3], [], 3, true, true, [[2], [1, 2, 3]]}}
    end
  end

  describe "scheduling: Rust picks the dirty variant from the real work" do
    test "writes of many terms x ids answer :dirty on the normal scheduler" do
      index = Index.new()
      ref = index.ref
      # One record with 300,000 tags, and one term added to a million ids.
      tags = [{:add_terms, Enum.to_list(1..300_000), 9}]
      million = [{:add, :all, Enum.to_list(0..999_999)}]
      assert Native.index_apply(ref, tags) == :dirty
      assert Native.index_apply(ref, million) == :dirty
      assert Index.terms(index) == []

      :ok = Index.batch(index, tags)
      :ok = Index.batch(index, million)
      assert Index.count(index, :all) == 1_000_000
      assert Index.count(index, 300_000) == 1

      # A write copies each chunk (container) it changes: a thousand ids in a
      # thousand chunks is real work, one id in a large posting is not.
      sparse = for id <- 0..1_000, do: id * 65_536
      assert Native.index_apply(ref, [{:add, :sparse, sparse}]) == :dirty
      :ok = Index.add(index, :sparse, sparse)
      assert Native.index_apply(ref, [{:add, :sparse, 7}]) == :ok
      assert Index.count(index, :sparse) == 1_002
    end

    test "reads answer :dirty past their budget and not before" do
      index = Index.new()
      ref = index.ref
      :ok = Index.add(index, :all, Enum.to_list(0..99_999))
      :ok = Index.add(index, :few, [1, 2])
      assert Native.index_query(ref, :all) == :dirty
      assert Native.index_query(ref, :few) == [1, 2]
      assert Native.index_query(ref, {:or, List.duplicate(:few, 50_000)}) == :dirty
      assert Native.index_query_many(ref, List.duplicate(:few, 50_000)) == :dirty
      assert Native.index_query(ref, {:term, :binary.copy("x", 10_000_000)}) == :dirty
      assert Native.index_query(ref, {:term, %{a: 1}}) == :dirty
      assert Index.query(index, {:term, %{a: 1}}) == []
      assert length(Index.query_many(index, List.duplicate(:few, 50_000))) == 50_000

      # Rebuilding a large stored term for terms_of/2 counts too.
      deep = Enum.reduce(1..100_000, :x, fn _, e -> {e} end)
      :ok = Index.add(index, deep, 5)
      assert Native.index_terms_of(ref, 5) == :dirty

      assert Native.index_terms_of(ref, 1) == [:all, :few] or
               Native.index_terms_of(ref, 1) == [:few, :all]

      assert Index.terms_of(index, 5) -- [:all] == [deep]
    end
  end

  describe "memory" do
    test "dropped indexes free their memory while their handles live (isolated VM)" do
      result =
        Isolated.native_bytes_dropped(
          quote do
            fn n ->
              index = Larder.Index.new()
              :ok = Larder.Index.add(index, {:n, n}, Enum.to_list(0..200_000//3))
              :ok = Larder.Index.add(index, :every, Enum.to_list(n..2_000_000//1000))
              index
            end
          end,
          quote(do: &Larder.Index.drop/1)
        )

      assert {:ok, {held, 0, 20}} = result
      assert held > 20 * 8_000
    end

    test "many writers on one term, some killed mid-write, lose nothing and leak nothing (isolated VM)" do
      result =
        Isolated.run(
          quote do
            before = Larder.Native.index_live_bytes()
            index = Larder.Index.new()

            writers =
              for w <- 0..7 do
                Task.async(fn ->
                  ids = Enum.to_list((w * 10_000)..(w * 10_000 + 9_999))

                  for _ <- 1..30 do
                    :ok = Larder.Index.batch(index, [{:add, :hot, ids}, {:add, {:w, w}, ids}])
                    :ok = Larder.Index.remove(index, :hot, Enum.take(ids, 5_000))
                  end

                  :ok = Larder.Index.add(index, :hot, ids)
                end)
              end

            # Killed while its big batch may be in the NIF: all of it or none.
            victims =
              for v <- 1..4 do
                spawn(fn ->
                  Larder.Index.batch(index, [
                    {:add, {:victim, v}, Enum.to_list(0..300_000)},
                    {:add, :victims, v}
                  ])
                end)
              end

            Enum.each(victims, &Process.exit(&1, :kill))
            Enum.each(writers, &Task.await(&1, 60_000))

            whole =
              Enum.all?(1..4, fn v ->
                count = Larder.Index.count(index, {:victim, v})

                count in [0, 300_001] and
                  count == 300_001 == v in Larder.Index.query(index, :victims)
              end)

            hot = Larder.Index.count(index, :hot)

            for term <- Larder.Index.terms(index) do
              :ok = Larder.Index.remove(index, term, Larder.Index.query(index, {:term, term}))
            end

            {whole, hot, Larder.Index.terms(index), Larder.Native.index_live_bytes() - before}
          end,
          120_000
        )

      assert result == {:ok, {true, 80_000, [], 0}}
    end

    test "memory/1 follows writes and drops" do
      index = Index.new()
      empty = Index.memory(index)
      :ok = Index.add(index, :a, Enum.to_list(0..100_000))
      full = Index.memory(index)
      assert full > empty + 8_000
      :ok = Index.remove(index, :a, Enum.to_list(0..100_000))
      assert Index.memory(index) < full
    end
  end

  describe "model (PropEr)" do
    # Random writes from several processes, each on its own terms, then random
    # expressions checked against a map of MapSets.
    test "queries agree with a map of sets after concurrent writes" do
      PropEr.check(:proper.forall(scenario(), &scenario_holds?/1), numtests: 60)
    end
  end

  @procs 3

  defp scenario do
    ops = :proper_types.list(op())
    exprs = :proper_types.list(expr(2))
    :proper_types.tuple([ops, exprs])
  end

  defp op do
    ids =
      :proper_types.list(
        :proper_types.oneof([:proper_types.range(0, 40), :proper_types.range(65_530, 65_545)])
      )

    :proper_types.tuple([
      :proper_types.oneof([:add, :add, :remove]),
      :proper_types.range(0, 5),
      ids
    ])
  end

  defp expr(0), do: leaf()

  defp expr(depth) do
    sub = :proper_types.list(expr(depth - 1))

    :proper_types.frequency([
      {4, leaf()},
      {2, :proper_types.tuple([:proper_types.exactly(:and), sub])},
      {2, :proper_types.tuple([:proper_types.exactly(:or), sub])},
      {1, :proper_types.tuple([:proper_types.exactly(:not), expr(depth - 1)])}
    ])
  end

  defp leaf do
    :proper_types.tuple([:proper_types.range(0, @procs - 1), :proper_types.range(0, 5)])
  end

  defp scenario_holds?({ops, exprs}) do
    index = Index.new()
    # Operation i goes to process rem(i, @procs), which owns terms {proc, n}.
    per_proc =
      ops
      |> Enum.with_index()
      |> Enum.group_by(fn {_, i} -> rem(i, @procs) end, fn {op, _} -> op end)

    per_proc
    |> Enum.map(fn {proc, proc_ops} ->
      Task.async(fn ->
        for {kind, n, ids} <- proc_ops, do: :ok = Index.batch(index, [{kind, {proc, n}, ids}])
      end)
    end)
    |> Enum.each(&Task.await/1)

    model =
      Enum.reduce(per_proc, %{}, fn {proc, proc_ops}, model ->
        Enum.reduce(proc_ops, model, fn {kind, n, ids}, model ->
          set = Map.get(model, {proc, n}, MapSet.new())

          set =
            if kind == :add,
              do: MapSet.union(set, MapSet.new(ids)),
              else: MapSet.difference(set, MapSet.new(ids))

          if MapSet.size(set) == 0,
            do: Map.delete(model, {proc, n}),
            else: Map.put(model, {proc, n}, set)
        end)
      end)

    Enum.sort(Index.terms(index)) == Enum.sort(Map.keys(model)) and
      Enum.all?(exprs, fn expr ->
        expected = model_eval(model, expr)

        Index.query(index, expr) == Enum.sort(MapSet.to_list(expected)) and
          Index.count(index, expr) == MapSet.size(expected)
      end)
  end

  defp universe(model), do: Enum.reduce(Map.values(model), MapSet.new(), &MapSet.union/2)

  defp model_eval(model, {:and, []}), do: universe(model)

  defp model_eval(model, {:and, exprs}),
    do: exprs |> Enum.map(&model_eval(model, &1)) |> Enum.reduce(&MapSet.intersection/2)

  defp model_eval(model, {:or, exprs}),
    do: Enum.reduce(exprs, MapSet.new(), &MapSet.union(model_eval(model, &1), &2))

  defp model_eval(model, {:not, expr}),
    do: MapSet.difference(universe(model), model_eval(model, expr))

  defp model_eval(model, term), do: Map.get(model, term, MapSet.new())
end
