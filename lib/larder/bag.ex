defmodule Larder.Bag do
  @moduledoc """
  A multi-value table with the semantics of an ETS `:bag` (a `{key, value}`
  pair is stored at most once, pairs compare with `=:=`, values come back in
  insertion order) without `:bag`'s insert cost, which grows with every
  value a key holds.

  ETS `:bag` deduplicates each insert by comparing the new object with every
  object already stored under its key. `Larder.Bag` stores the pairs in an
  ETS `:duplicate_bag`, whose inserts compare nothing, and keeps beside it a
  set of fingerprints (hashes) of the pairs it holds, in a NIF resource. A
  pair whose fingerprint is not in the set is new and is inserted at once;
  only a pair whose fingerprint is there (the pair itself, or a rare
  collision) is compared, with `=:=`, to its key's values.

      iex> bag = Larder.Bag.new()
      iex> Larder.Bag.insert(bag, :fruit, "pear")
      :ok
      iex> Larder.Bag.insert(bag, :fruit, "apple")
      :ok
      iex> Larder.Bag.insert(bag, :fruit, "pear")
      :ok
      iex> Larder.Bag.lookup(bag, :fruit)
      ["pear", "apple"]
      iex> Larder.Bag.size(bag)
      2

  Everything a program can observe is what an ETS `:bag` gives: `{1, :a}`
  and `{1.0, :a}` are two pairs, `{:k, 0.0}` and `{:k, -0.0}` one (the first
  inserted stays, as `0.0 =:= -0.0` on OTP 25); a pair inserted again while
  present keeps its place in `lookup/2`, one deleted and inserted again
  comes last; `insert_many/2` orders a batch as `:ets.insert/2` does on a
  `:bag`; keys that contain maps are looked up like any other.

  With `dedup: false` the bag is a plain ETS `:duplicate_bag` behind the same
  API: every insert adds a copy, and nothing is compared.

  A bag is owned by the process that created it, like an ETS table: it is
  deleted when that process exits. `start_link/1` (or `child_spec/1` in a
  supervisor) starts a process that owns a named bag, so the bag outlives the
  processes that use it. A named bag can be used through its name (an atom)
  or through its handle.

  ## Complexity

  `n` is the number of pairs in the bag, `m` the number of values under the
  key at hand, `b` the length of a batch.

  | function | cost |
  |---|---|
  | `insert/3` of a new pair | `O(1)` on average |
  | `insert/3` of a present pair (or a fingerprint collision) | `O(m)` |
  | `insert_many/2` | `O(b)`, plus `O(m)` per present pair |
  | `lookup/2`, `count/2`, `member?/3`, `delete/2`, `delete/3` | `O(m)` |
  | `size/1`, `memory/1` | `O(1)` |
  | `keys/1`, `stream/1` (fully consumed), `dump/2`, `load/2` | `O(n)` |

  With `dedup: false`, costs are those of the `:duplicate_bag`: `insert/3`
  is `O(1)` on average, everything that reads a key `O(m)`.

  ## Concurrency

  Bags are `:public` ETS tables: any process may insert, delete and read.
  Writers of one key (`insert/3`, `insert_many/2`, `delete/2`, `delete/3`)
  are serialised by a lock of 256 slots per bag, chosen by the key's hash;
  writers of keys in different slots run in parallel. Readers take no lock.

    * `insert/3`, `delete/3` and `delete/2` are atomic: two processes that
      insert the same pair at the same moment leave exactly one copy, and an
      insert racing a delete of the same pair leaves it once or not at all.
    * `insert_many/2` takes the slots of every key in its batch (in
      increasing order, so batches never deadlock), filters the batch, and
      makes one `:ets.insert/2` call: atomic and isolated. A concurrent
      reader sees either none or all of the batch, never part.
    * `lookup/2`, `count/2`, `member?/3` and `size/1` are one ETS call each
      and see each write whole.
    * `keys/1`, `stream/1` and `dump/2` traverse the table in chunks and are
      not snapshots: a pair present during the whole traversal is returned
      exactly once; a pair inserted or deleted meanwhile may or may not be.
    * A writer killed in the middle of a write leaves no duplicate: it
      counts a fingerprint before it inserts a pair, and deletes a pair
      before it uncounts its fingerprint, so at worst it leaves a
      fingerprint counted for a pair that is not there. The next writer of
      its slot takes the slot over (`Larder.Lock`) and first rebuilds the
      slot's fingerprints from the table, which removes it. That rebuild
      scans the whole bag (`O(n)`) while holding the slot.

  ## Failures

    * A handle that is not a bag, a name that no bag was created under, or a
      bag that was dropped (by `drop/1`, or because its owner
      exited) raises `ArgumentError` saying so, in one line that names the
      bag (its name, or its handle as `inspect/1` shows it:
      `#Larder.Bag<dedup: true>`): "unknown Larder.Bag :roles: it was never
      created, it was dropped, or the process that owned it exited".
    * `new/1`, `start_link/1`, `load/2` and `dump/2` raise `RuntimeError`
      when the `:larder` application is not started ("Larder.Bag: the
      :larder application is not started: add :larder to your project's
      deps ..."); so does a write, which takes a lock whose registry the
      application runs.
    * Bad arguments (a batch that is not a proper list of pairs, a path that
      is not a string or holds a null byte, unknown options or option
      values) raise `ArgumentError` naming the argument. Keys and values may
      be any term. No option is numeric, so none needs an upper bound.
    * `dump/2` and `load/2` return `{:error, %Larder.Error{}}` for failures
      of the file system (`reason: :file_error`, including a failed fsync)
      and for a snapshot that is truncated, corrupt, of another format
      version or not in the shape `dump/2` writes
      (`reason: :corrupt_snapshot`).
    * A snapshot file is untrusted input: `load/2` checks every chunk's
      length and checksum, decodes with `binary_to_term/2`'s `:safe` option
      (no new atoms, unless `create_atoms: true`), rejects compressed terms,
      and checks that every object is a `{key, value}` pair, so a foreign or
      hostile file gives `:corrupt_snapshot` and the memory it can make the
      loader take is bounded by a small multiple of its size. A pair a file
      holds twice is loaded once. A failed `load/2` leaves no table behind.
    * `dump/2` returns `:ok` only once the file and its directory are
      fsynced: after a crash or power loss, `path` holds the previous
      snapshot or the complete new one.
    * The fingerprint set's native code never touches a key or a value (the
      fingerprints are computed in Erlang by `:erlang.phash2/1,2`, which
      yield on large terms), takes at most 4,096 fingerprints per call,
      leaves any resize of a large table to a dirty scheduler, and counts
      its memory in `memory/1`.

  ## Logging

  `load/2` logs one line at `:info` once a bag is loaded: the bag (its
  name, or its handle), the path, the pairs, the file's bytes and the time
  the load took:

      [info] Larder.Bag :roles loaded from "/var/lib/app/roles.bag": 1000000 pairs, 21474836 bytes, in 274.0 ms

  A load that fails logs nothing (it returns the error). Larder's log calls
  carry the `application: :larder` metadata, so Logger's own settings turn
  these lines off: `Logger.put_application_level(:larder, :warning)` at
  run time, or, at compile time, in your `config/config.exs`:

      config :logger,
        compile_time_purge_matching: [[application: :larder, level_lower_than: :warning]]

  ## Performance

  Each figure is a ratio of medians to an ETS anchor measured in the same
  run, at 1M pairs over 10k keys (about 100 values a key), by
  `mix run bench/bag_bench.exs`; the README has the table of a full run.

    * Filling with `insert/3` costs 1.6-2.2x an ETS `:duplicate_bag` fill
      (which compares nothing) and is 7-9x faster than an ETS `:bag` fill;
      with `insert_many/2` in batches of 1,000, 1.3-1.8x `:duplicate_bag`
      (the anchor, which compares nothing, moves most between runs).
    * An insert into a bag of 1M pairs costs about 2x a `:duplicate_bag`
      insert. What deduplication adds is two `phash2` calls, the key's lock
      slot (two atomics operations) and one NIF call whose read of the
      fingerprint set (4-8 MB at 1M pairs) lands on a random cache line:
      that cache miss is most of the difference.
    * `lookup/2` costs about 0.85x `:ets.lookup/2` on an ETS `:bag`.
    * Memory: about 1.1x an ETS `:bag` holding the same pairs, the
      fingerprint set included (`memory/1` counts it).
    * `load/2` of a snapshot is 2.8-5x faster than re-inserting its pairs
      with `insert/3` (2.8x in the run in `docs/benchmarks.md`): it
      decodes, fingerprints and inserts each chunk in bulk. Decoding and
      the ETS insert alone (a `dedup: false` load, in the same bench) take
      about three quarters of it: a cheaper fingerprint step could win
      back at most the rest.
    * `dedup: false` makes the ETS calls of a `:duplicate_bag` and costs
      what it costs (0.95-1.1x).
    * `dump/2` waits for two fsyncs (the file, then its directory), whose
      cost depends on the storage rather than on Larder.

  Why this design: `mix run bench/bag_designs_bench.exs` measures five
  designs side by side (prototypes in `bench/support/bag_designs.ex`),
  with the README's table. A `:duplicate_bag` with a NIF fingerprint set
  (this module) is the fastest at every operation, with memory at about
  1.1x a `:bag`: an ETS `set` of fingerprints or of the pairs costs a
  second ETS insert of a whole object and doubles the memory; an
  `ordered_set` of `{[key | value]}` walks a tree of a million nodes per
  insert and cannot give `=:=` or insertion order; checking each batch
  without fingerprints makes the comparison a `:bag` makes, in Erlang.
  `insert_many/2` fingerprints a batch in one pass, takes its lock slots
  in one loop, and filters it in one NIF call per 4,096 pairs that locks
  each shard it touches once and loads the table buckets a few
  fingerprints ahead, so the cache misses of a batch overlap.
  """

  alias Larder.Bag.Dedup
  alias Larder.Bag.Order
  alias Larder.Bag.Snapshot
  alias Larder.Bag.Store
  alias Larder.Instance

  require Larder.Instance

  @enforce_keys [:tab, :dedup]
  defstruct [:tab, :dedup, :fps, :lock, :mask, :name, :owner, telemetry: false]

  @opaque t :: %__MODULE__{
            tab: :ets.tid(),
            dedup: boolean(),
            fps: reference() | nil,
            lock: Larder.Lock.t() | nil,
            mask: non_neg_integer() | nil,
            name: atom() | nil,
            owner: pid() | nil,
            telemetry: boolean()
          }

  @typedoc "A bag handle, or the name of a named bag."
  @type bag :: t() | atom()

  @type key :: term()
  @type value :: term()

  @stream_chunk 1_000

  # The shape of a handle new/1 builds.
  defguardp is_bag(tab, dedup, fps)
            when is_reference(tab) and
                   (dedup == false or (dedup == true and is_reference(fps)))

  @dump_chunk 4_096

  ## Creating

  @doc """
  Creates a bag owned by the calling process.

  Options:

    * `:name` - an atom; the bag is then also reachable by that name from
      any process. Default: unnamed. The name maps to the handle through
      `:persistent_term`, so using a name costs no more than using the
      handle; `drop/1` erases that entry, which makes the runtime
      scan every process once (cheap for long-lived bags, a cost if named
      bags are created and deleted at a high rate).
    * `:dedup` - `true` (default) gives ETS `:bag` semantics: each
      `{key, value}` pair at most once; `false` gives `:duplicate_bag`
      semantics.
    * `:read_concurrency` - the ETS option. Default `false`.
    * `:write_concurrency` - the ETS option (`true`, `false` or `:auto`).
      Default `false`.
    * `:compressed` - the ETS option. Default `false`.
    * `:telemetry` - `false` turns off this bag's `:telemetry` events
      (default `true`: emitted when `:telemetry` is loaded when the bag is
      created; see `Larder.Telemetry`).

  Raises `ArgumentError` for an unknown or invalid option, or when a bag
  with the given name already exists; `RuntimeError` when the `:larder`
  application is not started.

      iex> bag = Larder.Bag.new(dedup: false)
      iex> Larder.Bag.insert(bag, :k, 1)
      iex> Larder.Bag.insert(bag, :k, 1)
      iex> Larder.Bag.lookup(bag, :k)
      [1, 1]
  """
  @spec new(keyword()) :: t()
  def new(opts \\ []) do
    opts = validate_opts!(opts, :new)
    Instance.started!("Larder.Bag")
    Store.create(opts, nil)
  end

  @doc """
  Starts a process that owns a named bag, so the bag outlives the processes
  that use it. Takes the options of `new/1`; `:name` is required.
  Returns `{:error, {:already_started, pid}}` when the name is in use.

  Use the name as the bag: `Larder.Bag.insert(name, key, value)`.
  """
  @spec start_link(keyword()) :: GenServer.on_start()
  def start_link(opts) do
    opts = validate_opts!(opts, :start_link)
    Instance.start_link(Larder.Bag.Owner, opts, __MODULE__, opts[:name])
  end

  @doc """
  A child specification for a supervised named bag; takes the options of
  `start_link/1`. The child id is `{Larder.Bag, name}`. The child is
  `:transient`: a bag ended by `drop/1` stays dropped (its process exits
  normally), one whose process crashed is restarted (empty).
  """
  @spec child_spec(keyword()) :: Supervisor.child_spec()
  def child_spec(opts) do
    opts = validate_opts!(opts, :start_link)
    Instance.child_spec(__MODULE__, opts[:name], {__MODULE__, :start_link, [opts]})
  end

  ## Writing

  @doc """
  Inserts the pair `{key, value}` after the key's other values. Does
  nothing if a pair `=:=` to it is already there (it keeps its place),
  unless the bag was created with `dedup: false`.

  Atomic: two processes inserting the same pair at once leave one copy, and
  an insert racing a delete of the same pair leaves it once or not at all.
  """
  @spec insert(bag(), key(), value()) :: :ok
  def insert(
        %__MODULE__{tab: tab, dedup: dedup, fps: fps, lock: lock, mask: mask} = bag,
        key,
        value
      )
      when is_bag(tab, dedup, fps) do
    if dedup,
      do: Dedup.insert(tab, fps, lock, mask, key, value),
      else: :ets.insert(tab, {key, value})

    :ok
  rescue
    e in ArgumentError -> failed!(bag, e, __STACKTRACE__)
  end

  def insert(bag, key, value), do: insert(bag!(bag), key, value)

  @doc """
  Inserts every `{key, value}` pair of `pairs` in one atomic and isolated
  ETS call: a concurrent reader sees none or all of the batch.

  The pairs go in as `:ets.insert/2` puts a list into an ETS `:bag`: from
  the last to the first, each new pair after its key's other values, so
  `lookup/2` returns a batch's new values of one key in reverse batch order,
  and of two `=:=` pairs in the batch the later one is kept. With
  `dedup: false` the batch goes in in order, with repeats. That order holds
  for batches of up to 8,000 pairs; for a longer batch, ETS may insert the
  list from its end, and a key's new values of the batch then come back in
  the reverse order.

  Raises `ArgumentError` if `pairs` is not a list of two-element tuples.

      iex> bag = Larder.Bag.new()
      iex> Larder.Bag.insert_many(bag, [{:a, 1}, {:a, 2}, {:a, 1}, {:b, 1}])
      :ok
      iex> Larder.Bag.size(bag)
      3
  """
  @spec insert_many(bag(), [{key(), value()}]) :: :ok
  def insert_many(
        %__MODULE__{tab: tab, dedup: dedup, fps: fps, lock: lock, mask: mask} = bag,
        pairs
      )
      when is_bag(tab, dedup, fps) and is_list(pairs) do
    check_pairs(pairs, pairs)

    if dedup,
      do: Dedup.insert_many(tab, fps, lock, mask, pairs),
      else: Order.insert(tab, pairs)

    :ok
  rescue
    e in ArgumentError -> failed!(bag, e, __STACKTRACE__)
  end

  def insert_many(%__MODULE__{tab: tab, dedup: dedup, fps: fps}, pairs)
      when is_bag(tab, dedup, fps) do
    raise ArgumentError,
          "expected pairs to be a list of {key, value} tuples, got: #{inspect(pairs)}"
  end

  def insert_many(bag, pairs), do: insert_many(bag!(bag), pairs)

  defp check_pairs([{_, _} | rest], all), do: check_pairs(rest, all)
  defp check_pairs([], _all), do: :ok
  defp check_pairs(other, all), do: bad_pairs(other, all)

  defp bad_pairs([bad | _], _all) do
    raise ArgumentError,
          "expected pairs to be a list of {key, value} tuples, got an element: #{inspect(bad)}"
  end

  defp bad_pairs(_tail, all) do
    raise ArgumentError,
          "expected pairs to be a proper list of {key, value} tuples, got: #{inspect(all)}"
  end

  @doc """
  Deletes every pair under `key`. Returns `:ok` whether or not there were any.
  """
  @spec delete(bag(), key()) :: :ok
  def delete(%__MODULE__{tab: tab, dedup: dedup, fps: fps, lock: lock, mask: mask} = bag, key)
      when is_bag(tab, dedup, fps) do
    if dedup, do: Dedup.delete_key(tab, fps, lock, mask, key), else: :ets.delete(tab, key)
    :ok
  rescue
    e in ArgumentError -> failed!(bag, e, __STACKTRACE__)
  end

  def delete(bag, key), do: delete(bag!(bag), key)

  @doc """
  Deletes the pair `{key, value}` (the one `=:=` to it; every copy of it
  with `dedup: false`). Returns `:ok` whether or not it was there.

      iex> bag = Larder.Bag.new()
      iex> Larder.Bag.insert_many(bag, [{:a, 1}, {:a, 2}])
      iex> Larder.Bag.delete(bag, :a, 1)
      :ok
      iex> Larder.Bag.lookup(bag, :a)
      [2]
  """
  @spec delete(bag(), key(), value()) :: :ok
  def delete(
        %__MODULE__{tab: tab, dedup: dedup, fps: fps, lock: lock, mask: mask} = bag,
        key,
        value
      )
      when is_bag(tab, dedup, fps) do
    if dedup,
      do: Dedup.delete(tab, fps, lock, mask, key, value),
      else: :ets.delete_object(tab, {key, value})

    :ok
  rescue
    e in ArgumentError -> failed!(bag, e, __STACKTRACE__)
  end

  def delete(bag, key, value), do: delete(bag!(bag), key, value)

  @doc """
  Drops the bag: frees its ETS table, its name and its fingerprint set at
  once. Every later call on the bag raises `ArgumentError`, except `drop/1`
  itself, which returns `:ok` again, by handle or by name (a name that names
  no bag is taken as one already dropped).

      iex> bag = Larder.Bag.new()
      iex> Larder.Bag.drop(bag)
      :ok
      iex> Larder.Bag.drop(bag)
      :ok
  """
  @spec drop(bag()) :: :ok
  def drop(name) when Instance.name?(name), do: Instance.drop_name(__MODULE__, name, &drop/1)

  def drop(bag) do
    case bag!(bag) do
      # Its owner process frees it and exits (or is gone already).
      %{owner: owner} when is_pid(owner) -> Instance.drop(owner)
      handle -> Store.destroy(handle)
    end
  end

  ## Reading

  @doc """
  The values stored under `key`; `[]` if there are none.

  The values come in insertion order, as from an ETS `:bag`: a value
  inserted again while present keeps its place, one deleted and inserted
  again comes last. With `dedup: false` repeats are kept. Keys match as in
  ETS (`=:=`, a map only equal maps), without a scan of the bag.
  """
  @spec lookup(bag(), key()) :: [value()]
  # Reads match only the table: a forged handle whose table is not a bag's
  # is caught by failed!/4.
  def lookup(%__MODULE__{tab: tab} = bag, key) when is_reference(tab) do
    :ets.lookup_element(tab, key, 2)
  rescue
    # lookup_element/3 raises for an absent key as for a missing table.
    e in ArgumentError -> failed!(bag, e, __STACKTRACE__, [])
  end

  def lookup(bag, key), do: lookup(bag!(bag), key)

  @doc """
  Whether a pair `=:=` to `{key, value}` is in the bag.

      iex> bag = Larder.Bag.new()
      iex> Larder.Bag.insert(bag, :a, 1)
      iex> {Larder.Bag.member?(bag, :a, 1), Larder.Bag.member?(bag, :a, 2)}
      {true, false}
  """
  @spec member?(bag(), key(), value()) :: boolean()
  def member?(%__MODULE__{tab: tab} = bag, key, value) when is_reference(tab) do
    :lists.member({key, value}, :ets.lookup(tab, key))
  rescue
    e in ArgumentError -> failed!(bag, e, __STACKTRACE__)
  end

  def member?(bag, key, value), do: member?(bag!(bag), key, value)

  @doc """
  The number of values stored under `key`.
  """
  @spec count(bag(), key()) :: non_neg_integer()
  def count(%__MODULE__{tab: tab} = bag, key) when is_reference(tab) do
    length(:ets.lookup(tab, key))
  rescue
    e in ArgumentError -> failed!(bag, e, __STACKTRACE__)
  end

  def count(bag, key), do: count(bag!(bag), key)

  @doc """
  The total number of pairs in the bag, in constant time.
  """
  @spec size(bag()) :: non_neg_integer()
  def size(%__MODULE__{tab: tab} = bag) when is_reference(tab) do
    case :ets.info(tab, :size) do
      :undefined -> :erlang.error(:badarg)
      size -> size
    end
  rescue
    e in ArgumentError -> failed!(bag, e, __STACKTRACE__)
  end

  def size(bag), do: size(bag!(bag))

  @doc """
  The memory the bag takes, in words, in constant time: the ETS table's (as
  `:ets.info(table, :memory)`) plus, when it deduplicates, its fingerprint
  set and lock.
  """
  @spec memory(bag()) :: non_neg_integer()
  def memory(%__MODULE__{tab: tab, dedup: dedup, fps: fps} = bag) when is_bag(tab, dedup, fps) do
    case :ets.info(tab, :memory) do
      :undefined -> :erlang.error(:badarg)
      words when fps == nil -> words
      words -> words + div(Dedup.bytes(fps) + 7, :erlang.system_info(:wordsize))
    end
  rescue
    e in ArgumentError -> failed!(bag, e, __STACKTRACE__)
  end

  def memory(bag), do: memory(bag!(bag))

  @doc """
  The distinct keys of the bag, in no particular order. Scans the whole bag.

      iex> bag = Larder.Bag.new()
      iex> Larder.Bag.insert_many(bag, [{:a, 1}, {:a, 2}, {:b, 1}])
      iex> Enum.sort(Larder.Bag.keys(bag))
      [:a, :b]
  """
  @spec keys(bag()) :: [key()]
  def keys(bag) do
    # The objects of a key are next to each other in the table: dedup
    # collapses their keys, uniq catches the rest.
    bag |> bag!() |> stream_spec([{{:"$1", :_}, [], [:"$1"]}]) |> Stream.dedup() |> Enum.uniq()
  end

  @doc """
  A lazy stream of every `{key, value}` pair, read from the table in chunks
  of #{@stream_chunk} pairs as it is consumed. It is not a snapshot (see
  "Concurrency" above).

      iex> bag = Larder.Bag.new()
      iex> Larder.Bag.insert_many(bag, [{:a, 1}, {:b, 2}])
      iex> bag |> Larder.Bag.stream() |> Enum.sort()
      [a: 1, b: 2]
  """
  @spec stream(bag()) :: Enumerable.t()
  def stream(bag), do: bag |> bag!() |> stream_spec([{:_, [], [:"$_"]}])

  # Streams the match spec's results over the whole table, one element at a
  # time.
  defp stream_spec(bag, spec), do: bag |> chunks(spec, @stream_chunk) |> Stream.concat()

  # Streams the match spec's results over the whole table as lists of up to
  # `size` elements. Hash tables are fixed while the stream runs so that a
  # concurrent insert or delete cannot make the traversal skip or repeat pairs.
  defp chunks(%__MODULE__{tab: tab} = bag, spec, size) do
    Stream.resource(
      fn ->
        try do
          :ets.safe_fixtable(tab, true)
          :ets.select(tab, spec, size)
        rescue
          e in ArgumentError -> failed!(bag, e, __STACKTRACE__)
        end
      end,
      fn
        :"$end_of_table" ->
          {:halt, :done}

        {items, cont} ->
          next =
            try do
              :ets.select(cont)
            rescue
              e in ArgumentError -> failed!(bag, e, __STACKTRACE__)
            end

          {[items], next}
      end,
      fn _ -> unfix(tab) end
    )
  end

  defp unfix(tab) do
    :ets.safe_fixtable(tab, false)
  rescue
    # The table was deleted while the stream ran; the fixation went with it.
    ArgumentError -> :ok
  end

  ## Snapshots

  @doc """
  Writes the bag to `path`, atomically and durably: the pairs go to a
  temporary file in the same directory, which is fsynced, renamed over
  `path`, and then the directory is fsynced. A reader of `path` sees the old
  file or the new one, never a partial one, and once `dump/2` returns `:ok`
  the new file survives a crash or power loss.

  The bag stays usable meanwhile; the file holds each pair present during the
  whole dump, and may or may not hold pairs changed during it. Returns
  `{:error, %Larder.Error{reason: :file_error}}` if the file cannot be
  written or synced; if only the final sync of the directory fails, `path`
  already holds the new file, but it may not survive a power loss. Raises
  `ArgumentError` if `path` is not a string or holds a null byte.

  The temporary file is named `<path>.<os pid>.<token>-<n>.tmp`. A dump
  killed mid-write (or a VM that died during one) leaves it behind; the next
  dump of the same `path`, from this VM or another OS process, deletes every
  such file whose writer is gone, and never one a live dump is writing. It
  lists the directory once to find them. Dumps of one `path` may run
  concurrently: each renames a whole file over it.
  """
  @spec dump(bag(), Path.t()) :: :ok | {:error, Larder.Error.t()}
  def dump(bag, path) do
    %{dedup: dedup, telemetry: telemetry} = bag = bag!(bag)
    check_path!(path)
    meta = %{bag: id(bag), path: path}

    Larder.Telemetry.span(telemetry, [:larder, :bag, :dump], meta, fn ->
      result = Snapshot.dump(chunks(bag, [{:_, [], [:"$_"]}], @dump_chunk), dedup, path)
      {result, outcome(meta, result)}
    end)
  end

  @doc """
  Like `dump/2`, but raises the `Larder.Error` on failure.
  """
  @spec dump!(bag(), Path.t()) :: :ok
  def dump!(bag, path) do
    with {:error, error} <- dump(bag, path), do: raise(error)
  end

  @doc """
  Reads a snapshot written by `dump/2` into a new bag owned by the calling
  process. The deduplication mode is the one of the dumped bag.

  Options: `:name`, `:read_concurrency`, `:write_concurrency`,
  `:compressed` and `:telemetry` (for the load's own event too), as for
  `new/1`, and:

    * `:create_atoms` - `false` (default) decodes with
      `:erlang.binary_to_term/2`'s `:safe` option: a file holding an atom
      this VM does not know yet is rejected as `:corrupt_snapshot`, so no
      file can fill the atom table (which is never garbage collected and
      whose overflow aborts the VM). `true` lets the file create atoms; use
      it only for files your own service wrote, for instance when a bag's
      keys are atoms of modules that are not loaded yet.

  The whole file is checked (length and checksum of every chunk, count of
  pairs, at most 65,536 pairs per chunk) before the bag is created; then
  each chunk is decoded and must be a list of objects of the shape the file's
  mode announces. A missing file returns
  `{:error, %Larder.Error{reason: :file_error}}`; a truncated, corrupt,
  compressed or wrongly shaped one returns
  `{:error, %Larder.Error{reason: :corrupt_snapshot}}`. The table is
  created once the framing checks out and filled chunk by chunk; on an error
  it is deleted, so none is left behind (a `:name` is taken meanwhile).
  Raises `ArgumentError` for a bad `path` or bad options, or if
  a bag with the given `:name` exists. A bag loaded logs one line at
  `:info` (see "Logging").

      iex> bag = Larder.Bag.new()
      iex> Larder.Bag.insert(bag, :a, 1)
      iex> Larder.Bag.insert(bag, :a, 2)
      iex> path = Path.join(System.tmp_dir!(), "larder_doctest_#{System.unique_integer([:positive])}.bag")
      iex> Larder.Bag.dump(bag, path)
      :ok
      iex> {:ok, copy} = Larder.Bag.load(path)
      iex> File.rm!(path)
      iex> Larder.Bag.lookup(copy, :a)
      [1, 2]
  """
  @spec load(Path.t(), keyword()) :: {:ok, t()} | {:error, Larder.Error.t()}
  def load(path, opts \\ [])

  def load(path, opts) do
    check_path!(path)
    opts = validate_opts!(opts, :load)
    Instance.started!("Larder.Bag")
    telemetry = Instance.telemetry?(opts[:telemetry])
    meta = %{bag: opts[:name], path: path}

    Larder.Telemetry.span(telemetry, [:larder, :bag, :load], meta, fn ->
      case Snapshot.load(path, opts) do
        {:ok, bag} = ok -> {ok, %{meta | bag: id(bag)} |> Map.put(:result, :ok)}
        {:error, _} = error -> {error, outcome(meta, error)}
      end
    end)
  end

  # A span's stop metadata: `meta` with the call's :result (and :error).
  defp outcome(meta, :ok), do: Map.put(meta, :result, :ok)
  defp outcome(meta, {:error, error}), do: Map.merge(meta, %{result: :error, error: error})

  # A bag in telemetry metadata: its name, or its handle when it has none.
  defp id(%__MODULE__{name: nil} = bag), do: bag
  defp id(%__MODULE__{name: name}), do: name

  @doc """
  Like `load/2`, but returns the bag and raises the `Larder.Error` on failure.
  """
  @spec load!(Path.t(), keyword()) :: t()
  def load!(path, opts \\ []) do
    case load(path, opts) do
      {:ok, bag} -> bag
      {:error, error} -> raise error
    end
  end

  ## Internals

  # The one way in. Each function takes a handle of the shape new/1 builds
  # in its first clause (is_bag/3 in the head, so a call by handle costs no
  # extra call); anything else goes once through bag!/1, which resolves a
  # name (one :persistent_term.get/2) or raises Instance's error.
  defp bag!(%__MODULE__{tab: tab, dedup: dedup, fps: fps} = bag) when is_bag(tab, dedup, fps),
    do: bag

  defp bag!(name) when Instance.name?(name), do: Instance.resolve(__MODULE__, name)
  defp bag!(other), do: Instance.invalid!(__MODULE__, other)

  # The one error path, for an ArgumentError raised while `bag` was in use.
  # ETS's or the NIF's refusal becomes unknown (the table is gone) or
  # invalid (a forged handle naming something that is not a bag); on a live
  # bag the error is the caller's own (bad pairs), or means `live`
  # (lookup/2's absent key).
  defp failed!(bag, error, stack, live \\ :reraise) do
    case Store.table(bag) do
      :gone -> Instance.unknown!(__MODULE__, id(bag))
      :other -> Instance.invalid!(__MODULE__, bag)
      :bag when live != :reraise -> live
      :bag -> reraise error, stack
    end
  end

  defp check_path!(path) do
    unless is_binary(path) and not String.contains?(path, <<0>>) do
      raise ArgumentError,
            "expected path to be a string without null bytes, got: #{inspect(path)}"
    end
  end

  defp validate_opts!(opts, kind) do
    Larder.Options.validate!(opts, schema(kind), "Larder.Bag")
  end

  defp schema(:new) do
    [
      name: {{:or_nil, :atom}, nil},
      dedup: {:boolean, true},
      read_concurrency: {:boolean, false},
      write_concurrency: {{:in, [true, false, :auto]}, false},
      compressed: {:boolean, false},
      telemetry: {:boolean, true}
    ]
  end

  defp schema(:start_link), do: Keyword.put(schema(:new), :name, {:atom, :required})

  defp schema(:load) do
    schema(:new) |> Keyword.delete(:dedup) |> Keyword.put(:create_atoms, {:boolean, false})
  end

  defimpl Inspect do
    # Compact, as a handle is opaque: its name, else its mode.
    def inspect(bag, _opts) do
      case Map.get(bag, :name) do
        nil -> "#Larder.Bag<dedup: #{Kernel.inspect(Map.get(bag, :dedup), limit: 5)}>"
        name -> "#Larder.Bag<name: #{Kernel.inspect(name, limit: 5)}>"
      end
    end
  end
end
