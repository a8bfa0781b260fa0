defmodule Larder.Table.WriterTest do
  # The writer process behind each table: kill-safe writes, one key under
  # many writers, row id reuse, drop/1, names and supervision.
  use ExUnit.Case, async: true

  alias Larder.Table
  alias Larder.Test.Isolated

  import Larder.Test.TableCheck

  @direct_limit 0x80000000

  describe "kill-safety" do
    # A caller killed at a random point of insert_many/2, update/3 or
    # delete/2 never leaves index terms pointing at a row that does not
    # hold them. Before the writer process, the caller wrote the ETS rows
    # and then the index, and a kill between the two left the index behind.
    for store <- [nil, [:a, :tags]] do
      test "callers killed mid-write leave every search equal to a filter (store: #{inspect(store)})" do
        table = table(store: unquote(store))
        keys = Enum.to_list(0..299) ++ for(i <- 0..299, do: "k#{i}")

        for round <- 1..150 do
          v = rem(round, 5)

          killed_midway(round, fn ->
            records = for k <- keys, do: %{id: k, a: v, tags: [v, rem(round, 3) + 10]}
            Table.insert_many(table, records)
            Table.merge(table, 7, %{a: v + 100})
            Table.delete(table, "k#{rem(round, 300)}")
          end)
        end

        # A write queues behind those the killed callers had sent, so once it
        # returns, the writer has applied them all.
        :ok = Table.delete(table, :barrier)
        assert consistent?(table, Enum.to_list(0..4) ++ [10, 11, 12, 100, 101, 102, 103, 104])
      end
    end
  end

  describe "many writers on one key" do
    test "leave one record, consistent indexes and no growth in memory" do
      table = table(store: [:a, :tags])

      round = fn n ->
        1..8
        |> Enum.map(fn w ->
          Task.async(fn ->
            for i <- 1..n do
              :ok = Table.insert(table, %{id: "hot", a: rem(i + w, 7), tags: [w, i]})
              if rem(i, 5) == 0, do: :ok = Table.delete(table, "hot")

              :ok =
                Table.update(
                  table,
                  "hot",
                  %{id: "hot", a: w, tags: [0]},
                  &%{&1 | a: w, tags: [&1.a]}
                )
            end
          end)
        end)
        |> Enum.each(&Task.await(&1, 60_000))
      end

      round.(50)
      before = Table.memory(table)
      round.(400)
      after_ = Table.memory(table)

      assert Table.size(table) == 1
      assert consistent?(table, Enum.to_list(0..8))
      assert length(Table.search_keys(table, [])) == 1
      # One record: its row, its key's id, its terms. A leak of ids, rows or
      # bitmaps grows with the 8 x 400 x 2 writes of the second round.
      assert after_ <= before + 4_096
      assert {next, _free} = :sys.get_state(table.writer) |> then(&{&1.next, &1.free})
      assert next - @direct_limit <= 8
    end
  end

  describe "drop/1" do
    test "20 tables built and dropped keep none of their NIF memory (isolated VM)" do
      result =
        Isolated.native_bytes_dropped(
          quote do
            fn n ->
              table = Larder.Table.new(key: :id, index: [:a, :b])
              records = for i <- 0..20_000, do: %{id: i, a: rem(i, 7), b: {n, rem(i, 101)}}
              :ok = Larder.Table.insert_many(table, records)
              table
            end
          end,
          quote(do: &Larder.Table.drop/1)
        )

      assert {:ok, {held, 0, 20}} = result
      assert held > 20 * 10_000
    end

    test "a dropped table's writer is gone and every call raises" do
      table = table()
      :ok = Table.insert(table, %{id: 1, a: 1, tags: []})
      ref = Process.monitor(table.writer)
      :ok = Table.drop(table)
      assert_receive {:DOWN, ^ref, :process, _, :normal}

      assert_raise ArgumentError, ~r/unknown Larder.Table/, fn ->
        Table.update(table, 1, %{id: 1}, & &1)
      end

      # drop/1 alone is idempotent.
      assert Table.drop(table) == :ok
    end

    test "the writer goes away with the process that called new/1" do
      {table, owner} = Task.async(fn -> {table(), self()} end) |> Task.await()

      ref = Process.monitor(table.writer)
      refute Process.alive?(owner)
      assert_receive {:DOWN, ^ref, :process, _, _}
      assert_raise ArgumentError, ~r/unknown Larder.Table/, fn -> Table.size(table) end
    end
  end

  describe "names and supervision" do
    test "start_link/1 under a supervisor: used by name, restarted empty", context do
      name = context.test

      {:ok, sup} =
        Supervisor.start_link([{Table, key: :id, index: [:a], name: name}], strategy: :one_for_one)

      :ok = Table.insert(name, %{id: 1, a: :x})
      assert Table.search(name, a: :x) == [%{id: 1, a: :x}]
      assert {:ok, %{id: 1, a: :y}} = Table.merge(name, 1, %{a: :y})
      assert [{{Table, ^name}, writer, :worker, _}] = Supervisor.which_children(sup)

      ref = Process.monitor(writer)
      Process.exit(writer, :kill)
      assert_receive {:DOWN, ^ref, :process, _, :killed}

      # The supervisor starts a new, empty table under the same name.
      Larder.Test.Eventually.eventually(fn ->
        try do
          Table.size(name) == 0
        rescue
          ArgumentError -> false
        end
      end)

      :ok = Supervisor.stop(sup)

      assert_raise ArgumentError, ~r/unknown Larder.Table #{inspect(name)}/, fn ->
        Table.size(name)
      end
    end

    test "a name is taken once; new/1 can name a table too", context do
      name = context.test
      table = Table.new(key: :id, name: name)

      assert_raise ArgumentError, ~r/a Larder.Table named #{inspect(name)} already exists/, fn ->
        Table.new(key: :id, name: name)
      end

      :ok = Table.insert(name, %{id: 1})
      assert Table.get(table, 1) == %{id: 1}
      :ok = Table.drop(name)

      assert_raise ArgumentError, ~r/unknown Larder.Table #{inspect(name)}/, fn ->
        Table.get(name, 1)
      end

      # Once dropped, the name is free again.
      again = Table.new(key: :id, name: name)
      assert Table.size(name) == 0
      :ok = Table.drop(again)
    end

    test "start_link/1 and child_spec/1 check their options" do
      assert_raise ArgumentError,
                   ~r/expected Larder.Table option :name to be an atom, got nothing/,
                   fn ->
                     Table.start_link(key: :id)
                   end

      assert_raise ArgumentError,
                   ~r/expected Larder.Table option :name to be an atom, got: "t"/,
                   fn ->
                     Table.child_spec(key: :id, name: "t")
                   end

      assert_raise ArgumentError, ~r/keyword list/, fn -> Table.child_spec(:x) end
      assert %{id: {Table, :t}} = Table.child_spec(key: :id, name: :t)
    end
  end

  describe "update/4" do
    test "a raising fun raises in the caller and writes nothing; nested writes raise" do
      table = table()
      :ok = Table.insert(table, %{id: 1, a: 1, tags: []})

      assert_raise RuntimeError, "boom", fn ->
        Table.update(table, 1, %{id: 1}, fn _ -> raise "boom" end)
      end

      assert Table.get(table, 1) == %{id: 1, a: 1, tags: []}

      assert_raise ArgumentError,
                   ~r/cannot be made from a function that a table's writer runs/,
                   fn ->
                     Table.update(table, 1, %{id: 1}, fn r -> Table.insert(table, r) && r end)
                   end

      assert_raise ArgumentError, ~r/must return a map whose key field :id is 1/, fn ->
        Table.update(table, 1, %{id: 1}, fn r -> %{r | id: 2} end)
      end

      assert_raise ArgumentError, ~r/fun must be a function of one argument/, fn ->
        Table.update(table, 1, %{id: 1}, :nope)
      end

      for default <- [%{id: 2}, %{a: 1}, :nope] do
        assert_raise ArgumentError, ~r/default must be a map whose key field :id is 1/, fn ->
          Table.update(table, 1, default, & &1)
        end
      end

      assert Table.get(table, 1) == %{id: 1, a: 1, tags: []}
      assert consistent?(table, [1])
    end

    # Each update function writes the other table. Without a refusal each
    # writer waits on the other for ever (and every later write to either
    # with them); so every such write raises. A barrier inside the
    # functions puts both writers in them at once in half the rounds. The
    # receive timeout only detects a hang.
    test "functions that write another table are refused: two never deadlock" do
      a = Table.new(key: :id, index: [:n])
      b = Table.new(key: :id, index: [:n])
      parent = self()

      for round <- 1..300 do
        barrier? = rem(round, 2) == 0

        # The functions run on a record only: each key is there first.
        for table <- [a, b], do: :ok = Table.insert(table, %{id: round, n: 0})

        cross = fn mine, other, tag ->
          fn record ->
            if barrier? do
              send(parent, {:inside, tag, self()})
              receive do: (:go -> :ok)
            end

            :ok = Table.insert(other, %{id: round, n: tag})
            %{record | n: record.n + 1, from: mine}
          end
        end

        tasks =
          for {mine, other, tag} <- [{a, b, :a}, {b, a, :b}] do
            Task.async(fn ->
              try do
                Table.update(mine, round, %{id: round, n: 0}, cross.(mine, other, tag))
              rescue
                e in ArgumentError -> {:refused, Exception.message(e)}
              end
            end)
          end

        if barrier? do
          writers =
            for tag <- [:a, :b] do
              assert_receive {:inside, ^tag, writer}, 10_000
              writer
            end

          Enum.each(writers, &send(&1, :go))
        end

        for result <- Task.yield_many(tasks, 10_000) do
          assert {_task, {:ok, {:refused, message}}} = result
          assert message =~ "cannot be made from a function that a table's writer runs"
        end
      end

      # Nothing was written, and both tables still take writes.
      assert Table.count(a, n: 0) == 300 and Table.count(b, n: 0) == 300
      assert Table.search_keys(a, n: :b) == [] and Table.search_keys(b, n: :a) == []
      :ok = Table.insert(a, %{id: 1, n: 1})
      :ok = Table.update(b, 1, %{id: 1, n: 0}, &%{&1 | n: 2})
      assert Table.search_keys(a, n: 1) == [1] and Table.search_keys(b, n: 2) == [1]
    end

    test "index functions run by the writer, and drop/1, are refused too" do
      other = Table.new(key: :id)

      writing =
        Table.new(
          key: :id,
          index: [
            {:w,
             fn r ->
               :ok = Table.insert(other, %{id: r.id})
               r.n
             end}
          ]
        )

      # insert/2 computes index terms in the caller: allowed.
      :ok = Table.insert(writing, %{id: 1, n: 1})
      assert Table.size(other) == 1

      # merge/3 computes them in the writer: refused, record unchanged.
      assert_raise ArgumentError, ~r/writer runs/, fn ->
        Table.merge(writing, 1, %{n: 2})
      end

      assert Table.search_keys(writing, w: 1) == [1]

      assert_raise ArgumentError, ~r/writer runs/, fn ->
        Table.update(other, 1, %{id: 1}, fn r -> Table.drop(writing) && r end)
      end

      assert Table.get(writing, 1) == %{id: 1, n: 1}
    end
  end
end
