# The one internal lock of Larder: striped slot locks in :atomics, held by a
# process's holder id, with one takeover protocol for a holder that died.
defmodule Larder.Lock do
  @moduledoc false

  # A lock has `slots` independent slots; a key belongs to slot
  # `:erlang.phash2(key, slots) + 1`. A slot is an atomic holding 0 (free) or
  # its holder's id, a small positive integer the holder registry
  # (Larder.Lock.Holders) hands each process once and never reuses.
  #
  # Acquiring is a compare-and-swap of 0 to the caller's id. A held slot is
  # retried at once a few times (its holder most likely runs on another
  # scheduler and is about to release it), then with a yield between tries.
  # Each try past the spins checks the holder: an id whose process is no
  # longer alive (Holders.alive?/1, which reads the holder table and the
  # runtime and never waits on a process) is replaced by the caller's in one
  # compare-and-swap, so exactly one waiter takes a dead holder's slot over.
  # Since ids are never reused, a dead holder's id can never be mistaken for
  # a live process. A holder killed inside a dirty NIF counts as dead at
  # once, though the NIF runs on to its end (see Holders.alive?/1).
  #
  # The holder of a slot taken over learns it (`:taken_over`), and
  # `with_slot/4` then runs the caller's `on_takeover` before anything else,
  # so the caller repairs whatever the dead holder left half done. A holder
  # killed inside `on_takeover` leaves the slot to the next taker-over, and
  # one whose `on_takeover` raises hands the slot back to the dead holder's
  # id: either way the next acquirer runs it again, so it must be idempotent.

  import Bitwise, only: [<<<: 2]

  alias Larder.Lock.Holders

  @enforce_keys [:atomics, :slots]
  defstruct @enforce_keys

  @type t :: %__MODULE__{atomics: :atomics.atomics_ref(), slots: pos_integer()}
  @type slot :: pos_integer()

  # 8 bytes per slot: at most 8 MiB per lock.
  @max_slots 1 <<< 20
  @spins 20

  @doc "A lock with `slots` slots, all free: 1..1,048,576 (2^20) slots."
  @spec new(pos_integer()) :: t()
  def new(slots) when is_integer(slots) and slots >= 1 and slots <= @max_slots do
    %__MODULE__{atomics: :atomics.new(slots, signed: false), slots: slots}
  end

  def new(slots) do
    raise ArgumentError,
          "expected slots to be an integer in 1..#{@max_slots}, got: #{inspect(slots)}"
  end

  @doc "The slot `key` belongs to."
  @spec slot(t(), term()) :: slot()
  def slot(%__MODULE__{slots: slots}, key), do: :erlang.phash2(key, slots) + 1
  def slot(lock, _key), do: bad_lock!(lock)

  @doc """
  Takes `slot`, waiting while a live process holds it. Returns `:taken_over`
  when the previous holder died holding it. Raises ArgumentError when the
  caller already holds it (a nested acquire would wait for ever).
  """
  @spec acquire(t(), slot()) :: :acquired | :taken_over
  def acquire(%__MODULE__{atomics: atomics, slots: n}, slot)
      when is_integer(slot) and slot >= 1 and slot <= n do
    case take(atomics, slot, Holders.id(), 0) do
      :acquired -> :acquired
      {:taken_over, _dead} -> :taken_over
    end
  end

  def acquire(lock, slot), do: bad_slot!(lock, slot)

  @doc "Frees `slot` if the caller holds it; `:ok` either way."
  @spec release(t(), slot()) :: :ok
  def release(%__MODULE__{atomics: atomics, slots: n}, slot)
      when is_integer(slot) and slot >= 1 and slot <= n do
    _ = :atomics.compare_exchange(atomics, slot, Holders.id(), 0)
    :ok
  end

  def release(lock, slot), do: bad_slot!(lock, slot)

  @doc """
  Who holds `slot` now: `:free`, `:alive` (a live process) or `:dead` (a
  process that died holding it; the next acquirer takes it over). A snapshot.
  """
  @spec holder(t(), slot()) :: :free | :alive | :dead
  def holder(%__MODULE__{atomics: atomics, slots: n}, slot)
      when is_integer(slot) and slot >= 1 and slot <= n do
    case :atomics.get(atomics, slot) do
      0 -> :free
      id -> if Holders.alive?(id), do: :alive, else: :dead
    end
  end

  def holder(lock, slot), do: bad_slot!(lock, slot)

  @doc """
  Runs `fun.()` holding `slot` and returns its result. When the previous
  holder died holding the slot, runs `on_takeover.()` first. Releases the
  slot when `fun` returns or raises. When `on_takeover` raises, the slot
  goes back to the dead holder, so that the next acquirer takes it over and
  repairs again.

  `overtaken`, when given, is called each time the slot is found held by a
  live process: returning `{:overtaken, result}` stops waiting and returns
  `result` without taking the slot or running `fun` (a caller whose work
  another holder has made unneeded); `false` goes on waiting.
  """
  @spec with_slot(
          t(),
          slot(),
          (() -> term()),
          (() -> result),
          (() -> false | {:overtaken, result})
        ) ::
          result
        when result: var
  def with_slot(lock, slot, on_takeover, fun, overtaken \\ &never_overtaken/0)

  def with_slot(%__MODULE__{atomics: atomics, slots: n}, slot, on_takeover, fun, overtaken)
      when is_integer(slot) and slot >= 1 and slot <= n and is_function(on_takeover, 0) and
             is_function(fun, 0) and is_function(overtaken, 0) do
    me = Holders.id()

    case take(atomics, slot, me, 0, overtaken) do
      :acquired -> held(atomics, slot, me, fun)
      {:taken_over, dead} -> repaired(atomics, slot, me, dead, on_takeover, fun)
      {:overtaken, result} -> result
    end
  end

  def with_slot(%__MODULE__{} = lock, slot, on_takeover, fun, overtaken) do
    cond do
      not is_function(on_takeover, 0) ->
        raise ArgumentError,
              "expected on_takeover to be a 0-arity function, got: #{inspect(on_takeover)}"

      not is_function(fun, 0) ->
        raise ArgumentError, "expected fun to be a 0-arity function, got: #{inspect(fun)}"

      not is_function(overtaken, 0) ->
        raise ArgumentError,
              "expected overtaken to be a 0-arity function, got: #{inspect(overtaken)}"

      true ->
        bad_slot!(lock, slot)
    end
  end

  def with_slot(lock, _slot, _on_takeover, _fun, _overtaken), do: bad_lock!(lock)

  defp never_overtaken, do: false

  defp repaired(atomics, slot, me, dead, on_takeover, fun) do
    repair(atomics, slot, me, dead, on_takeover)
    held(atomics, slot, me, fun)
  end

  defp held(atomics, slot, me, fun) do
    fun.()
  after
    :atomics.compare_exchange(atomics, slot, me, 0)
  end

  @doc """
  Runs `fun.()` holding every slot of `slots` (a strictly increasing list)
  and returns its result: `with_slot/4` for a set of slots. Takes them in
  increasing order, so two callers never wait on each other in a cycle;
  runs `on_takeover.(slot)` for each slot whose holder died. Releases every
  slot taken when `fun` returns or raises, and when taking a slot fails.
  """
  @spec with_slots(t(), [slot()], (slot() -> term()), (() -> result)) :: result
        when result: var
  def with_slots(%__MODULE__{atomics: atomics, slots: n}, slots, on_takeover, fun)
      when is_list(slots) and is_function(on_takeover, 1) and is_function(fun, 0) do
    check_increasing!(slots, 0, n, slots)
    me = Holders.id()
    held = take_all(atomics, slots, me, on_takeover, [])

    try do
      fun.()
    after
      release_all(atomics, held, me)
    end
  end

  def with_slots(%__MODULE__{}, slots, on_takeover, fun) do
    cond do
      not is_list(slots) ->
        raise ArgumentError, "expected slots to be a list, got: #{inspect(slots)}"

      not is_function(on_takeover, 1) ->
        raise ArgumentError,
              "expected on_takeover to be a 1-arity function, got: #{inspect(on_takeover)}"

      true ->
        raise ArgumentError, "expected fun to be a 0-arity function, got: #{inspect(fun)}"
    end
  end

  def with_slots(lock, _slots, _on_takeover, _fun), do: bad_lock!(lock)

  defp check_increasing!([slot | rest], last, n, all)
       when is_integer(slot) and slot > last and slot <= n,
       do: check_increasing!(rest, slot, n, all)

  defp check_increasing!([], _last, _n, _all), do: :ok

  defp check_increasing!(_rest, _last, n, all) do
    raise ArgumentError,
          "expected slots to be a strictly increasing list of integers in 1..#{n}, " <>
            "got: #{inspect(all)}"
  end

  # Takes the slots in order; on a failure (a nested acquire, a raising
  # on_takeover) releases those taken before re-raising.
  defp take_all(atomics, [slot | rest], me, on_takeover, held) do
    try do
      case take(atomics, slot, me, 0) do
        :acquired -> :ok
        {:taken_over, dead} -> repair(atomics, slot, me, dead, fn -> on_takeover.(slot) end)
      end
    catch
      kind, reason ->
        release_all(atomics, held, me)
        :erlang.raise(kind, reason, __STACKTRACE__)
    end

    take_all(atomics, rest, me, on_takeover, [slot | held])
  end

  defp take_all(_atomics, [], _me, _on_takeover, held), do: held

  defp release_all(atomics, [slot | held], me) do
    _ = :atomics.compare_exchange(atomics, slot, me, 0)
    release_all(atomics, held, me)
  end

  defp release_all(_atomics, [], _me), do: :ok

  defp repair(atomics, slot, me, dead, on_takeover) do
    on_takeover.()
  catch
    kind, reason ->
      _ = :atomics.compare_exchange(atomics, slot, me, dead)
      :erlang.raise(kind, reason, __STACKTRACE__)
  end

  defp take(atomics, slot, me, tries, overtaken \\ &never_overtaken/0) do
    case :atomics.compare_exchange(atomics, slot, 0, me) do
      :ok ->
        :acquired

      ^me ->
        raise ArgumentError,
              "Larder.Lock slot #{slot} is already held by this process (nested acquire)"

      holder ->
        case overtaken.() do
          false -> wait(atomics, slot, me, tries, overtaken, holder)
          {:overtaken, _} = done -> done
        end
    end
  end

  defp wait(atomics, slot, me, tries, overtaken, _holder) when tries < @spins,
    do: take(atomics, slot, me, tries + 1, overtaken)

  defp wait(atomics, slot, me, tries, overtaken, holder) do
    cond do
      Holders.alive?(holder) ->
        :erlang.yield()
        take(atomics, slot, me, tries + 1, overtaken)

      :atomics.compare_exchange(atomics, slot, holder, me) == :ok ->
        {:taken_over, holder}

      true ->
        take(atomics, slot, me, tries + 1, overtaken)
    end
  end

  defp bad_slot!(%__MODULE__{slots: n}, slot) do
    raise ArgumentError, "expected slot to be an integer in 1..#{n}, got: #{inspect(slot)}"
  end

  defp bad_slot!(lock, _slot), do: bad_lock!(lock)

  defp bad_lock!(lock) do
    raise ArgumentError, "expected lock to be a Larder.Lock, got: #{inspect(lock)}"
  end
end
