defmodule Larder.Register do
  @moduledoc """
  Versioned hot-key values for any key: reading a value that has not changed
  since this process last read it costs one atomics read and one
  process-dictionary lookup, with no ETS lookup and no copy.

      iex> reg = Larder.Register.new()
      iex> Larder.Register.put(reg, {:price, "SKU-1"}, [1, 2, 3])
      :ok
      iex> Larder.Register.get(reg, {:price, "SKU-1"})
      [1, 2, 3]
      iex> Larder.Register.update(reg, :hits, 1, &(&1 + 1))
      :ok
      iex> Larder.Register.fetch(reg, :hits)
      {:ok, 1}
      iex> Larder.Register.get(reg, :missing, :none)
      :none
      iex> Larder.Register.drop(reg)
      :ok

  ## How it works

  Each register has an ETS table with one record `{key, version, value}` per
  key and an atomics array of `:slots` commit counters; a key belongs to slot
  `:erlang.phash2(key, slots)`. Every write to any key of a slot bumps that
  slot's counter. A reader keeps, in its process dictionary, the last value it
  read of each key tagged with the counter it read it under: if the counter
  has not moved, the copy is current and is returned as is (the very same
  term, so the caller's heap does not grow); otherwise the reader looks the
  key up in ETS and refreshes its copy.

  A writer (the calling process itself) takes its slot's lock, inserts the
  record with the slot's next counter value, which readers treat as not yet
  committed, then bumps the counter, which commits it for cached and fresh
  readers at the same instant, and releases the lock. The slot locks are
  Larder's one internal lock: a compare-and-swap of the writer's holder id (a
  small integer handed to each process once, on its first write, by a
  registry of the `:larder` application that deletes it when the process
  exits) into an atomics array. Readers never wait on a writer: a reader
  that meets an uncommitted record yields once, then commits it itself
  (one compare-and-swap of the counter from just below the record's
  version to it, which only that uncommitted write can match), then reads
  it, so a write becomes visible either at its writer's bump or at a
  reader's, both between its insert and its return. A dead writer's
  record is committed the same way. A slot whose holder has died is taken
  over by the next writer of the slot, which bumps the counter before
  anything else. A tombstone left by a killed `delete/2` is dropped by the
  next reader of its key. Writes to one slot are serialised; writes to
  different slots run in parallel. A `put/3` that
  finds its slot held needs no turn once another process's write of the
  same key has committed since the put began: last writer wins, so the put
  is ordered just before that write and returns without writing (its value
  could never have been read). Many writers of one hot key thus mostly wait
  for one commit, not for a turn each.

  Every register death (`drop/1`, its owner's exit, its
  supervisor's shutdown) bumps one VM-wide counter, which a `Larder.Cache`
  that stops bumps too. Each process lists in its process dictionary the
  registers (and caches) it holds copies of; when it misses, or makes its
  first copy of a register, and the counter has moved since it last looked,
  it drops its copies of every register (and cache) that is dead.

  ## Complexity and capacity

    * `get/3`, `fetch/2`, `version/2`: O(1). Unchanged key: no ETS access, no
      copy. Changed key (or first read in this process): one ETS lookup, which
      copies the value into the caller's heap; a record being written adds
      one yield, one compare-and-swap and a second lookup, never a wait
      for its writer.
    * `put/3`, `delete/2`: O(1): two atomics
      compare-and-swaps (lock, unlock) around one ETS insert and the bump.
      A writer that finds its slot locked retries at once a few times, then
      yields between tries, each time checking that the holder is alive (one
      lookup in the holders' table). A process's first write registers it
      as a lock holder (one call to the `:larder` application's registry).
      `update/4`: a read, the function, and a compare-and-swap under the
      lock, retried while other writers win.
    * `keys/1`: O(n). `size/1`: O(1).
    * Keys are arbitrary terms and the number of keys is unbounded: slots are
      shared by hashing. Two keys in one slot are never confused; a write to
      one only makes the other's cached copies miss once. Choose `:slots`
      around the number of hot keys (default 1024; 8 bytes each).
    * Local copies are bounded by `:max_cached` entries per register per
      process (default 1024), kept in one process-dictionary entry per
      register, under an integer key between -2^59 and -2^58 (a small
      integer hashes fastest; keep your own process-dictionary keys out
      of that range). When a process exceeds it, all of its copies of that
      register are dropped at once (amortised O(1) per miss). `forget/1`
      drops them on demand. Copies of a deleted register are dropped at
      the process's next miss or first copy of any register: each miss
      costs one more atomics read and one more process-dictionary read, and
      after a register death one sweep of the registers the process holds
      copies of (O(number held)).
      A process also keeps a map of the registers it holds copies of, its
      counter as of its last sweep and, once it has written, its holder id.
    * Idle readers keep what they read. A process keeps its copy of a value
      after another process replaces or deletes it, until it next reads
      that key (which refreshes the copy), the register dies (then until
      its next sweep), `:max_cached` drops its copies, or it calls
      `forget/1`: no other process can reach into its dictionary. A
      process that read a large value once and then waits (a pool worker,
      a long-lived connection process) keeps that value alive however
      often it is replaced; have it call `forget/1` when it is done with a
      register, or read through a short-lived process.

  ## Options and their bounds

    * `:slots`: 1 to 1,048,576 (default 1024). Each slot costs 16 bytes (a
      commit counter and a lock), allocated at creation.
    * `:max_cached`: 1 to 1,048,576 (default 1024) copies per process.
    * An option out of range raises `ArgumentError` naming it, before
      anything is allocated.

  ## Concurrency

    * Reads are linearizable per key: once `put/3` (or `update/4`,
      `delete/2`) returns, every `get/3` in every process returns the new
      value or a later one (a concurrent put of the same key that overtook
      it), and once any reader has returned a value, no reader returns an
      older one. A local copy is only served while its slot counter is
      unchanged, and a write becomes visible to fresh readers only when the
      counter moves.
    * `update/4` is an atomic read-modify-write: the function runs in the
      caller on the committed value and its result is written only if the key
      has not changed meanwhile (otherwise it runs again), so concurrent
      updates never lose a write. The function may run more than once.
    * A caller killed at any point of `put/3`, `update/4` or `delete/2`
      (`Process.exit(pid, :kill)`) leaves at most an uncommitted record and a
      slot lock naming a dead process. No reader returns the uncommitted value
      before it is committed; the next writer of the slot takes the lock
      over, and a reader that meets the record commits it, so the key never
      gets stuck, nobody has to clean up, and no reader stays on the old
      value while another sees the new one. Each key keeps exactly one
      record.
    * `keys/1` and `size/1` are snapshots that may or may not include writes
      running concurrently with them.

  ## Telemetry

  A slot taken over from a writer that died holding it is the
  `[:larder, :register, :lock, :takeover]` event of `Larder.Telemetry`.
  Without `:telemetry` (or with `telemetry: false`) it costs one boolean
  check per write.

  ## Failures

    * Every bad argument raises `ArgumentError` naming it: an unknown name, a
      deleted register, a register whose owner has exited, a term that is not
      a register, a forged handle, options that are not a keyword list (an
      improper list included), an unknown option or one out of its bounds, a
      `fun` that is not 1-arity. Keys and values may be any term.
    * `new/1` and `start_link/1` raise `RuntimeError` when the `:larder`
      application is not started ("Larder.Register: the :larder
      application is not started: add :larder to your project's deps
      ..."); writes need it too (it runs the lock holders' registry).
    * A register made with `new/1` belongs to the calling process and is
      deleted when it exits, like an ETS table. Registers started with
      `start_link/1` live under their supervisor.
    * An exception raised by the function given to `update/4` propagates to
      the caller; nothing is written.
    * The owner marks the register dead before it drops the table when it
      stops normally, on `drop/1`, or on its supervisor's
      shutdown. Killing the owner with `Process.exit(pid, :kill)` skips that:
      a process may then keep serving its local copies until it misses, and
      drops them at its next sweep (after another register's death, or at its
      first copy of a register).

  ## Performance

  `mix run bench/register_bench.exs` measures a register against an ETS
  `:set` with `read_concurrency` and `write_concurrency` in the same run:
  16 parallel runners on 2 cores, values of 100 integers, each figure the
  ETS median over the Register's (a speed-up). The README has the table of
  a full run.

    * One process re-reading an unchanged 100-integer list: about 7x
      faster than `:ets.lookup/2` (5x when each read is timed alone), and
      no garbage collection over 100,000 reads with a 10k-word heap, where
      the ETS reads collect about 1,800 times: the copy is returned as is,
      so nothing is copied.
    * Read-mostly workloads are faster than ETS. In the run in
      `docs/benchmarks.md`: 90% get / 10% put 3.15x on one hot key and
      2.1x over 16 keys; 99/1 6.8x and 3.3x. Runs on a busier machine
      have measured down to 1.3x (90/10) and 3x (99/1).
    * Write-heavy workloads spread over many keys are about as fast as
      ETS or slower: 16 keys at 50/50 0.55-0.93x across runs. Each write
      takes its slot's lock and bumps its counter besides the ETS insert.
    * Writers of one slot take turns on a spin-then-yield lock, so a writer
      whose scheduler thread the operating system deschedules while it
      holds the lock stalls the slot's other writers: on a machine shared
      with other CPU-heavy work the hot-key figures drop, and with 16
      runners on 2 cores they are the noisiest of the bench. Puts of one
      hot key are the exception: a waiting put ends as soon as another
      write of its key commits (see "How it works").

  `ANE_PATH=<a checkout of Ane> mix run bench/register_vs_ane_bench.exs`
  measures a register against [Ane](https://github.com/gyson/ane) on Ane's
  own workload in the same run (the README has the table of a run). Ane's
  writers never wait for each other (each inserts its own versioned record),
  where a register's writers of one slot take turns on its lock, except
  puts overtaken by a write of their key. What the register keeps that Ane
  lacks: any term as a key,
  no handle to thread through the caller, and writers killed mid-write
  leave nothing to clean up.
  """

  import Bitwise, only: [<<<: 2]

  alias Larder.{Instance, Lock}
  alias Larder.Register.{Local, Server, Store}

  require Larder.Instance
  require Larder.LocalCopies

  @enforce_keys [
    :tab,
    :lock,
    :versions,
    :slots,
    :local,
    :deaths,
    :server,
    :name,
    :max_cached,
    :telemetry
  ]
  defstruct @enforce_keys

  # Upper bounds of the numeric options: 16 bytes per slot (a lock and a
  # counter), so at most 16 MiB of atomics per register; and a process's
  # copies of one register at most a million keys.
  @max_slots 1 <<< 20
  @max_cached 1 <<< 20

  @typedoc "A register handle (from `new/1`) or the name of a named register."
  @opaque t :: %__MODULE__{}
  @type register :: t() | atom()
  @type key :: term()
  @type value :: term()

  ## Lifecycle

  @doc """
  Creates a register owned by the calling process (it is deleted when the
  caller exits) and returns its handle.

  Options:

    * `:name` - an atom to refer to the register by (default `nil`). The name
      resolves through `:persistent_term`, set once at creation.
    * `:slots` - number of commit counters (and slot locks) keys are hashed
      to, from 1 to 1,048,576 (default 1024; 16 bytes each).
    * `:max_cached` - bound on this register's local copies per process,
      from 1 to 1,048,576 keys (default 1024).
    * `:telemetry` - `false` turns off this register's `:telemetry` events
      (default `true`: emitted when `:telemetry` is loaded when the register
      is created; see `Larder.Telemetry`).

  Raises `ArgumentError` on an unknown or invalid option, or a name in use;
  `RuntimeError` when the `:larder` application is not started.

      iex> reg = Larder.Register.new(name: :doc_new_example)
      iex> Larder.Register.put(:doc_new_example, :k, 1)
      :ok
      iex> Larder.Register.get(reg, :k)
      1
      iex> Larder.Register.drop(:doc_new_example)
      :ok
  """
  @spec new(keyword()) :: t()
  def new(opts \\ []) do
    opts = validate_opts!(opts)

    case Instance.start(Server, {opts, self()}, __MODULE__, opts[:name]) do
      {:ok, pid} -> GenServer.call(pid, :handle)
      {:error, {:already_started, _}} -> Instance.taken!(__MODULE__, opts[:name])
      {:error, reason} -> raise RuntimeError, "could not start a register: #{inspect(reason)}"
    end
  end

  @doc """
  Starts a register under a supervisor. Takes the options of `new/1`;
  `:name` is required, since the caller gets a pid and not a handle.
  Returns `{:error, {:already_started, pid}}` when the name is in use, like
  any `GenServer`; raises `ArgumentError` on invalid options.
  """
  @spec start_link(keyword()) :: GenServer.on_start()
  def start_link(opts) do
    opts = validate_opts!(opts, {:atom, :required})
    Instance.start_link(Server, {opts, nil}, __MODULE__, opts[:name])
  end

  @doc """
  A child specification for `start_link/1`. Raises `ArgumentError` on the
  options `start_link/1` rejects. The child is `:transient`: a register
  ended by `drop/1` stays dropped, one whose process crashed is restarted
  (empty).
  """
  @spec child_spec(keyword()) :: Supervisor.child_spec()
  def child_spec(opts) do
    name = Keyword.fetch!(validate_opts!(opts, {:atom, :required}), :name)
    Instance.child_spec(__MODULE__, name, {__MODULE__, :start_link, [opts]})
  end

  @doc """
  Drops the register: frees its table, its name and this process's local
  copies at once. Other processes' copies are never served again and are
  freed when those processes next touch the register or call `forget/1`.
  Every later call on the register raises `ArgumentError`, except `drop/1`
  itself, which returns `:ok` again, by handle or by name (a name that names
  no register is taken as one already dropped).

      iex> Larder.Register.new(name: :doc_drop_example)
      iex> Larder.Register.drop(:doc_drop_example)
      :ok
      iex> Larder.Register.drop(:doc_drop_example)
      :ok
  """
  @spec drop(register()) :: :ok
  def drop(name) when Instance.name?(name), do: Instance.drop_name(__MODULE__, name, &drop/1)

  def drop(reg) do
    %__MODULE__{server: server, local: local} = resolve(reg)
    # An owner already gone dropped the register with it.
    :ok = Instance.drop(server)
    Local.drop(local)
  end

  @doc """
  Drops this process's local copies of the register's values. Later reads
  fetch them again.
  """
  @spec forget(register()) :: :ok
  def forget(reg), do: Local.drop(resolve(reg).local)

  ## Reads

  @doc """
  Returns the value of `key`, or `default` when it is absent.

  An unchanged value already read by this process is returned from its local
  copy: the same term, with no copy and no ETS access.
  """
  @spec get(register(), key(), value()) :: value()
  def get(reg, key, default \\ nil)

  # The hot path allocates nothing: a served copy is returned as is. It
  # calls :erlang.get/1 itself: Process.get/1 is two more remote calls
  # (get/1, then get/2), a third of an unchanged read's cost.
  def get(%__MODULE__{versions: versions, local: local} = reg, key, default) do
    case :erlang.get(local) do
      %{^key => {slot, tag, _version, value}} ->
        case :atomics.get(versions, slot) do
          ^tag -> value
          now -> stale_get(reg, key, default, slot, now)
        end

      %{^key => {slot, tag}} ->
        case :atomics.get(versions, slot) do
          ^tag -> default
          now -> stale_get(reg, key, default, slot, now)
        end

      _ ->
        fresh_get(reg, key, default)
    end
  end

  def get(reg, key, default), do: get(resolve(reg), key, default)

  @doc "Returns `{:ok, value}` for a present key, `:error` otherwise."
  @spec fetch(register(), key()) :: {:ok, value()} | :error
  def fetch(reg, key) do
    case read(resolve(reg), key) do
      {:ok, _version, value} -> {:ok, value}
      :error -> :error
    end
  end

  @doc """
  Returns the version of `key`'s current value, or `nil` when it is absent.
  Versions of a key grow with every write to it; equal versions mean the
  same write.
  """
  @spec version(register(), key()) :: pos_integer() | nil
  def version(reg, key) do
    case read(resolve(reg), key) do
      {:ok, version, _value} -> version
      :error -> nil
    end
  end

  @doc """
  Lists the keys present (a snapshot; O(n)). A key whose first write was cut
  short by a kill may be listed before any reader has seen it.
  """
  @spec keys(register()) :: [key()]
  def keys(reg) do
    reg = resolve(reg)

    try do
      :ets.select(reg.tab, [{{:"$1", :_, :_}, [], [:"$1"]}])
    rescue
      ArgumentError -> unknown!(reg)
    end
  end

  @doc """
  The number of keys present (O(1)); a key being deleted concurrently may
  still be counted.
  """
  @spec size(register()) :: non_neg_integer()
  def size(reg) do
    reg = resolve(reg)

    case :ets.info(reg.tab, :size) do
      :undefined -> unknown!(reg)
      size -> size
    end
  end

  defp fresh_get(reg, key, default) do
    case Store.read(resolve(reg), key) do
      {:ok, _version, value} -> value
      :error -> default
    end
  end

  # A copy gone stale: its slot, and the counter just read, serve the read
  # again (no second hash of the key, no second read of the counter).
  defp stale_get(reg, key, default, slot, counter) do
    case Store.read(reg, key, slot, counter) do
      {:ok, _version, value} -> value
      :error -> default
    end
  end

  defp read(%__MODULE__{versions: versions, local: local} = reg, key) do
    with %{^key => entry} <- :erlang.get(local),
         {:hit, found} <- served(entry, versions) do
      found
    else
      _ -> Store.read(reg, key)
    end
  rescue
    # A forged handle's counters are not atomics.
    ArgumentError -> unknown!(reg)
  end

  # A local copy is served while its slot's counter has not moved.
  defp served({slot, tag, version, value}, versions) do
    if :atomics.get(versions, slot) == tag, do: {:hit, {:ok, version, value}}, else: :miss
  end

  defp served({slot, tag}, versions) do
    if :atomics.get(versions, slot) == tag, do: {:hit, :error}, else: :miss
  end

  defp served(_not_a_copy, _versions), do: :miss

  ## Writes

  @doc """
  Sets `key` to `value`. When it returns, every process reads `value` (or a
  later one).
  """
  @spec put(register(), key(), value()) :: :ok
  def put(reg, key, value) do
    reg = resolve(reg)

    case Store.write(reg, key, value) do
      # replaced by another process's write before it was ever read
      :overtaken -> :ok
      written -> Local.remember(reg, key, written(written, value))
    end
  end

  @doc """
  Atomically replaces `key`'s value with `fun.(current)`, or puts `default`
  as it is when `key` is absent (as `Map.update/4` does: `fun` does not run
  on `default`). Concurrent updates never lose a write; `fun` may run more
  than once and should be free of side effects.

      iex> reg = Larder.Register.new()
      iex> Larder.Register.update(reg, :n, 10, &(&1 * 2))
      :ok
      iex> Larder.Register.get(reg, :n)
      10
      iex> Larder.Register.update(reg, :n, 10, &(&1 * 2))
      :ok
      iex> Larder.Register.get(reg, :n)
      20
  """
  @spec update(register(), key(), value(), (value() -> value())) :: :ok
  def update(reg, key, default, fun) when is_function(fun, 1) do
    do_update(resolve(reg), key, default, fun)
  end

  def update(_reg, _key, _default, fun) do
    raise ArgumentError, "update/4 expects fun to be a 1-arity function, got: #{inspect(fun)}"
  end

  defp do_update(reg, key, default, fun) do
    {expected, new} =
      case read(reg, key) do
        {:ok, version, value} -> {version, fun.(value)}
        :error -> {nil, default}
      end

    case Store.swap(reg, key, expected, new) do
      :conflict -> do_update(reg, key, default, fun)
      written -> Local.remember(reg, key, written(written, new))
    end
  end

  # The writer's own copy, built from the value it already holds.
  defp written({slot, version}, value), do: {slot, version, version, value}

  @doc "Removes `key`. Removing an absent key is a no-op."
  @spec delete(register(), key()) :: :ok
  def delete(reg, key) do
    reg = resolve(reg)
    Local.remember(reg, key, Store.remove(reg, key))
  end

  ## Internals

  defp unknown!(reg), do: Store.unknown!(reg)

  # A handle is checked for shape here; a forged one whose references are of
  # the wrong kind fails at its first use, which raises Store.unknown!/1.
  defp resolve(
         %__MODULE__{
           tab: tab,
           lock: %Lock{},
           versions: versions,
           slots: slots,
           local: local,
           deaths: deaths,
           server: server,
           name: name,
           max_cached: max_cached,
           telemetry: telemetry
         } = reg
       )
       when is_reference(tab) and is_reference(versions) and
              slots in 1..@max_slots and Larder.LocalCopies.key?(local) and is_reference(deaths) and
              is_pid(server) and is_atom(name) and max_cached in 1..@max_cached and
              is_boolean(telemetry),
       do: reg

  defp resolve(name) when Instance.name?(name), do: Instance.resolve(__MODULE__, name)
  defp resolve(other), do: Instance.invalid!(__MODULE__, other)

  defp validate_opts!(opts, name \\ {{:or_nil, :atom}, nil}) do
    schema = [
      name: name,
      slots: {{:integer, 1, @max_slots}, 1024},
      max_cached: {{:integer, 1, @max_cached}, 1024},
      telemetry: {:boolean, true}
    ]

    Larder.Options.validate!(opts, schema, "Larder.Register")
  end

  defimpl Inspect do
    def inspect(%{name: nil, local: local}, _opts) when is_integer(local),
      do: "#Larder.Register<#{Kernel.inspect(Larder.LocalCopies.key_number(local))}>"

    def inspect(%{name: name}, _opts) when is_atom(name),
      do: "#Larder.Register<#{Kernel.inspect(name)}>"

    def inspect(_forged, _opts), do: "#Larder.Register<forged>"
  end
end
