# mode: :ets - the same API on one plain ETS record per key, written by the
# callers themselves; the baseline the versioned mode is measured against.
defmodule Larder.Register.Plain do
  @moduledoc false

  alias Larder.Register

  @spec put(Register.t(), term(), term()) :: :ok
  def put(%Register{tab: tab} = reg, key, value) do
    :ets.insert(tab, {key, new_version(), value})
    :ok
  rescue
    ArgumentError -> Register.unknown!(reg)
  end

  @spec fetch(Register.t(), term()) :: {:ok, pos_integer(), term()} | :error
  def fetch(%Register{tab: tab} = reg, key) do
    case :ets.lookup(tab, key) do
      [{_, version, value}] -> {:ok, version, value}
      [] -> :error
    end
  rescue
    ArgumentError -> Register.unknown!(reg)
  end

  @spec get(Register.t(), term(), term()) :: term()
  def get(%Register{tab: tab} = reg, key, default) do
    case :ets.lookup(tab, key) do
      [{_, _, value}] -> value
      [] -> default
    end
  rescue
    ArgumentError -> Register.unknown!(reg)
  end

  @spec delete(Register.t(), term()) :: :ok
  def delete(%Register{tab: tab} = reg, key) do
    :ets.delete(tab, key)
    :ok
  rescue
    ArgumentError -> Register.unknown!(reg)
  end

  # Compare-and-swap on the record's version: an insert_new when absent, a
  # select_replace of {key, version, _} otherwise; retried on conflict.
  @spec update(Register.t(), term(), term(), (term() -> term())) :: :ok
  def update(reg, key, default, fun) do
    case fetch(reg, key) do
      :error ->
        new = fun.(default)

        if swapped?(reg, fn tab -> :ets.insert_new(tab, {key, new_version(), new}) end),
          do: :ok,
          else: update(reg, key, default, fun)

      {:ok, version, current} ->
        new = fun.(current)

        if swapped?(reg, fn tab -> :ets.select_replace(tab, cas_spec(key, version, new)) == 1 end),
          do: :ok,
          else: update(reg, key, default, fun)
    end
  end

  # The table may go between the read and the swap.
  defp swapped?(%Register{tab: tab} = reg, swap) do
    swap.(tab)
  rescue
    ArgumentError -> Register.unknown!(reg)
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

  # Whether `term` can stand literally in a match-spec head: no atoms that a
  # head would read as variables, and no maps, which a head matches partially.
  defp literal?(:_), do: false
  defp literal?(a) when is_atom(a), do: not String.starts_with?(Atom.to_string(a), "$")
  defp literal?(t) when is_tuple(t), do: literal?(Tuple.to_list(t))
  defp literal?([h | t]), do: literal?(h) and literal?(t)
  defp literal?(m) when is_map(m), do: false
  defp literal?(_), do: true

  defp new_version, do: :erlang.unique_integer([:monotonic, :positive])
end
