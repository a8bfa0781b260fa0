# The Larder.Replica.Source contract (version 3) as tests, run by every
# source: a test module calls
#
#     use Larder.Test.SourceConformance, source: Module, writes: true, trims: true
#
# (`writes: false` for a log the test cannot write, which then skips the
# tests that need entries; `trims: false` for one it cannot trim;
# `idle_moves: true` for a log whose end moves past records that are not
# entries, written by others than the test: a database's WAL, where other
# tables and the server itself write), and its setup provides in the test
# context:
#
#   :source_opts  options of a fresh, empty log of its own (not validated)
#   :bad_opts     option lists validate!/1 must refuse (besides an unknown key)
#   :append       (writes) fn values -> :ok: appends one entry per binary
#                 value, in order (spread over the log's parts as it likes)
#   :value        (writes) fn fields -> binary: the value an entry read carries
#   :part         (writes) fn entry_id -> term: the part of an entry (the
#                 contract orders entries within a part)
#   :trim         (trims) fn -> :ok: removes every entry but the last of each
#                 part that has any
#
# The tests that read call the source's callbacks in a process of their
# own (the contract's reader); one starts a Larder.Replica over the source,
# through Larder.Test.SourceConformance.Recorder, and checks that every
# call on a connection is made by the reader that made it. For a source
# with resumable?/1, a position a test reconnects at (or commits) is a
# resumable one, and a position that is not, read on a new connection, is
# a trim.
defmodule Larder.Test.SourceConformance do
  @moduledoc false

  import ExUnit.Assertions

  alias Larder.Test.SourceConformance.Recorder

  defmacro __using__(opts) do
    source = Keyword.fetch!(opts, :source)
    writes = Keyword.get(opts, :writes, true)
    trims = Keyword.get(opts, :trims, writes)
    idle_moves = Keyword.get(opts, :idle_moves, false)
    source_module = Macro.expand(source, __CALLER__)
    Code.ensure_loaded!(source_module)
    notifies = function_exported?(source_module, :notify, 2)
    commits = function_exported?(source_module, :committed, 2)
    resumable = function_exported?(source_module, :resumable?, 1)

    quote do
      alias Larder.Test.SourceConformance, as: C

      defmodule Recorder do
        @moduledoc false
        # The source under test, its calls on connections recorded (see
        # Larder.Test.SourceConformance.Recorder).

        @behaviour Larder.Replica.Source

        alias Larder.Test.SourceConformance.Recorder, as: R

        @source unquote(source)

        @impl true
        def validate!(opts), do: opts
        @impl true
        def identity(opts), do: @source.identity(opts[:opts])
        @impl true
        def origin(opts), do: @source.origin(opts[:opts])
        @impl true
        def cast_position(position), do: @source.cast_position(position)
        @impl true
        def advance(position, id), do: @source.advance(position, id)
        @impl true
        def reached?(position, target), do: @source.reached?(position, target)
        @impl true
        def latest(opts, timeout), do: @source.latest(opts[:opts], timeout)

        if unquote(resumable) do
          @impl true
          def resumable?(position), do: @source.resumable?(position)
        end

        @impl true
        def connect(opts), do: R.connect(@source, opts)
        @impl true
        def read(conn, position, count, block_ms),
          do: R.read(@source, conn, position, count, block_ms)

        @impl true
        def committed(conn, position), do: R.committed(@source, conn, position)
        @impl true
        def close(conn), do: R.close(@source, conn)

        if unquote(notifies) do
          @impl true
          def notify(conn, pid), do: R.notify(@source, conn, pid)
        end
      end

      describe "Larder.Replica.Source conformance" do
        test "validate!/1 takes the options, and refuses bad ones and unknown keys", ctx do
          C.options(unquote(source), ctx)
        end

        test "positions: origin/1, cast_position/1 of garbage, identity/1", ctx do
          C.positions(unquote(source), ctx)
        end

        test "an empty log: reads nothing, and latest/2 is where reading stops", ctx do
          C.empty(unquote(source), ctx, unquote(idle_moves))
        end

        test "a replica: connect/1 and every call on the connection in its reader", ctx do
          C.replica(unquote(source), __MODULE__.Recorder, ctx, unquote(writes))
        end

        if unquote(writes) do
          test "reads every entry from the origin once, in order, up to latest/2; " <>
                 "positions consistent",
               ctx do
            C.read_all(unquote(source), ctx, unquote(idle_moves))
          end

          test "reads from a middle position what follows it, on a new connection", ctx do
            C.from_middle(unquote(source), ctx)
          end

          test "latest/2 moves with writes", ctx do
            C.latest(unquote(source), ctx)
          end
        end

        if unquote(trims) do
          test "entries lost after the position are a trim, and reading resumes with " <>
                 "what is left",
               ctx do
            C.trim(unquote(source), ctx)
          end
        end

        if unquote(resumable and writes) do
          test "a position that is not resumable, read on a new connection, is a trim", ctx do
            C.not_resumable(unquote(source), ctx)
          end
        end

        if unquote(notifies and writes) do
          test "notify/2: a notice once something can be read", ctx do
            C.notice(unquote(source), ctx)
          end
        end

        if unquote(commits) do
          test "committed/2 takes the origin and positions read, and reading goes on", ctx do
            C.committed(unquote(source), ctx, unquote(writes))
          end
        end
      end
    end
  end

  # The most reads a test makes to get somewhere: a bound, not a speed.
  @max_reads 400

  @doc false
  def options(source, ctx) do
    opts = source.validate!(ctx.source_opts)
    assert Keyword.keyword?(opts)
    # validated options validate again to themselves
    assert source.validate!(opts) == opts

    error =
      assert_raise ArgumentError, fn ->
        source.validate!(ctx.source_opts ++ [conformance_unknown: 1])
      end

    assert Exception.message(error) =~ "conformance_unknown"
    assert_raise ArgumentError, fn -> source.validate!(:not_a_list) end

    for bad <- Map.get(ctx, :bad_opts, []) do
      assert_raise ArgumentError, fn -> source.validate!(bad) end
    end
  end

  @doc false
  def positions(source, ctx) do
    opts = source.validate!(ctx.source_opts)
    origin = source.origin(opts)
    assert source.cast_position(origin) == {:ok, origin}
    assert source.cast_position(stored(origin)) == {:ok, origin}
    assert source.reached?(origin, origin)

    for garbage <- [make_ref(), self(), {:garbage, make_ref()}, "not a position\0", [:x | :y]] do
      assert source.cast_position(garbage) == :error, "cast_position(#{inspect(garbage)})"
    end

    identity = source.identity(opts)
    assert is_binary(identity) and identity == source.identity(source.validate!(ctx.source_opts))
  end

  @doc false
  def empty(source, ctx, idle_moves) do
    opts = source.validate!(ctx.source_opts)
    origin = source.origin(opts)
    {:ok, latest} = source.latest(opts, 30_000)
    assert source.reached?(origin, latest)

    in_reader(fn ->
      {:ok, conn} = source.connect(opts)
      {entries, position, conn} = read_to(source, conn, origin, latest, 5)
      assert entries == []
      assert source.reached?(position, origin)
      conn = at_end(source, conn, position, idle_moves && opts)
      assert source.close(conn) == :ok
    end)
  end

  @doc false
  def replica(source, recorder, ctx, writes) do
    opts = source.validate!(ctx.source_opts)
    table = :ets.new(Recorder, [:public, :duplicate_bag])
    values = for i <- 1..20, do: value(i)
    if writes, do: ctx.append.(values)
    value = Map.get(ctx, :value, fn _ -> "none" end)
    name = :"#{inspect(ctx.module)} #{ctx.test}"
    dir = Path.join(System.tmp_dir!(), "larder-conformance-#{System.unique_integer([:positive])}")
    File.mkdir_p!(dir)
    ExUnit.Callbacks.on_exit(fn -> File.rm_rf(dir) end)

    {:ok, replica} =
      Larder.Replica.start_link(
        name: name,
        into: {Larder.Bag, []},
        source: {recorder, opts: opts, table: table},
        apply: fn fields -> {:insert, value.(fields), true} end,
        snapshot: Path.join(dir, "r.snap"),
        batch_size: 7,
        block_ms: 200
      )

    assert Larder.Replica.await(replica, :latest, 60_000) == :ok
    bag = Larder.Replica.target(replica)
    if writes, do: assert(Enum.sort(Larder.Bag.keys(bag)) == values)
    {:ok, offset} = Larder.Replica.dump(replica)
    reader = :sys.get_state(replica).reader

    # the snapshot's position told, once it is committed (when it moved)
    if function_exported?(source, :committed, 2) and writes do
      Larder.Test.Eventually.eventually(fn ->
        Enum.any?(Recorder.calls(table), &match?({:committed, _, ^offset}, &1))
      end)
    end

    # (a log with nothing to read answers await/3 before the reader may
    # have connected)
    Larder.Test.Eventually.eventually(fn ->
      Enum.any?(Recorder.calls(table), &match?({:connect, _, _}, &1))
    end)

    :ok = Larder.Replica.drop(replica)
    calls = Recorder.calls(table)
    assert [{:connect, ^reader} | _] = for({call, pid, _arg} <- calls, do: {call, pid})

    for {call, pid, _arg} <- calls, call in [:connect, :read, :notify, :committed, :close] do
      assert pid == reader, "#{call} called by #{inspect(pid)}, not the reader #{inspect(reader)}"
    end

    assert reader != replica
  end

  @doc false
  def read_all(source, ctx, idle_moves) do
    opts = source.validate!(ctx.source_opts)
    values = for i <- 1..25, do: value(i)
    :ok = ctx.append.(values)
    {:ok, latest} = source.latest(opts, 30_000)
    origin = source.origin(opts)
    refute source.reached?(origin, latest)

    in_reader(fn ->
      {:ok, conn} = source.connect(opts)
      {entries, position, conn} = read_to(source, conn, origin, latest, 7)
      assert source.reached?(position, latest)
      check_order(ctx, entries, values)
      conn = at_end(source, conn, position, idle_moves && opts)
      source.close(conn)
    end)
  end

  @doc false
  def from_middle(source, ctx) do
    opts = source.validate!(ctx.source_opts)
    values = for i <- 1..20, do: value(i)
    :ok = ctx.append.(values)
    {:ok, latest} = source.latest(opts, 30_000)

    in_reader(fn ->
      {:ok, conn} = source.connect(opts)
      {first, middle, conn} = read_resumable(source, conn, source.origin(opts), 5)
      source.close(conn)
      assert first != []

      {:ok, conn} = source.connect(opts)
      {rest, _position, conn} = read_to(source, conn, stored(middle), latest, 5)
      check_order(ctx, first ++ rest, values)
      source.close(conn)
    end)
  end

  @doc false
  def latest(source, ctx) do
    opts = source.validate!(ctx.source_opts)
    :ok = ctx.append.([value(1), value(2)])
    {:ok, before} = source.latest(opts, 30_000)
    :ok = ctx.append.([value(3)])
    {:ok, later} = source.latest(opts, 30_000)
    assert source.reached?(later, before)
    refute source.reached?(before, later)
    assert source.cast_position(stored(later)) == {:ok, later}
  end

  @doc false
  def trim(source, ctx) do
    opts = source.validate!(ctx.source_opts)
    values = for i <- 1..12, do: value(i)
    :ok = ctx.append.(values)
    {:ok, latest} = source.latest(opts, 30_000)

    in_reader(fn ->
      {:ok, conn} = source.connect(opts)
      origin = source.origin(opts)
      {all, _end, conn} = read_to(source, conn, origin, latest, 12)
      source.close(conn)
      # the last value of each part: what the trim leaves
      left =
        all
        |> Enum.group_by(&ctx.part.(elem(&1, 0)))
        |> Enum.map(fn {_, e} -> ctx.value.(elem(List.last(e), 1)) end)

      {:ok, conn} = source.connect(opts)
      {[_ | _], after_first, conn} = read_resumable(source, conn, origin, 1)
      source.close(conn)

      :ok = ctx.trim.()
      {:ok, conn} = source.connect(opts)
      assert {:trimmed, resume, conn} = read_past_empty(source, conn, after_first)
      assert source.cast_position(stored(resume)) == {:ok, resume}
      {rest, _position, conn} = read_to(source, conn, resume, latest, 12)
      assert Enum.sort(Enum.map(rest, &ctx.value.(elem(&1, 1)))) == Enum.sort(left)
      source.close(conn)
    end)
  end

  @doc false
  def not_resumable(source, ctx) do
    opts = source.validate!(ctx.source_opts)
    values = for i <- 1..12, do: value(i)
    :ok = ctx.append.(values)
    {:ok, latest} = source.latest(opts, 30_000)

    in_reader(fn ->
      {:ok, conn} = source.connect(opts)
      origin = source.origin(opts)
      {read, position, conn} = read_some(source, conn, origin, 5)

      # a log whose entries are all at resumable positions (a source that
      # copies nothing first) has nothing to show here
      if source.resumable?(position) do
        source.close(conn)
      else
        source.close(conn)
        {:ok, conn} = source.connect(opts)
        assert {:trimmed, resume, conn} = read_past_empty(source, conn, stored(position))
        assert source.cast_position(stored(resume)) == {:ok, resume}
        assert source.resumable?(resume)
        refute read == []
        # reading from where it resumes reads every entry again
        {all, _position, conn} = read_to(source, conn, resume, latest, 5)
        check_order(ctx, all, values)
        source.close(conn)
      end
    end)
  end

  @doc false
  def notice(source, ctx) do
    opts = source.validate!(ctx.source_opts)
    :ok = ctx.append.([value(1)])
    {:ok, latest} = source.latest(opts, 30_000)

    in_reader(fn ->
      {:ok, conn} = source.connect(opts)
      {_entries, position, conn} = read_to(source, conn, source.origin(opts), latest, 5)
      :ok = ctx.append.([value(2)])
      {found, conn} = await_value(source, ctx, conn, position, value(2), @max_reads)
      assert found
      source.close(conn)
    end)
  end

  @doc false
  def committed(source, ctx, writes) do
    opts = source.validate!(ctx.source_opts)
    if writes, do: :ok = ctx.append.(for(i <- 1..10, do: value(i)))
    {:ok, latest} = source.latest(opts, 30_000)

    in_reader(fn ->
      {:ok, conn} = source.connect(opts)
      origin = source.origin(opts)
      assert {:ok, conn} = source.committed(conn, origin)
      {first, middle, conn} = read_resumable(source, conn, origin, 3)
      assert {:ok, conn} = source.committed(conn, middle)
      {rest, position, conn} = read_to(source, conn, middle, latest, 3)
      assert source.reached?(position, latest)
      if writes, do: check_order(ctx, first ++ rest, for(i <- 1..10, do: value(i)))
      source.close(conn)
    end)
  end

  ## Helpers

  # A value that sorts in append order.
  defp value(i), do: "v" <> String.pad_leading(Integer.to_string(i), 6, "0")

  # A position as a snapshot gives it back.
  defp stored(position), do: :erlang.binary_to_term(:erlang.term_to_binary(position))

  # Runs `fun` in a process of its own, as the replica's reader does, and
  # waits for it (its assertions fail the test).
  defp in_reader(fun) do
    task = Task.async(fn -> fun.() end)
    Task.await(task, 120_000)
  end

  # Reads from `position` until it has reached `target`: {entries,
  # position, conn}. Checks each batch against the contract: at most
  # `count` entries, `position_after` at or past the entries' positions,
  # each position one cast_position/1 takes back, each entry moving the
  # position forward.
  defp read_to(source, conn, position, target, count),
    do: read_to(source, conn, position, target, count, [], @max_reads)

  defp read_to(source, conn, position, target, count, acc, tries) do
    if source.reached?(position, target) do
      {Enum.reverse(acc), position, conn}
    else
      assert tries > 0, "the position #{inspect(position)} never reached #{inspect(target)}"

      case source.read(conn, position, count, 100) do
        {:ok, entries, position_after, conn} ->
          check_batch(source, position, entries, position_after, count)
          acc = Enum.reverse(entries, acc)
          read_to(source, conn, position_after, target, count, acc, tries - 1)

        other ->
          flunk("read/4 from #{inspect(position)} returned #{inspect(other, limit: 10)}")
      end
    end
  end

  # At the log's end a read returns nothing, and a position equal to the
  # one given (each reached by the other: a source may fill in parts it
  # had left out, as Kafka's first read puts every partition in). With
  # `idle_moves` (the source's options), a log whose end moves past
  # records that are not entries: a position at or past the one given,
  # and not past the log's end.
  defp at_end(source, conn, position, false) do
    assert {:ok, [], after_end, conn} = source.read(conn, position, 5, 100)
    assert source.reached?(after_end, position) and source.reached?(position, after_end)
    conn
  end

  defp at_end(source, conn, position, opts) do
    assert {:ok, [], after_end, conn} = source.read(conn, position, 5, 100)
    {:ok, latest} = source.latest(opts, 30_000)
    assert source.reached?(after_end, position) and source.reached?(latest, after_end)
    conn
  end

  # Reads from `position` until some entries come: {entries, position_after, conn}.
  defp read_some(source, conn, position, count, tries \\ @max_reads) do
    assert tries > 0, "no entries came"

    case source.read(conn, position, count, 100) do
      {:ok, [], position_after, conn} ->
        check_batch(source, position, [], position_after, count)
        read_some(source, conn, position_after, count, tries - 1)

      {:ok, entries, position_after, conn} ->
        check_batch(source, position, entries, position_after, count)
        {entries, position_after, conn}

      other ->
        flunk("read/4 from #{inspect(position)} returned #{inspect(other, limit: 10)}")
    end
  end

  # Reads from `position` until some entries came and the position is
  # one a new connection can read on from (every position, for a source
  # without resumable?/1): {entries, position_after, conn}.
  defp read_resumable(source, conn, position, count) do
    {entries, position, conn} = read_some(source, conn, position, count)
    resumable_after(source, conn, position, count, Enum.reverse(entries), @max_reads)
  end

  defp resumable_after(source, conn, position, count, acc, tries) do
    if not function_exported?(source, :resumable?, 1) or source.resumable?(position) do
      {Enum.reverse(acc), position, conn}
    else
      assert tries > 0, "the position never became resumable: #{inspect(position)}"

      case source.read(conn, position, count, 100) do
        {:ok, entries, position_after, conn} ->
          check_batch(source, position, entries, position_after, count)
          acc = Enum.reverse(entries, acc)
          resumable_after(source, conn, position_after, count, acc, tries - 1)

        other ->
          flunk("read/4 from #{inspect(position)} returned #{inspect(other, limit: 10)}")
      end
    end
  end

  # The first read that is not empty (a source may see its log's state
  # only once it reads).
  defp read_past_empty(source, conn, position, tries \\ @max_reads) do
    case source.read(conn, position, 12, 100) do
      {:ok, [], ^position, conn} when tries > 0 ->
        read_past_empty(source, conn, position, tries - 1)

      other ->
        other
    end
  end

  defp check_batch(source, position, entries, position_after, count) do
    assert length(entries) <= count

    folded =
      Enum.reduce(entries, position, fn {id, _fields}, at ->
        next = source.advance(at, id)
        assert source.reached?(next, at)
        refute source.reached?(at, next), "the entry #{inspect(id)} did not move the position"
        next
      end)

    assert source.reached?(position_after, folded)
    assert source.cast_position(stored(position_after)) == {:ok, position_after}
  end

  # Every value once, and each part's values in the order appended.
  defp check_order(ctx, entries, values) do
    read = Enum.map(entries, fn {_id, fields} -> ctx.value.(fields) end)
    assert Enum.sort(read) == Enum.sort(values)

    for {_part, in_part} <- Enum.group_by(entries, &ctx.part.(elem(&1, 0))) do
      part_values = Enum.map(in_part, &ctx.value.(elem(&1, 1)))
      assert part_values == Enum.sort(part_values)
    end
  end

  # Reads on until `wanted` comes, asking for a notice whenever a read is
  # empty and waiting for it: {found, conn}.
  defp await_value(_source, _ctx, conn, _position, _wanted, 0), do: {false, conn}

  defp await_value(source, ctx, conn, position, wanted, tries) do
    case source.read(conn, position, 5, 0) do
      {:ok, [], ^position, conn} ->
        case source.notify(conn, self()) do
          {:armed, conn} ->
            assert_receive :larder_source_ready, 30_000
            await_value(source, ctx, conn, position, wanted, tries - 1)

          {:ready, conn} ->
            await_value(source, ctx, conn, position, wanted, tries - 1)
        end

      {:ok, entries, position_after, conn} ->
        if Enum.any?(entries, &(ctx.value.(elem(&1, 1)) == wanted)),
          do: {true, conn},
          else: await_value(source, ctx, conn, position_after, wanted, tries - 1)
    end
  end
end

defmodule Larder.Test.SourceConformance.Recorder do
  @moduledoc false
  # What the Recorder a conformance test module defines does around the
  # source under test: records each call that makes or takes a connection
  # (in `table:`, a public :duplicate_bag, with the calling process) and
  # passes it on; its options are `opts:` (the source's, validated) and
  # `table:`. committed/2 is passed on only to a source that implements it.

  @doc "The calls recorded: `{call, pid, arg}`, in order (arg: committed/2's position)."
  def calls(table) do
    table
    |> :ets.tab2list()
    |> Enum.sort()
    |> Enum.map(fn {_n, call, pid, arg} -> {call, pid, arg} end)
  end

  defp record(table, call, arg \\ nil),
    do: :ets.insert(table, {System.unique_integer([:monotonic]), call, self(), arg})

  def connect(source, opts) do
    record(opts[:table], :connect)

    case source.connect(opts[:opts]) do
      {:ok, conn} -> {:ok, {opts[:table], conn}}
      error -> error
    end
  end

  def read(source, {table, conn}, position, count, block_ms) do
    record(table, :read)
    result = source.read(conn, position, count, block_ms)
    last = tuple_size(result) - 1
    put_elem(result, last, {table, elem(result, last)})
  end

  def committed(source, {table, conn}, position) do
    record(table, :committed, position)

    if function_exported?(source, :committed, 2) do
      case source.committed(conn, position) do
        {:ok, conn} -> {:ok, {table, conn}}
        {:error, error, conn} -> {:error, error, {table, conn}}
      end
    else
      {:ok, {table, conn}}
    end
  end

  def close(source, {table, conn}) do
    record(table, :close)
    source.close(conn)
  end

  def notify(source, {table, conn}, pid) do
    record(table, :notify)

    case source.notify(conn, pid) do
      {:error, error, conn} -> {:error, error, {table, conn}}
      {kind, conn} -> {kind, {table, conn}}
    end
  end
end

defmodule Larder.Test.SourceConformance.Logs do
  @moduledoc false
  # The conformance context of the in-memory logs of the test support.

  alias Larder.Test.PartitionedSource

  @doc """
  The context of `log` (a Larder.Test.PartitionedSource table), appended
  to through `module` (its own, or NotifyingSource's, which sends notices):
  values spread over the partitions in turn.
  """
  def partitioned(module, log) do
    partitions = :ets.lookup_element(log, :partitions, 2)

    %{
      source_opts: [table: log],
      bad_opts: [[table: :not_a_table], [name: "a log without its table"], [table: log, name: ""]],
      append: fn values ->
        for value <- values do
          n = :ets.update_counter(log, :conformance_appended, 1, {:conformance_appended, 0})
          module.append(log, rem(n, partitions), %{"v" => value})
        end

        :ok
      end,
      value: fn fields -> fields["v"] end,
      part: fn {partition, _offset} -> partition end,
      trim: fn ->
        for p <- 0..(partitions - 1),
            last = :ets.lookup_element(log, {:end, p}, 2),
            last > 0,
            do: PartitionedSource.trim(log, p, last - 1)

        :ok
      end
    }
  end
end
