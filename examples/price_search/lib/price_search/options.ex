defmodule PriceSearch.Options do
  @moduledoc """
  The service's one option check, on Elixir's `Keyword.validate!/2` (the
  library's own check, `Larder.Options`, is internal to Larder; an
  application brings its own, and this one is small).

      iex> PriceSearch.Options.validate!([port: 80], [port: 8091, name: nil],
      ...>   [port: PriceSearch.Options.integer(0..65_535)], "PriceSearch.HTTP")
      [name: nil, port: 80]

  Every failure is an `ArgumentError` that names the option:

      expected PriceSearch.HTTP options to be a keyword list, got: 3
      unknown keys [:bogus] in [bogus: 1], the allowed keys are: [:port, :name]
      expected PriceSearch.HTTP option :port to be an integer in 0..65535, got: 70000
  """

  @typedoc "What a value must be: its description for messages, and the test."
  @type check :: {String.t(), (term() -> boolean())}

  @doc """
  Checks `opts` for `what` (the module, in messages): a keyword list whose
  keys are among `defaults`' (a key given twice is refused too, by
  `Keyword.validate!/2`), and whose values pass their `checks`. A check
  applies to a key that is given or has a default. Returns the options
  with the defaults filled in.
  """
  @spec validate!(term(), [atom() | {atom(), term()}], [{atom(), check()}], String.t()) ::
          keyword()
  def validate!(opts, defaults, checks, what) do
    unless is_list(opts) and Keyword.keyword?(opts) do
      raise ArgumentError,
            "expected #{what} options to be a keyword list, got: #{inspect(opts, limit: 10)}"
    end

    opts = Keyword.validate!(opts, defaults)

    for {key, {expected, valid?}} <- checks, {:ok, value} <- [Keyword.fetch(opts, key)] do
      unless valid?.(value) do
        raise ArgumentError,
              "expected #{what} option #{inspect(key)} to be #{expected}, " <>
                "got: #{inspect(value, limit: 10, printable_limit: 100)}"
      end
    end

    opts
  end

  @doc "A check: an integer in `range`."
  @spec integer(Range.t()) :: check()
  def integer(first..last = range),
    do: {"an integer in #{first}..#{last}", &(is_integer(&1) and &1 in range)}
end
