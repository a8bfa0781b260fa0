defmodule Larder.Cache.BadInputTest do
  # PropEr throws arbitrary terms (deep, improper, huge, pattern-like atoms)
  # at every argument of every public function of Larder.Cache: only a
  # result, an ArgumentError or {:error, %Larder.Error{}} may come back, and
  # the cache still holds its data afterwards.
  use ExUnit.Case, async: true

  alias Larder.Cache
  alias Larder.Test.{BadCall, Hostile, PropEr}

  import :proper_types, only: [oneof: 1, frequency: 1, list: 1, tuple: 1]

  defp nasty do
    Hostile.term([
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
        {:"$loader", how, value} -> loader_fun(how, Hostile.build(value))
        arg -> Hostile.build(arg)
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
    # The module too: Larder.Replica.BadInputTest's test has the same name.
    cache = :"#{inspect(__MODULE__)} #{ctx.test}"
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
    cfg = Larder.Cache.Runtime.get(cache)
    assert stats.entries == :ets.info(cfg.index, :size)
    assert stats.entries >= length(sentinels)
  end
end
