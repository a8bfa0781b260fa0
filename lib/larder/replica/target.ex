# The structure a replica keeps: a Larder.Table or Larder.Bag that the
# replica's process creates (empty, or from a snapshot's dump) and owns, so
# it lives and dies with the replica; its kind and name are its identity.
defmodule Larder.Replica.Target do
  @moduledoc false

  @typedoc "`{Larder.Table, opts}` or `{Larder.Bag, opts}`, as given to the replica."
  @type spec :: {Larder.Table | Larder.Bag, keyword()}

  # A restarted replica may find the name of its predecessor's structure
  # still registered for a moment (a table's writer stops once it sees its
  # owner's exit): creating is retried this long.
  @name_wait_ms 5_000

  @doc "Checks the structure's options (raises ArgumentError) without creating it."
  @spec validate!(term()) :: spec()
  def validate!({Larder.Table, opts} = spec) when is_list(opts) do
    unless Keyword.keyword?(opts) and Keyword.has_key?(opts, :key) do
      raise ArgumentError,
            "expected Larder.Replica option :into to be {Larder.Table, opts} with the " <>
              "options of Larder.Table.new/1 (:key required), got: #{inspect(spec, limit: 10)}"
    end

    spec
  end

  def validate!({Larder.Bag, opts} = spec) when is_list(opts) do
    unless Keyword.keyword?(opts) do
      raise ArgumentError,
            "expected Larder.Replica option :into to be {Larder.Bag, opts} with the " <>
              "options of Larder.Bag.new/1, got: #{inspect(spec, limit: 10)}"
    end

    spec
  end

  def validate!(other) do
    raise ArgumentError,
          "expected Larder.Replica option :into to be {Larder.Table, opts} or " <>
            "{Larder.Bag, opts}, got: #{inspect(other, limit: 10)}"
  end

  @doc "The identity stored in snapshots: the kind and the structure's name (or the replica's)."
  @spec identity(spec(), atom()) :: {:table | :bag, atom()}
  def identity({Larder.Table, opts}, replica), do: {:table, opts[:name] || replica}
  def identity({Larder.Bag, opts}, replica), do: {:bag, opts[:name] || replica}

  @doc "Creates the empty structure, owned by the calling process."
  @spec new(spec()) :: Larder.Table.t() | Larder.Bag.t()
  def new({module, opts} = spec) do
    await_name(spec)
    retry(spec, fn -> module.new(opts) end)
  end

  @doc "Creates the structure from a dump, owned by the calling process."
  @spec load(spec(), Path.t()) ::
          {:ok, Larder.Table.t() | Larder.Bag.t()} | {:error, Larder.Error.t()}
  def load({Larder.Bag, opts} = spec, path) do
    # The file holds the bag's mode (load/2 takes no :dedup): a file of the
    # other mode is refused.
    {dedup, opts} = Keyword.pop(opts, :dedup, true)
    await_name(spec)

    with {:ok, bag} <- retry(spec, fn -> Larder.Bag.load(path, opts) end) do
      if match?(%Larder.Bag{dedup: ^dedup}, bag) do
        {:ok, bag}
      else
        Larder.Bag.drop(bag)

        {:error,
         Larder.Error.new(
           :definition_mismatch,
           "the snapshot's bag has dedup: #{not dedup}, the replica's :into dedup: #{dedup}",
           path: path
         )}
      end
    end
  end

  def load({module, opts} = spec, path) do
    # Waited for first: a load that finds the name taken has read the whole
    # file for nothing.
    await_name(spec)
    retry(spec, fn -> module.load(path, opts) end)
  end

  @doc "Writes the structure's dump to `path`."
  @spec dump(spec(), Larder.Table.t() | Larder.Bag.t(), Path.t()) ::
          :ok | {:error, Larder.Error.t()}
  def dump({module, _opts}, handle, path), do: module.dump(handle, path)

  @doc "Drops the structure."
  @spec drop(spec(), Larder.Table.t() | Larder.Bag.t()) :: :ok
  def drop({module, _opts}, handle), do: module.drop(handle)

  # While a live structure answers to the name (a predecessor's, whose
  # owner is gone), up to @name_wait_ms.
  defp await_name({module, opts}, waited \\ 0) do
    name = opts[:name]

    if name && waited < @name_wait_ms && live?(module, name) do
      Process.sleep(5)
      await_name({module, opts}, waited + 5)
    else
      :ok
    end
  end

  defp live?(module, name) do
    _ = module.size(name)
    true
  rescue
    ArgumentError -> false
  end

  # Creates with `fun`, again while the name is taken: a creation that
  # raised while a live process held the name's claim (Larder.Instance),
  # before or after it, is tried again, up to @name_wait_ms. Any other
  # ArgumentError (a bad option) is raised at once.
  defp retry({module, opts} = spec, fun, waited \\ 0) do
    name = opts[:name]
    held_before = held?(module, name)

    try do
      fun.()
    rescue
      error in ArgumentError ->
        if waited < @name_wait_ms and (held_before or held?(module, name)) do
          Process.sleep(10)
          retry(spec, fun, waited + 10)
        else
          reraise error, __STACKTRACE__
        end
    end
  end

  defp held?(_module, nil), do: false
  defp held?(module, name), do: Larder.Instance.whereis(module, name) != nil
end
