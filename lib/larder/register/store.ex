# The register's storage: one ETS record per key plus, in :versioned mode, an
# atomics array of per-slot commit counters; the write protocol and the
# committed read that readers use on a local-copy miss.
defmodule Larder.Register.Store do
  @moduledoc false

  alias Larder.Register
  alias Larder.Register.Local

  # Slot counters start at 0 and only grow; a dead register has every slot
  # at @dead, which no local copy is ever tagged with.
  @dead -1

  @doc "Builds the table and counters; called by the owner process."
  @spec create(keyword(), pid()) :: Register.t()
  def create(opts, server) do
    mode = Keyword.fetch!(opts, :mode)
    slots = Keyword.fetch!(opts, :slots)

    tab =
      :ets.new(Register, [
        :set,
        :public,
        read_concurrency: true,
        write_concurrency: mode == :ets
      ])

    %Register{
      mode: mode,
      tab: tab,
      versions: :atomics.new(slots, signed: true),
      slots: slots,
      id: :erlang.unique_integer([:positive]),
      server: server,
      name: Keyword.fetch!(opts, :name),
      max_cached: Keyword.fetch!(opts, :max_cached)
    }
  end

  @spec name(Register.t()) :: atom() | nil
  def name(%Register{name: name}), do: name

  @spec slot(Register.t(), term()) :: pos_integer()
  def slot(%Register{slots: slots}, key), do: :erlang.phash2(key, slots) + 1

  ## Writes (:versioned mode: only the owner process runs these)

  # The record goes in first with version c + 1, which readers treat as not
  # yet committed; bumping the slot to c + 1 commits it. Readers that see a
  # record newer than its slot wait for the bump, so cached and fresh readers
  # switch to the new value at the same instant.
  @spec write(Register.t(), term(), term()) :: {:ok, pos_integer(), pos_integer()}
  def write(%Register{tab: tab, versions: versions} = reg, key, value) do
    slot = slot(reg, key)
    version = :atomics.get(versions, slot) + 1
    :ets.insert(tab, {key, version, value})
    :atomics.put(versions, slot, version)
    # The slot counter is the tag for local copies; it equals the key's
    # version right after the key's own write.
    {:ok, version, version}
  end

  # A tombstone {key, version} stands in for the record until the bump
  # commits the delete; only then does the record go.
  @spec remove(Register.t(), term()) :: :ok
  def remove(%Register{tab: tab, versions: versions} = reg, key) do
    if :ets.member(tab, key) do
      slot = slot(reg, key)
      version = :atomics.get(versions, slot) + 1
      :ets.insert(tab, {key, version})
      :atomics.put(versions, slot, version)
      :ets.delete(tab, key)
    end

    :ok
  end

  @doc "The key's version as the owner sees it (every record is committed then)."
  @spec current_version(Register.t(), term()) :: pos_integer() | nil
  def current_version(%Register{tab: tab}, key) do
    case :ets.lookup(tab, key) do
      [{_, version, _}] -> version
      _ -> nil
    end
  end

  @doc "Marks every slot dead, then drops the table."
  @spec kill(Register.t()) :: :ok
  def kill(%Register{tab: tab, versions: versions, slots: slots}) do
    for slot <- 1..slots, do: :atomics.put(versions, slot, @dead)
    :ets.delete(tab)
    :ok
  end

  ## Committed reads (:versioned mode, any process)

  @doc """
  Reads the committed record of `key`, given the slot counter `tag` read
  before, and remembers it in the caller's local copy under that tag.
  """
  @spec read(Register.t(), term(), pos_integer(), integer()) ::
          {:ok, pos_integer(), term()} | :error
  def read(reg, _key, _slot, tag) when tag < 0, do: Register.unknown!(reg)

  def read(%Register{tab: tab, versions: versions} = reg, key, slot, tag) do
    case lookup(reg, tab, key) do
      [{_, version, value}] when version <= tag ->
        Local.remember(reg, key, {tag, version, value})
        {:ok, version, value}

      [{_, version}] when version <= tag ->
        Local.remember(reg, key, {tag})
        :error

      [] ->
        Local.remember(reg, key, {tag})
        :error

      _uncommitted ->
        # The owner is between inserting and bumping: let it finish.
        :erlang.yield()
        read(reg, key, slot, :atomics.get(versions, slot))
    end
  end

  @spec lookup(Register.t(), :ets.tid(), term()) :: [tuple()]
  def lookup(reg, tab, key) do
    :ets.lookup(tab, key)
  rescue
    ArgumentError -> Register.unknown!(reg)
  end
end
