defmodule Larder.Index do
  @moduledoc """
  A bitmap index: maps terms to sets of `u32` row ids, one Roaring bitmap per
  term, held by a Rust NIF (`native/larder_native`).

      iex> index = Larder.Index.new()
      iex> :ok = Larder.Index.add(index, {:color, :red}, [1, 2, 3])
      iex> :ok = Larder.Index.add(index, {:size, :xl}, [2, 3, 4])
      iex> Larder.Index.query(index, {:and, [{:color, :red}, {:size, :xl}]})
      [2, 3]
      iex> Larder.Index.query(index, {:and, [{:size, :xl}, {:not, {:color, :red}}]})
      [4]
      iex> Larder.Index.count(index, {:or, [{:color, :red}, {:size, :xl}]})
      4

  Two terms share a bitmap exactly when they are `===` (the key is a
  canonical encoding of the term), so `1` and `1.0` are different terms. Any
  term can be an index term, however deep or long: the NIF walks terms with
  an explicit stack, never by recursion.

  ## Expressions

  `query/2`, `count/2` and `query_many/2` take an expression:

    * `{:and, [expr]}` - ids in every sub-expression. Bitmaps are intersected
      smallest first and the intersection stops once it is empty; a `{:not, e}`
      inside an `:and` is a difference.
    * `{:or, [expr]}` - ids in any sub-expression (the alternatives for one field).
    * `{:not, expr}` - outside an `:and`, every id of the index that `expr`
      does not match (this builds the union of all bitmaps).
    * `{:term, term}` - `term` itself, even when it looks like an operator.
    * any other term - that term.

  `:and`, `:or` and `:not` nest at most 100 levels deep; the lists of
  `:and` and `:or` are proper lists of any length.

  ## Complexity

  Each term's ids are kept in chunks of 64Ki ids (one Roaring container
  each). With `c` the chunks of the bitmaps involved, `query/2` costs O(c)
  plus O(r) to return `r` ids; `count/2` costs O(c). An `:and` of terms
  (no operator among them) is looked up without building a plan, and works
  chunk by chunk of its smallest term: only the span every operand's chunk
  covers can match (each chunk keeps its first and last id). Within it the
  chunks are leapfrogged: each operand's cursor seeks the largest id any
  cursor stands on until all stand on the same one, so an operand whose ids
  come in blocks skips a block in one seek and no container is copied; past
  128 seeks per operand (a large answer) the chunks are intersected whole
  instead, smallest first. Any other `:and` intersects, chunk by chunk, the
  operands' chunks smallest first; when its smallest operand is a term of at
  most 4,096 ids it instead looks each of those ids up in the other
  operands. Terms are found in a hash map split into shards
  (8 to 16 terms each on average; their number doubles as terms grow).

  A write of `k` ids to a term costs O(k log k) plus a copy of each chunk
  it changes (at most about 8 KB each), of the term's list of chunks, and of
  the shard and the shard group the term falls in (about
  `2 * sqrt(terms / 8)` pointers); it never copies the untouched terms or
  chunks, so building an index in many small batches stays linear. The
  write that doubles the shards copies every term's pointer once.

  `terms/1` and `memory/1` are O(terms). `terms_of/2` is O(terms) unless
  the index was made with `reverse: true`: it then keeps an id-to-terms map
  (each term numbered by a 32-bit id for its life, each row id's term
  numbers sorted in a flat array shared by 64 row ids) and `terms_of/2`
  costs O(terms of that id). Every write then also merges its changes into
  that map: O(changes log changes) plus a copy of each 64-id leaf it
  changes. A `{:set_terms, terms, ids}` (see `batch/2`), which only such
  an index takes, costs O(terms of each id) to diff before it writes.

  ## Concurrency

  Readers never wait for writers. The NIF publishes the index as immutable
  snapshots: `query/2`, `count/2`, `query_many/2`, `terms/1` and
  `terms_of/2` load the current snapshot (an atomic pointer load) and
  evaluate on it holding no lock, so every id list an answer is built from
  comes from one consistent state. A write (`add/3`, `remove/3`, and all
  the operations of one `batch/2`) is applied to a copy that shares every
  untouched term and chunk with the snapshot, then swapped in whole: no
  reader sees half of it. Writers serialise among themselves only.

  Calls that can take over about a millisecond run on dirty CPU schedulers.
  The NIF decides, from the work it counts while it decodes: a read
  estimates the containers it touches and the ids it returns, a write counts
  terms x ids and the chunks it copies, and a `query_many/2` of more than
  64 expressions always moves, and so does a call whose terms hold a map, a
  fun or a bitstring that is not whole bytes (their encoding's size is only
  known once it is built). Past the budget, the normal-scheduler call
  stops at once and the same call runs again on a dirty scheduler. A write
  that finds another write in progress also moves to a dirty scheduler to
  wait there.

  ## Failures

  Functions raise `ArgumentError`, with a message naming the argument, when
  the index is not a handle from `new/1` (a forged or foreign reference
  included), when it was dropped ("unknown Larder.Index: it was dropped"),
  when ids are not integers in `0..4_294_967_295` or a proper list of them,
  when `ops` or `exprs` are not proper lists of the documented shapes, or
  when an expression nests deeper than 100 levels. A failed write applies
  none of its operations. The NIF never panics and holds no lock a failure
  could poison (the writers' mutex guards no data). A stored term that
  could not be rebuilt (never expected) raises `Larder.Error` with reason
  `:internal`.

  An index's memory is freed when the last process holding its handle lets
  go of it, or at once by `drop/1`.

  ## Performance

  The index is measured through `Larder.Table` by
  `mix run bench/index_bench.exs` (see `Larder.Table`'s "Performance"): a
  search there intersects 8 terms of 9,744 to 243,600 ids each on the
  487,200-price catalogue, about 24x faster than a Go-style map index
  scanning the same data in the same run. Writes pay for readers never
  waiting: a write copies each chunk (at most one Roaring container, about
  8 KB) it changes. `reverse: true` (the id-to-terms map) keeps, besides
  the bitmaps, 4 bytes for each (id, term) pair and about 4 for each id.
  """

  alias Larder.Native

  # The NIF's nesting limit for :and, :or and :not (expr.rs, MAX_DEPTH).
  @max_depth 100

  @enforce_keys [:ref]
  defstruct [:ref]

  @opaque t :: %__MODULE__{ref: reference()}

  @typedoc "A row id."
  @type id :: non_neg_integer()

  @typedoc """
  One id, a list of them, or a binary of ids packed as little-endian 32-bit
  integers (4 bytes each: `for id <- ids, into: <<>>, do: <<id::32-little>>`),
  which a process sends without copying and the index reads without walking
  a list.
  """
  @type ids :: id() | [id()] | binary()

  @typedoc "A query expression; see the moduledoc."
  @type expr ::
          {:and, [expr()]} | {:or, [expr()]} | {:not, expr()} | {:term, term()} | term()

  @typedoc "A write for `batch/2`; the `_terms` forms apply to each term of a list."
  @type op ::
          {:add, term(), ids()}
          | {:remove, term(), ids()}
          | {:add_terms, [term()], ids()}
          | {:remove_terms, [term()], ids()}
          | {:set_terms, [term()], ids()}

  @doc """
  Creates an empty index. An unknown option raises.

  Options:

    * `:reverse` (boolean, default `false`) - also keep an id-to-terms map,
      so `terms_of/2` costs O(terms of that id) instead of O(terms), and
      `batch/2` takes `{:set_terms, terms, ids}`. It
      costs about 4 bytes per (id, term) pair plus about 300 bytes per 64
      ids in use, and every write updates it.

      iex> Larder.Index.new() |> Larder.Index.terms()
      []
      iex> index = Larder.Index.new(reverse: true)
      iex> :ok = Larder.Index.batch(index, [{:add, :a, [1, 2]}, {:add, :b, [2]}])
      iex> Larder.Index.terms_of(index, 2) |> Enum.sort()
      [:a, :b]
  """
  @spec new(keyword()) :: t()
  def new(opts \\ []) do
    opts = Larder.Options.validate!(opts, [reverse: {:boolean, false}], "Larder.Index")
    %__MODULE__{ref: Native.index_new(Keyword.fetch!(opts, :reverse))}
  end

  @doc """
  Adds `ids` to the bitmap of `term`. Atomic.
  """
  @spec add(t(), term(), ids()) :: :ok
  def add(index, term, ids), do: batch(index, [{:add, term, ids}])

  @doc """
  Removes `ids` from the bitmap of `term`; a bitmap left empty is dropped, so
  the term leaves `terms/1`. Removing absent ids is not an error. Atomic.
  """
  @spec remove(t(), term(), ids()) :: :ok
  def remove(index, term, ids), do: batch(index, [{:remove, term, ids}])

  # A batch of more ops than this goes to a dirty scheduler at once. Each
  # op costs at least about 0.1 us in the NIF and a replace (:set_terms)
  # about 3 us, so on a normal scheduler such a batch would mostly run out
  # of its millisecond and start again there: a table's write of 1,000
  # replaced records lost about 0.9 ms that way.
  @dirty_ops 512

  @doc """
  Applies `ops` in order, atomically: a concurrent reader sees all of them or
  none. `{:add_terms, terms, ids}` and `{:remove_terms, terms, ids}` do the
  same to each of `terms` (one operation per record instead of one per term).

      iex> index = Larder.Index.new()
      iex> Larder.Index.batch(index, [{:add, :a, [1, 2]}, {:remove, :a, 1}, {:add, :b, 7}])
      :ok
      iex> {Larder.Index.query(index, :a), Larder.Index.query(index, :b)}
      {[2], [7]}

  `{:set_terms, terms, ids}` gives each of `ids` exactly `terms`: the terms
  it had and `terms` lacks are removed, the others added. It needs an index
  made with `reverse: true` (which knows each id's terms), costs O(terms of
  each id), and its ids may appear in no other operation of the same batch;
  otherwise `batch/2` raises `ArgumentError` and changes nothing.

      iex> index = Larder.Index.new(reverse: true)
      iex> :ok = Larder.Index.batch(index, [{:add_terms, [:a, :b], 1}])
      iex> :ok = Larder.Index.batch(index, [{:set_terms, [:b, :c], 1}])
      iex> Larder.Index.terms_of(index, 1) |> Enum.sort()
      [:b, :c]
  """
  @spec batch(t(), [op()]) :: :ok
  def batch(index, ops) when is_list(ops) do
    first =
      if longer?(ops, @dirty_ops), do: &Native.index_apply_dirty/2, else: &Native.index_apply/2

    index
    |> ref!()
    |> dirty_retry(first, &Native.index_apply_dirty/2, ops)
    |> check(ops)
  end

  def batch(_index, ops), do: raise(ArgumentError, "ops must be a list, got: #{inspect(ops)}")

  @doc """
  The ids that `expr` matches, in ascending order.
  """
  @spec query(t(), expr()) :: [id()]
  def query(index, expr) do
    index
    |> ref!()
    |> dirty_retry(&Native.index_query/2, &Native.index_query_dirty/2, expr)
    |> check(expr)
  end

  @doc """
  The answers to several expressions, in one call on one snapshot (so
  they all see the same state).

      iex> index = Larder.Index.new()
      iex> :ok = Larder.Index.add(index, :a, [1, 2])
      iex> Larder.Index.query_many(index, [:a, {:not, :a}, :missing])
      [[1, 2], [], []]
  """
  @spec query_many(t(), [expr()]) :: [[id()]]
  def query_many(index, exprs) when is_list(exprs) do
    index
    |> ref!()
    |> dirty_retry(&Native.index_query_many/2, &Native.index_query_many_dirty/2, exprs)
    |> check({:exprs, exprs})
  end

  def query_many(_index, exprs),
    do: raise(ArgumentError, "exprs must be a list of expressions, got: #{inspect(exprs)}")

  @doc """
  How many ids `expr` matches, without building the list.
  """
  @spec count(t(), expr()) :: non_neg_integer()
  def count(index, expr) do
    index
    |> ref!()
    |> dirty_retry(&Native.index_count/2, &Native.index_count_dirty/2, expr)
    |> check(expr)
  end

  @doc """
  Every term that has at least one id, in no particular order.
  """
  @spec terms(t()) :: [term()]
  def terms(index), do: index |> ref!() |> Native.index_terms() |> check(nil)

  @doc """
  The terms whose bitmap holds `id`, in no particular order. With
  `reverse: true` (see `new/1`) it reads the id-to-terms map: O(terms of
  `id`). Without, it checks every bitmap: O(terms).

      iex> index = Larder.Index.new()
      iex> :ok = Larder.Index.batch(index, [{:add, :a, [1, 2]}, {:add, :b, [2]}])
      iex> Larder.Index.terms_of(index, 1)
      [:a]
  """
  @spec terms_of(t(), id()) :: [term()]
  def terms_of(index, id) when is_integer(id) and id >= 0 and id <= 0xFFFFFFFF do
    index
    |> ref!()
    |> dirty_retry(&Native.index_terms_of/2, &Native.index_terms_of_dirty/2, id)
    |> check(id)
  end

  def terms_of(_index, id),
    do: raise(ArgumentError, "id must be an integer in 0..4294967295, got: #{inspect(id)}")

  @doc """
  The bytes the index holds in the NIF: each bitmap's size, each term's key
  and the hash table's slots. This memory is outside the BEAM heaps and ETS.
  """
  @spec memory(t()) :: non_neg_integer()
  def memory(index), do: index |> ref!() |> Native.index_memory() |> check(nil)

  @doc """
  Drops the index: frees its memory in the NIF at once, even while other
  processes still hold its handle. Every later call on the index raises
  `ArgumentError`, except `drop/1` itself, which returns `:ok` again.

      iex> index = Larder.Index.new()
      iex> :ok = Larder.Index.add(index, :a, [1])
      iex> Larder.Index.drop(index)
      :ok
      iex> Larder.Index.query(index, :a)
      ** (ArgumentError) unknown Larder.Index: it was dropped
  """
  @spec drop(t()) :: :ok
  def drop(index), do: index |> ref!() |> Native.index_drop() |> check(nil)

  defp ref!(%__MODULE__{ref: ref}) when is_reference(ref), do: ref

  defp ref!(other),
    do:
      raise(
        ArgumentError,
        "index must be a Larder.Index (from Larder.Index.new/1), got: #{inspect(other)}"
      )

  # Whether `list` has more than `n` elements (an improper tail counts as
  # the end: the NIF refuses it).
  defp longer?([_ | rest], n), do: n == 0 or longer?(rest, n - 1)
  defp longer?(_end, _n), do: false

  # Turns the NIF's `{:error, reason}` into an ArgumentError naming the argument.
  # A normal-scheduler NIF answers `:dirty` when the call could run past
  # about a millisecond (or would wait for another write): the same call
  # then runs again on a dirty scheduler.
  defp dirty_retry(ref, normal, dirty, arg) do
    case normal.(ref, arg) do
      :dirty -> dirty.(ref, arg)
      answer -> answer
    end
  end

  defp check({:error, reason}, arg), do: fail!(reason, arg)
  defp check(result, _arg), do: result

  defp fail!(:dropped, _arg), do: raise(ArgumentError, "unknown Larder.Index: it was dropped")

  defp fail!(:bad_index, _arg) do
    raise ArgumentError,
          "index must be a Larder.Index (from Larder.Index.new/1), got a handle to something else"
  end

  defp fail!(:bad_expr, {:exprs, exprs}) do
    bad!(
      "exprs must be a proper list of expressions, each combining terms with " <>
        "{:and, [expr]}, {:or, [expr]} and {:not, expr}, got: ",
      exprs,
      20
    )
  end

  defp fail!(:too_deep, {:exprs, exprs}), do: fail!(:too_deep, exprs)

  defp fail!(:too_deep, expr),
    do: bad!("expr nests :and, :or and :not deeper than #{@max_depth} levels, got: ", expr, 5)

  defp fail!(:internal, _arg) do
    raise Larder.Error.new(:internal, "the index NIF could not rebuild a stored term")
  end

  defp fail!(:bad_ids, id) when is_integer(id),
    do: raise(ArgumentError, "id must be an integer in 0..4294967295, got: #{inspect(id)}")

  defp fail!(:bad_ids, ops) do
    bad!(
      "ids must be an integer in 0..4294967295, a proper list of them " <>
        "or a binary of 4-byte little-endian ones, in: ",
      ops,
      10
    )
  end

  defp fail!(:bad_op, ops) do
    bad!(
      "ops must be a list of {:add | :remove, term, ids} or " <>
        "{:add_terms | :remove_terms | :set_terms, [term], ids}, the ids of " <>
        ":set_terms in no other op of the batch, got: ",
      ops,
      10
    )
  end

  defp fail!(:no_reverse, ops) do
    bad!(
      "ops has {:set_terms, terms, ids}, which needs an index made with reverse: true, got: ",
      ops,
      10
    )
  end

  defp fail!(:bad_expr, expr) do
    bad!(
      "expr must combine terms with {:and, [expr]}, {:or, [expr]} and {:not, expr}, got: ",
      expr,
      20
    )
  end

  # The ArgumentError for a bad user term: `message` and the term, cut to
  # `limit` elements and short strings.
  defp bad!(message, term, limit),
    do: raise(ArgumentError, message <> inspect(term, limit: limit, printable_limit: 50))
end
