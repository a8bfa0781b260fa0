# The one option check of every public module: a schema gives each option's
# check and default; validate!/3 rejects a non-keyword list, unknown keys and
# bad values with ArgumentError messages of one shape.
defmodule Larder.Options do
  @moduledoc false

  # A check is data, so it also writes the "expected ..." of the message:
  #
  #   :boolean                 true or false
  #   :atom                    an atom other than nil, true and false
  #   {:integer, min, max}     an integer in min..max
  #   {:string, min, max}      a binary of min to max bytes
  #   {:in, values}            one of `values`
  #   {:or_nil, check}         nil or what `check` accepts
  #   {:or_infinity, check}    :infinity or what `check` accepts
  #   {:custom, expected, fun} what the 1-arity `fun` returns true for
  #
  # and a default is a value, or :required (the option must be given).
  @type check ::
          :boolean
          | :atom
          | {:integer, integer(), integer()}
          | {:string, non_neg_integer(), non_neg_integer()}
          | {:in, [term()]}
          | {:or_nil, check()}
          | {:or_infinity, check()}
          | {:custom, String.t(), (term() -> boolean())}
  @type schema :: [{atom(), {check(), term() | :required}}]

  @doc """
  Checks `opts` against `schema` and returns every option of the schema, in
  its order, with its default where `opts` does not give it. `what` names
  the options in messages ("Larder.Bag"):

      expected Larder.Bag options to be a keyword list, got: 3
      unknown Larder.Bag options [:x]; valid options are: [:name, ...]
      expected Larder.Bag option :name to be an atom, got: "x"
      expected Larder.Bag option :name to be an atom, got nothing (it is required)

  A key given twice has each of its values checked; the first one counts,
  as with `Keyword.get/2`.
  """
  @spec validate!(term(), schema(), String.t()) :: keyword()
  def validate!(opts, schema, what) do
    unless is_list(opts) and Keyword.keyword?(opts) do
      raise ArgumentError,
            "expected #{what} options to be a keyword list, got: #{inspect(opts, limit: 10)}"
    end

    valid = Keyword.keys(schema)

    case Enum.uniq(Keyword.keys(opts)) -- valid do
      [] ->
        :ok

      unknown ->
        raise ArgumentError,
              "unknown #{what} options #{inspect(unknown)}; valid options are: #{inspect(valid)}"
    end

    for {key, {check, default}} <- schema do
      case Keyword.get_values(opts, key) do
        [] when default == :required ->
          raise ArgumentError,
                "expected #{what} option #{inspect(key)} to be #{expected(check)}, " <>
                  "got nothing (it is required)"

        [] ->
          {key, default}

        [value | _] = values ->
          Enum.each(values, &check!(&1, key, check, what))
          {key, value}
      end
    end
  end

  @doc """
  Checks one value, `key`'s, with the message of validate!/3: for options
  checked where a schema cannot (one that depends on another).
  """
  @spec check!(term(), atom(), check(), String.t()) :: :ok
  def check!(value, key, check, what) do
    if valid?(check, value) do
      :ok
    else
      raise ArgumentError,
            "expected #{what} option #{inspect(key)} to be #{expected(check)}, " <>
              "got: #{inspect(value, limit: 10, printable_limit: 100)}"
    end
  end

  defp valid?(:boolean, v), do: is_boolean(v)
  defp valid?(:atom, v), do: is_atom(v) and v not in [nil, true, false]
  defp valid?({:integer, min, max}, v), do: is_integer(v) and v >= min and v <= max
  defp valid?({:string, min, max}, v), do: is_binary(v) and byte_size(v) in min..max
  defp valid?({:in, values}, v), do: v in values
  defp valid?({:or_nil, check}, v), do: v == nil or valid?(check, v)
  defp valid?({:or_infinity, check}, v), do: v == :infinity or valid?(check, v)
  defp valid?({:custom, _expected, fun}, v), do: fun.(v) == true

  defp expected(:boolean), do: "a boolean"
  defp expected(:atom), do: "an atom"
  defp expected({:integer, min, max}), do: "an integer in #{min}..#{max}"
  defp expected({:string, min, max}), do: "a string of #{min} to #{max} bytes"

  defp expected({:in, values}),
    do: "one of " <> Enum.map_join(values, ", ", &inspect/1)

  defp expected({:or_nil, check}), do: expected(check) <> " or nil"
  defp expected({:or_infinity, check}), do: expected(check) <> " or :infinity"
  defp expected({:custom, expected, _fun}), do: expected
end
