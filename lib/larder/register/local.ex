# The per-process copy: one map per register in the caller's process
# dictionary, from key to the committed value read under a slot counter,
# bounded per register; and the reclaiming of copies of deleted registers.
defmodule Larder.Register.Local do
  @moduledoc false

  alias Larder.Register

  # Under the register's `local` key ({Larder.Register, id}) the process
  # dictionary holds %{key => entry}, where entry is
  # {slot, tag, version, value} for a present key or {slot, tag} for an
  # absent one: valid while the slot's counter still equals tag.
  #
  # Under @held it holds %{local => {versions, tab}}: the registers this
  # process has copies of. Every register death (drop/1, owner
  # exit, shutdown) bumps one VM-wide counter, `deaths`; a process that
  # misses, or makes its first copy of a register, and sees `deaths` moved
  # since its last sweep (@swept) drops its copies of every dead register.
  @held {Register, :held}
  @swept {Register, :swept}
  @deaths {Register, :deaths}

  @doc "Creates the VM-wide deaths counter once; called by Larder.Application."
  @spec setup() :: :ok
  def setup do
    if :persistent_term.get(@deaths, nil) == nil do
      :persistent_term.put(@deaths, :atomics.new(1, signed: false))
    end

    :ok
  end

  @doc "The VM-wide deaths counter every register handle carries."
  @spec deaths() :: :atomics.atomics_ref()
  def deaths do
    case :persistent_term.get(@deaths, nil) do
      nil -> raise RuntimeError, "Larder.Register needs the :larder application to be started"
      deaths -> deaths
    end
  end

  @doc "Counts a register death (after it is marked dead)."
  @spec died(Register.t()) :: :ok
  def died(%Register{deaths: deaths}), do: :atomics.add(deaths, 1, 1)

  @doc """
  Stores `entry` for `key`. A register whose copies reach `max_cached` keys
  in this process drops them all first, so the bound holds at O(1)
  amortised cost. A first copy of a register records it as held and
  reclaims the copies of dead registers.
  """
  @spec remember(Register.t(), term(), tuple()) :: :ok
  def remember(%Register{local: local, max_cached: max} = reg, key, entry) do
    case Process.get(local) do
      %{^key => _} = copies ->
        Process.put(local, %{copies | key => entry})

      %{} = copies when map_size(copies) < max ->
        Process.put(local, Map.put(copies, key, entry))

      nil ->
        hold(reg)
        Process.put(local, %{key => entry})

      _full ->
        Process.put(local, %{key => entry})
    end

    :ok
  end

  @doc """
  Drops this process's copies of dead registers if a register died since
  this process last looked: one atomics read and one process-dictionary
  read when none did.
  """
  @spec reclaim(Register.t()) :: :ok
  def reclaim(%Register{deaths: deaths}) do
    now = :atomics.get(deaths, 1)

    case Process.get(@swept) do
      ^now -> :ok
      _ -> sweep(now)
    end
  end

  defp hold(%Register{local: local, versions: versions, tab: tab, deaths: deaths}) do
    Process.put(@held, Map.put(Process.get(@held, %{}), local, {versions, tab}))
    sweep(:atomics.get(deaths, 1))
  end

  defp sweep(now) do
    Process.put(@swept, now)

    live =
      for {local, {versions, tab}} = held <- Process.get(@held, %{}),
          live?(versions, tab) or drop_copies(local),
          into: %{},
          do: held

    Process.put(@held, live)
    :ok
  end

  # Dead: marked so by its owner, or its table is gone (owner killed).
  defp live?(versions, tab),
    do: :atomics.get(versions, 1) >= 0 and :ets.info(tab, :id) != :undefined

  defp drop_copies(local) do
    Process.delete(local)
    false
  end

  @doc "Drops this process's copies of the register under `local`."
  @spec drop(term()) :: :ok
  def drop(local) do
    Process.delete(local)

    case Process.get(@held) do
      %{^local => _} = held -> Process.put(@held, Map.delete(held, local))
      _ -> :ok
    end

    :ok
  end
end
