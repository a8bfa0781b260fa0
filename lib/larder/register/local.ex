# The per-process copy: one map per register in the caller's process
# dictionary, from key to the committed value read under a slot counter,
# bounded per register.
defmodule Larder.Register.Local do
  @moduledoc false

  alias Larder.Register

  # Under the register's `local` key ({Larder.Register, id}) the process
  # dictionary holds %{key => entry}, where entry is
  # {slot, tag, version, value} for a present key or {slot, tag} for an
  # absent one: valid while the slot's counter still equals tag.

  @doc """
  Stores `entry` for `key`. A register whose copies reach `max_cached` keys
  in this process drops them all first, so the bound holds at O(1)
  amortised cost.
  """
  @spec remember(Register.t(), term(), tuple()) :: :ok
  def remember(%Register{local: local, max_cached: max}, key, entry) do
    case Process.get(local) do
      %{^key => _} = copies -> Process.put(local, %{copies | key => entry})
      %{} = copies when map_size(copies) < max -> Process.put(local, Map.put(copies, key, entry))
      _none_or_full -> Process.put(local, %{key => entry})
    end

    :ok
  end

  @doc "Drops this process's copies of the register under `local`."
  @spec drop(term()) :: :ok
  def drop(local) do
    Process.delete(local)
    :ok
  end
end
