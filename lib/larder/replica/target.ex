# The structure a replica keeps, as a behaviour: a Table
# (Larder.Replica.Target.Table) or a Bag (Larder.Replica.Target.Bag)
# that the replica's process creates (empty, or from a snapshot's dump) and
# owns, so it lives and dies with the replica. An implementation owns
# everything that depends on the structure: its options, its identity in
# snapshots, the shapes of the ops an apply function returns and how they
# are written, whether a snapshot may dump it while the replica writes it,
# and how that dump is taken. The replica's processes (server, reader,
# steps, snapshots) call these functions with a %Target{} and never name a
# structure.
defmodule Larder.Replica.Target do
  @moduledoc false

  @enforce_keys [:module, :opts]
  defstruct @enforce_keys

  @typedoc "An implementation of this behaviour and the structure's options (from `:into`)."
  @type t :: %__MODULE__{module: module(), opts: keyword()}

  @typedoc "The structure's handle (a table's, a bag's)."
  @type handle :: term()

  @typedoc "An op an apply function returns, in one of the target's shapes (see `c:check/2`)."
  @type op :: tuple()

  @typedoc "What a concurrent dump's process is handed by `c:start_dump/3`."
  @type cut :: term()

  @doc "The structure's module, as `:into` names it (`{module, opts}`)."
  @callback structure() :: module()

  @doc """
  Checks the structure's options without creating it, and returns them.
  Raises `ArgumentError` naming `:into`.
  """
  @callback validate!(opts :: term()) :: keyword()

  @doc "What snapshots store to name the structure: its kind and name (or the replica's)."
  @callback identity(opts :: keyword(), replica :: atom()) :: term()

  @doc "Creates the empty structure, owned by the calling process."
  @callback new(opts :: keyword()) :: handle()

  @doc "Creates the structure from a dump, owned by the calling process."
  @callback load(opts :: keyword(), dump :: Path.t()) ::
              {:ok, handle()} | {:error, Larder.Error.t()}

  @doc "Drops the structure."
  @callback drop(handle()) :: :ok

  @doc """
  Whether `ops` (a list, as an apply function returned it) is a proper list
  of ops of this target's shapes. Pure: runs in the reader, beside the
  writes. `c:write/2` takes only ops that passed it.
  """
  @callback check(opts :: keyword(), ops :: term()) :: boolean()

  @doc """
  Writes checked `ops` in order (each run of one kind as one write where
  the structure has one, the inserts between two deletes as one insert of
  many). Raises when the structure refuses a write (an index function).
  """
  @callback write(handle(), ops :: [op()]) :: :ok

  @doc """
  How a snapshot dumps the structure while the replica applies batches:
  `:concurrent` (a process of its own dumps it while the replica writes on;
  see Larder.Replica.SnapshotSchedule for what the dump then holds) or
  `:exclusive` (the replica's process dumps it and writes nothing meanwhile).
  `arity` is the apply function's.
  """
  @callback dump_mode(opts :: keyword(), arity :: 1 | 2) :: :concurrent | :exclusive

  @doc "Dumps the structure to `path` in the calling process, which does not write it meanwhile."
  @callback dump(handle(), path :: Path.t()) :: :ok | {:error, Larder.Error.t()}

  @doc """
  Begins a concurrent dump to `path`, in the replica's process between two
  batches: returns what `c:finish_dump/3` needs in the dump's process
  `dumper`, or `:gone` when the structure is gone.
  """
  @callback start_dump(handle(), path :: Path.t(), dumper :: pid()) :: {:ok, cut()} | :gone

  @doc """
  Writes the dump begun by `c:start_dump/3`, in the dump's process: `:ok`,
  an error, `:gone` (the structure went), or a raise of the structure's
  to raise again (`{:raise, kind, reason, stacktrace}`).
  """
  @callback finish_dump(handle(), path :: Path.t(), cut()) ::
              :ok | {:error, Larder.Error.t()} | :gone | {:raise, atom(), term(), list()}

  @implementations [Larder.Replica.Target.Table, Larder.Replica.Target.Bag]

  # A restarted replica may find the name of its predecessor's structure
  # still registered for a moment (a table's writer stops once it sees its
  # owner's exit): creating is retried this long.
  @name_wait_ms 5_000

  @doc """
  The target of `into` (`{structure_module, opts}`, the replica's `:into`),
  its options checked. Raises `ArgumentError` naming `:into`.
  """
  @spec new!(term()) :: t()
  def new!({structure, opts} = into) when is_atom(structure) do
    case Enum.find(@implementations, &(&1.structure() == structure)) do
      nil -> bad_into!(into)
      module -> %__MODULE__{module: module, opts: module.validate!(opts)}
    end
  end

  def new!(other), do: bad_into!(other)

  defp bad_into!(into) do
    names = Enum.map_join(@implementations, " or ", &"{#{inspect(&1.structure())}, opts}")

    raise ArgumentError,
          "expected Larder.Replica option :into to be #{names}, got: #{inspect(into, limit: 10)}"
  end

  @doc "See `c:identity/2`."
  @spec identity(t(), atom()) :: term()
  def identity(%__MODULE__{module: m, opts: opts}, replica), do: m.identity(opts, replica)

  @doc "Creates the empty structure, owned by the calling process (see `c:new/1`)."
  @spec create(t()) :: handle()
  def create(%__MODULE__{module: m, opts: opts} = target) do
    await_name(target)
    retry(target, fn -> m.new(opts) end)
  end

  @doc "Creates the structure from a dump, owned by the calling process (see `c:load/2`)."
  @spec load(t(), Path.t()) :: {:ok, handle()} | {:error, Larder.Error.t()}
  def load(%__MODULE__{module: m, opts: opts} = target, path) do
    # Waited for first: a load that finds the name taken has read the whole
    # file for nothing.
    await_name(target)
    retry(target, fn -> m.load(opts, path) end)
  end

  @doc "See `c:drop/1`."
  @spec drop(t(), handle()) :: :ok
  def drop(%__MODULE__{module: m}, handle), do: m.drop(handle)

  @doc "See `c:check/2`."
  @spec check(t(), term()) :: boolean()
  def check(%__MODULE__{module: m, opts: opts}, ops), do: m.check(opts, ops)

  @doc "See `c:write/2`."
  @spec write(t(), handle(), [op()]) :: :ok
  def write(%__MODULE__{module: m}, handle, ops), do: m.write(handle, ops)

  @doc "See `c:dump_mode/2`."
  @spec dump_mode(t(), 1 | 2) :: :concurrent | :exclusive
  def dump_mode(%__MODULE__{module: m, opts: opts}, arity), do: m.dump_mode(opts, arity)

  @doc "See `c:dump/2`."
  @spec dump(t(), handle(), Path.t()) :: :ok | {:error, Larder.Error.t()}
  def dump(%__MODULE__{module: m}, handle, path), do: m.dump(handle, path)

  @doc "See `c:start_dump/3`."
  @spec start_dump(t(), handle(), Path.t(), pid()) :: {:ok, cut()} | :gone
  def start_dump(%__MODULE__{module: m}, handle, path, dumper),
    do: m.start_dump(handle, path, dumper)

  @doc "See `c:finish_dump/3`."
  @spec finish_dump(t(), handle(), Path.t(), cut()) ::
          :ok | {:error, Larder.Error.t()} | :gone | {:raise, atom(), term(), list()}
  def finish_dump(%__MODULE__{module: m}, handle, path, cut), do: m.finish_dump(handle, path, cut)

  @doc """
  For implementations: calls `fun.(kind, run)` on each run of consecutive
  ops of one kind (their first element: `:insert`, `:delete`), in order.
  """
  @spec each_run([op()], (atom(), [op()] -> term())) :: :ok
  def each_run([], _fun), do: :ok
  def each_run([op | ops], fun), do: each_run(ops, fun, elem(op, 0), [op])

  defp each_run([op | ops], fun, kind, run) when elem(op, 0) == kind,
    do: each_run(ops, fun, kind, [op | run])

  defp each_run(ops, fun, kind, run) do
    fun.(kind, :lists.reverse(run))
    each_run(ops, fun)
  end

  # While a live structure answers to the name (a predecessor's, whose
  # owner is gone), up to @name_wait_ms.
  defp await_name(target, waited \\ 0) do
    name = target.opts[:name]

    if name && waited < @name_wait_ms && live?(target.module.structure(), name) do
      Process.sleep(5)
      await_name(target, waited + 5)
    else
      :ok
    end
  end

  defp live?(structure, name) do
    _ = structure.size(name)
    true
  rescue
    ArgumentError -> false
  end

  # Creates with `fun`, again while the name is taken: a creation that
  # raised while a live process held the name's claim (Larder.Instance),
  # before or after it, is tried again, up to @name_wait_ms. Any other
  # ArgumentError (a bad option) is raised at once.
  defp retry(target, fun, waited \\ 0) do
    structure = target.module.structure()
    name = target.opts[:name]
    held_before = held?(structure, name)

    try do
      fun.()
    rescue
      error in ArgumentError ->
        if waited < @name_wait_ms and (held_before or held?(structure, name)) do
          Process.sleep(10)
          retry(target, fun, waited + 10)
        else
          reraise error, __STACKTRACE__
        end
    end
  end

  defp held?(_structure, nil), do: false
  defp held?(structure, name), do: Larder.Instance.whereis(structure, name) != nil
end
