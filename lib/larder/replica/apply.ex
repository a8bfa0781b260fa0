# Applying a batch of entries to a replica's target: the apply function
# called on each entry (in the reader for an arity-1 function, see
# prepare/1; in a step for an arity-2 one), its ops checked by the target
# and written in runs, an entry rejected (reported, then skipped or the
# replica stopped, by :on_error) when the function fails or returns
# something else, or when writing its ops raises. No process of its own:
# batch/4 runs in the replica's process or in a step.
defmodule Larder.Replica.Apply do
  @moduledoc false

  alias Larder.Replica.Target

  @enforce_keys [:fun, :target, :source, :on_error, :name, :telemetry]
  defstruct [:handle | @enforce_keys]

  @typedoc """
  What applying needs: the apply function, the target and the structure's
  handle (set once it exists), the source (its advance/2), :on_error, and
  the replica's name and telemetry switch for the `:rejected` event.
  """
  @type t :: %__MODULE__{
          fun: (term() -> term()) | (term(), term() -> term()),
          target: Target.t(),
          handle: Target.handle() | nil,
          source: module(),
          on_error: :stop | :skip,
          name: atom(),
          telemetry: boolean()
        }

  @typedoc "An entry as the apply function left it: its checked ops, or why it was rejected."
  @type result :: :ok | {:ops, [Target.op()]} | {:rejected, term()}

  @typedoc """
  `{:ok, position_after, applied, rejected}` once every entry is applied or
  skipped, or `{:stop, error, position}` at a rejected entry with
  `on_error: :stop` (`position` after the last entry done before it).
  """
  @type outcome ::
          {:ok, term(), non_neg_integer(), non_neg_integer()}
          | {:stop, Larder.Error.t(), term()}

  @typedoc """
  A batch as the reader leaves it for `batch/5` (an arity-1 function ran
  there): `{:single, ids, ops}` when every entry gave exactly one op (the
  common case: the ops alone are written, in one go), else `{:entries,
  [{id, result}]}`.
  """
  @type prepared :: {:single, [term()], [Target.op()]} | {:entries, [{term(), result()}]}

  @doc """
  The reader's work for an arity-1 function: a function from a batch's
  entries to its `t:prepared/0` form (pure: it runs beside the replica's
  writes), or nil for an arity-2 function, which runs in a step with the
  handle.
  """
  @spec prepare(t()) :: ([{term(), term()}] -> prepared()) | nil
  def prepare(%__MODULE__{fun: fun} = apply) when is_function(fun, 1) do
    apply = %{apply | handle: nil}
    fn entries -> single(entries, apply, [], []) end
  end

  def prepare(_apply), do: nil

  # While every entry gives one op: the ids and the ops, in two lists (what
  # the replica's process copies and walks is then the ops alone). At the
  # first entry that does not, the batch takes the general form.
  defp single([{id, fields} | rest], apply, ids, ops) do
    case run(apply, fields) do
      {:ops, [op]} -> single(rest, apply, [id | ids], [op | ops])
      result -> {:entries, zip_back(ids, ops, [{id, result} | general(rest, apply)])}
    end
  end

  defp single([], _apply, ids, ops), do: {:single, :lists.reverse(ids), :lists.reverse(ops)}

  defp general(entries, apply), do: for({id, fields} <- entries, do: {id, run(apply, fields)})

  defp zip_back([id | ids], [op | ops], acc), do: zip_back(ids, ops, [{id, {:ops, [op]}} | acc])
  defp zip_back([], [], acc), do: acc

  @doc """
  Applies `entries` in order, from `position`: a `t:prepared/0` batch
  when `prepared` (an arity-1 function ran in the reader), else `[{id,
  fields}]`. The position moves by the source's advance/2 over each entry
  done; a whole batch moves it to `position_after`, which may be past the
  last entry (past a gap of the log: a compacted offset, a transaction
  marker). An arity-1 function's ops are written in runs (a `{:single,
  ids, ops}` batch in one `Target.write/3`); an arity-2 function may write
  the structure itself, so what is queued is written before each call. If
  a write raises (an index function), the entries are written again one
  by one and the one that raises is rejected (an entry whose write raised
  wrote nothing: a Table write is whole or not done).
  """
  @spec batch(t(), prepared() | [{term(), term()}], term(), term(), boolean()) :: outcome()
  def batch(apply, {:single, ids, ops}, position, position_after, true) do
    Target.write(apply.target, apply.handle, ops)
    {:ok, position_after, length(ids), 0}
  rescue
    _ ->
      queued = zip_single(ids, ops, [])
      ctx = context(apply, true, position)

      case flush_one_by_one(ctx, queued) do
        {:ok, ctx} -> {:ok, position_after, ctx.applied, ctx.rejected}
        stop -> stop
      end
  end

  def batch(apply, {:entries, entries}, position, position_after, true),
    do: batch_entries(apply, entries, position, position_after, true)

  def batch(apply, entries, position, position_after, false),
    do: batch_entries(apply, entries, position, position_after, false)

  defp zip_single([id | ids], [op | ops], acc), do: zip_single(ids, ops, [{id, [op]} | acc])
  defp zip_single([], [], acc), do: :lists.reverse(acc)

  defp context(apply, prepared, position),
    do: %{apply: apply, prepared: prepared, pending: [], done: position, applied: 0, rejected: 0}

  defp batch_entries(apply, entries, position, position_after, prepared) do
    ctx = context(apply, prepared, position)
    pure = is_function(apply.fun, 1)

    result =
      Enum.reduce_while(entries, {:ok, ctx}, fn {id, fields}, {:ok, ctx} ->
        case if(pure, do: {:ok, ctx}, else: flush(ctx)) do
          {:ok, ctx} ->
            case entry(ctx, id, fields) do
              {:stop, error, ctx} -> {:halt, stop_after_flush(ctx, error)}
              ctx -> {:cont, {:ok, ctx}}
            end

          stop ->
            {:halt, stop}
        end
      end)

    with {:ok, ctx} <- result,
         {:ok, ctx} <- flush(ctx) do
      {:ok, position_after, ctx.applied, ctx.rejected}
    end
  end

  defp entry(ctx, id, fields) do
    result = if ctx.prepared, do: fields, else: run(ctx.apply, fields)

    case result do
      :ok ->
        %{ctx | done: done(ctx, id), applied: ctx.applied + 1}

      {:ops, ops} ->
        %{ctx | pending: [{id, ops} | ctx.pending]}

      {:rejected, why} ->
        case reject(ctx, id, why) do
          {:skip, ctx} -> %{ctx | pending: [{id, :skipped} | ctx.pending]}
          {:stop, error} -> {:stop, error, ctx}
        end
    end
  end

  # The position after entry `id`, done after the entries before it.
  defp done(ctx, id), do: ctx.apply.source.advance(ctx.done, id)

  defp stop_after_flush(ctx, error) do
    case flush(ctx) do
      {:ok, ctx} -> {:stop, error, ctx.done}
      {:stop, _error, _done} = stop -> stop
    end
  end

  # An entry's result: its checked ops ({:ops, []} for :ok or [] of a pure
  # function), :ok for an arity-2 function that wrote itself, or why it
  # was rejected.
  defp run(%{fun: fun} = apply, fields) when is_function(fun, 1) do
    case fun.(fields) do
      :ok -> {:ops, []}
      ops -> checked(apply, ops)
    end
  catch
    kind, reason -> {:rejected, {kind, reason}}
  end

  defp run(apply, fields) do
    case apply.fun.(fields, apply.handle) do
      :ok -> :ok
      nil -> {:rejected, {:returned, nil}}
      ops -> checked(apply, ops)
    end
  catch
    kind, reason -> {:rejected, {kind, reason}}
  end

  defp checked(apply, ops) do
    list = List.wrap(ops)

    if Target.check(apply.target, list),
      do: {:ops, list},
      else: {:rejected, {:returned, ops}}
  end

  defp reject(ctx, id, why) do
    %{apply: apply} = ctx

    Larder.Telemetry.execute(
      apply.telemetry,
      [:larder, :replica, :rejected],
      %{count: 1},
      %{replica: apply.name, id: id, reason: why, action: apply.on_error}
    )

    case apply.on_error do
      :skip ->
        {:skip, %{ctx | rejected: ctx.rejected + 1}}

      :stop ->
        {:stop,
         Larder.Error.new(:apply_failed, "the apply function rejected an entry",
           id: id,
           reason: why
         )}
    end
  end

  # Writes the queued ops, in one go; if that raises, one entry at a time.
  defp flush(%{pending: []} = ctx), do: {:ok, ctx}

  defp flush(ctx) do
    queued = Enum.reverse(ctx.pending)
    ctx = %{ctx | pending: []}
    ops = for {_id, ops} <- queued, ops != :skipped, op <- ops, do: op

    try do
      Target.write(ctx.apply.target, ctx.apply.handle, ops)

      done =
        Enum.reduce(queued, ctx.done, fn {id, _}, done -> ctx.apply.source.advance(done, id) end)

      applied = Enum.count(queued, &(elem(&1, 1) != :skipped))
      {:ok, %{ctx | done: done, applied: ctx.applied + applied}}
    rescue
      _ -> flush_one_by_one(ctx, queued)
    end
  end

  defp flush_one_by_one(ctx, []), do: {:ok, ctx}

  defp flush_one_by_one(ctx, [{id, :skipped} | rest]),
    do: flush_one_by_one(%{ctx | done: done(ctx, id)}, rest)

  defp flush_one_by_one(ctx, [{id, ops} | rest]) do
    result =
      try do
        Target.write(ctx.apply.target, ctx.apply.handle, ops)
      rescue
        error -> {:raised, error}
      end

    case result do
      {:raised, error} ->
        case reject(ctx, id, {:error, error}) do
          {:skip, ctx} -> flush_one_by_one(%{ctx | done: done(ctx, id)}, rest)
          {:stop, error} -> {:stop, error, ctx.done}
        end

      _ ->
        flush_one_by_one(%{ctx | done: done(ctx, id), applied: ctx.applied + 1}, rest)
    end
  end
end
