# Checks the options of Larder.Table.new/1, start_link/1 and load/2 and
# builds the table's definition from them.
defmodule Larder.Table.Options do
  @moduledoc false

  @reserved [:and, :or, :not, :term]

  @typedoc "A table's definition: what its writer needs to create it."
  @type config :: %{
          key: term(),
          entries: [{term(), {:field, atom()} | (map() -> term())}],
          store: [term()] | nil,
          name: atom() | nil,
          telemetry: boolean()
        }

  @doc """
  The definition given by `opts` (`kind` `:start_link` requires `:name`).
  Raises `ArgumentError` for an unknown, missing or invalid option, and for
  index entries that repeat a name or use a reserved one.
  """
  @spec config!(keyword(), :new | :start_link) :: config()
  def config!(opts, kind) do
    opts = Larder.Options.validate!(opts, schema(kind), "Larder.Table")
    index = Keyword.fetch!(opts, :index)
    store = Keyword.fetch!(opts, :store)
    name = Keyword.fetch!(opts, :name)

    entries = Enum.map(index, &entry!/1)

    entries
    |> Enum.map(&elem(&1, 0))
    |> Enum.frequencies()
    |> Enum.find(fn {_name, n} -> n > 1 end)
    |> case do
      nil -> :ok
      {dup, _} -> raise ArgumentError, "option :index names #{inspect(dup)} more than once"
    end

    key = Keyword.fetch!(opts, :key)

    %{
      key: key,
      entries: entries,
      store: store && Enum.uniq([key | store]),
      name: name,
      telemetry: Keyword.fetch!(opts, :telemetry)
    }
  end

  defp schema(:new) do
    [
      key: {{:custom, "a field name", fn _ -> true end}, :required},
      index: {{:custom, "a list of field names and {name, fun} entries", &proper_list?/1}, []},
      store: {{:or_nil, {:custom, "a list of fields", &proper_list?/1}}, nil},
      name: {{:or_nil, :atom}, nil},
      telemetry: {:boolean, true}
    ]
  end

  defp schema(:start_link), do: Keyword.put(schema(:new), :name, {:atom, :required})

  defp proper_list?([_ | rest]), do: proper_list?(rest)
  defp proper_list?([]), do: true
  defp proper_list?(_other), do: false

  defp entry!(field) when is_atom(field) and field not in @reserved, do: {field, {:field, field}}

  defp entry!({name, fun} = entry) when is_function(fun, 1) do
    if name in @reserved, do: reserved!(name)
    entry
  end

  defp entry!(field) when field in @reserved, do: reserved!(field)

  defp entry!(other) do
    raise ArgumentError,
          "each :index entry must be a field name (atom) or {name, fun/1}, got: #{inspect(other, limit: 10)}"
  end

  defp reserved!(name),
    do:
      raise(
        ArgumentError,
        "index name #{inspect(name)} is reserved (#{inspect(@reserved)} are query operators)"
      )
end
