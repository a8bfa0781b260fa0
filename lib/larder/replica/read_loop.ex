# The read loop of a replica, the same for every source: connect, tell the
# source what is committed, read, and classify what came back (a batch,
# nothing, a trim, a stop, an error); after an error close the connection
# and wait 100 ms, doubling up to 1 s, before connecting again; a warning
# once per outage and an info line once the source answers again; a batch
# too large for the source (`:batch_too_large`) read in halves from then on.
# A data structure, no process: the reader (Larder.Replica.Reader) runs it,
# so the process that connects is the one that reads, notifies and closes.
defmodule Larder.Replica.ReadLoop do
  @moduledoc false

  require Logger

  @min_wait_ms 100
  # A source back up is met within a second (plus a connect).
  @max_wait_ms 1_000

  @enforce_keys [:source, :opts, :position, :count, :block_ms, :name]
  defstruct @enforce_keys ++
              [
                :conn,
                # the last committed position (Source.committed/2), and
                # whether this connection has been told it
                :committed,
                # whether `conn` is a connection (a source's may be nil)
                connected: false,
                told: false,
                wait: @min_wait_ms,
                failing: false
              ]

  @type t :: %__MODULE__{
          source: module(),
          opts: keyword(),
          position: term(),
          count: pos_integer(),
          block_ms: non_neg_integer(),
          name: atom(),
          conn: term(),
          connected: boolean(),
          committed: term(),
          told: boolean(),
          wait: pos_integer(),
          failing: boolean()
        }

  @typedoc """
  What one step found: connected; a batch (`position_after` may be past
  the last entry, even with none); nothing (the position did not move); a
  trim (`resume` is where reading goes on); a stop (the log cannot be
  followed); or an error, after which the step returns the wait before the
  next one (the connection is closed).
  """
  @type event ::
          :connected
          | {:batch, [{term(), term()}], term()}
          | :empty
          | {:trimmed, term()}
          | {:stop, Larder.Error.t()}
          | {:error, Larder.Error.t(), pos_integer()}

  @doc """
  A loop reading `source` (options `opts`) from `position`, `count` entries
  at most per read, each read waiting up to `block_ms` for entries (0 for a
  source that notifies). `position` counts as committed (see
  `Larder.Replica.Source`). `name` is the replica's, for the log.
  """
  @spec new(module(), keyword(), term(), pos_integer(), non_neg_integer(), atom()) :: t()
  def new(source, opts, position, count, block_ms, name) do
    %__MODULE__{
      source: source,
      opts: opts,
      position: position,
      committed: position,
      count: count,
      block_ms: block_ms,
      name: name
    }
  end

  @doc "Whether the source implements the optional `notify/2` (its reads do not wait)."
  @spec notifies?(module()) :: boolean()
  def notifies?(source), do: exported?(source, :notify, 2)

  @doc "Whether the last connect, read or notice failed (and no read has succeeded since)."
  @spec failing?(t()) :: boolean()
  def failing?(%__MODULE__{failing: failing}), do: failing

  @doc """
  One step, in the calling process: a connect (and the committed position
  told to the new connection) when there is none, or else the committed
  position told if it moved, then one read from the loop's position, which
  moves to the batch's `position_after`.
  """
  @spec step(t()) :: {event(), t()}
  def step(%__MODULE__{connected: false} = loop) do
    case call(loop, :connect, [loop.opts]) do
      {:ok, conn} -> tell(%{loop | conn: conn, connected: true, told: false}, :connected)
      {:error, %Larder.Error{} = error} -> failed(loop, error)
      {:error, %Larder.Error{} = error, _raised} -> failed(loop, error)
      other -> failed(loop, bad_return(loop, :connect, other))
    end
  end

  def step(%__MODULE__{told: false} = loop), do: tell(loop, :read)
  def step(loop), do: read(loop)

  # Tells the connection the committed position (if the source takes it),
  # then reads, or reports the connect.
  defp tell(loop, next) do
    result =
      if exported?(loop.source, :committed, 2),
        do: call(loop, :committed, [loop.conn, loop.committed]),
        else: {:ok, loop.conn}

    case result do
      {:ok, conn} ->
        loop = %{loop | conn: conn, told: true}
        if next == :connected, do: {:connected, loop}, else: read(loop)

      {:error, %Larder.Error{} = error, conn} ->
        closed(%{loop | conn: conn}, error)

      other ->
        closed(loop, bad_return(loop, :committed, other))
    end
  end

  defp read(loop) do
    position = loop.position

    case call(loop, :read, [loop.conn, position, loop.count, loop.block_ms]) do
      {:ok, [], ^position, conn} ->
        {:empty, recovered(%{loop | conn: conn})}

      {:ok, entries, position_after, conn} when is_list(entries) ->
        {{:batch, entries, position_after},
         recovered(%{loop | conn: conn, position: position_after})}

      {:trimmed, resume, conn} ->
        {{:trimmed, resume}, recovered(%{loop | conn: conn})}

      {:stop, %Larder.Error{} = error, conn} ->
        {{:stop, error}, %{loop | conn: conn}}

      {:error, %Larder.Error{} = error, conn} ->
        closed(%{loop | conn: conn}, error)

      other ->
        closed(loop, bad_return(loop, :read, other))
    end
  end

  @doc """
  Asks a notifying source for a notice to `pid` once there is something to
  read (after an `:empty` step): `:armed` (wait for `:larder_source_ready`,
  and read again after `block_ms` at the latest), `:ready` (read now), or
  an error as a step's.
  """
  @spec await_notice(t(), pid()) ::
          {:armed | :ready, t()} | {{:error, Larder.Error.t(), pos_integer()}, t()}
  def await_notice(loop, pid) do
    case call(loop, :notify, [loop.conn, pid]) do
      {:armed, conn} -> {:armed, %{loop | conn: conn}}
      {:ready, conn} -> {:ready, %{loop | conn: conn}}
      {:error, %Larder.Error{} = error, conn} -> closed(%{loop | conn: conn}, error)
      other -> closed(loop, bad_return(loop, :notify, other))
    end
  end

  @doc """
  A snapshot holding `position` is durable: the source is told at the next
  step (on this connection, or the next one after a connect).
  """
  @spec committed(t(), term()) :: t()
  def committed(loop, position), do: %{loop | committed: position, told: false}

  @doc "Reading goes on from `position` (after a trim, once the replica rebuilt)."
  @spec resume(t(), term()) :: t()
  def resume(loop, position), do: %{loop | position: position}

  @doc "The position the next read reads from."
  @spec position(t()) :: term()
  def position(loop), do: loop.position

  @doc "Closes the connection, if any."
  @spec close(t()) :: t()
  def close(%__MODULE__{connected: false} = loop), do: loop

  def close(loop) do
    _ = call(loop, :close, [loop.conn])
    %{loop | conn: nil, connected: false}
  end

  defp closed(loop, error), do: failed(close(loop), error)

  # Reported by the caller; warned once per outage; the next step after a
  # wait of @min_wait_ms doubling to @max_wait_ms. A batch too large for
  # the source is read in halves (down to one entry) from then on.
  defp failed(loop, error) do
    loop =
      if error.reason == :batch_too_large and loop.count > 1,
        do: %{loop | count: div(loop.count, 2)},
        else: loop

    unless loop.failing do
      Logger.warning(
        "Larder.Replica #{inspect(loop.name)}: the source failed (#{Exception.message(error)}); " <>
          "retrying every #{loop.wait}..#{@max_wait_ms} ms from #{inspect(loop.position)}"
      )
    end

    wait = loop.wait
    {{:error, error, wait}, %{loop | wait: min(wait * 2, @max_wait_ms), failing: true}}
  end

  defp recovered(%__MODULE__{failing: true} = loop) do
    Logger.info("Larder.Replica #{inspect(loop.name)}: the source answers again")
    %{loop | failing: false, wait: @min_wait_ms}
  end

  defp recovered(loop), do: loop

  # A source's callback. One that raises, throws or exits (the contract
  # says it must not) fails as a value, with the connection it was given,
  # as Larder.Replica.Latest takes latest/2's: never the reader's crash.
  defp call(loop, fun, args) do
    apply(loop.source, fun, args)
  catch
    kind, reason ->
      {:error,
       Larder.Error.new(:source_failed, "#{inspect(loop.source)}.#{fun}/#{length(args)} failed",
         reason: {kind, reason}
       ), loop.conn}
  end

  defp bad_return(loop, fun, other) do
    Larder.Error.new(:source_bad_reply, "#{inspect(loop.source)}.#{fun} returned a bad value",
      returned: inspect(other, limit: 5, printable_limit: 100)
    )
  end

  defp exported?(source, fun, arity),
    do: Code.ensure_loaded?(source) and function_exported?(source, fun, arity)
end
