defmodule Larder.CacheBadInputTest do
  # PropEr throws arbitrary terms (deep, improper, huge, pattern-like atoms)
  # at every argument of every public function of Larder.Cache: only a
  # result, an ArgumentError or {:error, %Larder.Error{}} may come back, and
  # the cache still holds its data afterwards.
  use ExUnit.Case, async: true

  alias Larder.Cache
  alias Larder.Test.{BadCall, PropEr}

  import :proper_types, only: [oneof: 1, frequency: 1, bind: 3, list: 1, range: 2, tuple: 1]

  # Deep, improper and huge terms are generated as small specs and built at
  # run time (build/1): PropEr walks every generated term, which a 20,000
  # deep one makes slow.
  defp deep,
    do: tuple([:"$build", :deep, range(1, 20_000), oneof([:tuple, :list, :map, :improper])])

  defp huge, do: tuple([:"$build", :huge, range(1, 100_000), oneof([:list, :binary, :tuple])])

  defp improper do
    bind(
      tuple([list(:proper_types.any()), :proper_types.any()]),
      fn {list, tail} -> Enum.reduce(Enum.reverse(list), tail, &[&1 | &2]) end,
      false
    )
  end

  defp build({:"$build", :deep, n, shape}) do
    Enum.reduce(1..n, :leaf, fn _, acc ->
      case shape do
        :tuple -> {acc}
        :list -> [acc]
        :map -> %{acc => 1}
        :improper -> [acc | :tail]
      end
    end)
  end

  defp build({:"$build", :huge, n, :list}), do: Enum.to_list(1..n)
  defp build({:"$build", :huge, n, :binary}), do: :binary.copy("x", n * 8)
  defp build({:"$build", :huge, n, :tuple}), do: List.to_tuple(Enum.to_list(1..n))
  defp build(term), do: term

  defp nasty do
    frequency([
      {4, :proper_types.any()},
      {2, oneof([:_, :"$1", :"$$", :"$_", {:_, :"$2"}, [:_ | :"$3"], nil, :infinity, -1])},
      {1, deep()},
      {2, improper()},
      {1, huge()},
      {1, oneof([:ttl, :max_bytes, :name, :local_copy_max_bytes])},
      {1, list(tuple([oneof([:ttl, :name, :max_bytes, :bogus]), :proper_types.any()]))}
    ])
  end

  defp loader do
    oneof([
      nasty(),
      tuple([:"$loader", oneof([:return, :ok, :raise, :throw, :exit]), nasty()])
    ])
  end

  # {function, args}; :cache in an argument stands for the cache's name.
  defp call do
    name = frequency([{3, :cache}, {1, nasty()}])

    oneof([
      tuple([:fetch, tuple([name, nasty(), loader()])]),
      tuple([:fetch!, tuple([name, nasty(), loader()])]),
      tuple([:get, tuple([name, nasty()])]),
      tuple([:get, tuple([name, nasty(), nasty()])]),
      tuple([:put, tuple([name, nasty(), nasty()])]),
      tuple([:put, tuple([name, nasty(), nasty(), nasty()])]),
      tuple([:delete, tuple([name, nasty()])]),
      tuple([:invalidate_all, tuple([nasty()])]),
      tuple([:stats, tuple([name])]),
      tuple([:start_link, tuple([nasty()])]),
      tuple([:child_spec, tuple([nasty()])])
    ])
  end

  defp run(cache, {fun, args}) do
    args =
      args
      |> Tuple.to_list()
      |> Enum.map(fn
        :cache -> cache
        {:"$loader", how, value} -> loader_fun(how, build(value))
        arg -> build(arg)
      end)

    # (arbitrary options that happen to be valid start a cache: stopped)
    case BadCall.run(Cache, fun, args) do
      {:raised, %Larder.Error{} = e, _stacktrace} -> {:error, e}
      {:raised, e, stacktrace} -> reraise e, stacktrace
      result -> result
    end
  end

  defp loader_fun(:return, value), do: fn -> value end
  defp loader_fun(:ok, value), do: fn -> {:ok, value} end
  defp loader_fun(:raise, value), do: fn -> raise ArgumentError, inspect(value, limit: 3) end
  defp loader_fun(:throw, value), do: fn -> throw(value) end
  defp loader_fun(:exit, value), do: fn -> exit(value) end

  defp allowed?(:fetch, {:ok, _}), do: true
  defp allowed?(:fetch!, _value), do: true
  defp allowed?(:get, _value), do: true
  defp allowed?(:stats, %{entries: _, bytes: _}), do: true
  defp allowed?(:child_spec, %{id: _, start: _}), do: true
  defp allowed?(_fun, :ok), do: true
  defp allowed?(_fun, :argument_error), do: true
  defp allowed?(_fun, {:error, %Larder.Error{}}), do: true
  defp allowed?(_fun, _other), do: false

  test "arbitrary arguments get a result, an ArgumentError or a Larder.Error", ctx do
    # (named after the module too: replica_bad_input_test has a test of this name)
    cache = :"#{inspect(ctx.module)}.#{ctx.test}"
    start_supervised!({Cache, name: cache, local_copy_min_bytes: 1_000})
    sentinels = for i <- 1..20, do: {{:sentinel, make_ref()}, {i, Enum.to_list(1..(i * 100))}}
    for {key, value} <- sentinels, do: :ok = Cache.put(cache, key, value)

    property =
      :proper.forall(list(call()), fn calls ->
        Enum.all?(calls, fn {fun, _args} = call ->
          result = run(cache, call)

          allowed?(fun, result) or
            (IO.puts("#{fun} returned #{inspect(result, limit: 20)}") && false)
        end) and
          Enum.all?(sentinels, fn {key, value} -> Cache.get(cache, key) == value end)
      end)

    PropEr.check(property, numtests: 200, max_size: 20)

    stats = Cache.stats(cache)
    cfg = :persistent_term.get({Larder.Cache, cache})
    assert stats.entries == :ets.info(cfg.index, :size)
    assert stats.entries >= length(sentinels)
  end
end
