# The one mechanism behind process-local copies of values read from a
# structure that can die (a Larder.Register, an incarnation of a
# Larder.Cache): which structures a process holds copies of, one VM-wide
# count of deaths, and the reclaiming of a process's copies of dead ones.
defmodule Larder.LocalCopies do
  @moduledoc false

  # A kind of structure (Larder.Register.Local, Larder.Cache.LocalCopies)
  # keeps its copies where and how it likes, bounded by its own policy, and
  # tells this module:
  #
  #   * hold/4 when a process makes its first copy of a structure: the
  #     process dictionary's @held map gets id => {module, arg};
  #   * died/1 once a structure is dead for good (module.live?(arg) is
  #     false for ever from then on): that bumps the VM-wide `deaths`
  #     counter.
  #
  # A process that calls reclaim/1 (a kind does it on its slow paths: a
  # miss, a new copy) and sees `deaths` moved since its last sweep (@swept)
  # sweeps: for every held structure that is no longer live, it calls
  # module.drop_copies(id) and forgets it. When nothing died that costs one
  # atomics read and one process-dictionary read. hold/4 always sweeps, so a
  # structure that died without a bump (its owner killed) is reclaimed at
  # the process's next first copy of any structure.
  #
  # A process's @held map therefore only ever lists live structures plus
  # those that died since its last sweep, and its copies of a dead one never
  # outlive that sweep.

  @doc "Whether the structure `arg` describes still lives; false for ever once it is dead."
  @callback live?(arg :: term()) :: boolean()

  @doc "Drops the calling process's copies of the structure held under `id`."
  @callback drop_copies(id :: term()) :: :ok

  @held {__MODULE__, :held}
  @swept {__MODULE__, :swept}
  @deaths {__MODULE__, :deaths}

  # A kind may keep a structure's copies under a key of new_key/0: an
  # integer below -2^58 (@key_base), one per structure. A process-dictionary
  # lookup hashes a small integer several times faster than a tuple such as
  # {Larder.Register, id}, whose hashing was a large share of a Register
  # hit (bench/register_vs_ane_bench.exs measures hits beside Ane's), and
  # it stays a small integer (from -2^59) that no other code is likely to
  # use as a key.
  @key_base -288_230_376_151_711_744
  @key_span 144_115_188_075_855_872

  @doc "A new process-dictionary key for one structure's copies."
  @spec new_key() :: neg_integer()
  def new_key, do: @key_base - 1 - rem(:erlang.unique_integer([:positive]), @key_span)

  @doc "Whether `term` is a key of new_key/0 (a guard)."
  defguard key?(term)
           when is_integer(term) and term < @key_base and term >= @key_base - @key_span

  @doc "The number of a key of new_key/0 within the VM (1, 2, ...), for inspect."
  @spec key_number(neg_integer()) :: pos_integer()
  def key_number(key), do: @key_base - key

  @doc "Creates the VM-wide deaths counter once; called by Larder.Application."
  @spec setup() :: :ok
  def setup do
    if :persistent_term.get(@deaths, nil) == nil do
      :persistent_term.put(@deaths, :atomics.new(1, signed: false))
    end

    :ok
  end

  @doc "The VM-wide deaths counter (a structure may keep it in its handle)."
  @spec deaths() :: :atomics.atomics_ref()
  def deaths do
    case :persistent_term.get(@deaths, nil) do
      nil -> raise RuntimeError, "Larder needs the :larder application to be started"
      deaths -> deaths
    end
  end

  @doc "Counts a death; call it once the structure is dead for good."
  @spec died(:atomics.atomics_ref()) :: :ok
  def died(deaths), do: :atomics.add(deaths, 1, 1)

  @doc """
  Records that this process holds copies of the structure `id` (call it
  after storing the first ones), then reclaims the copies of every dead
  structure, this one included if it died meanwhile.
  """
  @spec hold(:atomics.atomics_ref(), term(), module(), term()) :: :ok
  def hold(deaths, id, module, arg) do
    Process.put(@held, Map.put(Process.get(@held, %{}), id, {module, arg}))
    sweep(:atomics.get(deaths, 1))
  end

  @doc """
  Drops this process's copies of dead structures if a structure died since
  this process last looked: one atomics read and one process-dictionary
  read when none did.
  """
  @spec reclaim(:atomics.atomics_ref()) :: :ok
  def reclaim(deaths) do
    now = :atomics.get(deaths, 1)

    # :erlang.get/1: on every miss of every kind
    case :erlang.get(@swept) do
      ^now -> :ok
      _ -> sweep(now)
    end
  end

  @doc "Forgets `id` (its kind has dropped this process's copies itself)."
  @spec release(term()) :: :ok
  def release(id) do
    case Process.get(@held) do
      %{^id => _} = held -> Process.put(@held, Map.delete(held, id))
      _ -> :ok
    end

    :ok
  end

  defp sweep(now) do
    Process.put(@swept, now)

    live =
      for {id, {module, arg}} = held <- Process.get(@held, %{}),
          module.live?(arg) or dropped(module, id),
          into: %{},
          do: held

    Process.put(@held, live)
    :ok
  end

  defp dropped(module, id) do
    :ok = module.drop_copies(id)
    false
  end
end
