defmodule Larder.BagTest do
  use ExUnit.Case, async: true

  # Each load logs a line at info (checked in Larder.Bag.SnapshotTest).
  @moduletag :capture_log

  import Bitwise, only: [<<<: 2]
  import Larder.Test.Eventually

  alias Larder.Bag

  doctest Larder.Bag

  defp tmp_path(context) do
    dir = Path.join(System.tmp_dir!(), "larder_bag_test_#{System.unique_integer([:positive])}")
    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf!(dir) end)
    Path.join(dir, "#{context.test}.bag" |> String.replace(~r/[^\w.]+/, "_"))
  end

  # A set: :ets.all/0 lists tables in no fixed order, and tables other tests
  # create meanwhile can change that order.
  defp own_tables,
    do: :ets.all() |> Enum.filter(&(:ets.info(&1, :owner) == self())) |> MapSet.new()

  describe "set semantics" do
    test "a pair is stored once, values of a key come back in insertion order" do
      bag = Bag.new()
      for _ <- 1..3, v <- [3, 1, 2], do: Bag.insert(bag, :k, v)
      Bag.insert(bag, :other, 1)

      assert Bag.lookup(bag, :k) == [3, 1, 2]
      assert Bag.count(bag, :k) == 3
      assert Bag.size(bag) == 4
      assert Bag.lookup(bag, :missing) == []
      assert Bag.count(bag, :missing) == 0
    end

    test "insert_many deduplicates within the batch and against the bag" do
      bag = Bag.new()
      Bag.insert(bag, :a, 1)
      assert Bag.insert_many(bag, [{:a, 1}, {:a, 2}, {:a, 2}, {:b, 1}]) == :ok
      assert Bag.insert_many(bag, []) == :ok
      assert Enum.sort(Bag.stream(bag)) == [a: 1, a: 2, b: 1]
    end

    test "delete/2 removes a key, delete/3 one pair" do
      bag = Bag.new()
      Bag.insert_many(bag, [{:a, 1}, {:a, 2}, {:b, 1}, {:b, 2}])
      assert Bag.delete(bag, :a) == :ok
      assert Bag.delete(bag, :b, 1) == :ok
      assert Bag.delete(bag, :nothing) == :ok
      assert Bag.delete(bag, :b, :nothing) == :ok
      assert Enum.to_list(Bag.stream(bag)) == [b: 2]
      refute Bag.member?(bag, :b, 1)
      assert Bag.member?(bag, :b, 2)
    end

    test "keys that look like match-spec variables are matched literally" do
      bag = Bag.new()
      keys = [:_, :"$1", {:"$2", :_}, [:_ | :"$3"], %{:_ => :"$4"}, :plain]
      for k <- keys, v <- [1, 2], do: Bag.insert(bag, k, v)

      for k <- keys do
        assert Bag.lookup(bag, k) == [1, 2], "lookup of #{inspect(k)}"
        assert Bag.count(bag, k) == 2
      end

      Bag.delete(bag, :_)
      Bag.delete(bag, {:"$2", :_})
      assert Enum.sort(Bag.keys(bag)) == Enum.sort(keys -- [:_, {:"$2", :_}])
      assert Bag.size(bag) == 8
    end

    test "a map key matches only that map, not larger ones" do
      bag = Bag.new()
      Bag.insert(bag, %{a: 1}, :small)
      Bag.insert(bag, %{a: 1, b: 2}, :large)
      Bag.insert(bag, {:user, %{a: 1}}, :nested)
      Bag.insert(bag, {:user, %{a: 1, b: 2}}, :nested_large)

      assert Bag.lookup(bag, %{a: 1}) == [:small]
      assert Bag.lookup(bag, {:user, %{a: 1}}) == [:nested]
      assert Bag.count(bag, %{a: 1}) == 1
      Bag.delete(bag, %{a: 1})
      assert Bag.lookup(bag, %{a: 1, b: 2}) == [:large]
      assert Bag.size(bag) == 3
    end

    test "keys and values of any shape, including lists as values" do
      bag = Bag.new()
      pairs = [{"k", [1, 2]}, {"k", [1 | 2]}, {"k", []}, {{1, "x"}, %{a: [1]}}, {[], self()}]
      Bag.insert_many(bag, pairs)
      assert Enum.sort(Bag.lookup(bag, "k")) == Enum.sort([[1, 2], [1 | 2], []])
      assert Bag.lookup(bag, {1, "x"}) == [%{a: [1]}]
      assert Bag.lookup(bag, []) == [self()]
      assert Enum.sort(Bag.stream(bag)) == Enum.sort(pairs)
    end

    test "pairs compare with =:=, like ETS :bag: 1 and 1.0 are two pairs, 0.0 and -0.0 one" do
      ops = [
        {1, :a},
        {1.0, :a},
        {:k, 1},
        {:k, 1.0},
        {:z, 0.0},
        {:z, -0.0},
        {0.0, :v},
        {-0.0, :v},
        {:k, 1}
      ]

      ets = :ets.new(:model, [:bag])
      Enum.each(ops, &:ets.insert(ets, &1))

      for how <- [:insert, :insert_many] do
        bag = Bag.new()

        if how == :insert,
          do: Enum.each(ops, fn {k, v} -> Bag.insert(bag, k, v) end),
          else: Bag.insert_many(bag, ops)

        assert Bag.size(bag) == :ets.info(ets, :size), "#{how}"

        for k <- [1, 1.0, :k, :z, 0.0, -0.0] do
          assert Bag.lookup(bag, k) == for({_, v} <- :ets.lookup(ets, k), do: v), "#{how} #{k}"
        end

        assert Bag.member?(bag, 1.0, :a) and Bag.member?(bag, 1, :a)
        assert Bag.member?(bag, :z, -0.0)
        Bag.delete(bag, :k, 1.0)
        assert Bag.lookup(bag, :k) == [1]
      end
    end

    test "a re-insert keeps a pair's place; delete then insert moves it last, as in ETS :bag" do
      ets = :ets.new(:model, [:bag])
      bag = Bag.new()

      ops = [
        {:insert, 1},
        {:insert, 2},
        {:insert, 3},
        {:insert, 1},
        {:delete, 2},
        {:insert, 2},
        {:insert, 3}
      ]

      for {op, v} <- ops do
        if op == :insert,
          do: {:ets.insert(ets, {:k, v}), Bag.insert(bag, :k, v)},
          else: {:ets.delete_object(ets, {:k, v}), Bag.delete(bag, :k, v)}
      end

      assert Bag.lookup(bag, :k) == [1, 3, 2]
      assert Bag.lookup(bag, :k) == for({_, v} <- :ets.lookup(ets, :k), do: v)
    end

    test "the NIF fingerprint table counts like a multiset under random adds and removes" do
      alias Larder.Native
      set = Native.bag_fps_new(2)
      # Few distinct values (including 0), so probe runs collide and wrap.
      values = [0 | for(_ <- 1..300, do: :rand.uniform(1 <<< 40))]

      model =
        Enum.reduce(1..20_000, %{}, fn _, model ->
          fp = Enum.random(values)
          <<hi::32, lo::32>> = <<fp::64>>

          case :rand.uniform(3) do
            1 ->
              new = Native.bag_fps_add(set, hi, lo)
              assert new == not Map.has_key?(model, fp)
              Map.put_new(model, fp, 1)

            2 ->
              Native.bag_fps_incr(set, hi, lo)
              Map.update(model, fp, 1, &(&1 + 1))

            3 ->
              Native.bag_fps_remove(set, hi, lo)

              case model do
                %{^fp => 1} -> Map.delete(model, fp)
                %{^fp => n} -> %{model | fp => n - 1}
                _ -> model
              end
          end
        end)

      assert Native.bag_fps_count(set) == model |> Map.values() |> Enum.sum()

      for fp <- values do
        <<hi::32, lo::32>> = <<fp::64>>
        # add/3 answers whether the fingerprint was absent; undo the add.
        absent = Native.bag_fps_add(set, hi, lo)
        assert absent == not Map.has_key?(model, fp)
        if absent, do: Native.bag_fps_remove(set, hi, lo)
      end

      Native.bag_fps_remove_many(
        set,
        Enum.flat_map(model, fn {fp, n} -> List.duplicate(fp, n) end)
      )

      assert_fps_emptied(set, 2)
    end

    test "memory/1 is the table's size in words and grows with the pairs" do
      bag = Bag.new()
      empty = Bag.memory(bag)
      assert is_integer(empty) and empty > 0
      Bag.insert_many(bag, for(v <- 1..1_000, do: {:k, v}))
      assert Bag.memory(bag) > empty + 1_000
      # The fingerprint set is counted: more than the ETS table alone.
      assert Bag.memory(bag) > :ets.info(bag.tab, :memory)
    end

    test "keys/1 lists each key once" do
      bag = Bag.new()
      Bag.insert_many(bag, for(k <- 1..50, v <- 1..30, do: {k, v}))
      assert Enum.sort(Bag.keys(bag)) == Enum.to_list(1..50)

      # 1 and 1.0 are different keys.
      other = Bag.new()
      Bag.insert_many(other, [{1, :a}, {1.0, :b}, {1, :c}])
      assert Enum.sort(Bag.keys(other)) == [1, 1.0]
    end

    test "stream/1 is lazy and covers more than one chunk" do
      bag = Bag.new()
      pairs = for k <- 1..30, v <- 1..100, do: {k, v}
      Bag.insert_many(bag, pairs)
      assert bag |> Bag.stream() |> Enum.take(5) |> length() == 5
      assert Enum.sort(Bag.stream(bag)) == pairs
    end
  end

  describe "dedup: false" do
    test "behaves like a duplicate_bag" do
      bag = Bag.new(dedup: false)
      Bag.insert(bag, :a, 1)
      Bag.insert(bag, :a, 1)
      Bag.insert_many(bag, [{:a, 2}, {:a, 1}, {:b, 1}])
      assert Bag.lookup(bag, :a) == [1, 1, 2, 1]
      assert Bag.count(bag, :a) == 4
      assert Bag.size(bag) == 5
      assert Bag.member?(bag, :a, 2)
      refute Bag.member?(bag, :a, 3)
      assert Enum.sort(Bag.keys(bag)) == [:a, :b]
      Bag.delete(bag, :a, 1)
      assert Bag.lookup(bag, :a) == [2]
      Bag.delete(bag, :a)
      assert Enum.to_list(Bag.stream(bag)) == [b: 1]
    end
  end

  describe "named bags" do
    test "are reachable by name from other processes", context do
      name = context.test
      bag = Bag.new(name: name)
      Task.async(fn -> Bag.insert(name, :k, :from_task) end) |> Task.await()
      assert Bag.lookup(bag, :k) == [:from_task]
      assert Bag.lookup(name, :k) == [:from_task]
      assert Bag.size(name) == 1
      assert Bag.drop(name) == :ok
      assert Bag.drop(name) == :ok
      assert Bag.drop(bag) == :ok
      assert_raise ArgumentError, ~r/unknown Larder.Bag :/, fn -> Bag.lookup(name, :k) end
      assert_raise ArgumentError, ~r/unknown Larder.Bag/, fn -> Bag.lookup(bag, :k) end
    end

    test "drop/1 frees the fingerprint set at once, though a handle remains" do
      bag = Bag.new()
      Bag.insert_many(bag, for(i <- 1..20_000, do: {i, i}))
      %{fps: fps} = bag
      {empty, _lock} = Larder.Bag.Dedup.new()
      assert Larder.Native.bag_fps_memory(fps) > Larder.Native.bag_fps_memory(empty)

      :ok = Bag.drop(bag)
      assert Larder.Native.bag_fps_count(fps) == 0
      assert Larder.Native.bag_fps_memory(fps) == Larder.Native.bag_fps_memory(empty)
    end

    test "drop/1 of an old handle leaves a new bag of the same name alone", context do
      old = Bag.new(name: context.test)
      :ok = Bag.drop(old)
      new = Bag.new(name: context.test)
      Bag.insert(new, :k, :v)
      assert Bag.drop(old) == :ok
      assert Bag.lookup(context.test, :k) == [:v]
      :ok = Bag.drop(new)
    end

    test "a second bag with the same name is refused", context do
      Bag.new(name: context.test)

      assert_raise ArgumentError, ~r/already exists/, fn ->
        Bag.new(name: context.test, dedup: false)
      end
    end

    test "a supervised bag outlives the processes that use it", context do
      name = context.test
      pid = start_supervised!({Bag, name: name, dedup: false})

      {:ok, writer} = Task.start(fn -> Bag.insert(name, :k, 1) end)
      ref = Process.monitor(writer)
      assert_receive {:DOWN, ^ref, _, _, _}

      assert Bag.lookup(name, :k) == [1]
      assert :ets.info(:sys.get_state(pid).tab, :owner) == pid
    end

    test "child_spec/1 ids the child by name", context do
      assert %{id: {Bag, name}} = Bag.child_spec(name: context.test)
      assert name == context.test
    end

    test "start_link/1 returns an error when the name is taken", context do
      Bag.new(name: context.test)
      Process.flag(:trap_exit, true)

      assert {:error, {:already_started, owner}} = Bag.start_link(name: context.test)
      assert owner == self()
    end

    test "start_link/1 requires a name" do
      assert_raise ArgumentError,
                   ~r/expected Larder.Bag option :name to be an atom, got nothing/,
                   fn -> Bag.start_link([]) end
    end

    test "a bag whose owner exited raises a clear error", context do
      name = context.test

      {:ok, owner} =
        Task.start(fn ->
          Bag.new(name: name)

          receive do
            :stop -> :ok
          end
        end)

      eventually(fn -> :persistent_term.get({Bag, name}, nil) != nil end, 1_000, 5)
      ref = Process.monitor(owner)
      send(owner, :stop)
      assert_receive {:DOWN, ^ref, _, _, _}

      assert_raise ArgumentError,
                   ~r/unknown Larder.Bag #{inspect(name)}: .*owned it exited/,
                   fn ->
                     Bag.insert(name, 1, 1)
                   end
    end
  end

  describe "bad input" do
    test "a deleted bag raises ArgumentError from every function" do
      for dedup <- [true, false] do
        bag = Bag.new(dedup: dedup)
        assert Bag.drop(bag) == :ok

        calls = [
          fn -> Bag.insert(bag, 1, 1) end,
          fn -> Bag.insert_many(bag, [{1, 1}]) end,
          fn -> Bag.lookup(bag, 1) end,
          fn -> Bag.member?(bag, 1, 1) end,
          fn -> Bag.delete(bag, 1) end,
          fn -> Bag.delete(bag, 1, 1) end,
          fn -> Bag.count(bag, 1) end,
          fn -> Bag.size(bag) end,
          fn -> Bag.memory(bag) end,
          fn -> Bag.keys(bag) end,
          fn -> Enum.to_list(Bag.stream(bag)) end,
          fn -> Bag.dump(bag, "/tmp/never-written") end
        ]

        for call <- calls do
          assert_raise ArgumentError, ~r/unknown Larder.Bag .*dropped/, call
        end

        # drop/1 alone is idempotent.
        assert Bag.drop(bag) == :ok
      end
    end

    test "a handle shows in one short line, in inspect and in the error about a dropped one",
         ctx do
      anonymous = Bag.new(dedup: false)
      named = Bag.new(name: ctx.test)

      assert inspect(anonymous) == "#Larder.Bag<dedup: false>"
      assert inspect(named) == "#Larder.Bag<name: #{inspect(ctx.test)}>"

      :ok = Bag.drop(anonymous)
      :ok = Bag.drop(named)

      assert_raise ArgumentError,
                   "unknown Larder.Bag #Larder.Bag<dedup: false>: it was dropped, or the " <>
                     "process that owned it exited",
                   fn -> Bag.insert(anonymous, 1, 1) end

      assert_raise ArgumentError,
                   "unknown Larder.Bag #{inspect(ctx.test)}: it was never created, it was " <>
                     "dropped, or the process that owned it exited",
                   fn -> Bag.lookup(named, 1) end
    end

    test "something that is not a bag raises ArgumentError" do
      for handle <- ["bag", 42, make_ref(), %{tab: :x}] do
        assert_raise ArgumentError,
                     ~r/expected a Larder.Bag \(a handle or the name of one\)/,
                     fn ->
                       Bag.lookup(handle, 1)
                     end

        assert_raise ArgumentError,
                     ~r/expected a Larder.Bag \(a handle or the name of one\)/,
                     fn ->
                       Bag.insert(handle, 1, 1)
                     end
      end

      assert_raise ArgumentError, ~r/unknown Larder.Bag :no_such_bag: it was never created/, fn ->
        Bag.size(:no_such_bag)
      end
    end

    test "insert_many rejects anything but a list of pairs" do
      bag = Bag.new()

      assert_raise ArgumentError, ~r/expected pairs to be a list/, fn ->
        Bag.insert_many(bag, %{a: 1})
      end

      assert_raise ArgumentError, ~r/got an element: \{:a, 1, 2\}/, fn ->
        Bag.insert_many(bag, [{:b, 1}, {:a, 1, 2}])
      end

      assert_raise ArgumentError, ~r/proper list/, fn -> Bag.insert_many(bag, [{:b, 1} | :x]) end
      assert Bag.size(bag) == 0

      dup = Bag.new(dedup: false)
      assert_raise ArgumentError, ~r/got an element: :x/, fn -> Bag.insert_many(dup, [:x]) end
    end

    test "options are validated" do
      assert_raise ArgumentError,
                   ~r/unknown Larder.Bag options \[:bogus\]; valid options are: \[:name/,
                   fn ->
                     Bag.new(bogus: 1)
                   end

      assert_raise ArgumentError, ~r/expected Larder.Bag option :dedup to be /, fn ->
        Bag.new(dedup: :yes)
      end

      assert_raise ArgumentError, ~r/expected Larder.Bag option :name to be /, fn ->
        Bag.new(name: "x")
      end

      assert_raise ArgumentError, ~r/keyword list/, fn -> Bag.new(:oops) end

      assert_raise ArgumentError, ~r/unknown Larder.Bag options \[:dedup\]/, fn ->
        Bag.load("x", dedup: true)
      end

      bag = Bag.new(read_concurrency: true, write_concurrency: :auto, compressed: true)
      Bag.insert(bag, :a, 1)
      assert Bag.lookup(bag, :a) == [1]
    end

    test "paths must be strings without null bytes" do
      bag = Bag.new()

      for path <- ["a\0b", ~c"x.bag", 42, nil, {:path}] do
        assert_raise ArgumentError, ~r/expected path to be a string without null bytes/, fn ->
          Bag.dump(bag, path)
        end

        assert_raise ArgumentError, ~r/expected path to be a string without null bytes/, fn ->
          Bag.load(path)
        end
      end
    end

    test "child_spec/1 checks its options like start_link/1" do
      assert_raise ArgumentError, ~r/keyword list/, fn -> Bag.child_spec(:oops) end
      assert_raise ArgumentError, ~r/keyword list/, fn -> Bag.child_spec([{:name, :a} | :x]) end

      assert_raise ArgumentError, ~r/expected Larder.Bag option :name to be /, fn ->
        Bag.child_spec(name: "x")
      end

      assert_raise ArgumentError, ~r/unknown Larder.Bag options \[:bogus\]/, fn ->
        Bag.child_spec(name: :x, bogus: 1)
      end
    end

    test "a forged handle raises ArgumentError naming the bag argument" do
      owner = spawn_link(fn -> receive(do: (:never -> :ok)) end)
      foreign = :ets.new(:foreign, [:set, :protected])
      :ets.give_away(foreign, owner, nil)

      for dedup <- [true, false] do
        forged = struct(Bag, tab: foreign, dedup: dedup)

        for call <- [
              fn -> Bag.insert(forged, 1, 1) end,
              fn -> Bag.insert_many(forged, [{1, 1}]) end,
              fn -> Bag.delete(forged, 1) end,
              fn -> Bag.delete(forged, 1, 1) end,
              fn -> Bag.drop(forged) end
            ] do
          assert_raise ArgumentError,
                       ~r/expected a Larder.Bag \(a handle or the name of one\), got a forged Larder.Bag handle: #Larder.Bag<dedup: (true|false)>$/,
                       call
        end
      end

      for forged <- [struct(Bag, tab: 42, dedup: true), struct(Bag, tab: make_ref(), dedup: 1)] do
        assert_raise ArgumentError, ~r/Larder.Bag/, fn -> Bag.insert(forged, 1, 1) end
        assert_raise ArgumentError, ~r/Larder.Bag/, fn -> Bag.dump(forged, "x") end
        assert_raise ArgumentError, ~r/Larder.Bag/, fn -> Bag.keys(forged) end
        assert_raise ArgumentError, ~r/Larder.Bag/, fn -> Bag.drop(forged) end
      end

      assert :ets.info(foreign, :size) == 0
    end
  end

  describe "concurrency" do
    test "16 writers on one key: the bag equals the model, memory what the content needs" do
      for dedup <- [true, false], write_concurrency <- [false, true] do
        bag = Bag.new(dedup: dedup, write_concurrency: write_concurrency)
        empty = Bag.memory(bag)
        parent = self()
        rounds = 300

        tasks =
          for i <- 1..16 do
            Task.async(fn ->
              send(parent, {:ready, self()})
              receive(do: (:go -> :ok))

              for r <- 1..rounds do
                Bag.insert(bag, :hot, {i, r})
                if dedup, do: Bag.insert(bag, :hot, {:shared, rem(r, 10)})
                batch = for b <- 1..5, do: {:hot, {i, r, b}}
                Bag.insert_many(bag, batch)
                Bag.delete(bag, :hot, {i, r - 1})
                Enum.each(batch, fn {k, v} -> Bag.delete(bag, k, v) end)
              end
            end)
          end

        for t <- tasks, do: assert_receive({:ready, pid} when pid == t.pid)
        Enum.each(tasks, &send(&1.pid, :go))
        Enum.each(tasks, &Task.await(&1, 60_000))

        model =
          for(i <- 1..16, do: {:hot, {i, rounds}}) ++
            if dedup, do: for(s <- 0..9, do: {:hot, {:shared, s}}), else: []

        what = "dedup: #{dedup}, write_concurrency: #{write_concurrency}"
        assert Enum.sort(Bag.stream(bag)) == Enum.sort(model), what
        assert Bag.size(bag) == length(model), what

        fresh = Bag.new(dedup: dedup, write_concurrency: write_concurrency)
        Bag.insert_many(fresh, model)
        assert_memory(bag, fresh, what)

        Bag.delete(bag, :hot)
        assert Bag.memory(bag) <= empty, what
      end
    end

    test "writers killed mid-insert_many leave all or none of each batch, and no leak" do
      for dedup <- [true, false], write_concurrency <- [false, true] do
        bag = Bag.new(dedup: dedup, write_concurrency: write_concurrency)
        batch = 50_000

        writers =
          for i <- 1..16 do
            pairs = for v <- 1..batch, do: {:hot, {i, v}}
            pid = spawn(fn -> Bag.insert_many(bag, pairs) end)
            ref = Process.monitor(pid)
            # Kill at a random moment: before, during or after the insert.
            Process.sleep(:rand.uniform(30) - 1)
            Process.exit(pid, :kill)
            {i, ref}
          end

        for {_, ref} <- writers, do: assert_receive({:DOWN, ^ref, _, _, _}, 30_000)

        # A writer of the key takes over a dead writer's slot and repairs it.
        Bag.insert(bag, :hot, :probe)
        Bag.delete(bag, :hot, :probe)

        counts = Enum.frequencies_by(Bag.lookup(bag, :hot), fn {i, _} -> i end)
        what = "dedup: #{dedup}, write_concurrency: #{write_concurrency}: #{inspect(counts)}"
        assert Enum.all?(counts, fn {_, n} -> n == batch end), what

        content = Enum.to_list(Bag.stream(bag))
        fresh = Bag.new(dedup: dedup, write_concurrency: write_concurrency)
        Bag.insert_many(fresh, content)
        assert_memory(bag, fresh, what)
      end
    end

    test "writers of one key killed mid-insert or mid-delete leave no duplicate, no stale fingerprint" do
      bag = Bag.new(write_concurrency: true)
      empty = Bag.memory(bag)

      for round <- 1..20 do
        writers =
          for i <- 1..4 do
            spawn(fn ->
              for r <- Stream.cycle(1..50) do
                Bag.insert(bag, :hot, {i, r})
                Bag.insert(bag, :hot, {:shared, rem(r, 7)})
                Bag.delete(bag, :hot, {i, r - 1})
                if rem(r, 10) == 0, do: Bag.delete(bag, :hot, {:shared, rem(r, 7)})
              end
            end)
          end

        Process.sleep(:rand.uniform(5))

        for pid <- writers do
          ref = Process.monitor(pid)
          Process.exit(pid, :kill)
          assert_receive {:DOWN, ^ref, _, _, _}
        end

        # The next writer of the key takes the dead writers' slot over.
        Bag.insert(bag, :hot, {:probe, round})
        values = Bag.lookup(bag, :hot)
        assert length(values) == length(Enum.uniq(values)), "round #{round}"
        assert fingerprints(bag) == Bag.size(bag), "round #{round}"
      end

      Bag.delete(bag, :hot)
      assert Bag.size(bag) == 0 and fingerprints(bag) == 0
      assert Bag.memory(bag) <= empty
    end

    test "processes inserting the same pairs at once leave exactly one copy of each" do
      for dedup_many <- [false, true] do
        bag = Bag.new(write_concurrency: true)
        pairs = for k <- 1..50, v <- 1..40, do: {k, v}
        parent = self()

        tasks =
          for i <- 1..8 do
            Task.async(fn ->
              send(parent, {:ready, self()})
              receive(do: (:go -> :ok))
              mine = if rem(i, 2) == 0, do: Enum.reverse(pairs), else: pairs

              if dedup_many,
                do: Enum.each(Enum.chunk_every(mine, 100), &Bag.insert_many(bag, &1)),
                else: Enum.each(mine, fn {k, v} -> Bag.insert(bag, k, v) end)
            end)
          end

        for t <- tasks, do: assert_receive({:ready, pid} when pid == t.pid)
        Enum.each(tasks, &send(&1.pid, :go))
        Enum.each(tasks, &Task.await/1)

        assert Bag.size(bag) == length(pairs)
        for k <- 1..50, do: assert(Enum.sort(Bag.lookup(bag, k)) == Enum.to_list(1..40))
      end
    end

    test "a concurrent reader sees none or all of an insert_many batch" do
      bag = Bag.new()
      batches = for b <- 0..49, do: for(v <- 1..100, do: {:k, b * 100 + v})

      writer =
        Task.async(fn ->
          Enum.each(batches, &Bag.insert_many(bag, &1))
        end)

      counts = read_until_done(bag, writer, [])
      assert Enum.all?(counts, &(rem(&1, 100) == 0)), "partial batch seen: #{inspect(counts)}"
      assert Bag.count(bag, :k) == 5_000
    end
  end

  # The bag's ETS memory is what a fresh bag with the same content takes:
  # nothing leaked. A contention-adapting tree (ordered_set with
  # write_concurrency) may keep routing nodes that contention split off.
  # The ETS table takes exactly what a fresh bag with the same content
  # takes; the fingerprint set counts exactly the pairs (no stale or missing
  # fingerprint), and its tables are at most 4x the fresh one's (they shrink
  # below a quarter full) plus the fixed part.
  defp assert_memory(%Bag{tab: tab} = bag, %Bag{tab: fresh_tab} = fresh, what) do
    got = :ets.info(tab, :memory)
    want = :ets.info(fresh_tab, :memory)
    assert got == want, "#{what}: #{got} words, want #{want}"

    if bag.dedup do
      assert fingerprints(bag) == Bag.size(bag), what
      fixed = Bag.memory(Bag.new()) - :ets.info(Bag.new().tab, :memory)
      extra = Bag.memory(bag) - got - fixed
      fresh_extra = Bag.memory(fresh) - want - fixed

      assert extra <= 4 * fresh_extra,
             "#{what}: fingerprints #{extra} words, fresh #{fresh_extra}"
    end
  end

  defp fingerprints(%Bag{fps: fps}), do: Larder.Native.bag_fps_count(fps)

  # The fingerprint set of `shards` shards holds nothing and has shrunk back
  # to a new one's memory.
  defp assert_fps_emptied(set, shards) do
    assert Larder.Native.bag_fps_count(set) == 0

    assert Larder.Native.bag_fps_memory(set) ==
             Larder.Native.bag_fps_memory(Larder.Native.bag_fps_new(shards))
  end

  defp read_until_done(bag, writer, acc) do
    acc = [Bag.count(bag, :k), length(Bag.lookup(bag, :k)) | acc]

    case Task.yield(writer, 0) do
      nil -> read_until_done(bag, writer, acc)
      {:ok, _} -> acc
    end
  end

  describe "snapshots" do
    test "dump and load round-trip both modes", context do
      path = tmp_path(context)

      for dedup <- [true, false] do
        bag = Bag.new(dedup: dedup)
        pairs = for k <- 1..200, v <- 1..30, do: {k, {v, "v#{v}"}}
        Bag.insert_many(bag, pairs ++ [{:dup, 1}, {:dup, 1}])
        assert Bag.dump(bag, path) == :ok

        assert {:ok, copy} = Bag.load(path)
        assert Enum.sort(Bag.stream(copy)) == Enum.sort(Bag.stream(bag))
        assert Bag.size(copy) == Bag.size(bag)
        # The mode travels with the file.
        Bag.insert(copy, :dup, 1)
        assert Bag.count(copy, :dup) == if(dedup, do: 1, else: 3)
      end

      # Only the snapshot is left in the directory: no temporary file.
      assert File.ls!(Path.dirname(path)) == [Path.basename(path)]
    end

    test "load takes new/1 options, including a name", context do
      path = tmp_path(context)
      bag = Bag.new()
      Bag.insert(bag, :a, 1)
      Bag.dump!(bag, path)
      loaded = Bag.load!(path, name: context.test, read_concurrency: true)
      assert Bag.lookup(context.test, :a) == [1]
      assert Bag.lookup(loaded, :a) == [1]
    end

    test "a dump taken while another process writes holds every pair present throughout",
         context do
      path = tmp_path(context)
      bag = Bag.new()
      stable = for k <- 1..200, v <- 1..50, do: {k, v}
      Bag.insert_many(bag, stable)

      parent = self()

      writer =
        Task.async(fn ->
          Bag.insert(bag, 0, :first)
          send(parent, :writing)
          for i <- 1..20_000, do: Bag.insert(bag, rem(i, 300), {:new, i})
        end)

      assert_receive :writing
      Bag.dump!(bag, path)
      Task.await(writer)

      loaded = Bag.stream(Bag.load!(path)) |> MapSet.new()
      assert MapSet.subset?(MapSet.new([{0, :first} | stable]), loaded)
    end

    test "an empty bag round-trips", context do
      path = tmp_path(context)
      Bag.dump!(Bag.new(), path)
      assert Bag.size(Bag.load!(path)) == 0
    end

    test "a flipped byte or a cut-off file is an error and leaves no table", context do
      path = tmp_path(context)
      bag = Bag.new()
      Bag.insert_many(bag, for(k <- 1..100, v <- 1..100, do: {k, v}))
      Bag.dump!(bag, path)
      good = File.read!(path)
      size = byte_size(good)
      before = own_tables()

      corruptions =
        [
          {"flipped byte in the middle", flip(good, div(size, 2))},
          {"flipped byte in a chunk header", flip(good, 13)},
          {"flipped byte in the trailer", flip(good, size - 2)},
          {"flipped magic", flip(good, 0)},
          {"extra byte", good <> <<0>>},
          {"empty", ""}
        ] ++
          for cut <- [1, 11, 20, div(size, 3), size - 12, size - 1] do
            {"cut at #{cut} of #{size}", binary_part(good, 0, cut)}
          end

      for {what, data} <- corruptions do
        File.write!(path, data)

        assert {:error, %Larder.Error{reason: :corrupt_snapshot}} =
                 Bag.load(path, name: context.test),
               what

        assert :persistent_term.get({Bag, context.test}, nil) == nil, what
        assert Larder.Instance.whereis(Bag, context.test) == nil, what
        assert own_tables() == before, what
      end

      File.write!(path, good)
      assert Bag.size(Bag.load!(path)) == 10_000
    end

    test "file system failures are Larder.Errors", context do
      path = tmp_path(context)
      assert {:error, %Larder.Error{reason: :file_error}} = Bag.load(path)

      assert {:error, %Larder.Error{reason: :file_error, details: %{posix: :enoent}}} =
               Bag.dump(Bag.new(), Path.join([path, "no", "such", "dir"]))

      assert_raise Larder.Error, ~r/file_error/, fn -> Bag.load!(path) end
    end
  end

  describe "untrusted snapshots" do
    # A snapshot with valid checksums whose chunks are term_to_binary of each
    # element of `terms` (or the binary itself, if given {:raw, binary}).
    defp forge(path, dedup, payloads) do
      chunks =
        for payload <- payloads do
          {count, bin} =
            case payload do
              {:raw, count, bin} ->
                {count, bin}

              term ->
                {if(is_list(term), do: length_or_1(term), else: 1), :erlang.term_to_binary(term)}
            end

          {count, [<<byte_size(bin)::32, count::32, :erlang.crc32(bin)::32>>, bin]}
        end

      total = chunks |> Enum.map(&elem(&1, 0)) |> Enum.sum()
      data = ["LARDERBAG", 2, dedup, Enum.map(chunks, &elem(&1, 1)), <<0::32, total::64>>]
      File.write!(path, data)
    end

    defp length_or_1(list) do
      length(list)
    rescue
      ArgumentError -> 1
    end

    defp assert_corrupt(path, name, what) do
      before = own_tables()

      assert {:error, %Larder.Error{reason: :corrupt_snapshot}} = Bag.load(path, name: name),
             what

      assert Larder.Instance.whereis(Bag, name) == nil, what
      assert own_tables() == before, what
      assert :persistent_term.get({Larder.Bag, name}, nil) == nil, what
    end

    test "objects of the wrong shape are rejected, whatever the mode byte says", context do
      path = tmp_path(context)

      cases = [
        # files of both modes hold {key, value} tuples only
        {"dedup: a 1-tuple", 1, [[{:k, 1}, {:k}]]},
        {"dedup: version 1 objects {[key | value]}", 1, [[{[:k | 1]}]]},
        {"dedup: a 3-tuple", 1, [[{:k, 2, 3}]]},
        {"dedup: non-tuples", 1, [[1, 2]]},
        {"dedup: not a list", 1, [%{a: 1}]},
        {"dedup: an improper list", 1, [[{:k, 1} | :tail]]},
        {"dedup: a good chunk, then a bad one", 1, [[{:k, 1}], [{[:k | 1]}]]},
        {"dup: version 1 dedup objects (mode byte says dedup: false)", 0, [[{[:k | 1]}]]},
        {"dup: a 3-tuple", 0, [[{:k, 1, 2}]]},
        {"dup: a 1-tuple", 0, [[{:k}]]},
        {"dup: non-tuples", 0, [[:a, :b]]},
        {"dup: an improper list", 0, [[{:k, 1} | {:k, 2}]]}
      ]

      for {what, dedup, payloads} <- cases do
        forge(path, dedup, payloads)
        assert_corrupt(path, context.test, what)
      end

      # The same forge with well-shaped objects loads, in file order; a
      # deduplicating bag keeps the first of a pair the file holds twice.
      forge(path, 1, [[{:k, 2}, {:k, 1}], [{:k, 2}, {:k, 3}, {:k, 1.0}]])
      assert Bag.lookup(Bag.load!(path), :k) == [2, 1, 3, 1.0]
      forge(path, 0, [[{:k, 1}, {:k, 1}]])
      assert Bag.lookup(Bag.load!(path), :k) == [1, 1]
    end

    test "a snapshot of another version is refused", context do
      path = tmp_path(context)
      forge(path, 1, [[{:k, 1}]])
      data = File.read!(path)

      for version <- [0, 1, 3, 255] do
        <<magic::binary-size(9), _v, rest::binary>> = data
        File.write!(path, [magic, version, rest])

        assert {:error, %Larder.Error{reason: :corrupt_snapshot, message: message}} =
                 Bag.load(path)

        assert message =~ "unsupported snapshot version #{version}"
      end
    end

    test "a chunk must be exactly one uncompressed term", context do
      path = tmp_path(context)
      good = :erlang.term_to_binary([{:k, 1}])

      # Trailing bytes after the term, inside a checksummed chunk.
      forge(path, 1, [{:raw, 1, good <> <<0, 1, 2>>}])
      assert_corrupt(path, context.test, "trailing bytes")

      # Not an external term at all.
      forge(path, 1, [{:raw, 1, "garbage"}])
      assert_corrupt(path, context.test, "garbage")

      # A compressed term: 1 MB of zeros in a payload of about a kilobyte.
      # A compressed chunk can declare gigabytes; the loader refuses them all.
      bomb = :erlang.term_to_binary([{:k, <<0::size(8_000_000)>>}], compressed: 9)
      assert byte_size(bomb) < 10_000
      forge(path, 1, [{:raw, 1, bomb}])
      assert_corrupt(path, context.test, "compressed")
    end

    test "header counts are bounded before anything is decoded", context do
      path = tmp_path(context)
      objects = for v <- 1..65_537, do: {:k, v}
      forge(path, 1, [objects])
      assert_corrupt(path, context.test, "65,537 pairs in one chunk")

      # Many values under one key (one hash bucket with dedup: false) still
      # dump in chunks within the bound, so they load.
      one_key = Bag.new(dedup: false)
      Bag.insert_many(one_key, for(v <- 1..100_000, do: {:one, v}))
      Bag.dump!(one_key, path)
      assert Bag.count(Bag.load!(path), :one) == 100_000

      # A count that lies about the payload.
      forge(path, 1, [{:raw, 3, :erlang.term_to_binary([{:k, 1}])}])
      assert_corrupt(path, context.test, "count 3, one object")
    end

    test "a snapshot cannot create atoms unless create_atoms: true", context do
      path = tmp_path(context)
      # An atom that exists nowhere in this VM: spelled out in the external
      # format (ATOM_UTF8_EXT), never written as an atom literal here.
      name = "larder_never_#{System.unique_integer([:positive])}"
      atom_ext = <<118, byte_size(name)::16, name::binary>>
      # [{:k, atom}] in the external format.
      payload = <<131, 108, 1::32, 104, 2, 100, 1::16, "k", atom_ext::binary, 106>>

      forge(path, 1, [{:raw, 1, payload}])
      assert_corrupt(path, context.test, "unknown atom")
      assert_raise ArgumentError, fn -> String.to_existing_atom(name) end

      assert {:ok, bag} = Bag.load(path, create_atoms: true)
      assert Bag.lookup(bag, :k) == [String.to_existing_atom(name)]

      assert_raise ArgumentError, ~r/expected Larder.Bag option :create_atoms to be /, fn ->
        Bag.load(path, create_atoms: :yes)
      end
    end

    # Crash class: the atom table is never collected and its overflow aborts
    # the VM. A file of 1.1M distinct unknown atoms (valid checksums) must be
    # refused, in a peer VM so that a regression does not kill the suite.
    test "a snapshot holding more atoms than the atom table is refused, the VM lives",
         context do
      path = tmp_path(context)
      prefix = "lx#{System.unique_integer([:positive])}_"
      chunk = 65_536

      payloads =
        for c <- 0..16 do
          objects =
            for i <- (c * chunk)..(c * chunk + chunk - 1) do
              name = prefix <> Integer.to_string(i)
              # {:k, atom}: SMALL_TUPLE of two atoms.
              [104, 2, 119, 1, "k", 119, byte_size(name), name]
            end

          {:raw, chunk, IO.iodata_to_binary([131, 108, <<chunk::32>>, objects, 106])}
        end

      forge(path, 1, payloads)

      result =
        Larder.Test.Isolated.run(
          quote do
            Larder.Bag.load(unquote(path))
          end,
          120_000
        )

      assert {:ok, {:error, %Larder.Error{reason: :corrupt_snapshot}}} = result
    end
  end

  defp flip(data, at) do
    <<before::binary-size(at), byte, rest::binary>> = data
    <<before::binary, Bitwise.bxor(byte, 0xFF), rest::binary>>
  end

  test "the life cycle's internals are not part of Larder.Bag's API" do
    # Creating, filling from a snapshot and freeing belong to
    # Larder.Bag.Store; the public module exports its documented API only.
    Code.ensure_loaded!(Bag)

    for {fun, arity} <- [create: 1, create: 2, insert_objects: 2, destroy: 1] do
      refute function_exported?(Bag, fun, arity), "Larder.Bag exports #{fun}/#{arity}"
    end

    {:docs_v1, _, _, _, _, _, docs} = Code.fetch_docs(Bag)
    hidden = for {{:function, f, a}, _, _, :hidden, _} <- docs, f != :__struct__, do: {f, a}
    assert hidden == []
  end
end
