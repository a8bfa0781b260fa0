# The per-process copy: committed values kept in the caller's process
# dictionary, tagged with the slot counter they were read under, bounded per
# register.
defmodule Larder.Register.Local do
  @moduledoc false

  alias Larder.Register

  # A copy lives under {Larder.Register, id, key}; Larder.Register.get/3
  # builds that key inline on its hot path.
  @doc """
  Stores `entry` (`{tag, version, value}`, or `{tag}` for an absent key). When the
  register already has `max_cached` copies in this process, they are all
  dropped first: the bound holds and eviction costs O(1) amortised.
  """
  @spec remember(Register.t(), term(), tuple()) :: :ok
  def remember(%Register{id: id, max_cached: max}, key, entry) do
    case Process.put({Larder.Register, id, key}, entry) do
      nil ->
        count_key = {Larder.Register, id}
        count = (Process.get(count_key) || 0) + 1

        if count > max do
          drop(id)
          Process.put({Larder.Register, id, key}, entry)
          Process.put(count_key, 1)
        else
          Process.put(count_key, count)
        end

      _old ->
        :ok
    end

    :ok
  end

  @doc "Drops every copy of register `id` from this process."
  @spec drop(pos_integer()) :: :ok
  def drop(id) do
    for {{Larder.Register, ^id, _} = k, _} <- Process.get(), do: Process.delete(k)
    Process.delete({Larder.Register, id})
    :ok
  end

  @doc "How many copies of register `id` this process holds."
  @spec count(pos_integer()) :: non_neg_integer()
  def count(id), do: Process.get({Larder.Register, id}) || 0
end
