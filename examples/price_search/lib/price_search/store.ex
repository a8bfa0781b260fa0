defmodule PriceSearch.Store do
  @moduledoc """
  Loads the catalogue and holds it: a `Larder.Table` with the Go service's
  bitmap indexes, and the Go-style map index (offering -> its prices).

  The store process owns the table. It loads in `handle_continue/2`, so the
  supervisor (and the HTTP listener after it) start at once and answer 503
  until the catalogue is in. When loaded it publishes a `%PriceSearch.Store{}`
  through `:persistent_term` (one copy at load, none per request; the terms
  keep their sharing), and request processes search it directly with
  `fetch/1`: no process sits in the request path.

  ## Snapshots

  A catalogue read from a CSV file is snapshotted after it is loaded
  (`PriceSearch.Snapshot`: the table and the map index, named by the CSV's
  SHA-256, in `:snapshot_dir`); the next start loads the snapshot instead
  of parsing and indexing the CSV, when the CSV's bytes are unchanged.
  `origin/1` and the "loaded" log line say where the data came from. The
  snapshot is written after the catalogue is published, so it never delays
  the first answer.

  ## Performance

  The store process makes (or loads) the table, which it owns; the rest
  (the CSV's prices, the map index, the store itself) is built in a
  short-lived linked process that publishes the store and exits, so the
  load's garbage (hundreds of MB for a CSV load) is freed at once, before
  the first request, and the published terms are copied once, into
  `:persistent_term`. A restart decodes the map index from the snapshot
  (about 0.1 s) instead of building it from the prices.

  ## Failures

  A catalogue that cannot be read makes the store fall back to the generated
  one, as `PriceCatalogue.reference_or_generated/1` does. A missing
  snapshot (or one of the earlier format, without a `.map` file) is made
  quietly; a damaged or foreign one is logged as a warning and
  the CSV is loaded (and snapshotted again); a snapshot that cannot be
  written is logged and the service goes on. If the store
  process dies, its table goes with it; `fetch/1` then answers `:loading`
  until the restarted store has loaded again.
  """

  use GenServer
  require Logger

  alias Larder.Table
  alias PriceCatalogue.MapIndex
  alias PriceSearch.{Options, Snapshot}

  @enforce_keys [
    :name,
    :table,
    :map_index,
    :offerings,
    :groups,
    :specs,
    :chars,
    :source,
    :origin,
    :size
  ]
  defstruct @enforce_keys

  @typedoc "A loaded catalogue."
  @type t :: %__MODULE__{
          name: atom(),
          table: Table.table(),
          map_index: MapIndex.t(),
          offerings: %{String.t() => true},
          groups: %{String.t() => true},
          specs: %{String.t() => true},
          chars: %{String.t() => %{String.t() => true}},
          source: String.t(),
          origin: origin(),
          size: non_neg_integer()
        }

  @typedoc """
  Where the loaded data came from: a snapshot, the CSV (no usable snapshot),
  a `:load` function (no snapshot is kept), or a stream a `Larder.Replica`
  follows (`:follow`).
  """
  @type origin :: :snapshot | :csv | :load | :stream

  # The fields a search answers with, as the Go bitmap service keeps them.
  @store [:idx, :spec, :value, :currency, :is_default]

  @doc """
  Starts a store that loads a catalogue.

  Options:

    * `:name` - the store's name (an atom), also the key requests fetch it
      by. Default `PriceSearch.Store`.
    * `:csv` - the path of a catalogue CSV (`.csv` or `.csv.gz`), loaded
      through its snapshot (see "Snapshots").
    * `:load` - instead of `:csv`, a zero-arity function returning
      `{source, prices}`; no snapshot is kept.
      Default: the shared CSV when present (as `:csv`), the generated
      catalogue otherwise (`PriceCatalogue.reference_or_generated/0`).
    * `:follow` - `{replica, table}`: search `table` (a name), which the
      `Larder.Replica` `replica` keeps equal to a `prices` stream
      (`PriceSearch.PriceStream`), instead of a table of the store's own;
      the store is ready once the replica has applied the stream's last
      entry (`Larder.Replica.await/3`). The bitmap searches then follow the
      stream; the map index and the sets of known values are the
      catalogue's (`:csv` or `:load`), read once at start.
    * `:snapshot_dir` - the snapshots' directory, or `false` for none.
      Default: `PriceSearch.Snapshot.default_dir/0` (`PRICE_SEARCH_SNAPSHOT_DIR`,
      else outside the source tree).
  """
  @spec start_link(keyword()) :: GenServer.on_start()
  def start_link(opts \\ []) do
    opts =
      Options.validate!(
        opts,
        [:load, :csv, :snapshot_dir, name: __MODULE__, follow: nil],
        [
          name: {"an atom", &is_atom/1},
          load: {"a function of arity 0", &is_function(&1, 0)},
          csv: {"a path (a string)", &is_binary/1},
          snapshot_dir: {"a path (a string) or false", &(&1 == false or is_binary(&1))},
          follow:
            {"{replica, table} (two atoms) or nil",
             &(&1 == nil or match?({r, t} when is_atom(r) and is_atom(t), &1))}
        ],
        "PriceSearch.Store"
      )

    load =
      case {Keyword.fetch(opts, :load), Keyword.fetch(opts, :csv)} do
        {{:ok, _}, {:ok, _}} ->
          raise ArgumentError, "give PriceSearch.Store :load or :csv, not both"

        {{:ok, load}, :error} ->
          load

        {:error, {:ok, csv}} ->
          {:csv, csv}

        {:error, :error} ->
          default_load()
      end

    name = opts[:name]
    dir = Keyword.get_lazy(opts, :snapshot_dir, &Snapshot.default_dir/0)
    GenServer.start_link(__MODULE__, {name, load, dir, opts[:follow]}, name: name)
  end

  # The shared CSV when present, through its snapshot; else the generated
  # catalogue.
  defp default_load do
    csv = Path.join(PriceCatalogue.default_dir(), "prices-487k.csv.gz")

    if File.exists?(csv) do
      {:csv, csv}
    else
      fn ->
        {source, prices, _requests} = PriceCatalogue.reference_or_generated()
        {source, prices}
      end
    end
  end

  @doc """
  The `Larder.Table.new/1` options of the table a store searches: keyed by
  `idx`, the Go service's indexes (offering, group, spec, one term per
  characteristic value), `store:` the fields a search answers with; plus
  `extra` (`name:`, for a replica's table).
  """
  @spec table_opts(keyword()) :: keyword()
  def table_opts(extra \\ []) do
    Keyword.merge(
      [
        key: :idx,
        index: [:offering_id, :group_id, :spec, {:char, &PriceCatalogue.char_terms/1}],
        store: @store
      ],
      extra
    )
  end

  @doc "Where the loaded catalogue of the store `name` came from, or `:loading`."
  @spec origin(atom()) :: origin() | :loading
  def origin(name \\ __MODULE__) do
    case fetch(name) do
      {:ok, store} -> store.origin
      :loading -> :loading
    end
  end

  @doc "The loaded catalogue of the store `name`, or `:loading`."
  @spec fetch(atom()) :: {:ok, t()} | :loading
  def fetch(name \\ __MODULE__) do
    case :persistent_term.get({__MODULE__, name}, nil) do
      %__MODULE__{} = store -> {:ok, store}
      nil -> :loading
    end
  end

  @impl true
  def init({name, load, dir, follow}) do
    # Unpublished before its table goes, so no request searches a dropped table.
    Process.flag(:trap_exit, true)
    {:ok, %{name: name, load: load, dir: dir, table: nil, follow: follow}, {:continue, :load}}
  end

  @impl true
  def handle_continue(:load, %{name: name} = state) do
    started = System.monotonic_time()
    {table, save} = load(state)
    ms = System.convert_time_unit(System.monotonic_time() - started, :native, :millisecond)
    {:ok, store} = fetch(name)
    log_loaded(store, ms)
    state = %{state | table: table, load: nil}

    case save do
      nil -> {:noreply, state, :hibernate}
      base -> {:noreply, state, {:continue, {:save, base}}}
    end
  end

  # Written after the catalogue is published: the first answers do not wait.
  # The map index is read from the published store, not copied.
  def handle_continue({:save, base}, state) do
    {:ok, store} = fetch(state.name)

    case Snapshot.save(base, state.table, store.map_index) do
      :ok ->
        Logger.info("price catalogue snapshot written to #{base}.{table,map}")

      {:error, reason} ->
        Logger.warning("cannot write the price catalogue snapshot: #{inspect(reason)}")
    end

    :erlang.garbage_collect()
    {:noreply, state, :hibernate}
  end

  # Loads and publishes the catalogue: {table, base of a snapshot to write
  # or nil}. The table is made (or loaded) here, as this process owns it;
  # everything else (the CSV's prices, the map index, the store) is built in
  # a short-lived process that publishes the store and exits, so that the
  # load's garbage is freed at once, before the first request is answered,
  # not copied by a collection of this process (see publish/1).
  defp load(%{follow: {replica, table}, load: load, name: name}) do
    :ok =
      publish(fn ->
        {source, prices} =
          case load do
            {:csv, csv} ->
              case PriceCatalogue.load(csv) do
                {:ok, prices} -> {csv, prices}
                {:error, _} -> {"generated (seed 1)", PriceCatalogue.generate()}
              end

            load ->
              load.()
          end

        await_replica(replica)
        source = "#{source}, searched in the stream's replica"
        store(name, table, MapIndex.new(prices), source, :stream)
      end)

    {table, nil}
  end

  defp load(%{load: {:csv, csv}, dir: dir, name: name}) do
    base =
      with dir when is_binary(dir) <- dir,
           {:ok, sum} <- Snapshot.checksum(csv) do
        Snapshot.base(dir, sum)
      else
        _ -> nil
      end

    # Without both files (none yet, or one of the earlier format, which kept
    # the prices in place of the map index) there is no snapshot to load.
    case base && File.exists?(base <> ".table") && File.exists?(base <> ".map") &&
           load_snapshot(name, csv, base) do
      {:ok, table} ->
        {table, nil}

      {:error, error} ->
        Logger.warning(
          "price catalogue snapshot not used, loading the CSV: #{Exception.message(error)}"
        )

        load_csv(name, csv, base)

      _ ->
        load_csv(name, csv, base)
    end
  end

  defp load(%{load: load, name: name}) do
    table = Table.new(table_opts())

    publish(fn ->
      {source, prices} = load.()
      store(name, table, build(table, prices), source, :load)
    end)

    {table, nil}
  end

  defp load_snapshot(name, csv, base) do
    with {:ok, table} <- Snapshot.load_table(base, table_opts()) do
      # The file's binary (tens of MB) goes now, not at a later collection.
      :erlang.garbage_collect()

      result =
        publish(fn ->
          with {:ok, index} <- Snapshot.load_map(base, Table.size(table)) do
            store(name, table, index, csv, :snapshot)
          end
        end)

      case result do
        :ok ->
          {:ok, table}

        {:error, _} = error ->
          Table.drop(table)
          error
      end
    end
  end

  defp load_csv(name, csv, base) do
    table = Table.new(table_opts())

    :ok =
      publish(fn ->
        case PriceCatalogue.load(csv) do
          {:ok, prices} ->
            store(name, table, build(table, prices), csv, :csv)

          {:error, error} ->
            Logger.warning(
              "cannot load #{csv}, serving the generated catalogue: #{Exception.message(error)}"
            )

            # Nothing was inserted: the table is still empty.
            prices = PriceCatalogue.generate()
            store(name, table, build(table, prices), "generated (seed 1)", :load)
        end
      end)

    {:ok, store} = fetch(name)
    {table, if(store.origin == :csv, do: base)}
  end

  # Runs `fun` in a linked process that publishes the store it returns and
  # exits, freeing its heap (the parsed prices, the decoded index) in one
  # step. `fun` returns a store or an error; :ok or the error. A crash in
  # it is this process's crash.
  defp publish(fun) do
    pid =
      spawn_link(fn ->
        case fun.() do
          %__MODULE__{} = store ->
            :persistent_term.put({__MODULE__, store.name}, store)
            exit({:shutdown, :ok})

          {:error, _} = error ->
            exit({:shutdown, error})
        end
      end)

    receive do
      {:EXIT, ^pid, {:shutdown, result}} -> result
      {:EXIT, ^pid, reason} -> exit(reason)
    end
  end

  defp store(name, table, map_index, source, origin) do
    # The sets of known values come from the index's terms (a few hundred),
    # not from the 487,200 prices.
    known = known(table)

    %__MODULE__{
      name: name,
      table: table,
      map_index: map_index,
      offerings: known.offerings,
      groups: known.groups,
      specs: known.specs,
      chars: known.chars,
      source: source,
      origin: origin,
      size: Table.size(table)
    }
  end

  # Until the replica has applied the stream's last entry; Redis down only
  # delays it.
  defp await_replica(replica) do
    case Larder.Replica.await(replica, :latest, :infinity) do
      :ok ->
        :ok

      {:error, error} ->
        Logger.warning("waiting for the prices stream: #{Exception.message(error)}")
        Process.sleep(1_000)
        await_replica(replica)
    end
  end

  # Inserts the prices; their map index.
  defp build(table, prices) do
    :ok = Table.insert_many(table, prices)
    MapIndex.new(prices)
  end

  # Offerings, groups, specs and each characteristic's values, as sets.
  defp known(table) do
    set = fn name -> Map.new(Table.terms(table, name), &{&1, true}) end

    chars =
      table
      |> Table.terms(:char)
      |> Enum.reduce(%{}, fn {c, v}, acc ->
        Map.update(acc, c, %{v => true}, &Map.put(&1, v, true))
      end)

    %{offerings: set.(:offering_id), groups: set.(:group_id), specs: set.(:spec), chars: chars}
  end

  defp log_loaded(store, ms) do
    mb = fn bytes -> "#{Float.round(bytes / 1_000_000, 1)} MB" end
    # The map index is the bulk of the persistent terms.
    map_bytes = :persistent_term.info().memory

    Logger.info(
      "price catalogue loaded from #{store.source} (#{store.origin}): #{store.size} prices in #{ms} ms; " <>
        "table #{mb.(Table.memory(store.table))}, map index (persistent terms) #{mb.(map_bytes)}, " <>
        "VM total #{mb.(:erlang.memory(:total))}, OS pid #{System.pid()}"
    )
  end

  @impl true
  def terminate(_reason, %{name: name}) do
    :persistent_term.erase({__MODULE__, name})
    :ok
  end
end
