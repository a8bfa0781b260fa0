defmodule Larder.Table do
  @moduledoc """
  Map records keyed by a primary key, stored in ETS, with declared secondary
  indexes held as Roaring bitmaps by `Larder.Index` (a Rust NIF).

      iex> table = Larder.Table.new(key: :id, index: [:color, {:tag, & &1.tags}])
      iex> :ok = Larder.Table.insert_many(table, [
      ...>   %{id: 1, color: :red, tags: [:new, :sale]},
      ...>   %{id: 2, color: :blue, tags: [:sale]},
      ...>   %{id: 3, color: :red, tags: []}
      ...> ])
      iex> Larder.Table.search(table, color: :red, tag: :sale)
      [%{id: 1, color: :red, tags: [:new, :sale]}]
      iex> Larder.Table.search_keys(table, tag: :sale, color: {:in, [:red, :blue]})
      [1, 2]
      iex> Larder.Table.count(table, %{color: :red})
      2

  ## Indexes

  Each entry of `:index` is a field name (the record's value for that field
  is its term; a record without the field is not in that index) or
  `{name, fun}`, where `fun` gets the record and returns its term, or a list
  of terms for a multi-valued index. A condition `{name, value}` holds when
  the record's term for `name` (one of them, for a multi-valued index) is
  `===` to `value`; `{name, {:in, values}}` holds when one of `values` does.
  On OTP 25 `0.0 === -0.0`, and so a condition on either zero finds both,
  also inside tuples and lists; inside a map, a zero's sign still tells two
  terms apart.
  A list of conditions may name the same multi-valued index several times:
  `[char: {"Term", "18"}, char: {"Router", "Included"}]`.

  ## Storage

  Each table has a writer process that owns its ETS tables and its index and
  applies every write. Each record is one ETS row under a `u32` row id, which
  is the key itself for integer keys in `0..2_147_483_647` and an id assigned
  on first insert (kept in a second ETS table) for any other key. The id of a
  deleted record is reused by the next new key, so ids run out only when
  2,147,483,648 records with non-integer keys are live at once (the insert
  that would need one more raises `ArgumentError` and writes nothing). With
  `store: fields`, only those fields (and the key) are kept in ETS; the others
  live only in the indexes, as in the Go bitmap service this is modelled on.
  `get/3` and `search/2` then return the stored fields.

  `new/1` makes a table that belongs to the calling process: its writer
  monitors the caller and deletes the table when the caller exits, like an
  ETS table. `start_link/1` (or `child_spec/1` in a supervisor) starts a
  writer of its own, so the table lives as long as its supervisor keeps it.
  A table made with `:name` can be used through that atom anywhere a
  handle is taken.

  ## Snapshots

  `dump/2` writes a table to a file, `load/2` reads it into a new table:
  the definition (key, `:store` fields, index names), the records and the
  index's bitmaps (Roaring's portable serialisation, one bitmap per 64Ki
  ids), in CRC-checked chunks, written to a temporary file, fsynced and
  renamed, as `Larder.Bag`'s snapshots are. With `:store` (up to 32
  fields), a stored record that holds every stored field is written as its
  values alone, and `load/2` builds its map again in the NIF: no map keys
  are written or decoded per record. Loading inserts the records in lists
  and rebuilds the index from its bytes: no record is re-indexed, no index
  function runs. `load/2` reads the files of earlier Larder versions too.
  Index functions cannot be stored, so `load/2` takes the options of
  `new/1` and refuses a file whose definition differs; the caller must
  pass the same functions as the dumped table had.

  ## Complexity

  `get/3` is one ETS lookup (two for non-integer keys). `search/2` is one
  bitmap query (see `Larder.Index`, smallest bitmap first) plus one ETS lookup
  per result. `insert/2`, `merge/3` and `delete/2` update one bitmap per index
  term of the record, plus one round trip to the writer process per call (per
  chunk of 5,000 records for `insert_many/2`; two for a claimed chunk, see
  "Concurrency"). Replacing or deleting a record needs its old terms:
  they are computed from the record in ETS, or, with `:store` (whose
  stored record no longer holds them), kept by the index in its
  id-to-terms map (`Larder.Index.new(reverse: true)`), which diffs the new
  terms against them itself (`{:set_terms, terms, id}`): O(terms of that
  record). `size/1` is O(1); `count/2` is a bitmap count. `dump/2` is
  O(records + index bytes), `load/2` O(records log records + index bytes),
  plus, with `:store`, the (record, term) pairs of its id-to-terms map,
  which it bounds (see "Failures"); `load/2` decodes the records' chunks
  in as many processes as there are schedulers, and checks and builds the
  index (and its id-to-terms map, with `:store`) in one NIF call on a
  dirty scheduler while they decode and insert the records (it needs
  their row ids, which the NIF reads from the records' bytes first).

  ## Concurrency

  Reads (`get/3`, `search/2`, `search_keys/2`, `count/2`, `search_many/2`,
  `stream/1`) run in the caller, straight on ETS and the index, and never wait
  for a write. Writes go to the table's writer process, which applies them one
  at a time, each whole: the index batch and the ETS rows of a record (of a
  chunk, for `insert_many/2`). Once the writer has a write it completes it
  even if the caller is killed, so a killed caller leaves its write done or
  not begun, never half done. The caller computes the new records' index
  terms (so an index function that fails makes the write raise in the
  caller, and nothing of that chunk is written; see "Failures") and sends
  the stored rows and the index ops, grouped by term (a term shared by
  many records of a chunk is sent and indexed once); the
  writer gives row ids to non-integer keys and computes the old terms of the
  records it replaces (none when every integer key of a chunk is above the
  highest one it has written, as in a build). `merge/3` and `update/4` read,
  change and write a record in one step of the writer, so concurrent
  read-modify-writes of one key never lose one another's changes.

  A function that a writer runs (an `update/4` function, and index
  functions in `merge/3`, `update/4` and on the records a write replaces)
  must not write to any `Larder.Table`, its own or another: such a write
  (`insert/2`, `insert_many/2`, `merge/3`, `update/4`, `delete/2`,
  `drop/1`) raises `ArgumentError` there, and the function fails as any
  function that raises does (see "Failures"). Two writers whose functions
  wrote each other's tables would otherwise wait on each other for ever.
  Reads are allowed. A function that waits on another process which writes
  to the table cannot be detected and would wait for ever: do not.

  `dump/2` writes one state of the table (a consistent cut, every write
  before it whole and none after it), taken by the writer in constant time
  between two writes; a process of the writer's writes the file while
  writes and reads go on (see `dump/2` for what a write costs meanwhile). A
  table being
  loaded is not visible to anyone until `load/2` returns.

  A chunk of at least 256 new records whose integer keys are all above any
  key the table has held (a build) is written differently, to spare copying
  its rows to the writer: the writer grants the caller a claim, during which
  it applies no other write, the caller inserts the rows into ETS itself (one
  atomic insert), and the writer then applies the chunk's index ops. If the
  caller dies holding the claim, the writer completes the chunk when its rows
  are in ETS and drops it when they are not; if the index refuses the ops, it
  takes the rows out again. So that chunk is whole too.

  Within a write the index changes before the ETS rows (for a claimed chunk,
  after them: its rows can show in `get/3`, `size/1` and `stream/1` before a
  search finds them). A search that runs during a write sees the index either
  before or after that write (never half of it) and returns each record as
  ETS holds it when looked up: during a write that can be its old version,
  and a row id freed by a delete may already hold another key's record.
  `insert_many/2` is atomic per chunk of 5,000 records, not as a whole; it
  computes the next chunk while the writer applies the previous one. Once
  writes are done, a search returns exactly what a plain filter over the
  records returns (checked by a PropEr model test, and by a test that kills
  writers mid-write).

  ## Failures

  Raises `ArgumentError`, with a message that names the argument, for a
  condition on a field that has no index (the message lists the indexed
  ones), a record that is not a map or lacks the key field, improper lists,
  bad or duplicate options, an index function that returns an improper list,
  and a table that was dropped, whose owner exited or whose handle is not a
  table's, in one line that names the table (its name, or its handle as
  `inspect/1` shows it: `#Larder.Table<key: :id, writer: #PID<0.210.0>>`):

      unknown Larder.Table :prices: it was never created, it was dropped, or the process that owned it exited

  `new/1`, `start_link/1` and `load/2` raise `RuntimeError` when the
  `:larder` application is not started ("Larder.Table: the :larder
  application is not started: add :larder to your project's deps ...").

  An index function that raises, throws or exits on a record makes the
  write (`insert/2`, `insert_many/2`, `merge/3`, `update/4`) raise an
  `ArgumentError` in the caller, with the stacktrace of the index function,
  whose message names the table, the index, the operation and the record's
  key, says what was written, and ends with the original error:

      Larder.Table :prices: the index function of :by_nope raised on the record with key 2 in insert_many/2, and the write was not applied (none of its records was written): ** (KeyError) key :nope not found in: %{id: 2}

  The chunk the record was in is not written, nor any after it; earlier
  chunks of an `insert_many/2` are, and the message then says how many
  records were. Index functions also run in the writer
  (on records it replaces, and in `merge/3` and `update/4`); they should be
  pure and quick, and must not write to a table (that raises, see
  "Concurrency"). If one raises there on a record it accepted before, the
  writer finds the old terms in the index instead. One that is not pure
  (without `:store`) can leave a deleted or replaced record's id under a
  term it no longer computes. A deleted record's id is skipped by
  `search/2` (not by `count/2`, nor by `search_keys/2` for integer keys,
  which answer from the index), and `load/2` of a dump of such a table
  leaves it out of the loaded index (see below).

  `dump/2` returns `{:error, %Larder.Error{reason: :file_error}}` when the
  file cannot be written (the old file at `path`, if any, is kept).
  `load/2` never raises on a bad file and leaves no table behind: a file
  that cannot be read is `:file_error`, one of another definition
  `:definition_mismatch`, and any damaged, truncated or foreign file
  `:corrupt_snapshot` (every chunk's length and CRC are checked before
  anything is created, payloads are decoded with `binary_to_term/2`'s
  `:safe` option, shapes are checked, and the NIF validates the bitmaps'
  bytes with Roaring's checked deserialisation). Checksums catch damage,
  not forgery, so the index is checked against the records too: row ids
  that the index names but that have no record in the file (forged, or
  left by an impure index function, see above) are left out of the
  loaded index, so no search returns them and `count/2` does not count
  them, and `load/2` logs one warning with how many it left out
  (each bitmap is intersected with the records' ids before it is kept, at
  a cost of its bytes, not of the ids it names). A file whose index,
  cut down to the records, holds more ids built from Roaring run
  containers than 256 per record plus 8 per byte of index data (and at
  least 16,777,216) is `:corrupt_snapshot`, and so is, with `:store`, one
  whose index holds more (record, term) pairs than that. Larder's index
  never makes a run container, so the dump of a table built by writes
  holds at most 8 ids per byte of index data and reaches neither bound. A
  load of a forged file thus takes time and memory bounded by its records
  and bytes.

  ## Logging

  `load/2` logs one line at `:info` once a table is loaded: the table (its
  name, or its handle), the path, the records, the file's bytes and the
  time the load took:

      [info] Larder.Table :prices loaded from "/var/lib/app/prices.table": 487200 records, 22628241 bytes, in 397.0 ms

  A load that fails logs nothing (it returns the error). Larder's log calls
  carry the `application: :larder` metadata, so Logger's own settings turn
  these lines off: `Logger.put_application_level(:larder, :warning)` at
  run time, or, at compile time, in your `config/config.exs`:

      config :logger,
        compile_time_purge_matching: [[application: :larder, level_lower_than: :warning]]

  ## Performance

  `mix run bench/index_bench.exs` searches the 487,200-price catalogue
  with 100 reference requests (every answer checked against a plain
  filter) and prints each figure beside a Go-style map index (each
  offering's prices scanned as Go's `FindPriceBy` does) and an ETS
  match-spec select, measured in the same run; the README has the table
  of a full run.

    * A search of 8 conditions intersects bitmaps of 9,744 to 243,600 ids
      and looks up the one matching row: about 24x faster than the map
      index's scan of the offering's 9,744 prices (25x with each search
      timed alone). Timed alone, a search's p99 is 2.4x its median (3.4x
      with full records).
    * `search_many/2` of 1,000 searches costs about 0.6x per search what
      the same searches cost one call at a time, about what one search
      timed alone costs: each answer is a list built for the caller, and
      the calls into the NIF are amortised.
    * With `store:` four fields, the table (ETS and the NIF, the
      id-to-terms map included) takes about 1.4x the map index's heap,
      and a quarter of a table of full records. Full records cost about
      1.2x per search and 1.3x per build.
    * `load/2` of a snapshot of that catalogue takes about 0.25x of
      rebuilding it with `insert_many/2`: measured by `make bench-startup`
      (`examples/price_search/bench/startup_bench.exs`), in the same run.
  """

  alias Larder.Index
  alias Larder.Instance
  alias Larder.Table.Conditions
  alias Larder.Table.IndexFailure
  alias Larder.Table.Requests
  alias Larder.Table.Writer

  import Larder.Table.Options, only: [config!: 2]

  require Larder.Instance

  # `top`: an :atomics the writer publishes its `top` in (Larder.Table.Writes),
  # a hint for callers that build writes.
  @enforce_keys [:rows, :keys, :index, :key, :entries, :names, :store, :writer, :name, :top]
  defstruct [telemetry: false] ++ @enforce_keys

  @opaque t :: %__MODULE__{}

  @typedoc "A table: its handle, or the name it was created with."
  @type table :: t() | atom()

  @typedoc "A record: a map that holds the table's key field."
  @type record :: map()

  @typedoc "`{index_name, value}` or `{index_name, {:in, [value]}}`."
  @type condition :: {term(), term()}

  @typedoc "Conditions that must all hold: a map or a list of pairs."
  @type conditions :: %{optional(term()) => term()} | [condition()]

  @direct_limit 0x80000000

  ## Creating

  @doc """
  Creates a table owned by the calling process: it is deleted when that
  process exits, like an ETS table.

  Options:

    * `:key` (required) - the field that holds each record's primary key.
    * `:index` - the indexes, a list of field names and `{name, fun}`
      entries (see "Indexes"); names must be distinct. Default `[]`.
    * `:store` - the fields kept in ETS; the key is always kept. Default: all.
    * `:name` - an atom; the table is then also reachable by that name from
      any process (through `:persistent_term`, so a name costs no more than
      the handle). Default: unnamed.
    * `:telemetry` - `false` turns off this table's `:telemetry` events
      (default `true`: emitted when `:telemetry` is loaded when the table is
      created; see `Larder.Telemetry`).

  Raises `ArgumentError` for an unknown or invalid option, or when a table
  with that name exists; `RuntimeError` when the `:larder` application is
  not started.
  """
  @spec new(keyword()) :: t()
  def new(opts) do
    config = config!(opts, :new)

    case Instance.start(Writer, {config, self(), nil}, __MODULE__, config.name) do
      {:ok, writer} -> Writer.handle(writer)
      {:error, {:already_started, _}} -> Instance.taken!(__MODULE__, config.name)
      {:error, reason} -> exit(reason)
    end
  end

  @doc """
  Starts the writer process of a named table under a supervisor, so the table
  outlives the processes that use it. Takes the options of `new/1`; `:name` is
  required. Use the name as the table: `Larder.Table.search(name, ...)`.
  Returns `{:error, {:already_started, pid}}` when the name is in use.
  """
  @spec start_link(keyword()) :: GenServer.on_start()
  def start_link(opts) do
    config = config!(opts, :start_link)
    Instance.start_link(Writer, {config, nil, nil}, __MODULE__, config.name)
  end

  @doc """
  A child specification for a supervised named table; takes the options of
  `start_link/1`. The child id is `{Larder.Table, name}`. The child is
  `:transient`: a table ended by `drop/1` stays dropped, one whose writer
  crashed is restarted (empty).
  """
  @spec child_spec(keyword()) :: Supervisor.child_spec()
  def child_spec(opts) do
    config = config!(opts, :start_link)
    Instance.child_spec(__MODULE__, config.name, {__MODULE__, :start_link, [opts]})
  end

  ## Snapshots

  @doc """
  Writes the table to the file `path`: its definition (key, `:store`
  fields, index names), its records and its index's bitmaps (Roaring's
  portable serialisation), in checksummed chunks. Returns `:ok` once the
  file is durable, or `{:error, %Larder.Error{reason: :file_error}}` when it
  cannot be written (`path` then keeps its old contents, if any).

  The file is one state of the table (a consistent cut): the table as it
  was when its writer took the dump's request, every write before it whole
  and none after it. Writes and reads go on during the dump: the writer
  takes the cut in constant time (the index's current immutable snapshot is
  kept, the id state copied) and a process of its own, at low priority,
  writes the file, pausing 1 ms after each chunk of 2,048 objects so that
  its scheduler takes over other runnable work (at least 489 ms more for
  a million rows); a write made meanwhile first saves the rows it changes
  as they were (one ETS lookup and insert per row, the first time), and
  the dump writes those saved rows instead of the changed ones. It writes
  a temporary file `<path>.<os pid>.<token>-<n>.tmp`, fsyncs it, renames
  it over `path` and fsyncs the directory; a dump killed mid-write leaves
  that file, which the next dump of `path` deletes (as
  `Larder.Bag.dump/2` does).

  Raises `ArgumentError` for a table that is gone or a `path` that is not a
  string without null bytes.
  """
  @spec dump(table(), Path.t()) :: :ok | {:error, Larder.Error.t()}
  def dump(table, path) do
    table = handle!(table)
    path!(path)
    {:ok, ref} = write!(table, {:dump, path, self()})

    case Larder.Table.Dump.await(table.writer, ref) do
      {:raise, kind, reason, stack} -> :erlang.raise(kind, reason, stack)
      :gone -> gone!(table)
      result -> result
    end
  end

  @doc "Like `dump/2`, but raises the `Larder.Error` on failure."
  @spec dump!(table(), Path.t()) :: :ok
  def dump!(table, path) do
    with {:error, error} <- dump(table, path), do: raise(error)
  end

  @doc """
  Reads a snapshot written by `dump/2` into a new table owned by the
  calling process (as `new/1` makes one).

  Takes the options of `new/1`, which must define the table as the dumped
  one was: the same `:key`, `:store` fields and index names in the same
  order. Index functions cannot be stored in a file: the caller passes the
  same functions again, and they must compute what the dumped table's did
  (they are used for later writes; the loaded index is the file's, no
  record is re-indexed). `:name` and `:telemetry` may differ.

  The whole file is read and checked (magic, version, each chunk's length,
  checksum and count, the trailer's totals) and its definition compared
  with the options before the table is created; then each chunk is decoded
  with `binary_to_term/2`'s `:safe` option (no new atoms) and checked for
  its shape as it is inserted (records in lists, the index's bitmaps in
  one NIF call on a dirty scheduler). Returns:

    * `{:error, %Larder.Error{reason: :file_error}}` when the file cannot be
      read;
    * `{:error, %Larder.Error{reason: :definition_mismatch}}` when the
      file's definition differs from the options;
    * `{:error, %Larder.Error{reason: :corrupt_snapshot}}` for any other
      bad file (truncated, damaged, another format such as a
      `Larder.Bag` snapshot, wrong shapes, an atom this VM does not know,
      or too many index ids or terms per record, which a dump of a table
      built by writes never holds; see "Failures" in the moduledoc). Index ids that have no
      record in the file are not an error: they are left out of the
      loaded index, and one warning is logged with their count.

  On an error no table is left behind. Raises `ArgumentError` for bad
  options or `path`, or when a table with that `:name` exists. A table
  loaded logs one line at `:info` (see "Logging").

      iex> table = Larder.Table.new(key: :id, index: [:color])
      iex> :ok = Larder.Table.insert_many(table, [%{id: 1, color: :red}, %{id: 2, color: :blue}])
      iex> path = Path.join(System.tmp_dir!(), "larder_doctest_#{System.unique_integer([:positive])}.table")
      iex> Larder.Table.dump(table, path)
      :ok
      iex> {:ok, copy} = Larder.Table.load(path, key: :id, index: [:color])
      iex> File.rm!(path)
      iex> Larder.Table.search(copy, color: :red)
      [%{id: 1, color: :red}]
  """
  @spec load(Path.t(), keyword()) :: {:ok, t()} | {:error, Larder.Error.t()}
  def load(path, opts) do
    path!(path)
    config = config!(opts, :new)

    case Instance.start(Writer, {config, self(), path}, __MODULE__, config.name) do
      {:ok, writer} -> {:ok, Writer.handle(writer)}
      {:error, {:shutdown, %Larder.Error{} = error}} -> {:error, error}
      {:error, {:already_started, _}} -> Instance.taken!(__MODULE__, config.name)
      {:error, reason} -> exit(reason)
    end
  end

  @doc "Like `load/2`, but returns the table and raises the `Larder.Error` on failure."
  @spec load!(Path.t(), keyword()) :: t()
  def load!(path, opts) do
    case load(path, opts) do
      {:ok, table} -> table
      {:error, error} -> raise error
    end
  end

  defp path!(path) do
    unless is_binary(path) and not String.contains?(path, <<0>>) do
      raise ArgumentError,
            "path must be a string without null bytes, got: #{inspect(path, limit: 10)}"
    end
  end

  ## Writing

  @doc """
  Inserts `record`, replacing the record with the same key (and re-indexing
  it). Whole even if the caller is killed, see "Concurrency". An index
  function that fails on `record` raises `ArgumentError` and nothing is
  written (see "Failures").
  """
  @spec insert(table(), record()) :: :ok
  def insert(table, record) do
    write_span(handle!(table), :insert, %{}, &write_many!(&1, [record], "insert/2"))
  end

  @doc """
  Inserts `records` in chunks of 5,000; each chunk is one write (one index
  batch and one ETS insert, applied by the writer process). Every record is
  checked for the key field before anything is written. An index function
  that fails on a record raises `ArgumentError`: that record's chunk and
  every later one are not written, the earlier ones are, and the message
  says how many records were (see "Failures").
  """
  @spec insert_many(table(), [record()]) :: :ok
  def insert_many(table, records) do
    write_span(handle!(table), :insert_many, %{}, &write_many!(&1, records, "insert_many/2"))
  end

  # Every record checked for the key field before anything is written.
  defp write_many!(table, records, op) do
    Requests.live!(table)
    records!(table, records, records)
    Requests.insert!(table, records, op)
  end

  @doc """
  Merges `changes` into the record under `key` (as `Map.merge/2`) and
  re-indexes it. Returns `{:ok, record}` (the stored record after the merge)
  or `:error` when there is no such record. The writer process reads, merges
  and writes in one step, so concurrent merges into one key all apply. Index
  functions run in the writer process here; one that fails makes `merge/3`
  raise `ArgumentError` (see "Failures") and leaves the record as it was.

  With `:store`, the fields an index function reads may not be stored, so
  `merge/3` re-indexes field indexes only and leaves `{name, fun}` indexes
  as they are; replace the whole record with `insert/2` or `update/4` to
  change those.

      iex> table = Larder.Table.new(key: :id, index: [:state])
      iex> :ok = Larder.Table.insert(table, %{id: 7, state: :new, n: 1})
      iex> Larder.Table.merge(table, 7, %{state: :done})
      {:ok, %{id: 7, state: :done, n: 1}}
      iex> Larder.Table.search_keys(table, state: :done)
      [7]
      iex> Larder.Table.merge(table, 8, %{state: :done})
      :error
  """
  @spec merge(table(), term(), map()) :: {:ok, record()} | :error
  def merge(table, key, changes) do
    write_span(handle!(table), :merge, %{key: key}, &merge!(&1, key, changes))
  end

  defp merge!(table, key, changes) do
    unless is_map(changes),
      do: raise(ArgumentError, "changes must be a map, got: #{inspect(changes, limit: 10)}")

    if is_map_key(changes, table.key) and :erlang.map_get(table.key, changes) !== key do
      raise ArgumentError, "changes must not change the key field #{inspect(table.key)}"
    end

    try do
      write!(table, {:merge, key, changes})
    rescue
      failure in IndexFailure ->
        index_failed!(
          table,
          "merge/3",
          failure,
          "the write was not applied (the record is as it was)"
        )
    end
  end

  @doc """
  Replaces the record under `key` with `fun.(record)`, or inserts `default`
  as it is when there is no record under `key` (as `Map.update/4` does), in
  one step of the writer process: no other write to the table runs between
  the read and the write, so concurrent read-modify-writes of one key never
  lose one another's changes. Returns `:ok`.

  `fun` runs in the writer process, as do the index functions on its result:
  it must be quick and must not write to any `Larder.Table`, this one or
  another (that raises `ArgumentError`, see "Concurrency": two updates
  whose functions wrote each other's tables would wait on each other for
  ever). When `fun` raises, `update/4` raises the same in the caller and
  nothing is written; when an index function fails on the new record, it
  raises `ArgumentError` (see "Failures") and nothing is written. Raises
  `ArgumentError` when `fun` is not a one-argument function, or when
  `default` or what `fun` returns is not a map whose key field is `key`
  (`===`).

      iex> table = Larder.Table.new(key: :id, index: [:n])
      iex> Larder.Table.update(table, 1, %{id: 1, n: 1}, &%{&1 | n: &1.n + 1})
      :ok
      iex> Larder.Table.get(table, 1)
      %{id: 1, n: 1}
      iex> Larder.Table.update(table, 1, %{id: 1, n: 1}, &%{&1 | n: &1.n + 1})
      :ok
      iex> Larder.Table.search_keys(table, n: 2)
      [1]
  """
  @spec update(table(), term(), record(), (record() -> record())) :: :ok
  def update(table, key, default, fun) do
    write_span(handle!(table), :update, %{key: key}, fn table ->
      unless is_function(fun, 1),
        do: raise(ArgumentError, "fun must be a function of one argument, got: #{inspect(fun)}")

      unless is_map(default) and is_map_key(default, table.key) and
               :erlang.map_get(table.key, default) === key do
        raise ArgumentError,
              "default must be a map whose key field #{inspect(table.key)} is " <>
                "#{inspect(key, limit: 10)}, got: #{inspect(default, limit: 10)}"
      end

      try do
        write!(table, {:update, key, default, fun})
      rescue
        failure in IndexFailure ->
          index_failed!(table, "update/4", failure, "the write was not applied")
      end
    end)
  end

  @doc """
  Deletes the record under `key`, if any. Whole even if the caller is
  killed; the row id of a non-integer key is reused by a later insert.
  """
  @spec delete(table(), term()) :: :ok
  def delete(table, key) do
    write_span(handle!(table), :delete, %{key: key}, &write!(&1, {:delete, key}))
  end

  ## Reading

  @doc """
  The record under `key`, or `default`.
  """
  @spec get(table(), term(), term()) :: record() | term()
  def get(table, key, default \\ nil)

  def get(%__MODULE__{} = table, key, default)
      when is_integer(key) and key >= 0 and key < @direct_limit do
    guard(table, fn ->
      case :ets.lookup(table.rows, key) do
        [{_, record}] -> record
        [] -> default
      end
    end)
  end

  def get(%__MODULE__{} = table, key, default) do
    field = table.key

    guard(table, fn ->
      with [{_, id}] <- :ets.lookup(table.keys, key),
           [{_, record}] <- :ets.lookup(table.rows, id),
           # The id may have been freed and reused since the first lookup.
           %{^field => ^key} <- record do
        record
      else
        _ -> default
      end
    end)
  end

  def get(name, key, default), do: get(handle!(name), key, default)

  @doc """
  The records for which every condition holds, in row id order (key order for
  integer keys). Empty conditions match every record.
  """
  @spec search(table(), conditions()) :: [record()]
  def search(%__MODULE__{telemetry: true} = table, conditions),
    do: search_span(table, :search, conditions, &run_search/2)

  def search(%__MODULE__{} = table, conditions), do: run_search(table, conditions)
  def search(name, conditions), do: search(handle!(name), conditions)

  defp run_search(table, conditions) do
    guard(table, fn ->
      fetch_rows(table, Index.query(table.index, Conditions.expr!(table, conditions)), conditions)
    end)
  end

  @doc """
  The keys of the records for which every condition holds, in row id order.
  """
  @spec search_keys(table(), conditions()) :: [term()]
  def search_keys(%__MODULE__{telemetry: true} = table, conditions),
    do: search_span(table, :search_keys, conditions, &run_search_keys/2)

  def search_keys(%__MODULE__{} = table, conditions), do: run_search_keys(table, conditions)
  def search_keys(name, conditions), do: search_keys(handle!(name), conditions)

  defp run_search_keys(table, conditions) do
    guard(table, fn ->
      ids = Index.query(table.index, Conditions.expr!(table, conditions))

      cond do
        Conditions.empty?(conditions) -> Enum.map(all_rows(table), &Map.fetch!(&1, table.key))
        Enum.all?(ids, &(&1 < @direct_limit)) -> live!(table) && ids
        true -> table |> fetch_rows(ids, conditions) |> Enum.map(&Map.fetch!(&1, table.key))
      end
    end)
  end

  @doc """
  How many records every condition holds for, without fetching them.
  """
  @spec count(table(), conditions()) :: non_neg_integer()
  def count(%__MODULE__{telemetry: true} = table, conditions),
    do: search_span(table, :count, conditions, &run_count/2)

  def count(%__MODULE__{} = table, conditions), do: run_count(table, conditions)
  def count(name, conditions), do: count(handle!(name), conditions)

  defp run_count(table, conditions) do
    guard(table, fn ->
      expr = Conditions.expr!(table, conditions)

      if Conditions.empty?(conditions),
        do: size(table),
        else: live!(table) && Index.count(table.index, expr)
    end)
  end

  @doc """
  Answers many searches in one index call (one consistent index state, one
  scheduler hop), in order.

      iex> table = Larder.Table.new(key: :id, index: [:n])
      iex> :ok = Larder.Table.insert_many(table, for(i <- 1..4, do: %{id: i, n: rem(i, 2)}))
      iex> Larder.Table.search_many(table, [[n: 0], [n: 1], [n: 2]])
      [[%{id: 2, n: 0}, %{id: 4, n: 0}], [%{id: 1, n: 1}, %{id: 3, n: 1}], []]
  """
  @spec search_many(table(), [conditions()]) :: [[record()]]
  def search_many(%__MODULE__{telemetry: true} = table, many),
    do: search_span(table, :search_many, many, &run_search_many/2)

  def search_many(%__MODULE__{} = table, many), do: run_search_many(table, many)
  def search_many(name, many), do: search_many(handle!(name), many)

  defp run_search_many(table, many) do
    guard(table, fn ->
      exprs = Conditions.exprs!(table, many)

      table.index
      |> Index.query_many(exprs)
      |> Enum.zip_with(many, &fetch_rows(table, &1, &2))
    end)
  end

  # A search, in a [:larder, :table, :search] span (the table emits events).
  defp search_span(table, op, conditions, fun) do
    meta = %{table: id(table), op: op, conditions: conditions}

    Larder.Telemetry.span(true, [:larder, :table, :search], meta, fn ->
      result = fun.(table, conditions)
      {result, Map.put(meta, :results, results(op, result))}
    end)
  end

  defp results(:count, count), do: count
  defp results(:search_many, lists), do: Enum.reduce(lists, 0, &(length(&1) + &2))
  defp results(_op, list), do: length(list)

  # A table in telemetry metadata: its name, or its handle when it has none.
  defp id(%__MODULE__{name: nil} = table), do: table
  defp id(%__MODULE__{name: name}), do: name

  @doc """
  A stream of every record, read from ETS in chunks as it is consumed (not a
  snapshot: concurrent writes may or may not show).
  """
  @spec stream(table()) :: Enumerable.t()
  def stream(table) do
    table = handle!(table)
    guard(table, fn -> live!(table) end)
    match = [{{:_, :"$1"}, [], [:"$1"]}]

    Stream.resource(
      fn -> guard(table, fn -> :ets.select(table.rows, match, 500) end) end,
      fn
        :"$end_of_table" -> {:halt, nil}
        {records, cont} -> {records, guard(table, fn -> :ets.select(cont) end)}
      end,
      fn _ -> :ok end
    )
  end

  @doc """
  The distinct terms the index `name` holds (each term that at least one
  record has: for `{name, value}` conditions, the values that match
  something), in no particular order, as `Larder.Index.terms/1` gives them
  for a whole index. O(terms of every index). Raises `ArgumentError` when
  the table has no index `name`.

      iex> table = Larder.Table.new(key: :id, index: [:color])
      iex> :ok = Larder.Table.insert_many(table, [%{id: 1, color: :red}, %{id: 2, color: :red}])
      iex> Larder.Table.terms(table, :color)
      [:red]
  """
  @spec terms(table(), term()) :: [term()]
  def terms(table, name) do
    table = handle!(table)
    Conditions.indexed!(table, name)

    guard(table, fn ->
      live!(table)
      for {^name, value} <- Index.terms(table.index), do: value
    end)
  end

  @doc "The number of records. O(1)."
  @spec size(table()) :: non_neg_integer()
  def size(table) do
    table = handle!(table)

    case guard(table, fn -> :ets.info(table.rows, :size) end) do
      size when is_integer(size) -> size
      _ -> gone!(table)
    end
  end

  @doc """
  Bytes the table holds: its ETS tables (words times the word size) plus the
  index's bytes in the NIF (`Larder.Index.memory/1`).
  """
  @spec memory(table()) :: non_neg_integer()
  def memory(table) do
    table = handle!(table)

    guard(table, fn ->
      live!(table)
      words = :ets.info(table.rows, :memory) + :ets.info(table.keys, :memory)
      words * :erlang.system_info(:wordsize) + Index.memory(table.index)
    end)
  end

  @doc """
  Drops the table: frees its ETS tables, its name, its index's memory in
  the NIF and its writer process at once. Every later call on the table
  raises `ArgumentError`, except `drop/1` itself, which returns `:ok` again,
  by handle or by name (a name that names no table is taken as one already
  dropped).

      iex> table = Larder.Table.new(key: :id)
      iex> Larder.Table.drop(table)
      :ok
      iex> Larder.Table.drop(table)
      :ok
  """
  @spec drop(table()) :: :ok
  def drop(%__MODULE__{} = table) do
    # Only a live table's own writer is asked (valid?/1), never a pid a
    # forged handle names.
    if valid?(table) do
      Requests.not_from_writer!()
      Instance.drop(table.writer)
    else
      :ok
    end
  end

  def drop(name) when Instance.name?(name), do: Instance.drop_name(__MODULE__, name, &drop/1)

  def drop(other), do: handle!(other)

  defp write!(table, request), do: Requests.write!(table, request)
  defp write_span(table, op, meta, fun), do: Requests.span(table, op, meta, fun)

  defp index_failed!(table, op, failure, outcome),
    do: Requests.index_failed!(table, op, failure, outcome)

  defp live!(table), do: Requests.live!(table)
  defp valid?(table), do: Requests.valid?(table)
  defp gone!(table), do: Requests.gone!(table)

  ## Rows

  defp fetch_rows(table, [], conditions) do
    live!(table)
    if Conditions.empty?(conditions), do: all_rows(table), else: []
  end

  defp fetch_rows(table, ids, conditions) do
    if Conditions.empty?(conditions) do
      all_rows(table)
    else
      lookup_rows(table.rows, ids)
    end
  end

  # A row deleted since the index answered is skipped (see "Concurrency").
  defp lookup_rows(rows, [id | ids]) do
    case :ets.lookup(rows, id) do
      [{_, record}] -> [record | lookup_rows(rows, ids)]
      [] -> lookup_rows(rows, ids)
    end
  end

  defp lookup_rows(_rows, []), do: []

  defp all_rows(table) do
    table.rows
    |> :ets.select([{{:"$1", :"$2"}, [], [{{:"$1", :"$2"}}]}])
    |> Enum.sort()
    |> Enum.map(&elem(&1, 1))
  end

  defp records!(table, [record | rest], all) do
    key!(table, record)
    records!(table, rest, all)
  end

  defp records!(_table, [], _all), do: :ok

  defp records!(_table, _other, all) do
    raise ArgumentError, "records must be a list of maps, got: #{inspect(all, limit: 5)}"
  end

  defp key!(table, record) when is_map(record) do
    unless is_map_key(record, table.key) do
      raise ArgumentError,
            "record must have the key field #{inspect(table.key)}, got: #{inspect(record, limit: 10)}"
    end
  end

  defp key!(_table, record),
    do: raise(ArgumentError, "record must be a map, got: #{inspect(record, limit: 10)}")

  ## Handles and options

  # A handle, or the name of a table, checked for its shape. Whether the
  # table still exists is checked where it is used (live!/1, guard/2).
  defp handle!(%__MODULE__{} = table), do: table
  defp handle!(name) when Instance.name?(name), do: Instance.resolve(__MODULE__, name)
  defp handle!(other), do: Instance.invalid!(__MODULE__, other)

  # Runs a read; an exception on a table that is gone (dropped, its owner
  # exited) or a handle that is not a table's turns into an ArgumentError
  # that says so. On a live table the exception is the caller's own.
  defp guard(table, fun) do
    fun.()
  rescue
    error ->
      if valid?(table), do: reraise(error, __STACKTRACE__), else: gone!(table)
  end

  defimpl Inspect do
    # Compact, as a handle is opaque: its name or, for a table without
    # one, its writer process; and its key field.
    def inspect(table, _opts) do
      key = "key: " <> Kernel.inspect(Map.get(table, :key), limit: 5)

      case Map.get(table, :name) do
        nil ->
          "#Larder.Table<#{key}, writer: #{Kernel.inspect(Map.get(table, :writer), limit: 5)}>"

        name ->
          "#Larder.Table<name: #{Kernel.inspect(name, limit: 5)}, #{key}>"
      end
    end
  end
end
