# The caller's side of a Larder.Table's writer: a write sent as a request
# and its reply awaited (a raise in the writer raised again here), records
# written in chunks (the next chunk's rows and index ops computed here while
# the writer applies the one before; a large chunk of fresh rows under a
# build claim, Larder.Table.Claim), the error of an index function that
# fails, the write's telemetry span, and whether a handle is live.
# Larder.Table checks its callers' arguments and then calls these;
# Larder.Replica's Table target calls insert!/3 with records its op checks
# already checked, so they are not checked twice.
defmodule Larder.Table.Requests do
  @moduledoc false

  alias Larder.Instance
  alias Larder.Table.Claim
  alias Larder.Table.IndexFailure
  alias Larder.Table.Records
  alias Larder.Table.Writer

  @chunk 5_000

  @doc """
  Writes `records`, already checked (a proper list of maps that hold the
  table's key field: `Larder.Table.insert_many/2` checks them, and so does
  a replica's Table target, which checks each op as it is made), in chunks
  of #{@chunk}: each chunk one write of the writer, the next chunk's rows
  and index ops computed while the writer applies the one before. `op`
  names the public call in an index function's error (`"insert/2"`,
  `"insert_many/2"`). Raises `ArgumentError` for a table that is gone, or
  an index function that fails (the chunks before it written).
  """
  @spec insert!(Larder.Table.t(), [map()], String.t()) :: :ok
  def insert!(table, records, op) do
    live!(table)
    await!(table, write_chunks!(table, records, nil, {op, 0}))
    :ok
  end

  # Takes the chunks of @chunk records one by one (Stream.chunk_every/2
  # cost about 5% of a build). Returns the last chunk's request. `done`
  # counts the records of the chunks before this one, for the error of an
  # index function that fails (index_failed!/4).
  defp write_chunks!(_table, [], pending, _progress), do: pending

  defp write_chunks!(table, records, pending, {op, done}) do
    {chunk, rest} = take_chunk(records, :persistent_term.get(:larder_chunk, @chunk), [])

    # The index functions run here, in the caller, which builds the rows
    # and index ops (Records.write/2); the writer only applies them. One
    # chunk is applied while the next is computed.
    {rows, ops, keyed, span} =
      try do
        Records.write(table, last_per_key(chunk, table))
      rescue
        failure in IndexFailure ->
          await!(table, pending)
          index_failed!(table, op, failure, unwritten(op, done))
      catch
        kind, reason ->
          await!(table, pending)
          :erlang.raise(kind, reason, __STACKTRACE__)
      end

    pending = write_chunk!(table, {rows, ops, keyed, span}, pending)
    write_chunks!(table, rest, pending, {op, done + length(chunk)})
  end

  # What became of an insert whose index function failed, `done` records
  # of it written before.
  defp unwritten("insert/2", _done), do: "the write was not applied"
  defp unwritten(_op, 0), do: "the write was not applied (none of its records was written)"

  defp unwritten(_op, done) do
    "the write stopped there (its first #{done} records were written, in whole chunks " <>
      "of #{@chunk}; none from record #{done + 1} on)"
  end

  defp take_chunk([record | rest], n, chunk) when n > 0,
    do: take_chunk(rest, n - 1, [record | chunk])

  defp take_chunk(rest, _n, chunk), do: {:lists.reverse(chunk), rest}

  # Sends a chunk's write and awaits the previous one; returns the request
  # to await for this chunk's outcome. A large chunk of fresh rows (as in a
  # build) goes into ETS from the caller, under a claim (Larder.Table.Claim).
  defp write_chunk!(table, {rows, ops, _keyed, span} = write, pending) do
    case Claim.request(write) do
      nil ->
        request = send!(table, Tuple.insert_at(write, 0, :insert))
        await!(table, pending)
        request

      claim ->
        claim = send!(table, claim)
        await!(table, pending)

        case await!(table, claim) do
          {:claimed, ref} ->
            case Claim.fill(table, rows, ref) do
              {:ok, release} ->
                release

              # The table is gone (await! says so), or else the insert's
              # error is the caller's.
              {{:raise, kind, reason, stack}, release} ->
                await!(table, release)
                :erlang.raise(kind, reason, stack)
            end

          :stale ->
            send!(table, {:insert, rows, ops, [], span})
        end
    end
  end

  # Within one chunk a key given twice must be reduced to its last record.
  # Keys in ascending order (as in a build) are distinct without a map.
  defp last_per_key(chunk, table) do
    if ascending?(chunk, table.key, nil) do
      chunk
    else
      by_key = Map.new(chunk, &{:erlang.map_get(table.key, &1), &1})
      if map_size(by_key) == length(chunk), do: chunk, else: Map.values(by_key)
    end
  end

  defp ascending?([record | rest], field, previous) do
    case :erlang.map_get(field, record) do
      key when is_integer(key) and (previous == nil or key > previous) ->
        ascending?(rest, field, key)

      _ ->
        false
    end
  end

  defp ascending?([], _field, _previous), do: true

  @doc "Sends `request` to the table's writer and returns its reply (a raise there is raised here)."
  @spec write!(Larder.Table.t(), term()) :: term()
  def write!(table, request), do: await!(table, send!(table, request))

  @doc """
  Sends `request` to the table's writer without waiting: the request to
  give `await!/2`. Raises `ArgumentError` for a table that is gone, or
  when called from a function the writer runs.
  """
  @spec send!(Larder.Table.t(), term()) :: :gen_server.request_id()
  def send!(table, request) do
    live!(table)
    not_from_writer!()
    :gen_server.send_request(table.writer, request)
  end

  @doc "Raises `ArgumentError` when called from a function a table's writer runs."
  @spec not_from_writer!() :: :ok
  def not_from_writer! do
    if Writer.writer?() do
      raise ArgumentError,
            "Larder.Table writes cannot be made from a function that a table's writer runs " <>
              "(an update/4 function or an index function): two such writes could wait " <>
              "on each other for ever"
    end

    :ok
  end

  @doc "The writer's reply to `request` (nil: none, `:ok`)."
  @spec await!(Larder.Table.t(), :gen_server.request_id() | nil) :: term()
  def await!(_table, nil), do: :ok

  def await!(table, request) do
    case :gen_server.receive_response(request, :infinity) do
      {:reply, {:raise, kind, reason, stack}} -> :erlang.raise(kind, reason, stack)
      {:reply, reply} -> reply
      {:error, _} -> gone!(table)
    end
  end

  @doc """
  Raises the error of a write whose index function failed (raised, threw
  or exited): an ArgumentError that names the table, the index, the
  operation, the record's key and what became of the write (`outcome`),
  with the original's message; its stacktrace is the index function's.
  """
  @spec index_failed!(Larder.Table.t(), String.t(), IndexFailure.t(), String.t()) :: no_return()
  def index_failed!(table, op, %IndexFailure{} = failure, outcome) do
    verb =
      case failure.kind do
        :error -> "raised"
        :throw -> "threw"
        :exit -> "exited"
      end

    message =
      "#{Instance.describe(Larder.Table, table.name, table)}: the index function of " <>
        "#{inspect(failure.index, limit: 10)} #{verb} on the record with key " <>
        "#{inspect(failure.key, limit: 10)} in #{op}, and #{outcome}: " <>
        IndexFailure.banner(failure)

    reraise ArgumentError, message, failure.stacktrace
  end

  @doc "Runs `fun.(table)`, a write, in a `[:larder, :table, :write]` span when the table emits events."
  @spec span(Larder.Table.t(), atom(), map(), (Larder.Table.t() -> result)) :: result
        when result: term()
  def span(%Larder.Table{telemetry: true} = table, op, meta, fun) do
    meta = Map.merge(%{table: id(table), op: op}, meta)

    Larder.Telemetry.span(true, [:larder, :table, :write], meta, fn ->
      result = fun.(table)
      {result, Map.put(meta, :result, if(result == :error, do: :not_found, else: :ok))}
    end)
  end

  def span(table, _op, _meta, fun), do: fun.(table)

  defp id(%Larder.Table{name: nil} = table), do: table
  defp id(%Larder.Table{name: name}), do: name

  @doc "True when the table exists and the handle is its own (its writer owns its rows); raises otherwise."
  @spec live!(Larder.Table.t()) :: true
  def live!(table) do
    if valid?(table), do: true, else: gone!(table)
  end

  @doc "Whether the table exists and the handle is its own."
  @spec valid?(term()) :: boolean()
  def valid?(%Larder.Table{rows: rows, writer: writer}) when is_pid(writer) do
    :ets.info(rows, :owner) == writer
  rescue
    ArgumentError -> false
  end

  def valid?(_table), do: false

  @doc "Raises the `ArgumentError` of a table that is gone (\"unknown Larder.Table ...\")."
  @spec gone!(Larder.Table.t()) :: no_return()
  def gone!(%Larder.Table{name: nil} = table), do: Instance.unknown!(Larder.Table, table)
  def gone!(%Larder.Table{name: name}), do: Instance.unknown!(Larder.Table, name)
end
