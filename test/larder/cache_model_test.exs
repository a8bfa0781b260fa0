defmodule Larder.CacheModelTest do
  # PropEr model tests: random sequences of fetch, get, put, delete and
  # invalidate_all against a plain map, sequentially and from several
  # processes at once.
  use ExUnit.Case, async: true

  alias Larder.Cache
  alias Larder.Test.{MemoryL2, PropEr}

  defp op_gen(keys) do
    key = :proper_types.oneof(keys)
    value = :proper_types.integer()

    :proper_types.frequency([
      {4, {:fetch, key, value}},
      {2, {:get, key}},
      {3, {:put, key, value}},
      {2, {:delete, key}},
      {1, {:fail, key}}
    ])
  end

  defp seq_gen do
    ops =
      :proper_types.list(
        :proper_types.frequency([{15, op_gen([1, 2, 3, 4, 5])}, {1, :invalidate_all}])
      )

    :proper_types.tuple([:proper_types.oneof([:local, :l2, :large]), ops])
  end

  # What the map model says each operation returns.
  defp model(ops, map) do
    Enum.map_reduce(ops, map, fn
      {:fetch, k, v}, m ->
        if Map.has_key?(m, k), do: {{:ok, m[k]}, m}, else: {{:ok, v}, Map.put(m, k, v)}

      {:get, k}, m ->
        {Map.get(m, k), m}

      {:put, k, v}, m ->
        {:ok, Map.put(m, k, v)}

      {:delete, k}, m ->
        {:ok, Map.delete(m, k)}

      {:fail, k}, m ->
        if Map.has_key?(m, k), do: {{:ok, m[k]}, m}, else: {:error, m}

      :invalidate_all, _m ->
        {:ok, %{}}
    end)
    |> elem(0)
  end

  defp run(cache, ops) do
    Enum.map(ops, fn
      {:fetch, k, v} -> Cache.fetch(cache, k, fn -> {:ok, v} end)
      {:get, k} -> Cache.get(cache, k)
      {:put, k, v} -> Cache.put(cache, k, v)
      {:delete, k} -> Cache.delete(cache, k)
      {:fail, k} -> Cache.fetch(cache, k, fn -> {:error, :no} end) |> simplify_error()
      :invalidate_all -> Cache.invalidate_all(cache)
    end)
  end

  defp simplify_error({:error, %Larder.Error{reason: :loader_failed}}), do: :error
  defp simplify_error(other), do: other

  # A fresh cache per case: local; or with an L2 and a tiny L1 (max_entries:
  # 2) so that evictions happen and must be invisible (L2 still has the
  # value); or with every value on the large-value path.
  defp with_cache(ctx, mode, fun) do
    name = :"#{ctx.test}.#{System.unique_integer([:positive])}"

    {opts, l2} =
      case mode do
        :local ->
          {[], nil}

        # every value takes the large-value path (own table, process copy)
        :large ->
          {[local_copy_min_bytes: 0], nil}

        :l2 ->
          {:ok, l2} = MemoryL2.start_link()
          {[l2: {MemoryL2, server: l2}, max_entries: 2], l2}
      end

    {:ok, pid} = Cache.start_link([name: name] ++ opts)

    try do
      fun.(name)
    after
      GenServer.stop(pid)
      if l2, do: GenServer.stop(l2)
    end
  end

  test "sequences of operations behave like a map", ctx do
    property =
      :proper.forall(seq_gen(), fn {mode, ops} ->
        with_cache(ctx, mode, fn cache -> run(cache, ops) == model(ops, %{}) end)
      end)

    PropEr.check(property, numtests: 200)
  end

  test "several processes on their own keys, and on shared read-only keys, at once", ctx do
    # each process works on keys {i, 1..3}: its results must match its own
    # model; all of them also fetch shared keys whose loaders agree.
    per_process = fn i ->
      :proper_types.list(
        :proper_types.frequency([
          {6, op_gen(for k <- 1..3, do: {i, k})},
          {2, {:shared, :proper_types.oneof([:s1, :s2])}}
        ])
      )
    end

    gen =
      :proper_types.tuple([
        :proper_types.oneof([:local, :l2, :large]) | Enum.map(1..4, per_process)
      ])

    property =
      :proper.forall(gen, fn case_ ->
        [mode | lists] = Tuple.to_list(case_)

        with_cache(ctx, mode, fn cache ->
          lists
          |> Enum.map(fn ops ->
            Task.async(fn ->
              results =
                Enum.map(ops, fn
                  {:shared, k} -> Cache.fetch(cache, k, fn -> {:ok, {:shared, k}} end)
                  op -> hd(run(cache, [op]))
                end)

              expected =
                Enum.map(ops, fn
                  {:shared, k} -> {:ok, {:shared, k}}
                  _ -> :own
                end)

              own = Enum.reject(ops, &match?({:shared, _}, &1))
              own_results = for {r, :own} <- Enum.zip(results, expected), do: r
              shared_ok = for({r, e} <- Enum.zip(results, expected), e != :own, do: r == e)

              own_results == model(own, %{}) and Enum.all?(shared_ok)
            end)
          end)
          |> Task.await_many(10_000)
          |> Enum.all?()
        end)
      end)

    PropEr.check(property, numtests: 100)
  end
end
