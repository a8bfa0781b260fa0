# The per-process copy: one map per register in the caller's process
# dictionary, from key to the committed value read under a slot counter,
# bounded per register. Copies of dead registers are reclaimed by
# Larder.LocalCopies.
defmodule Larder.Register.Local do
  @moduledoc false

  @behaviour Larder.LocalCopies

  alias Larder.LocalCopies
  alias Larder.Register

  # Under the register's `local` key the process dictionary holds
  # %{key => entry}, where entry is
  # {slot, tag, version, value} for a present key or {slot, tag} for an
  # absent one: valid while the slot's counter still equals tag.
  #
  # A process's first copy of a register holds it in Larder.LocalCopies;
  # every register death (drop/1, owner exit, shutdown) is counted there,
  # and Register.Store reclaims on every miss.

  @doc "Counts a register death (after it is marked dead)."
  @spec died(Register.t()) :: :ok
  def died(%Register{deaths: deaths}), do: LocalCopies.died(deaths)

  @doc """
  Stores `entry` for `key`. A register whose copies reach `max_cached` keys
  in this process drops them all first, so the bound holds at O(1)
  amortised cost. A first copy of a register holds it in
  Larder.LocalCopies, which reclaims the copies of dead registers.
  """
  @spec remember(Register.t(), term(), tuple()) :: :ok
  def remember(%Register{local: local, max_cached: max} = reg, key, entry) do
    case :erlang.get(local) do
      %{^key => _} = copies ->
        :erlang.put(local, %{copies | key => entry})

      %{} = copies when map_size(copies) < max ->
        :erlang.put(local, Map.put(copies, key, entry))

      :undefined ->
        # No copies yet (:erlang.get/1 answers :undefined). Stored before
        # it is held: if the register died meanwhile, the sweep of hold/4
        # drops this copy too.
        :erlang.put(local, %{key => entry})
        LocalCopies.hold(reg.deaths, local, __MODULE__, {reg.versions, reg.tab})

      _full ->
        :erlang.put(local, %{key => entry})
    end

    :ok
  end

  # Dead: marked so by its owner, or its table is gone (owner killed).
  @impl LocalCopies
  def live?({versions, tab}),
    do: :atomics.get(versions, 1) >= 0 and :ets.info(tab, :id) != :undefined

  @impl LocalCopies
  def drop_copies(local) do
    Process.delete(local)
    :ok
  end

  @doc "Drops this process's copies of the register under `local`."
  @spec drop(term()) :: :ok
  def drop(local) do
    Process.delete(local)
    LocalCopies.release(local)
  end
end
