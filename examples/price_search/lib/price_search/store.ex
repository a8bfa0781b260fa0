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

  ## Failures

  A catalogue that cannot be read makes the store fall back to the generated
  one, as `PriceSearch.Catalogue.reference_or_generated/1` does. If the store
  process dies, its table goes with it; `fetch/1` then answers `:loading`
  until the restarted store has loaded again.
  """

  use GenServer
  require Logger

  alias Larder.Table
  alias PriceSearch.Catalogue

  @enforce_keys [:table, :map_index, :offerings, :groups, :specs, :chars, :source, :size]
  defstruct @enforce_keys

  @typedoc "A loaded catalogue."
  @type t :: %__MODULE__{
          table: Table.t(),
          map_index: Catalogue.map_index(),
          offerings: %{String.t() => true},
          groups: %{String.t() => true},
          specs: %{String.t() => true},
          chars: %{String.t() => %{String.t() => true}},
          source: String.t(),
          size: non_neg_integer()
        }

  # The fields a search answers with, as the Go bitmap service keeps them.
  @store [:idx, :spec, :value, :currency, :is_default]

  @doc """
  Starts a store that loads a catalogue.

  Options:

    * `:name` - the store's name (an atom), also the key requests fetch it
      by. Default `PriceSearch.Store`.
    * `:load` - a zero-arity function returning `{source, prices}`.
      Default: the shared CSV when present, the generated catalogue
      otherwise (`PriceSearch.Catalogue.reference_or_generated/0`).
  """
  @spec start_link(keyword()) :: GenServer.on_start()
  def start_link(opts \\ []) do
    {name, load} = options!(opts)
    GenServer.start_link(__MODULE__, {name, load}, name: name)
  end

  defp options!(opts) do
    valid = [:name, :load]

    case Keyword.keys(opts) -- valid do
      [] ->
        :ok

      unknown ->
        raise ArgumentError, "unknown options #{inspect(unknown)}, valid: #{inspect(valid)}"
    end

    name = Keyword.get(opts, :name, __MODULE__)
    load = Keyword.get(opts, :load, &default_load/0)

    unless is_atom(name), do: raise(ArgumentError, ":name must be an atom, got: #{inspect(name)}")

    unless is_function(load, 0),
      do: raise(ArgumentError, ":load must be a function of arity 0, got: #{inspect(load)}")

    {name, load}
  end

  defp default_load do
    {source, prices, _requests} = Catalogue.reference_or_generated()
    {source, prices}
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
  def init({name, load}) do
    # Unpublished before its table goes, so no request searches a dropped table.
    Process.flag(:trap_exit, true)
    {:ok, %{name: name, load: load, table: nil}, {:continue, :load}}
  end

  @impl true
  def handle_continue(:load, %{name: name, load: load} = state) do
    started = System.monotonic_time()
    {source, prices} = load.()
    table = Table.new(Catalogue.table_opts(store: @store))
    :ok = Table.insert_many(table, prices)

    store = %__MODULE__{
      table: table,
      map_index: Catalogue.map_index(prices),
      offerings: set_of(prices, & &1.offering_id),
      groups: set_of(prices, & &1.group_id),
      specs: set_of(prices, & &1.spec),
      chars: chars_of(prices),
      source: source,
      size: Table.size(table)
    }

    :persistent_term.put({__MODULE__, name}, store)
    ms = System.convert_time_unit(System.monotonic_time() - started, :native, :millisecond)
    :erlang.garbage_collect()
    log_loaded(store, ms)
    {:noreply, %{state | table: table, load: nil}, :hibernate}
  end

  defp set_of(prices, fun), do: prices |> Enum.map(&{fun.(&1), true}) |> Map.new()

  # Each characteristic's values, for the search's "unknown char or value"
  # errors. Prices share few distinct lists of characteristics (9,744 in the
  # reference catalogue): those first, then their values.
  defp chars_of(prices) do
    lists = Enum.reduce(prices, %{}, fn price, acc -> Map.put(acc, price.chars, true) end)

    for {chars, true} <- lists, %{char: c, value: v} <- chars, reduce: %{} do
      acc -> Map.update(acc, c, %{v => true}, &Map.put(&1, v, true))
    end
  end

  defp log_loaded(store, ms) do
    mb = fn bytes -> "#{Float.round(bytes / 1_000_000, 1)} MB" end
    # The map index is the bulk of the persistent terms.
    map_bytes = :persistent_term.info().memory

    Logger.info(
      "price catalogue loaded from #{store.source}: #{store.size} prices in #{ms} ms; " <>
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
