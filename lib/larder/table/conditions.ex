# Compiles a Larder.Table search's conditions into a Larder.Index expression,
# checking every index name and the shape of every condition.
defmodule Larder.Table.Conditions do
  @moduledoc false

  alias Larder.Table

  @doc "Whether `conditions` is empty (it then matches every record)."
  @spec empty?(Table.conditions()) :: boolean()
  def empty?(conditions), do: conditions == [] or conditions == %{}

  @doc """
  The index expression of `conditions`: `{:and, [...]}` of one term per
  condition, an `{:in, values}` condition as `{:or, [...]}`. Raises
  `ArgumentError` for a bad shape or a name that has no index.
  """
  @spec expr!(Table.t(), Table.conditions()) :: Larder.Index.expr()
  def expr!(table, conditions) when is_map(conditions),
    do: {:and, conditions!(table, Map.to_list(conditions), conditions)}

  def expr!(table, conditions) when is_list(conditions),
    do: {:and, conditions!(table, conditions, conditions)}

  def expr!(_table, conditions) do
    raise ArgumentError,
          "conditions must be a map or a list of {index, value} pairs, got: #{inspect(conditions, limit: 10)}"
  end

  @doc "The expressions of a list of searches (`search_many/2`), in order."
  @spec exprs!(Table.t(), [Table.conditions()]) :: [Larder.Index.expr()]
  def exprs!(table, many), do: exprs!(table, many, many)

  defp exprs!(table, [conditions | rest], all),
    do: [expr!(table, conditions) | exprs!(table, rest, all)]

  defp exprs!(_table, [], _all), do: []

  defp exprs!(_table, _other, all) do
    raise ArgumentError,
          "searches must be a list of conditions, got: #{inspect(all, limit: 10)}"
  end

  @doc "Raises `ArgumentError` listing the indexes unless `name` is one."
  @spec indexed!(Table.t(), term()) :: :ok
  def indexed!(%{names: names}, name) when is_map_key(names, name), do: :ok

  def indexed!(table, name) do
    raise ArgumentError,
          "no index named #{inspect(name, limit: 10)} in conditions; indexed fields: " <>
            inspect(Enum.map(table.entries, &elem(&1, 0)))
  end

  # A direct recursion rather than Enum.map with a closure: this runs once per
  # condition of every search.
  defp conditions!(table, [{name, {:in, values}} | rest], all) when is_list(values) do
    indexed!(table, name)
    [{:or, alternatives!(name, values, values)} | conditions!(table, rest, all)]
  end

  defp conditions!(table, [{name, _value} = condition | rest], all) do
    indexed!(table, name)
    [condition | conditions!(table, rest, all)]
  end

  defp conditions!(_table, [], _all), do: []

  defp conditions!(_table, [other | _], _all) do
    raise ArgumentError,
          "each condition must be {index, value}, got: #{inspect(other, limit: 10)}"
  end

  defp conditions!(_table, _improper, all) do
    raise ArgumentError,
          "conditions must be a map or a list of {index, value} pairs, got: #{inspect(all, limit: 10)}"
  end

  defp alternatives!(name, [value | rest], all),
    do: [{name, value} | alternatives!(name, rest, all)]

  defp alternatives!(_name, [], _all), do: []

  defp alternatives!(name, _improper, all) do
    raise ArgumentError,
          "{:in, values} for #{inspect(name)} in conditions needs a list of values, got: #{inspect(all, limit: 10)}"
  end
end
