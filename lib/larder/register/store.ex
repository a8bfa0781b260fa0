# The :versioned storage protocol: one ETS record per key plus an atomics
# array of per-slot commit counters. A writer takes its slot's lock, inserts,
# bumps, and unlocks; whoever takes over a dead holder's lock bumps first,
# which commits any write the dead holder left half done.
defmodule Larder.Register.Store do
  @moduledoc false

  alias Larder.Register
  alias Larder.Register.Local

  import Bitwise, only: [<<<: 2]

  @self_id {Larder.Register, :self_id}
  @serial_range 1 <<< 32

  # Slot counters start at 0 and only grow; a dead register has every slot at
  # @dead, which no local copy is ever tagged with.
  @dead -1

  @doc "Builds the table and counters; called by the owner process."
  @spec create(keyword(), pid()) :: Register.t()
  def create(opts, server) do
    mode = Keyword.fetch!(opts, :mode)

    %Register{
      mode: mode,
      tab: :ets.new(Register, [:set, :public, read_concurrency: true, write_concurrency: true]),
      locks: :atomics.new(Keyword.fetch!(opts, :slots), signed: true),
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
  # Under its slot's lock, a writer inserts a record with the slot's next
  # counter value, then bumps the slot to it. A record whose version is above
  # its slot's counter is not committed yet: readers never return it, so
  # cached and fresh readers switch values at the same bump. If its writer is
  # alive, readers wait; if it died, they take the lock over, which bumps.

  @doc "Writes `key`; returns its slot and new version."
  @spec write(Register.t(), term(), term()) :: {pos_integer(), pos_integer()}
  def write(reg, key, value) do
    slot = slot(reg, key)

    locked(reg, slot, fn tag ->
      version = tag + 1
      :ets.insert(reg.tab, {key, version, value})
      commit(reg, slot, tag, version)
      {slot, version}
    end)
  end

  @doc """
  Writes `key` only if its committed version is still `expected` (nil: the
  key is absent); returns its slot and new version, or `:conflict`.
  """
  @spec swap(Register.t(), term(), pos_integer() | nil, term()) ::
          {pos_integer(), pos_integer()} | :conflict
  def swap(%Register{tab: tab} = reg, key, expected, value) do
    slot = slot(reg, key)

    locked(reg, slot, fn tag ->
      current =
        case :ets.lookup(tab, key) do
          [{_, version, _}] when version <= tag -> version
          [{_, version}] when version <= tag -> nil
          [] -> nil
          _left_by_a_dead_writer -> :uncommitted
        end

      cond do
        current == :uncommitted ->
          commit(reg, slot, tag, tag + 1)
          :conflict

        current == expected ->
          version = tag + 1
          :ets.insert(tab, {key, version, value})
          commit(reg, slot, tag, version)
          {slot, version}

        true ->
          :conflict
      end
    end)
  end

  @doc "Removes `key`; returns the writer's local-copy entry."
  @spec remove(Register.t(), term()) :: tuple()
  def remove(%Register{tab: tab} = reg, key) do
    slot = slot(reg, key)

    locked(reg, slot, fn tag ->
      if :ets.member(tab, key) do
        version = tag + 1
        :ets.insert(tab, {key, version})
        commit(reg, slot, tag, version)
        :ets.delete(tab, key)
        {slot, version}
      else
        {slot, tag}
      end
    end)
  end

  # Runs fun.(tag) holding the slot's lock, tag being the slot's counter.
  defp locked(%Register{locks: locks, versions: versions} = reg, slot, fun) do
    taken = lock(locks, slot)

    try do
      case {:atomics.get(versions, slot), taken} do
        {tag, _} when tag < 0 ->
          Register.unknown!(reg)

        {tag, :acquired} ->
          fun.(tag)

        {tag, :taken_over} ->
          # The dead holder may have left a record above the counter: commit
          # it before anything else, since fun may release the lock without
          # bumping (a conflicting swap, removing an absent key).
          commit(reg, slot, tag, tag + 1)
          fun.(tag + 1)
      end
    after
      unlock(locks, slot)
    end
  rescue
    # The table went with the register.
    ArgumentError -> Register.unknown!(reg)
  end

  # A slot's lock is an atomic holding 0 (free) or its holder's pid as an
  # integer, so that a waiter can tell a live holder from a dead one. A held
  # lock is retried a few times at once (its holder is most likely running on
  # another scheduler and about to release it), then with yields.
  @spins 20

  defp lock(locks, slot, me \\ self_id(), tries \\ 0) do
    case :atomics.compare_exchange(locks, slot, 0, me) do
      :ok ->
        :acquired

      holder when tries < @spins ->
        _ = holder
        lock(locks, slot, me, tries + 1)

      holder ->
        cond do
          alive?(holder) ->
            :erlang.yield()
            lock(locks, slot, me, tries + 1)

          # Take over a dead holder's lock in one step.
          :atomics.compare_exchange(locks, slot, holder, me) == :ok ->
            :taken_over

          true ->
            lock(locks, slot, me, tries + 1)
        end
    end
  end

  defp unlock(locks, slot), do: :atomics.compare_exchange(locks, slot, self_id(), 0)

  # This process's pid as a positive integer, computed once per process.
  defp self_id do
    case Process.get(@self_id) do
      nil ->
        '<0.' ++ rest = :erlang.pid_to_list(self())
        [number, serial] = rest |> List.delete_at(-1) |> List.to_string() |> String.split(".")
        id = String.to_integer(number) * @serial_range + String.to_integer(serial) + 1
        Process.put(@self_id, id)
        id

      id ->
        id
    end
  end

  defp alive?(id) do
    number = div(id - 1, @serial_range)
    serial = rem(id - 1, @serial_range)
    Process.alive?(:erlang.list_to_pid('<0.#{number}.#{serial}>'))
  end

  # Under the lock only the register's death can move the counter.
  defp commit(reg, slot, tag, version) do
    case :atomics.compare_exchange(reg.versions, slot, tag, version) do
      :ok -> :ok
      _dead -> Register.unknown!(reg)
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
        # A committed tombstone means absent; its remover was killed before
        # dropping it. Drop exactly this one (a newer record stays).
        :ets.delete_object(tab, {key, version})
        Local.remember(reg, key, {slot, tag})
        :error

      [] ->
        Local.remember(reg, key, {slot, tag})
        :error

      _uncommitted ->
        settle(reg, slot)
        read(reg, key, slot, :atomics.get(versions, slot))
    end
  end

  # A record above its slot's counter: its writer holds the lock. Wait for a
  # live writer; for a dead one, take the lock and commit its write (under
  # the lock, any record above the counter is a dead writer's).
  defp settle(%Register{locks: locks} = reg, slot) do
    case :atomics.get(locks, slot) do
      0 ->
        :ok

      holder ->
        if alive?(holder) do
          :erlang.yield()
        else
          locked(reg, slot, fn _tag -> :ok end)
        end
    end
  end

  defp lookup(reg, tab, key) do
    :ets.lookup(tab, key)
  rescue
    ArgumentError -> Register.unknown!(reg)
  end
end
