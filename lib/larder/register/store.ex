# The storage protocol: one ETS record per key plus an atomics
# array of per-slot commit counters. A writer takes its slot's Larder.Lock,
# inserts, bumps, and releases; whoever takes over a dead holder's slot bumps
# first (the on_takeover of Larder.Lock.with_slot/4), which commits any write
# the dead holder left half done.
defmodule Larder.Register.Store do
  @moduledoc false

  alias Larder.{LocalCopies, Lock}
  alias Larder.Register
  alias Larder.Register.Local

  # Slot counters start at 0 and only grow; a dead register has every slot at
  # @dead, which no local copy is ever tagged with.
  @dead -1

  # Process-dictionary flag: this process just took a slot over.
  @takeover {Register, :took_over}

  @doc "Builds the table and counters; called by the owner process."
  @spec create(keyword(), pid()) :: Register.t()
  def create(opts, server) do
    slots = Keyword.fetch!(opts, :slots)

    %Register{
      tab: :ets.new(Register, [:set, :public, read_concurrency: true, write_concurrency: true]),
      lock: Lock.new(slots),
      versions: :atomics.new(slots, signed: true),
      slots: slots,
      local: LocalCopies.new_key(),
      deaths: LocalCopies.deaths(),
      server: server,
      name: Keyword.fetch!(opts, :name),
      max_cached: Keyword.fetch!(opts, :max_cached),
      telemetry: Larder.Instance.telemetry?(Keyword.fetch!(opts, :telemetry))
    }
  end

  @doc """
  Raises the one error for a register that is gone (dropped, or its owner
  exited), after dropping the caller's local copies of it.
  """
  @spec unknown!(Register.t()) :: no_return()
  def unknown!(%Register{local: local, name: name} = reg) do
    Local.drop(local)
    Larder.Instance.unknown!(Register, name || reg)
  end

  # A miss is a handful of calls; these two need not be.
  @compile {:inline, slot: 2, counter: 2}

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
  # cached and fresh readers switch values at the same bump.
  #
  # Readers never wait on a writer: one that meets an uncommitted record
  # yields once (its writer was most likely descheduled just after its
  # insert, which costs many reductions, and a yield lets it run and commit),
  # then commits it itself (it helps), with the same compare-and-swap of the
  # counter from the record's version - 1 to its version, and reads again.
  # That is safe because such a record can only be the last write of the
  # slot's holder, inserted when the counter was exactly version - 1 (the
  # holder's tag), so the swap succeeds only while that write is uncommitted
  # and commits nothing else. The write is then linearized at the helper's
  # swap, between the writer's insert and its return; the writer's own swap
  # finds the counter already at its version and goes on (commit/4). A dead
  # writer's record is committed the same way, by the first reader that
  # meets it, and the next writer takes its lock over. (Committing without
  # the yield measured slower on a hot key under 50% writes,
  # bench/register_vs_ane_bench.exs: the readers ran ahead of the
  # descheduled writer that held up the slot's other writers.)

  @doc """
  Writes `key`; returns its slot and new version, or `:overtaken` when a
  write of `key` by another process committed while this one waited for
  the slot (see overtaken/4).
  """
  @spec write(Register.t(), term(), term()) :: {pos_integer(), pos_integer()} | :overtaken
  def write(reg, key, value) do
    slot = slot(reg, key)
    since = since(reg, slot)

    locked(
      reg,
      slot,
      fn tag ->
        version = tag + 1
        :ets.insert(reg.tab, {key, version, value})
        commit(reg, slot, tag, version)
        {slot, version}
      end,
      fn -> overtaken(reg, key, slot, since) end
    )
  end

  # Last writer wins: a put that finds its slot held may end without
  # writing once a write of the same key (a put or a delete) has committed
  # after the put began, that is at a version above the slot's counter
  # `since` read before the put's first try. The put is linearized just
  # before that commit, which falls between the put's start and its return,
  # so its value is never read: no reader could tell it from a put that
  # wrote and was replaced at once. An uncommitted record (its writer holds
  # the slot) is waited for, and an absent key (deleted and gone) proves
  # nothing, so the put goes on waiting for the slot. Reads the record's
  # version only, so the value is not copied.
  defp overtaken(%Register{tab: tab, versions: versions}, key, slot, since) do
    version = :ets.lookup_element(tab, key, 2)

    if version > since and version <= :atomics.get(versions, slot),
      do: {:overtaken, :overtaken},
      else: false
  rescue
    # Absent (or the register is gone, which taking the slot reports).
    ArgumentError -> false
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
  # Taking over a dead holder's slot commits first: the dead holder may have
  # left a record above the counter, and fun may release the slot without
  # bumping (a conflicting swap, removing an absent key).
  # `overtaken` is Lock.with_slot/5's: see overtaken/4.
  defp locked(reg, slot, fun, overtaken \\ fn -> false end)

  defp locked(%Register{lock: lock, telemetry: false} = reg, slot, fun, overtaken) do
    Lock.with_slot(
      lock,
      slot,
      fn -> commit_next(reg, slot) end,
      fn -> fun.(tag!(reg, slot)) end,
      overtaken
    )
  rescue
    # The table or the counters went with the register (or the handle is forged).
    ArgumentError -> unknown!(reg)
  end

  # With telemetry, a takeover is noted under the lock and reported after
  # it is released, so no handler runs holding a slot.
  defp locked(%Register{lock: lock} = reg, slot, fun, overtaken) do
    try do
      Lock.with_slot(
        lock,
        slot,
        fn -> take_over(reg, slot) end,
        fn -> fun.(tag!(reg, slot)) end,
        overtaken
      )
    rescue
      ArgumentError -> unknown!(reg)
    after
      report_takeover(reg, slot)
    end
  end

  defp take_over(reg, slot) do
    commit_next(reg, slot)
    Process.put(@takeover, true)
  end

  defp report_takeover(reg, slot) do
    if Process.delete(@takeover) do
      Larder.Telemetry.execute(true, [:larder, :register, :lock, :takeover], %{count: 1}, %{
        register: reg.name || reg,
        slot: slot
      })
    end
  end

  # The slot's counter before a write's first try (a forged handle's
  # counters are not atomics of its size).
  defp since(reg, slot) do
    tag!(reg, slot)
  rescue
    ArgumentError -> unknown!(reg)
  end

  defp tag!(%Register{versions: versions} = reg, slot) do
    case :atomics.get(versions, slot) do
      tag when tag < 0 -> unknown!(reg)
      tag -> tag
    end
  end

  defp commit_next(reg, slot) do
    tag = tag!(reg, slot)
    commit(reg, slot, tag, tag + 1)
  end

  # Under the lock the counter moves only by this commit, by a reader that
  # committed the holder's record for it (the counter is then at
  # `version`), or by the register's death.
  defp commit(reg, slot, tag, version) do
    case :atomics.compare_exchange(reg.versions, slot, tag, version) do
      :ok -> :ok
      ^version -> :ok
      _dead -> unknown!(reg)
    end
  end

  @doc "Marks every slot dead, then drops the table (owner only)."
  @spec kill(Register.t()) :: :ok
  def kill(%Register{tab: tab, versions: versions, slots: slots} = reg) do
    for slot <- 1..slots, do: :atomics.put(versions, slot, @dead)
    :ets.delete(tab)
    Local.died(reg)
  end

  @doc """
  Reads `key`'s committed record (any process) and remembers it in the
  caller's local copy, tagged with the slot counter read before the lookup.
  """
  @spec read(Register.t(), term()) :: {:ok, pos_integer(), term()} | :error
  def read(reg, key) do
    slot = slot(reg, key)
    read(reg, key, slot, counter(reg, slot))
  rescue
    # A forged handle's counters are not atomics of its size.
    ArgumentError -> unknown!(reg)
  end

  @doc """
  read/2 of a key whose slot (`slot(reg, key)`) and counter (`tag`, read
  before this call) the caller already has: a local copy gone stale.
  """
  @spec read(Register.t(), term(), pos_integer(), integer()) ::
          {:ok, pos_integer(), term()} | :error
  def read(reg, key, slot, tag) do
    LocalCopies.reclaim(reg.deaths)
    read_at(reg, key, slot, tag)
  rescue
    # A table gone with its register.
    ArgumentError -> unknown!(reg)
  end

  defp read_at(reg, _key, _slot, tag) when tag < 0, do: unknown!(reg)

  defp read_at(%Register{tab: tab} = reg, key, slot, tag) do
    # inside read/4's rescue: a table gone with its register raises there
    case :ets.lookup(tab, key) do
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

      [uncommitted] ->
        :erlang.yield()
        help(reg, slot, :erlang.element(2, uncommitted))
        read_at(reg, key, slot, counter(reg, slot))
    end
  end

  defp counter(%Register{versions: versions}, slot), do: :atomics.get(versions, slot)

  # Commits the uncommitted record of version `version` (see "Records"):
  # a no-op when its writer, or another reader, has committed it since, or
  # the register died (the caller's next counter read reports it).
  defp help(%Register{versions: versions}, slot, version) do
    _ = :atomics.compare_exchange(versions, slot, version - 1, version)
    :ok
  end
end
