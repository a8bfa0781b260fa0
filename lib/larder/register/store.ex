# The :versioned storage protocol: one ETS record per key plus an atomics
# array of per-slot commit counters. The owner process performs every write
# (insert, then bump); any process reads, and waits out the instant between.
defmodule Larder.Register.Store do
  @moduledoc false

  alias Larder.Register
  alias Larder.Register.Local

  # Slot counters start at 0 and only grow; a dead register has every slot at
  # @dead, which no local copy is ever tagged with.
  @dead -1

  @doc "Builds the table and counters; called by the owner process."
  @spec create(keyword(), pid()) :: Register.t()
  def create(opts, server) do
    mode = Keyword.fetch!(opts, :mode)

    %Register{
      mode: mode,
      tab:
        :ets.new(Register, [
          :set,
          :public,
          read_concurrency: true,
          write_concurrency: mode == :ets
        ]),
      versions: :atomics.new(Keyword.fetch!(opts, :slots), signed: true),
      slots: Keyword.fetch!(opts, :slots),
      local: {Register, :erlang.unique_integer([:positive])},
      server: server,
      name: Keyword.fetch!(opts, :name),
      max_cached: Keyword.fetch!(opts, :max_cached)
    }
  end

  @spec slot(Register.t(), term()) :: pos_integer()
  def slot(%Register{slots: slots}, key), do: :erlang.phash2(key, slots) + 1

  ## Records
  #
  #   {key, version, value}  the key's value
  #   {key, version}         a tombstone: the key is being deleted
  #
  # The owner writes a record with its slot's next counter value, then bumps
  # the slot to it. A record whose version is above its slot's counter is not
  # committed yet: readers wait for the bump rather than return it, so cached
  # and fresh readers switch values at the same instant.

  @doc "Writes `key` (owner only); returns its slot and new version."
  @spec write(Register.t(), term(), term()) :: {pos_integer(), pos_integer()}
  def write(%Register{tab: tab, versions: versions} = reg, key, value) do
    slot = slot(reg, key)
    version = :atomics.get(versions, slot) + 1
    :ets.insert(tab, {key, version, value})
    :atomics.put(versions, slot, version)
    {slot, version}
  end

  @doc "Removes `key` (owner only); returns the local-copy entry for the writer."
  @spec remove(Register.t(), term()) :: tuple()
  def remove(%Register{tab: tab, versions: versions} = reg, key) do
    slot = slot(reg, key)

    if :ets.member(tab, key) do
      version = :atomics.get(versions, slot) + 1
      :ets.insert(tab, {key, version})
      :atomics.put(versions, slot, version)
      :ets.delete(tab, key)
      {slot, version}
    else
      {slot, :atomics.get(versions, slot)}
    end
  end

  @doc "The key's version as the owner sees it (owner only: all committed)."
  @spec current_version(Register.t(), term()) :: pos_integer() | nil
  def current_version(%Register{tab: tab}, key) do
    case :ets.lookup(tab, key) do
      [{_, version, _}] -> version
      _ -> nil
    end
  end

  @doc "Marks every slot dead, then drops the table (owner only)."
  @spec kill(Register.t()) :: :ok
  def kill(%Register{tab: tab, versions: versions, slots: slots}) do
    for slot <- 1..slots, do: :atomics.put(versions, slot, @dead)
    :ets.delete(tab)
    :ok
  end

  @doc """
  Reads `key`'s committed record (any process) and remembers it in the
  caller's local copy, tagged with the slot counter read before the lookup.
  """
  @spec read(Register.t(), term()) :: {:ok, pos_integer(), term()} | :error
  def read(%Register{versions: versions} = reg, key) do
    slot = slot(reg, key)
    read(reg, key, slot, :atomics.get(versions, slot))
  end

  defp read(reg, _key, _slot, tag) when tag < 0, do: Register.unknown!(reg)

  defp read(%Register{tab: tab, versions: versions} = reg, key, slot, tag) do
    case lookup(reg, tab, key) do
      [{_, version, value}] when version <= tag ->
        Local.remember(reg, key, {slot, tag, version, value})
        {:ok, version, value}

      [{_, version}] when version <= tag ->
        Local.remember(reg, key, {slot, tag})
        :error

      [] ->
        Local.remember(reg, key, {slot, tag})
        :error

      _uncommitted ->
        # The owner is between its insert and its bump: let it finish.
        :erlang.yield()
        read(reg, key, slot, :atomics.get(versions, slot))
    end
  end

  defp lookup(reg, tab, key) do
    :ets.lookup(tab, key)
  rescue
    ArgumentError -> Register.unknown!(reg)
  end
end
