# Option checks shared by Larder.Cache and Larder.Cache.Redis: unknown keys
# and bad values raise ArgumentError naming them and what was expected.
defmodule Larder.Cache.Options do
  @moduledoc false

  # `opts` over `defaults`, after rejecting a non-keyword list or any key
  # `defaults` lacks; `what` names the options in messages ("Redis").
  def merge!(opts, defaults, what) do
    unless Keyword.keyword?(opts) do
      raise ArgumentError, "expected #{what} options to be a keyword list, got: #{inspect(opts)}"
    end

    case Enum.uniq(Keyword.keys(opts)) -- Keyword.keys(defaults) do
      [] ->
        Keyword.merge(defaults, opts)

      unknown ->
        raise ArgumentError,
              "unknown #{what} options #{inspect(unknown)}, valid options are: " <>
                inspect(Keyword.keys(defaults))
    end
  end

  def check!(opts, key, valid?, expected, what) do
    value = Keyword.fetch!(opts, key)

    unless valid?.(value) do
      raise ArgumentError,
            "expected #{what} option #{inspect(key)} to be #{expected}, got: #{inspect(value)}"
    end
  end
end
