# The plain-ETS baseline of Larder.Register for bench/register_bench.exs: the
# same calls on one ETS record {key, version, value} per key, read with a
# lookup every time and written by the callers themselves, with no counters
# and no local copies.
defmodule Larder.RegisterBench.Plain do
  @moduledoc false

  def new do
    :ets.new(__MODULE__, [:set, :public, read_concurrency: true, write_concurrency: true])
  end

  def put(tab, key, value) do
    :ets.insert(tab, {key, new_version(), value})
    :ok
  end

  def fetch(tab, key) do
    case :ets.lookup(tab, key) do
      [{_, version, value}] -> {:ok, version, value}
      [] -> :error
    end
  end

  def get(tab, key, default \\ nil) do
    case :ets.lookup(tab, key) do
      [{_, _, value}] -> value
      [] -> default
    end
  end

  def delete(tab, key) do
    :ets.delete(tab, key)
    :ok
  end

  # Compare-and-swap on the record's version: an insert_new when absent, a
  # select_replace of {key, version, _} otherwise; retried on conflict.
  def update(tab, key, default, fun) do
    case fetch(tab, key) do
      :error ->
        new = fun.(default)

        if :ets.insert_new(tab, {key, new_version(), new}),
          do: :ok,
          else: update(tab, key, default, fun)

      {:ok, version, current} ->
        new = fun.(current)

        if :ets.select_replace(tab, cas_spec(key, version, new)) == 1,
          do: :ok,
          else: update(tab, key, default, fun)
    end
  end

  # A key is matched literally in a match-spec head (a direct lookup) unless
  # it holds atoms that a head would read as variables, or maps (which a head
  # matches partially); those keys fall back to a guard, which scans the table.
  defp cas_spec(key, version, new) do
    if literal?(key) do
      [{{key, version, :_}, [], [{{{:const, key}, new_version(), {:const, new}}}]}]
    else
      [
        {{:"$1", version, :_}, [{:"=:=", :"$1", {:const, key}}],
         [{{:"$1", new_version(), {:const, new}}}]}
      ]
    end
  end

  defp literal?(:_), do: false
  defp literal?(a) when is_atom(a), do: not String.starts_with?(Atom.to_string(a), "$")
  defp literal?(t) when is_tuple(t), do: literal?(Tuple.to_list(t))
  defp literal?([h | t]), do: literal?(h) and literal?(t)
  defp literal?(m) when is_map(m), do: false
  defp literal?(_), do: true

  defp new_version, do: :erlang.unique_integer([:monotonic, :positive])
end
