# The price catalogue as a Postgres table, for larder_postgres's bench and
# the Postgres demo: the table and its publication, a fill through psql's
# \copy, the rows as Larder.Replica.Postgres hands them over (maps of text
# columns), the apply that decodes them, price changes at a steady rate,
# the lag of a replica behind a committed change, and writers whose
# acknowledged changes a replica's applied ones are checked against.
#
#   prices (idx bigint PRIMARY KEY, offering_id text, group_id text,
#           spec text, chars text, "values" text, value bigint,
#           is_default boolean, currency text)
#
# `chars` and `values` are the characteristics' names and values joined by
# `|`, as in the catalogue's CSV.
defmodule Larder.Bench.PostgresLoad do
  @moduledoc false

  alias Larder.Postgres.{Connection, Options}
  alias Larder.Test.{PostgresServer, Prices}
  alias PriceCatalogue.Changes

  @columns ~w(idx offering_id group_id spec chars values value is_default currency)

  @doc "Creates the `prices` table and the `prices` publication of it."
  def create!(server) do
    PostgresServer.sql!(server, """
    CREATE TABLE prices (
      idx bigint PRIMARY KEY, offering_id text NOT NULL, group_id text NOT NULL,
      spec text NOT NULL, chars text NOT NULL, "values" text NOT NULL, value bigint NOT NULL,
      is_default boolean NOT NULL, currency text NOT NULL);
    CREATE PUBLICATION prices FOR TABLE prices;
    """)

    :ok
  end

  @doc "Copies `prices` into the table (psql's \\copy of a file written in `dir`)."
  def fill!(server, prices, dir) do
    path = Path.join(dir, "prices.tsv")

    File.write!(
      path,
      Enum.map(prices, fn price -> [Enum.join(columns(price), "\t"), "\n"] end)
    )

    PostgresServer.sql!(server, "\\copy prices FROM '#{path}'")
    File.rm!(path)
    :ok
  end

  defp columns(price) do
    {chars, values} = price.chars |> Enum.map(&{&1.char, &1.value}) |> Enum.unzip()

    [
      Integer.to_string(price.idx),
      price.offering_id,
      price.group_id,
      price.spec,
      Enum.join(chars, "|"),
      Enum.join(values, "|"),
      Integer.to_string(price.value),
      if(price.is_default, do: "t", else: "f"),
      price.currency
    ]
  end

  @doc "A price as the source's `\"new\"` row: column name to text."
  def row(price), do: Map.new(Enum.zip(@columns, columns(price)))

  @doc "The initial copy of `prices` as the source hands it over: one \"insert\" entry a price."
  def copy_entries(prices), do: Enum.map(prices, &%{"op" => "insert", "new" => row(&1)})

  @doc """
  The copy's floor: `entries` (from `copy_entries/1`, `count` of them,
  best held off the heap with `Larder.Bench.off_heap/2`) decoded and
  inserted with one `Larder.Table.insert_many/2` into a new Table of
  `table_opts`. It runs in a process of its own whose heap holds the
  decoded catalogue from the start (about 80 words a price) and the
  binaries it refers to, so it pays for no copying collections as one
  list of every price grows, which the replica, working in batches, never
  does; a process that holds the catalogue already (a bench's, a demo's)
  would also copy that at each collection.
  """
  def copy_floor(entries, count, table_opts) do
    Larder.Bench.in_process(
      fn ->
        table = Larder.Table.new(table_opts)
        :ok = Larder.Table.insert_many(table, Enum.map(entries, &elem(apply(&1), 1)))
        Larder.Table.drop(table)
      end,
      min_heap_size: 100 * count,
      min_bin_vheap_size: 100_000_000
    )
  end

  @doc "The replica's apply: a row inserted or updated is the price, a deletion its idx."
  def apply(%{"op" => op, "new" => row}) when op in ["insert", "update"],
    do: {:insert, decode(row)}

  def apply(%{"op" => "delete", "old" => %{"idx" => idx}}), do: {:delete, String.to_integer(idx)}

  @doc "A `\"new\"` row decoded to a price."
  def decode(%{
        "idx" => idx,
        "offering_id" => offering,
        "group_id" => group,
        "spec" => spec,
        "chars" => chars,
        "values" => values,
        "value" => value,
        "is_default" => default,
        "currency" => currency
      }) do
    %{
      idx: String.to_integer(idx),
      offering_id: offering,
      group_id: group,
      spec: spec,
      chars: chars(chars, values),
      value: String.to_integer(value),
      is_default: default == "t",
      currency: currency
    }
  end

  defp chars("", ""), do: []

  defp chars(chars, values) do
    Enum.zip_with(
      :binary.split(chars, "|", [:global]),
      :binary.split(values, "|", [:global]),
      &%{char: &1, value: &2}
    )
  end

  @doc "A connection (Larder.Postgres.Connection) to the server, for the writers below."
  def connect!(server) do
    opts = Options.validate!(PostgresServer.options(server), "bench")
    {:ok, conn} = Connection.connect(opts)
    conn
  end

  @doc "Commits `prices`' values (one transaction)."
  def change!(conn, prices) do
    sql =
      Enum.map_join(prices, " ", fn p ->
        "UPDATE prices SET value = #{p.value} WHERE idx = #{p.idx};"
      end)

    {:ok, _, conn} = Connection.query(conn, "BEGIN; #{sql} COMMIT", 60_000)
    conn
  end

  @doc """
  Commits random changes of `prices` (a tuple) at `rate` a second, a
  transaction about every 10 ms (`PriceCatalogue.Changes.paced/3`), for
  `duration_ms`; returns how many.
  """
  def produce(server, prices, rate, duration_ms) do
    conn = connect!(server)
    Process.put(:conn, conn)

    Changes.paced(rate, duration_ms, fn n ->
      Process.put(:conn, change!(Process.get(:conn), for(_ <- 1..n, do: Changes.random(prices))))
    end)
  end

  @doc """
  The lag of a replica keeping `table`: every 5 ms until `deadline`
  (monotonic ms), a price of `markers` (a tuple) gets a value no price has,
  committed alone, and a search for it is made until it finds it
  (`Larder.Test.Prices.visible/3`). Returns `{from_statement, from_commit}`
  in microseconds for each.
  """
  def marker_lags(server, table, markers, deadline) do
    conn = connect!(server)
    lags(conn, table, markers, deadline, [])
  end

  defp lags(conn, table, markers, deadline, acc) do
    if System.monotonic_time(:millisecond) >= deadline do
      acc
    else
      price = Changes.random(markers)
      marker = %{price | value: 2_000_000 + System.unique_integer([:positive])}
      started = System.monotonic_time(:microsecond)

      {:ok, _, conn} =
        Connection.query(
          conn,
          "UPDATE prices SET value = #{marker.value} WHERE idx = #{marker.idx}",
          60_000
        )

      committed = System.monotonic_time(:microsecond)
      Prices.visible(table, marker, committed)
      now = System.monotonic_time(:microsecond)
      Process.sleep(5)
      lags(conn, table, markers, deadline, [{now - started, now - committed} | acc])
    end
  end

  @doc """
  Writers for the kill scenario: `count` processes (linked) that each
  commit one change at a time of a random price of `prices` (a tuple) to a
  value no other change gives, recording `{idx, value}` in `acked` (a
  public ETS :duplicate_bag) once the commit returned; a writer whose
  connection fails connects again and goes on, its change unrecorded.
  """
  def writers(server, prices, count, acked) do
    for w <- 1..count do
      spawn_link(fn -> write(server, prices, w, 0, nil, acked) end)
    end
  end

  @doc "Stops the writers."
  def stop(writers) do
    for pid <- writers do
      ref = Process.monitor(pid)
      Process.unlink(pid)
      Process.exit(pid, :kill)
      receive do: ({:DOWN, ^ref, _, _, _} -> :ok)
    end

    :ok
  end

  defp write(server, prices, w, n, conn, acked) do
    conn =
      conn ||
        case Connection.connect(
               Options.validate!(PostgresServer.options(server, timeout: 2_000), "bench")
             ) do
          {:ok, conn} -> conn
          {:error, _} -> Process.sleep(50) && nil
        end

    if conn do
      price = elem(prices, :rand.uniform(tuple_size(prices)) - 1)
      value = 10_000_000 + w * 100_000_000 + n

      case Connection.query(
             conn,
             "UPDATE prices SET value = #{value} WHERE idx = #{price.idx}",
             5_000
           ) do
        {:ok, _, conn} ->
          :ets.insert(acked, {price.idx, value})
          write(server, prices, w, n + 1, conn, acked)

        {:error, _, conn} ->
          Connection.close(conn)
          write(server, prices, w, n + 1, nil, acked)
      end
    else
      write(server, prices, w, n, nil, acked)
    end
  end

  @doc """
  An apply that records the `{idx, value}` of each update in `applied` (a
  public ETS :duplicate_bag), and the monotonic time (us) of the call as
  a key of `times` (a public ETS :ordered_set) when given, before decoding
  it as `apply/1` does.
  """
  def recording_apply(applied, times \\ nil) do
    fn
      %{"op" => "update", "new" => %{"idx" => idx, "value" => value}} = entry ->
        if times, do: :ets.insert(times, {System.monotonic_time(:microsecond)})
        :ets.insert(applied, {String.to_integer(idx), String.to_integer(value)})
        apply(entry)

      entry ->
        apply(entry)
    end
  end

  @doc """
  A prober (a Task) that connects to `server` every millisecond until a
  connection completes its startup and authentication (the server ready
  for a query), closes it and returns the monotonic time (us) at which
  it completed. Started after a SIGKILL, it gives when the restarted
  server first answered.
  """
  def first_answer(server) do
    opts = Options.validate!(PostgresServer.options(server, timeout: 1_000), "bench")
    Task.async(fn -> probe(opts) end)
  end

  defp probe(opts) do
    case Connection.connect(opts) do
      {:ok, conn} ->
        answered = System.monotonic_time(:microsecond)
        Connection.close(conn)
        answered

      {:error, _} ->
        Process.sleep(1)
        probe(opts)
    end
  end
end
