# Option checks shared by every public module: a keyword list, no unknown
# keys, values of the expected shape. Failures raise ArgumentError naming the
# option and what was expected, and list the valid options.
defmodule Larder.Options do
  @moduledoc false

  # Returns `opts` if it is a keyword list whose keys are all in `valid`;
  # `what` names the options in messages ("Larder.Bag").
  def check_keys!(opts, valid, what) do
    unless Keyword.keyword?(opts) do
      raise ArgumentError, "expected #{what} options to be a keyword list, got: #{inspect(opts)}"
    end

    case Enum.uniq(Keyword.keys(opts)) -- valid do
      [] ->
        opts

      unknown ->
        raise ArgumentError,
              "unknown #{what} options #{inspect(unknown)}; valid options are: #{inspect(valid)}"
    end
  end

  # `opts` over `defaults`, after check_keys!/3 against the keys of `defaults`.
  def merge!(opts, defaults, what) do
    check_keys!(opts, Keyword.keys(defaults), what)
    Keyword.merge(defaults, opts)
  end

  def check!(opts, key, valid?, expected, what) do
    value = Keyword.fetch!(opts, key)

    unless valid?.(value) do
      raise ArgumentError,
            "expected #{what} option #{inspect(key)} to be #{expected}, got: #{inspect(value)}"
    end
  end
end
