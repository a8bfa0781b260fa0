# What a bag is made of and how it comes and goes: the ETS :duplicate_bag
# (and, when it deduplicates, the fingerprint set and lock of
# Larder.Bag.Dedup), created under its name, filled from a snapshot, freed;
# and what a handle's table is now. Used by Larder.Bag, Larder.Bag.Owner and
# Larder.Bag.Snapshot (see Larder.Instance for the life cycle every
# structure shares).
defmodule Larder.Bag.Store do
  @moduledoc false

  alias Larder.Bag
  alias Larder.Bag.{Dedup, Fingerprint, Order}
  alias Larder.Instance

  @doc """
  Creates the bag from validated options. `owner` is the process that holds
  its name already (Larder.Bag.Owner), or nil: then the bag's name, if it
  has one, is claimed for the caller (`ArgumentError` when taken).
  """
  @spec create(keyword(), pid() | nil) :: Bag.t()
  def create(opts, owner \\ nil) do
    name = Keyword.get(opts, :name)

    with true <- owner == nil and name != nil,
         {:error, _} <- Instance.claim(Bag, name, self()) do
      Instance.taken!(Bag, name)
    end

    ets_opts =
      [:duplicate_bag, :public] ++
        if(opts[:compressed], do: [:compressed], else: []) ++
        [
          read_concurrency: opts[:read_concurrency],
          write_concurrency: opts[:write_concurrency]
        ]

    bag = %Bag{
      tab: :ets.new(Bag, ets_opts),
      dedup: false,
      name: name,
      owner: owner,
      telemetry: Instance.telemetry?(Keyword.get(opts, :telemetry, true))
    }

    bag =
      if Keyword.fetch!(opts, :dedup) do
        {fps, lock} = Dedup.new()
        %{bag | dedup: true, fps: fps, lock: lock, mask: Fingerprint.full_mask()}
      else
        bag
      end

    Instance.publish(Bag, name, bag)
    bag
  end

  @doc """
  Inserts the checked pairs of a snapshot chunk into a bag nobody else uses
  yet; a deduplicating bag counts their fingerprints and skips a pair the
  snapshot holds twice.
  """
  @spec insert_loaded(Bag.t(), [{term(), term()}]) :: true
  def insert_loaded(%Bag{tab: tab, dedup: true, fps: fps, mask: mask}, pairs),
    do: Order.insert(tab, Dedup.load(tab, fps, mask, pairs))

  def insert_loaded(%Bag{tab: tab}, pairs), do: Order.insert(tab, pairs)

  @doc """
  Frees the bag: its name, its table and its fingerprint set. Called from
  any process (Larder.Bag.drop/1 for a bag without an owner process, the
  owner on a drop or a shutdown); freeing a freed bag does nothing.
  """
  @spec destroy(Bag.t()) :: :ok
  def destroy(%Bag{tab: tab, name: name, dedup: dedup} = bag) do
    case table(bag) do
      :gone ->
        :ok

      :bag ->
        Instance.release(Bag, name, bag, :ets.info(tab, :owner))
        # Deleted by a concurrent drop meanwhile: that is fine.
        _ = safe(fn -> :ets.delete(tab) end)
        if dedup, do: Dedup.free(bag.fps)
        :ok

      :other ->
        Instance.invalid!(Bag, bag)
    end
  end

  @doc """
  What a checked handle's table is: `:gone`, a bag's (`:bag`: a public
  :duplicate_bag, with a fingerprint set if it deduplicates), or `:other`.
  """
  @spec table(Bag.t()) :: :gone | :bag | :other
  def table(%Bag{tab: tab, fps: fps}) do
    case safe(fn -> {:ets.info(tab, :type), :ets.info(tab, :protection)} end) do
      nil ->
        :gone

      {:undefined, _} ->
        :gone

      {:duplicate_bag, :public} ->
        if fps == nil or safe(fn -> Dedup.bytes(fps) end), do: :bag, else: :other

      _ ->
        :other
    end
  end

  defp safe(fun) do
    fun.()
  rescue
    ArgumentError -> nil
  end
end
