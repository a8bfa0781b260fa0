defmodule Larder.BagModelTest do
  # PropEr model test: random sequences of insert, insert_many, delete/2,
  # delete/3 and lookup, split over several processes that run at the same
  # time, against an ETS :bag (or :duplicate_bag for `dedup: false`).
  # Keys and values include pairs that differ only by =:= (1 and 1.0, which
  # are two pairs; 0.0 and -0.0, which are one) and maps.
  #
  # Each process owns its keys, so its own sequential model is exact for
  # them: every lookup of an owned key must equal the model's, in the same
  # (insertion) order. Shared keys are inserted by every process at once
  # (inserts commute, so the final contents are still determined) and are
  # never deleted: a lookup of a shared key must be a subset of the model,
  # which is written first. Race keys are inserted into and deleted from by
  # every process at once, pair by pair, so an insert and a delete of the
  # same pair race: no lookup of them may ever hold a pair twice, and at the
  # end each pair is there once or not at all. After the run, the bag and
  # the model hold the same pairs outside race keys, and the bag's
  # fingerprint set counts exactly its pairs.
  use ExUnit.Case, async: true

  alias Larder.Bag
  alias Larder.Test.PropEr

  @processes 3

  defp value_gen do
    :proper_types.oneof([
      :proper_types.integer(0, 5),
      :proper_types.oneof([1.0, 0.0, -0.0, 2.5]),
      :proper_types.oneof([%{a: 1}, %{a: 1.0}, %{a: 1, b: [2]}, %{}]),
      :proper_types.oneof([:a, :b, :_, :"$1"]),
      :proper_types.oneof(["x", "y", <<>>]),
      :proper_types.tuple([:proper_types.integer(0, 2), :proper_types.oneof([:a, "b"])]),
      :proper_types.list(:proper_types.integer(0, 2))
    ])
  end

  # `{:own, n}` becomes a key only the running process writes; `{:shared, n}`
  # a key every process inserts into; `{:race, n}` one every process inserts
  # into and deletes from (race_insert, race_delete).
  defp key_gen do
    :proper_types.frequency([
      {4, own_key_gen()},
      {1, {:shared, :proper_types.integer(0, 2)}}
    ])
  end

  defp race_key_gen, do: {:race, :proper_types.integer(0, 1)}

  # Few values, so that processes keep hitting the same pairs.
  defp race_value_gen, do: :proper_types.oneof([1, 1.0, 0.0, -0.0, %{a: 1}])

  # Atoms ETS reads as pattern variables, and maps (a map in a pattern also
  # matches larger maps), must still be matched exactly.
  defp own_key_gen do
    {:own,
     :proper_types.oneof([
       :proper_types.integer(0, 3),
       :proper_types.oneof([1.0, 0.0, -0.0]),
       :proper_types.oneof([:_, :"$1", %{a: 1}, %{a: 1, b: 2}, %{a: 1.0}, {%{}, [%{b: 2}]}])
     ])}
  end

  defp command_gen do
    :proper_types.frequency([
      {5, {:insert, key_gen(), value_gen()}},
      {2, {:insert_many, :proper_types.list({key_gen(), value_gen()})}},
      {1, {:delete, own_key_gen()}},
      {3, {:delete, own_key_gen(), value_gen()}},
      {3, {:race_insert, race_key_gen(), race_value_gen()}},
      {3, {:race_delete, race_key_gen(), race_value_gen()}},
      {2, {:lookup, race_key_gen()}},
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

    {raced, contents} = bag |> Bag.stream() |> Enum.split_with(&match?({{:race, _}, _}, &1))
    expected = :ets.tab2list(model)
    size = Bag.size(bag)
    fingerprints = if dedup, do: Larder.Native.bag_fps_count(bag.fps), else: size
    # Owned keys: the same values in the same order as the model's.
    order_ok =
      Enum.all?(:ets.tab2list(model), fn {k, _} ->
        not match?({:own, _, _}, k) or
          Bag.lookup(bag, k) == for({_, v} <- :ets.lookup(model, k), do: v)
      end)

    Bag.drop(bag)
    :ets.delete(model)

    failures =
      if Enum.sort(contents) == Enum.sort(expected),
        do: failures,
        else: [{:contents, contents, expected}]

    failures = if size == length(contents) + length(raced), do: failures, else: [:size | failures]
    failures = if order_ok, do: failures, else: [:order | failures]

    failures =
      if dedup and length(Enum.uniq(raced)) != length(raced),
        do: [{:raced_twice, raced} | failures],
        else: failures

    failures =
      if fingerprints == size,
        do: failures,
        else: [{:fingerprints, fingerprints, size} | failures]

    :proper.equals(failures, [])
  end

  defp key({:own, n}, i), do: {:own, i, n}
  defp key({:shared, n}, _i), do: {:shared, n}
  defp key({:race, n}, _i), do: {:race, n}

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

  # Race keys stay out of the model: their final contents depend on timing.
  defp apply_command({:race_insert, k, v}, _i, bag, _model, _dedup) do
    :ok = Bag.insert(bag, k, v)
    []
  end

  defp apply_command({:race_delete, k, v}, _i, bag, _model, _dedup) do
    :ok = Bag.delete(bag, k, v)
    []
  end

  defp apply_command({:lookup, {:race, _} = k}, _i, bag, _model, dedup) do
    got = Bag.lookup(bag, k)
    if dedup and length(Enum.uniq(got)) != length(got), do: [{:duplicates, k, got}], else: []
  end

  defp apply_command({:lookup, k}, i, bag, model, dedup) do
    k = key(k, i)
    got = Bag.lookup(bag, k)
    want = for {_, v} <- :ets.lookup(model, k), do: v

    cond do
      dedup and length(Enum.uniq(got)) != length(got) -> [{:duplicates, k, got}]
      match?({:own, _, _}, k) and got != want -> [{:lookup, k, got, want}]
      match?({:shared, _}, k) and got -- want != [] -> [{:lookup_shared, k, got, want}]
      true -> []
    end
  end
end
