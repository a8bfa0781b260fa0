defmodule Larder.Table.Lock do
  # The per-table writer lock: one ETS row {:lock, pid}; a dead holder is evicted.
  @moduledoc false

  @spins 64

  @doc "Runs `fun` while holding the lock in `meta` (an ETS set)."
  @spec with_lock(:ets.tid(), (() -> result)) :: result when result: var
  def with_lock(meta, fun) do
    acquire(meta, 0)

    try do
      fun.()
    after
      :ets.delete_object(meta, {:lock, self()})
    end
  end

  defp acquire(meta, attempt) do
    if :ets.insert_new(meta, {:lock, self()}) do
      :ok
    else
      case :ets.lookup(meta, :lock) do
        [{:lock, holder}] when holder == self() ->
          raise ArgumentError,
                "Larder.Table writes cannot be nested (the index function wrote to the table)"

        [{:lock, holder}] ->
          # A holder killed mid-write would otherwise block every writer.
          unless Process.alive?(holder), do: :ets.delete_object(meta, {:lock, holder})
          wait(attempt)

        [] ->
          :ok
      end

      acquire(meta, attempt + 1)
    end
  end

  defp wait(attempt) when attempt < @spins, do: :erlang.yield()
  defp wait(_attempt), do: Process.sleep(1)
end
