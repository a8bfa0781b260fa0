defmodule Larder.BagModelTest do
  # PropEr model test: random sequences of insert, insert_many, delete/2,
  # delete/3 and lookup, split over several processes that run at the same
  # time, against an ETS :bag (or :duplicate_bag for `dedup: false`).
  #
  # Each process owns its keys for deletes, so its own sequential model is
  # exact for them and every lookup of an owned key is checked against it.
  # Shared keys are inserted by every process at once (inserts commute, so
  # the final contents are still determined) and are never deleted: a lookup
  # of a shared key must be a subset of the model, which is written first.
  # After the run, the bag and the model must hold the same pairs, and no
  # lookup may ever have returned a value twice (with dedup).
  #
  # Values avoid floats: Larder.Bag treats pairs equal by == as one pair,
  # where an ETS :bag keeps `{1, :a}` and `{1.0, :a}` apart (documented, and
  # tested in bag_test.exs).
  use ExUnit.Case, async: true

  alias Larder.Bag
  alias Larder.Test.PropEr

  @processes 3

  defp value_gen do
    :proper_types.oneof([
      :proper_types.integer(0, 5),
      :proper_types.oneof([:a, :b, :_, :"$1"]),
      :proper_types.oneof(["x", "y", <<>>]),
      :proper_types.tuple([:proper_types.integer(0, 2), :proper_types.oneof([:a, "b"])]),
      :proper_types.list(:proper_types.integer(0, 2))
    ])
  end

  # `{:own, n}` becomes a key only the running process deletes; `{:shared, n}`
  # a key every process inserts into.
  defp key_gen do
    :proper_types.frequency([
      {4, own_key_gen()},
      {1, {:shared, :proper_types.integer(0, 2)}}
    ])
  end

  # Atoms ETS reads as pattern variables, and maps (a map in a pattern also
  # matches larger maps), must still be matched exactly.
  defp own_key_gen do
    {:own,
     :proper_types.oneof([
       :proper_types.integer(0, 3),
       :proper_types.oneof([:_, :"$1", %{a: 1}, %{a: 1, b: 2}])
     ])}
  end

  defp command_gen do
    :proper_types.frequency([
      {5, {:insert, key_gen(), value_gen()}},
      {2, {:insert_many, :proper_types.list({key_gen(), value_gen()})}},
      {1, {:delete, own_key_gen()}},
      {3, {:delete, own_key_gen(), value_gen()}},
      {4, {:lookup, key_gen()}}
    ])
  end

  defp program_gen do
    :proper_types.vector(@processes, :proper_types.list(command_gen()))
  end

  for {dedup, model_type} <- [{true, :bag}, {false, :duplicate_bag}] do
    test "dedup: #{dedup} matches an ETS #{model_type} under concurrent random operations" do
      dedup = unquote(dedup)
      model_type = unquote(model_type)

      property =
        :proper.forall(program_gen(), fn programs -> run(programs, dedup, model_type) end)

      PropEr.check(property, numtests: 400)
    end
  end

  defp run(programs, dedup, model_type) do
    bag = Bag.new(dedup: dedup, write_concurrency: true)
    model = :ets.new(:model, [model_type, :public, write_concurrency: true])
    parent = self()

    tasks =
      for {program, i} <- Enum.with_index(programs) do
        Task.async(fn ->
          send(parent, {:ready, self()})
          receive(do: (:go -> :ok))
          Enum.flat_map(program, &apply_command(&1, i, bag, model, dedup))
        end)
      end

    for t <- tasks, do: receive(do: ({:ready, pid} when pid == t.pid -> :ok))
    Enum.each(tasks, &send(&1.pid, :go))
    failures = Enum.flat_map(tasks, &Task.await(&1, 30_000))

    contents = Enum.sort(Bag.stream(bag))
    expected = Enum.sort(:ets.tab2list(model))
    size_ok = Bag.size(bag) == length(expected)
    Bag.delete_table(bag)
    :ets.delete(model)

    failures = if contents == expected, do: failures, else: [{:contents, contents, expected}]
    failures = if size_ok, do: failures, else: [:size | failures]
    :proper.equals(failures, [])
  end

  defp key({:own, n}, i), do: {:own, i, n}
  defp key({:shared, n}, _i), do: {:shared, n}

  # Runs one command on the model and the bag; returns a list of failures.
  defp apply_command({:insert, k, v}, i, bag, model, _dedup) do
    k = key(k, i)
    :ets.insert(model, {k, v})
    :ok = Bag.insert(bag, k, v)
    []
  end

  defp apply_command({:insert_many, pairs}, i, bag, model, _dedup) do
    pairs = for {k, v} <- pairs, do: {key(k, i), v}
    :ets.insert(model, pairs)
    :ok = Bag.insert_many(bag, pairs)
    []
  end

  defp apply_command({:delete, k}, i, bag, model, _dedup) do
    k = key(k, i)
    :ets.delete(model, k)
    :ok = Bag.delete(bag, k)
    []
  end

  defp apply_command({:delete, k, v}, i, bag, model, _dedup) do
    k = key(k, i)
    :ets.delete_object(model, {k, v})
    :ok = Bag.delete(bag, k, v)
    []
  end

  defp apply_command({:lookup, k}, i, bag, model, dedup) do
    k = key(k, i)
    got = Bag.lookup(bag, k)
    want = for {_, v} <- :ets.lookup(model, k), do: v

    cond do
      dedup and length(Enum.uniq(got)) != length(got) -> [{:duplicates, k, got}]
      match?({:own, _, _}, k) and Enum.sort(got) != Enum.sort(want) -> [{:lookup, k, got, want}]
      match?({:shared, _}, k) and got -- want != [] -> [{:lookup_shared, k, got, want}]
      true -> []
    end
  end
end
