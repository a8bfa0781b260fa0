defmodule Larder.TableTest do
  use ExUnit.Case, async: true

  alias Larder.Table
  alias Larder.Test.PropEr

  import Larder.Test.Eventually

  doctest Larder.Table

  defp catalogue_like do
    Table.new(
      key: :idx,
      index: [:offering_id, :spec, {:char, fn r -> Enum.map(r.chars, &{&1.char, &1.value}) end}]
    )
  end

  defp price(idx, offering, spec, term, router) do
    %{
      idx: idx,
      offering_id: offering,
      spec: spec,
      value: idx * 10,
      chars: [%{char: "Term", value: term}, %{char: "Router", value: router}]
    }
  end

  describe "search" do
    test "names a multi-valued index several times, and {:in, values}" do
      table = catalogue_like()

      :ok =
        Table.insert_many(table, [
          price(0, "o1", "MRC", "12", "Included"),
          price(1, "o1", "NRC", "18", "Included"),
          price(2, "o1", "MRC", "18", "Included"),
          price(3, "o2", "MRC", "18", "Not Included")
        ])

      assert [%{idx: 2}] =
               Table.search(table, offering_id: "o1", spec: "MRC", char: {"Term", "18"})

      assert Table.search_keys(table, char: {"Term", "18"}, char: {"Router", "Included"}) == [
               1,
               2
             ]

      assert Table.search_keys(table, spec: {:in, ["NRC", "XRC"]}) == [1]
      assert Table.search_keys(table, spec: {:in, []}) == []
      assert Table.count(table, %{char: {"Term", "18"}}) == 3
      assert Table.search_keys(table, []) == [0, 1, 2, 3]

      assert Table.search_many(table, [[spec: "NRC"], [offering_id: "o2"]]) == [
               [Table.get(table, 1)],
               [Table.get(table, 3)]
             ]
    end

    test "replacing a record by its key re-indexes it" do
      table = catalogue_like()
      :ok = Table.insert(table, price(5, "o1", "MRC", "12", "Included"))
      :ok = Table.insert(table, price(5, "o2", "NRC", "12", "Included"))
      assert Table.search_keys(table, offering_id: "o1") == []
      assert Table.search_keys(table, offering_id: "o2") == [5]
      assert Table.size(table) == 1
    end

    test "with :store, only the stored fields stay in ETS and the rest still index" do
      table =
        Table.new(
          key: :idx,
          index: [
            :offering_id,
            :spec,
            {:char, fn r -> Enum.map(r.chars, &{&1.char, &1.value}) end}
          ],
          store: [:spec, :value]
        )

      :ok = Table.insert(table, price(1, "o1", "MRC", "12", "Included"))
      :ok = Table.insert(table, price(2, "o1", "NRC", "12", "Included"))

      assert Table.search(table, offering_id: "o1", char: {"Term", "12"}, spec: "MRC") == [
               %{idx: 1, spec: "MRC", value: 10}
             ]

      # Replacing finds the old terms in the index, since ETS does not hold them.
      :ok = Table.insert(table, price(1, "o9", "MRC", "48", "Included"))
      assert Table.search_keys(table, offering_id: "o1") == [2]
      assert Table.search_keys(table, char: {"Term", "48"}) == [1]

      # update/3 re-indexes field indexes; function indexes keep their terms.
      {:ok, _} = Table.merge(table, 2, %{offering_id: "o9"})
      assert Table.search_keys(table, offering_id: "o9") == [1, 2]
      assert Table.search_keys(table, char: {"Term", "12"}) == [2]
      :ok = Table.delete(table, 1)
      assert Table.search_keys(table, char: {"Term", "48"}) == []
      assert Table.memory(table) > 0
    end

    test "non-integer keys get row ids of their own" do
      table = Table.new(key: :name, index: [:team])

      :ok =
        Table.insert_many(table, [
          %{name: "ann", team: 1},
          %{name: {:bob, 2}, team: 1},
          %{name: 7, team: 2}
        ])

      assert Enum.sort(Table.search_keys(table, team: 1)) == [{:bob, 2}, "ann"] |> Enum.sort()
      assert Table.get(table, {:bob, 2}) == %{name: {:bob, 2}, team: 1}
      :ok = Table.delete(table, "ann")
      assert Table.get(table, "ann") == nil
      assert Table.get(table, "ann", :none) == :none
      assert Table.search_keys(table, team: 1) == [{:bob, 2}]
      assert table |> Table.stream() |> Enum.count() == 2
    end

    # OTP 25: 0.0 === -0.0. A search must agree with a plain === filter
    # whichever zero the record or the condition holds, also inside tuples
    # and lists of terms, through search_many/2, :store's id-to-terms map,
    # and after records holding either zero are replaced and deleted.
    test "0.0 and -0.0 are one term, as === says" do
      neg = -0.0
      pos = 0.0

      for store <- [nil, [:p]] do
        table = Table.new(key: :id, index: [:p, {:t, &[{:z, &1.p}, [&1.p]]}], store: store)
        records = [%{id: 1, p: neg}, %{id: 2, p: pos}, %{id: 3, p: 1.0}, %{id: 4, p: 0}]
        :ok = Table.insert_many(table, records)

        for zero <- [pos, neg], condition <- [[p: zero], [t: {:z, zero}], [t: [zero]]] do
          expected = for r <- records, r.p === zero, do: r.id
          assert expected == [1, 2]
          assert Table.search_keys(table, condition) == expected
          assert Table.count(table, condition) == 2
          assert [found] = Table.search_many(table, [condition])
          assert Enum.map(found, & &1.id) == expected
          assert Table.search_keys(table, p: {:in, [zero]}) == expected
        end

        # Replaced by the other zero, then by something else, then deleted:
        # each leaves the index as a plain filter says.
        :ok = Table.insert(table, %{id: 1, p: pos})
        {:ok, _} = Table.merge(table, 2, %{p: neg})
        assert Table.search_keys(table, p: neg) == [1, 2]
        :ok = Table.update(table, 1, %{id: 1}, fn r -> %{r | p: 5.0} end)
        assert Table.search_keys(table, t: {:z, pos}) == [2]
        :ok = Table.delete(table, 2)
        assert Table.search_keys(table, p: pos) == []
        assert Table.search_keys(table, t: [neg]) == []
        assert Table.search_keys(table, p: 5.0) == [1]
        :ok = Table.drop(table)
      end
    end
  end

  describe "terms/2" do
    test "the distinct terms of one index, as they are after writes and deletes", ctx do
      table =
        Table.new(
          key: :id,
          name: :"#{ctx.test}",
          index: [:color, {:tags, & &1.tags}]
        )

      :ok =
        Table.insert_many(table, [
          %{id: 1, color: :red, tags: [:a, :b]},
          %{id: 2, color: :red, tags: [:b]},
          %{id: 3, color: :blue, tags: []}
        ])

      assert Enum.sort(Table.terms(table, :color)) == [:blue, :red]
      # by name too; a multi-valued index gives each term once
      assert Enum.sort(Table.terms(:"#{ctx.test}", :tags)) == [:a, :b]

      :ok = Table.delete(table, 3)
      Table.delete(table, 1)
      assert Table.terms(table, :color) == [:red]
      assert Table.terms(table, :tags) == [:b]

      assert_raise ArgumentError, ~r/:size/, fn -> Table.terms(table, :size) end
      Table.drop(table)
      assert_raise ArgumentError, ~r/unknown Larder.Table/, fn -> Table.terms(table, :color) end
    end
  end

  describe "bad input" do
    test "a record without the key raises, and nothing is written" do
      table = catalogue_like()

      assert_raise ArgumentError, ~r/record must have the key field :idx/, fn ->
        Table.insert_many(table, [price(1, "o", "MRC", "1", "x"), %{spec: "MRC"}])
      end

      assert Table.size(table) == 0
    end

    test "an index function that raises leaves its chunk unwritten" do
      table = Table.new(key: :id, index: [{:n, fn %{n: n} when n > 0 -> n end}])

      assert_raise ArgumentError, ~r/\(FunctionClauseError\) no function clause matching/, fn ->
        Table.insert_many(table, [%{id: 1, n: 1}, %{id: 2, n: 0}])
      end

      assert Table.size(table) == 0
      assert Table.search(table, n: 1) == []
    end

    test "improper lists, non-map records and bad options name the argument" do
      table = Table.new(key: :id, index: [:a, {:m, & &1.tags}])
      :ok = Table.insert(table, %{id: 1, a: 1, tags: [1]})

      for {call, message} <- [
            {fn -> Table.insert_many(table, [%{id: 2, a: 1, tags: []} | :x]) end, ~r/records/},
            {fn -> Table.insert(table, :x) end, ~r/record must be a map/},
            {fn -> Table.insert(table, %{id: 3, tags: [1 | 2]}) end, ~r/index function of :m/},
            {fn -> Table.search(table, [{:a, 1} | :x]) end, ~r/conditions/},
            {fn -> Table.search(table, a: {:in, [1 | 2]}) end, ~r/\{:in, values\} for :a/},
            {fn -> Table.search_many(table, [[a: 1] | :x]) end, ~r/searches/},
            {fn -> Table.merge(table, 1, a: 2) end, ~r/changes must be a map/},
            {fn -> Table.new(key: :id, index: [:a | :b]) end, ~r/option :index/},
            {fn -> Table.new(key: :id, store: [:a | :b]) end, ~r/option :store/},
            {fn -> Table.new(key: :id, name: "t") end, ~r/option :name/},
            {fn -> Table.new([{:key, :id} | :x]) end, ~r/keyword list/},
            {fn -> Table.get(struct(table, rows: make_ref()), 1) end, ~r/unknown Larder.Table/},
            {fn -> Table.insert(struct(table, writer: self()), %{id: 9, tags: []}) end,
             ~r/unknown Larder.Table/}
          ] do
        assert_raise ArgumentError, message, call
      end

      assert Table.search(table, []) == [%{id: 1, a: 1, tags: [1]}]
    end

    test "a dropped table or one whose owner exited raises a clear ArgumentError", context do
      table = Table.new(key: :id, index: [:a])
      :ok = Table.insert(table, %{id: 1, a: 1, test: context.test})
      :ok = Table.drop(table)

      for call <- [
            fn -> Table.get(table, 1) end,
            fn -> Table.search(table, a: 1) end,
            fn -> Table.search(table, a: 2) end,
            fn -> Table.count(table, a: 1) end,
            fn -> Table.search_keys(table, a: 1) end,
            fn -> Table.insert(table, %{id: 2, a: 1}) end,
            fn -> Table.delete(table, 1) end,
            fn -> Table.size(table) end,
            fn -> Table.memory(table) end,
            fn -> Table.merge(table, 1, %{a: 2}) end
          ] do
        assert_raise ArgumentError, ~r/unknown Larder.Table/, call
      end

      # The owner frees the table once it has seen its caller exit: a
      # moment after Task.await/1 returns, longer on a loaded machine.
      orphan = Task.async(fn -> Table.new(key: :id, index: [:a]) end) |> Task.await()
      eventually(fn -> raises_argument_error?(fn -> Table.get(orphan, 1) end) end)
      assert_raise ArgumentError, ~r/unknown Larder.Table/, fn -> Table.get(orphan, 1) end

      assert_raise ArgumentError, ~r/unknown Larder.Table :nope: it was never created/, fn ->
        Table.get(:nope, 1)
      end

      assert_raise ArgumentError,
                   ~r/expected a Larder.Table \(a handle or the name of one\), got: "nope"/,
                   fn -> Table.get("nope", 1) end
    end
  end

  describe "an index function that fails" do
    # The ArgumentError the caller gets, and its stacktrace.
    defp index_error(fun) do
      fun.()
      flunk("expected the write to raise")
    rescue
      error in ArgumentError -> {error.message, __STACKTRACE__}
    end

    test "insert/2: names the table, the index, the operation and the key; the original's message",
         ctx do
      by_nope = fn record -> record.nope end
      table = Table.new(key: :id, name: ctx.test, index: [:a, {:by_nope, by_nope}])
      :ok = Table.insert(table, %{id: 1, a: 1, nope: :x})

      {message, stack} = index_error(fn -> Table.insert(ctx.test, %{id: 2, a: 1}) end)

      assert message ==
               "Larder.Table #{inspect(ctx.test)}: the index function of :by_nope raised on " <>
                 "the record with key 2 in insert/2, and the write was not applied: " <>
                 "** (KeyError) key :nope not found in: %{a: 1, id: 2}"

      # The stacktrace is the index function's own.
      assert [{__MODULE__, _by_nope, 1, _location}, {Larder.Table.Records, _, _, _} | _] = stack
      assert Table.get(table, 2) == nil
      assert Table.search_keys(table, a: 1) == [1]
    end

    test "insert_many/2: the chunk it was in and every later one are not written; the message says what was" do
      table = Table.new(key: :id, index: [{:n, &Map.fetch!(&1, :n)}])
      records = for id <- 1..12_000, do: if(id == 7_001, do: %{id: id}, else: %{id: id, n: 1})

      {message, _stack} = index_error(fn -> Table.insert_many(table, records) end)

      assert message =~
               ~r/^#Larder.Table<key: :id, writer: #PID<[\d.]+>>: the index function of :n raised on the record with key 7001 in insert_many\/2, and the write stopped there \(its first 5000 records were written, in whole chunks of 5000; none from record 5001 on\): \*\* \(KeyError\) key :n not found in: %\{id: 7001\}$/

      assert Table.size(table) == 5_000
      assert Table.count(table, n: 1) == 5_000

      {message, _stack} = index_error(fn -> Table.insert_many(table, [%{id: 20_000}]) end)
      assert message =~ "in insert_many/2, and the write was not applied (none of its records"
      assert Table.size(table) == 5_000
    end

    test "merge/3 and update/4 (run by the writer): the record is left as it was; throws and exits too" do
      index = fn
        %{bad: :raise} -> raise "bad record"
        %{bad: :throw} -> throw(:bad)
        %{bad: :exit} -> exit(:bad)
        _ -> :ok
      end

      table = Table.new(key: :id, index: [{:check, index}])
      :ok = Table.insert(table, %{id: 1})

      for {bad, banner} <- [
            raise: "** (RuntimeError) bad record",
            throw: "** (throw) :bad",
            exit: "** (exit) :bad"
          ] do
        verb = %{raise: "raised", throw: "threw", exit: "exited"}[bad]

        {message, _} = index_error(fn -> Table.merge(table, 1, %{bad: bad}) end)

        assert message =~
                 "the index function of :check #{verb} on the record with key 1 in merge/3, " <>
                   "and the write was not applied (the record is as it was): #{banner}"

        {message, _} =
          index_error(fn -> Table.update(table, 1, %{id: 1}, &Map.put(&1, :bad, bad)) end)

        assert message =~
                 "the index function of :check #{verb} on the record with key 1 in update/4, " <>
                   "and the write was not applied: #{banner}"

        {message, _} = index_error(fn -> Table.update(table, 2, %{id: 2, bad: bad}, & &1) end)
        assert message =~ "on the record with key 2 in update/4"
      end

      assert Table.search(table, check: :ok) == [%{id: 1}]
      assert Table.size(table) == 1
    end
  end

  describe "handles" do
    test "inspect shows a handle in one short line, and so do the errors about a dropped one",
         ctx do
      anonymous = Table.new(key: :id, index: [:a])
      named = Table.new(key: :sku, name: ctx.test)

      assert inspect(anonymous) =~ ~r/^#Larder.Table<key: :id, writer: #PID<[\d.]+>>$/
      assert inspect(named) == "#Larder.Table<name: #{inspect(ctx.test)}, key: :sku>"

      :ok = Table.drop(anonymous)
      :ok = Table.drop(named)

      assert_raise ArgumentError,
                   ~r/^unknown Larder.Table #Larder.Table<key: :id, writer: #PID<[\d.]+>>: it was dropped, or the process that owned it exited$/,
                   fn -> Table.insert(anonymous, %{id: 1}) end

      assert_raise ArgumentError,
                   "unknown Larder.Table #{inspect(ctx.test)}: it was never created, it was " <>
                     "dropped, or the process that owned it exited",
                   fn -> Table.size(named) end
    end
  end

  describe "model (PropEr)" do
    # About 0.2 s each on a quiet machine; when both cores are saturated, each
    # write's hop to a dirty scheduler can wait for an OS time slice, and the
    # 50 cases have taken over a minute. The limit guards against a hang only.
    @describetag timeout: :timer.minutes(10)

    # Random inserts, updates and deletes from several processes, each on its
    # own keys but sharing every index term; afterwards each search must equal
    # a plain filter over a map of the records.
    test "search equals a plain filter after concurrent writes (full records)" do
      PropEr.check(:proper.forall(scenario(), &holds?(&1, nil)), numtests: 50)
    end

    test "search equals a plain filter after concurrent writes (store: limited)" do
      PropEr.check(:proper.forall(scenario(), &holds?(&1, [:a, :tags])), numtests: 50)
    end
  end

  @procs 3

  defp scenario do
    :proper_types.tuple([:proper_types.list(op()), :proper_types.list(conditions())])
  end

  defp key,
    do:
      :proper_types.oneof([:proper_types.range(0, 4), :proper_types.oneof(["k1", "k2", {:k, 3}])])

  # 0.0 and -0.0 are === on OTP 25: a search must treat them as one value.
  defp small,
    do:
      :proper_types.frequency([
        {4, :proper_types.range(0, 3)},
        {1, :proper_types.oneof([:proper_types.exactly(0.0), :proper_types.exactly(-0.0)])}
      ])

  defp fields do
    :proper_types.tuple([
      small(),
      :proper_types.oneof([small(), :none]),
      :proper_types.list(small())
    ])
  end

  defp op do
    :proper_types.oneof([
      :proper_types.tuple([:proper_types.exactly(:insert), key(), fields()]),
      :proper_types.tuple([
        :proper_types.exactly(:insert_many),
        :proper_types.list(:proper_types.tuple([key(), fields()]))
      ]),
      :proper_types.tuple([
        :proper_types.exactly(:merge),
        key(),
        :proper_types.oneof([:a, :b]),
        small()
      ]),
      :proper_types.tuple([
        :proper_types.exactly(:update),
        key(),
        fields(),
        :proper_types.oneof([:a, :b]),
        small()
      ]),
      :proper_types.tuple([:proper_types.exactly(:delete), key()])
    ])
  end

  defp conditions do
    value =
      :proper_types.oneof([
        small(),
        :proper_types.tuple([:proper_types.exactly(:in), :proper_types.list(small())])
      ])

    :proper_types.list(:proper_types.tuple([:proper_types.oneof([:a, :b, :m]), value]))
  end

  defp record(proc, key, {a, b, tags}) do
    base = %{id: {proc, key}, a: a, tags: tags}
    if b == :none, do: base, else: Map.put(base, :b, b)
  end

  # Keys are {proc, key}; they are not integers, so they get assigned row ids.
  # Integer keys go straight in as row ids: proc * 100 + key.
  defp table_key(proc, key) when is_integer(key), do: proc * 100 + key
  defp table_key(proc, key), do: {proc, key}

  defp holds?({ops, queries}, store) do
    table = Table.new(key: :id, index: [:a, :b, {:m, & &1.tags}], store: store)

    per_proc =
      ops |> Enum.with_index() |> Enum.group_by(fn {_, i} -> rem(i, @procs) end, &elem(&1, 0))

    per_proc
    |> Enum.map(fn {proc, proc_ops} ->
      Task.async(fn -> Enum.each(proc_ops, &run(table, proc, &1)) end)
    end)
    |> Enum.each(&Task.await(&1, 30_000))

    model =
      Enum.reduce(per_proc, %{}, fn {proc, proc_ops}, m ->
        Enum.reduce(proc_ops, m, &model(&2, proc, &1, store))
      end)

    # The table's snapshot, loaded, must hold the model too (dump/2 and
    # load/2 as one more step of the scenario).
    path = Path.join(System.tmp_dir!(), "larder_model_#{System.unique_integer([:positive])}")
    :ok = Table.dump(table, path)
    copy = Table.load!(path, key: :id, index: [:a, :b, {:m, & &1.tags}], store: store)
    File.rm!(path)

    agrees?(table, model, queries, store) and agrees?(copy, model, queries, store)
  end

  defp agrees?(table, model, queries, store) do
    project = fn r -> if store, do: Map.take(r, [:id | store]), else: r end
    sort = fn rs -> Enum.sort_by(rs, & &1.id) end

    answers = Table.search_many(table, queries)

    Table.size(table) == map_size(model) and
      Enum.all?(model, fn {k, r} -> Table.get(table, k) == project.(r) end) and
      Enum.zip(queries, answers)
      |> Enum.all?(fn {conditions, many_answer} ->
        expected =
          model
          |> Map.values()
          |> Enum.filter(&matches?(&1, conditions))
          |> Enum.map(project)
          |> sort.()

        found = Table.search(table, conditions)

        sort.(found) == expected and found == many_answer and
          Table.count(table, conditions) == length(expected) and
          Enum.sort(Table.search_keys(table, conditions)) ==
            Enum.sort(Enum.map(expected, & &1.id))
      end)
  end

  defp run(table, proc, {:insert, key, fields}),
    do: :ok = Table.insert(table, with_key(record(proc, key, fields), proc, key))

  defp run(table, proc, {:insert_many, entries}) do
    :ok =
      Table.insert_many(
        table,
        for({key, fields} <- entries, do: with_key(record(proc, key, fields), proc, key))
      )
  end

  defp run(table, proc, {:merge, key, field, value}),
    do: Table.merge(table, table_key(proc, key), %{field => value})

  defp run(table, proc, {:update, key, fields, field, value}) do
    default = with_key(record(proc, key, fields), proc, key)
    :ok = Table.update(table, table_key(proc, key), default, &Map.put(&1, field, value))
  end

  defp run(table, proc, {:delete, key}), do: :ok = Table.delete(table, table_key(proc, key))

  defp with_key(record, proc, key), do: %{record | id: table_key(proc, key)}

  defp model(m, proc, {:insert, key, fields}, _store),
    do: Map.put(m, table_key(proc, key), with_key(record(proc, key, fields), proc, key))

  defp model(m, proc, {:insert_many, entries}, store),
    do:
      Enum.reduce(entries, m, fn {key, fields}, m ->
        model(m, proc, {:insert, key, fields}, store)
      end)

  # update/4 is Map.update/4 of the record as the table stores it.
  defp model(m, proc, {:update, key, fields, field, value}, store) do
    stored = fn r -> if store, do: Map.take(r, [:id | store]), else: r end
    default = with_key(record(proc, key, fields), proc, key)
    Map.update(m, table_key(proc, key), default, &Map.put(stored.(&1), field, value))
  end

  defp model(m, proc, {:merge, key, field, value}, _store) do
    k = table_key(proc, key)
    if Map.has_key?(m, k), do: Map.update!(m, k, &Map.put(&1, field, value)), else: m
  end

  defp model(m, proc, {:delete, key}, _store), do: Map.delete(m, table_key(proc, key))

  defp matches?(record, conditions), do: Enum.all?(conditions, &holds_for?(record, &1))

  defp holds_for?(record, {name, {:in, values}}),
    do: Enum.any?(values, &holds_for?(record, {name, &1}))

  defp holds_for?(record, {:m, v}), do: Enum.any?(record.tags, &(&1 === v))

  defp holds_for?(record, {field, v}),
    do: Map.has_key?(record, field) and Map.fetch!(record, field) === v
end
