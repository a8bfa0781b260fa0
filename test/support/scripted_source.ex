# A Larder.Replica.Source whose replies a test scripts, for the tests of
# the read loop, the reader and the replica's process: each call of
# connect/1, read/4, notify/2 (Larder.Test.ScriptedSource.Notifying only),
# committed/2 or close/1 takes the next reply queued for that callback (a
# term, or a function of the call's arguments), or else a default, and
# every call is recorded with the process that made it. Positions are
# integers: an entry's id is the position after it. Larder.Test.
# ScriptedSource.Copying's log begins with positions a restart cannot read
# on from (1 to 99).
defmodule Larder.Test.ScriptedSource do
  @moduledoc false

  @behaviour Larder.Replica.Source

  # The script lives in a public ETS table owned by the test:
  #   {{:reply, callback, seq}, reply}   replies queued, in seq order
  #   {{:call, n}, callback, pid, args}  the calls made, in order
  #   {:seq, n}                          the counter of both

  @doc "A new script; its table."
  def new do
    table = :ets.new(__MODULE__, [:public, :ordered_set])
    :ets.insert(table, {:seq, 0})
    table
  end

  @doc "Queues `replies` for `callback` (a term, or a function of the call's arguments)."
  def script(table, callback, replies) do
    for reply <- replies, do: :ets.insert(table, {{:reply, callback, seq(table)}, reply})
    :ok
  end

  @doc "The calls made so far: `{callback, pid, args}`, in order."
  def calls(table) do
    for [callback, pid, args] <- :ets.match(table, {{:call, :_}, :"$1", :"$2", :"$3"}),
        do: {callback, pid, args}
  end

  @doc "The calls of `callback`: `{pid, args}`."
  def calls(table, callback), do: for({^callback, pid, args} <- calls(table), do: {pid, args})

  @doc "Entries with ids `from + 1 .. to`, fields `%{\"n\" => id}`."
  def entries(from, to), do: for(id <- (from + 1)..to//1, do: {id, %{"n" => id}})

  defp seq(table), do: :ets.update_counter(table, :seq, 1)

  @doc false
  # The next reply for `callback`, or the default's.
  def reply(table, callback, args, default) do
    :ets.insert(table, {{:call, seq(table)}, callback, self(), args})

    case :ets.select(table, [{{{:reply, callback, :"$1"}, :"$2"}, [], [{{:"$1", :"$2"}}]}], 1) do
      {[{seq, reply}], _} ->
        :ets.delete(table, {:reply, callback, seq})
        if is_function(reply), do: apply(reply, args), else: reply

      _ ->
        apply(default, args)
    end
  end

  @impl true
  def validate!(opts) do
    Larder.Options.validate!(
      opts,
      [script: {{:custom, "a script's table", &is_reference/1}, :required}],
      "Larder.Test.ScriptedSource"
    )
  end

  @impl true
  def identity(_opts), do: "scripted"

  @impl true
  def origin(_opts), do: 0

  @impl true
  def cast_position(position) when is_integer(position) and position >= 0, do: {:ok, position}
  def cast_position(_other), do: :error

  @impl true
  def advance(_position, id), do: id

  @impl true
  def reached?(position, target), do: position >= target

  @impl true
  def connect(opts), do: reply(opts[:script], :connect, [opts], fn _ -> {:ok, opts[:script]} end)

  @impl true
  def read(table, position, count, block_ms) do
    reply(table, :read, [table, position, count, block_ms], fn conn, position, _, block_ms ->
      Process.sleep(min(block_ms, 10))
      {:ok, [], position, conn}
    end)
  end

  @impl true
  def committed(table, position),
    do: reply(table, :committed, [table, position], fn conn, _ -> {:ok, conn} end)

  @impl true
  def close(table), do: reply(table, :close, [table], fn _ -> :ok end)

  @impl true
  def latest(opts, timeout),
    do: reply(opts[:script], :latest, [opts, timeout], fn _, _ -> {:ok, 0} end)

  defmodule Copying do
    @moduledoc false
    # Larder.Test.ScriptedSource whose positions 1 to 99 are not resumable
    # (a copy's, as Larder.Replica.Postgres's initial copy): its log begins
    # with 99 entries that a restart cannot read on from.

    @behaviour Larder.Replica.Source

    alias Larder.Test.ScriptedSource, as: S

    @impl true
    defdelegate validate!(opts), to: S
    @impl true
    def identity(_opts), do: "scripted, copying"
    @impl true
    defdelegate origin(opts), to: S
    @impl true
    defdelegate cast_position(position), to: S
    @impl true
    defdelegate advance(position, id), to: S
    @impl true
    defdelegate reached?(position, target), to: S
    @impl true
    def resumable?(position), do: position not in 1..99
    @impl true
    defdelegate connect(opts), to: S
    @impl true
    defdelegate read(conn, position, count, block_ms), to: S
    @impl true
    defdelegate committed(conn, position), to: S
    @impl true
    defdelegate close(conn), to: S
    @impl true
    defdelegate latest(opts, timeout), to: S
  end

  defmodule Notifying do
    @moduledoc false
    # Larder.Test.ScriptedSource with notify/2.

    @behaviour Larder.Replica.Source

    alias Larder.Test.ScriptedSource, as: S

    @impl true
    defdelegate validate!(opts), to: S
    @impl true
    defdelegate identity(opts), to: S
    @impl true
    defdelegate origin(opts), to: S
    @impl true
    defdelegate cast_position(position), to: S
    @impl true
    defdelegate advance(position, id), to: S
    @impl true
    defdelegate reached?(position, target), to: S
    @impl true
    defdelegate connect(opts), to: S
    @impl true
    defdelegate read(conn, position, count, block_ms), to: S
    @impl true
    defdelegate committed(conn, position), to: S
    @impl true
    defdelegate close(conn), to: S
    @impl true
    defdelegate latest(opts, timeout), to: S
    @impl true
    def notify(table, pid),
      do: S.reply(table, :notify, [table, pid], fn conn, _ -> {:armed, conn} end)
  end
end
