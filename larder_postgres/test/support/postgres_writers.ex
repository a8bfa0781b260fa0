# Writers of a key/value table (`k int PRIMARY KEY, v text`, REPLICA
# IDENTITY FULL) for the tests of Larder.Replica.Postgres, and the check
# of a replica against them. Each writer runs transactions of one to three
# statements: an upsert of a random key to a value no other write gives
# ("w<writer>-<n>"), or a delete of a random key (RETURNING the value it
# deleted). What a commit acknowledged goes into a public ETS table, as
# the entries it made: `{:row, k, v}` for an upsert, `{:delete, k, v}`
# for a delete that found its row. A writer whose connection fails (the
# server killed, restarting) connects again and goes on: its transaction
# then may or may not have committed, and is not recorded.
#
# The replica's side: `apply/2` is an arity-1 apply function that also
# records, in another such table, every entry it is given in the same
# shape (a copied row is a `:row`), so a test sees whether an entry was
# lost (acknowledged, never applied) or applied twice (every value is
# written once, so an entry given twice is a duplicate).
defmodule Larder.Test.PostgresWriters do
  @moduledoc false

  alias Larder.Postgres.{Connection, Options}

  @doc """
  Starts `count` writers of `table` over keys `1..keys` (linked to the
  caller), recording in `acked` (a public ETS :duplicate_bag). Returns
  their pids.
  """
  def start(opts, table, count, keys, acked) do
    opts = Options.validate!(opts, "writers")
    parent = self()

    for w <- 1..count do
      spawn_link(fn ->
        loop(%{opts: opts, table: table, w: w, keys: keys, acked: acked}, nil, 0, parent)
      end)
    end
  end

  @doc "Stops the writers and waits for them (each finishes its transaction first)."
  def stop(pids) do
    for pid <- pids, do: send(pid, {:stop, self()})

    for pid <- pids,
        do:
          receive(do: ({:stopped, ^pid} -> :ok), after: (60_000 -> raise "a writer did not stop"))

    :ok
  end

  @doc "How many transactions the writers committed so far."
  def committed(acked), do: :ets.info(acked, :size)

  defp loop(state, conn, n, parent) do
    receive do
      {:stop, from} ->
        if conn, do: Connection.close(conn)
        send(from, {:stopped, self()})
    after
      0 ->
        case conn || connect(state) do
          nil ->
            Process.sleep(50)
            loop(state, nil, n, parent)

          conn ->
            {statements, entries} = transaction(state, n)

            case Connection.query(conn, "BEGIN; #{statements} COMMIT", 10_000) do
              {:ok, results, conn} ->
                record(state.acked, entries, results)
                loop(state, conn, n + 1, parent)

              {:error, _error, conn} ->
                Connection.close(conn)
                loop(state, nil, n + 1, parent)
            end
        end
    end
  end

  defp connect(state) do
    case Connection.connect(Keyword.put(state.opts, :timeout, 2_000)) do
      {:ok, conn} -> conn
      {:error, _} -> nil
    end
  end

  # One to three statements; the entries an upsert makes are known before
  # it runs, a delete's from what it returns.
  defp transaction(state, n) do
    Enum.map_reduce(1..(1 + rem(n, 3)), [], fn i, entries ->
      k = :rand.uniform(state.keys)

      if :rand.uniform(10) <= 7 do
        v = "w#{state.w}-#{n}-#{i}"

        {"INSERT INTO #{state.table} (k, v) VALUES (#{k}, '#{v}') " <>
           "ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v;", [{:row, k, v} | entries]}
      else
        {"DELETE FROM #{state.table} WHERE k = #{k} RETURNING k, v;", [:delete | entries]}
      end
    end)
    |> then(fn {statements, entries} -> {Enum.join(statements, " "), Enum.reverse(entries)} end)
  end

  # The results: BEGIN, one per statement, COMMIT.
  defp record(acked, entries, [_begin | results]) do
    entries
    |> Enum.zip(results)
    |> Enum.each(fn
      {{:row, _, _} = row, _} -> :ets.insert(acked, row)
      {:delete, %{rows: [[k, v]]}} -> :ets.insert(acked, {:delete, String.to_integer(k), v})
      {:delete, %{rows: []}} -> :ok
    end)
  end

  @doc """
  An arity-1 apply function for a Table keyed by `:k`, recording each
  entry it is given in `applied` (a public ETS :duplicate_bag).
  """
  def apply(applied) do
    fn
      %{"op" => op, "new" => %{"k" => k, "v" => v}} when op in ["insert", "update"] ->
        k = String.to_integer(k)
        :ets.insert(applied, {:row, k, v})
        {:insert, %{k: k, v: v}}

      %{"op" => "delete", "old" => %{"k" => k} = old} ->
        k = String.to_integer(k)
        :ets.insert(applied, {:delete, k, old["v"]})
        {:delete, k}
    end
  end

  @doc "The table's rows: `%{k => v}`."
  def rows(server, table) do
    Larder.Test.PostgresServer.sql!(server, "SELECT k, v FROM #{table}")
    |> String.split("\n", trim: true)
    |> Map.new(fn line ->
      [k, v] = String.split(line, "|", parts: 2)
      {String.to_integer(k), v}
    end)
  end

  @doc "A Larder.Table's records keyed by `:k`: `%{k => v}`."
  def contents(table), do: table |> Larder.Table.stream() |> Map.new(&{&1.k, &1.v})

  @doc """
  The entries applied more than once, and those acknowledged and never
  applied: `{twice, lost}` (each a list).
  """
  def check(acked, applied) do
    all = :ets.tab2list(applied)

    twice =
      all
      |> Enum.frequencies()
      |> Enum.filter(fn {_entry, n} -> n > 1 end)
      |> Enum.map(&elem(&1, 0))

    applied_set = MapSet.new(all)
    lost = for entry <- :ets.tab2list(acked), not MapSet.member?(applied_set, entry), do: entry
    {twice, lost}
  end
end
