defmodule PriceSearch.Snapshot do
  @moduledoc """
  The catalogue's snapshot, so that a restart does not parse and index the
  CSV again: the `Larder.Table` (`Larder.Table.dump/2`) and the Go-style
  map index (`PriceCatalogue.MapIndex`), in two files named by
  the CSV's SHA-256, in a directory of their own:

      <dir>/prices-<sha256 of the CSV file>.table
      <dir>/prices-<sha256 of the CSV file>.map

  A snapshot is used only for the CSV file whose bytes it was made from; a
  changed CSV has another name, so the old snapshot is never served for it
  (and is deleted by the next `save/3`; so are the `.prices` files of the
  earlier format).

  The `.map` file is `"PSMAPIDX" <<1, crc32::32>>` and then
  `term_to_binary/1` of the map index: a term of integers in tuples and a
  few thousand strings, so reading it is one `binary_to_term/2` (about
  0.1 s for the reference catalogue), with nothing rebuilt and no prices
  in memory. It is written to a temporary file, fsynced and renamed.

  ## Performance

  A restart reads the two files (46 MB and 30 MB for the reference
  catalogue) instead of parsing 487,200 CSV lines and indexing them: the
  table's load and this decode are most of a warm start's time.

  ## Failures

  `load/2` returns `{:error, %Larder.Error{}}` for a missing, damaged or
  foreign snapshot (a checksum, shape or definition that does not match,
  or a map index and a table that hold different counts);
  the caller then loads the CSV. Nothing raises on a bad file.
  """

  alias Larder.Table
  alias PriceCatalogue.{MapIndex, RawFile}

  @magic "PSMAPIDX"
  @version 1

  @doc """
  The default directory: `PRICE_SEARCH_SNAPSHOT_DIR` when set, else
  `price_search` under `XDG_CACHE_HOME` when that is set, else under the
  system's temporary directory. Never inside the source tree.
  """
  @spec default_dir() :: Path.t()
  def default_dir do
    cond do
      dir = System.get_env("PRICE_SEARCH_SNAPSHOT_DIR") -> dir
      cache = System.get_env("XDG_CACHE_HOME") -> Path.join(cache, "price_search")
      true -> Path.join(System.tmp_dir!(), "price_search")
    end
  end

  @doc """
  The SHA-256 of the file at `csv`, in hex (the snapshot's name), or an
  error when it cannot be read. Reads the file once (4.5 MB for the
  reference catalogue: a few milliseconds).
  """
  @spec checksum(Path.t()) :: {:ok, String.t()} | {:error, File.posix()}
  def checksum(csv) do
    with {:ok, data} <- RawFile.read(csv) do
      {:ok, Base.encode16(:crypto.hash(:sha256, data), case: :lower)}
    end
  end

  @doc "The base path (without extension) of the snapshot of a CSV with checksum `sum`."
  @spec base(Path.t(), String.t()) :: Path.t()
  def base(dir, sum), do: Path.join(dir, "prices-" <> sum)

  @doc """
  Loads the table of the snapshot at `base` into a new table made with
  `table_opts` (owned by the caller): `{:ok, table}` or an error.
  """
  @spec load_table(Path.t(), keyword()) :: {:ok, Table.t()} | {:error, Larder.Error.t()}
  def load_table(base, table_opts), do: Table.load(base <> ".table", table_opts)

  @doc """
  Reads the map index of the snapshot at `base`, which must hold `size`
  prices (its table's size): `{:ok, map_index}` or an error.

  It sets the caller's minimum heap size to the index's size, so that the
  index is decoded in place: call it in a process that ends once the index
  is published (as `PriceSearch.Store` does).
  """
  @spec load_map(Path.t(), non_neg_integer()) ::
          {:ok, MapIndex.t()} | {:error, Larder.Error.t()}
  def load_map(base, size) do
    with {:ok, index} <- read_map(base <> ".map") do
      if MapIndex.size(index) == size,
        do: {:ok, index},
        else: corrupt(base, "the table and the map index hold different counts")
    end
  end

  @doc """
  Writes the snapshot of `table` and `map_index` at `base`, then deletes the
  other snapshots in its directory (of CSV files that changed).
  """
  @spec save(Path.t(), Table.t(), MapIndex.t()) :: :ok | {:error, term()}
  def save(base, table, map_index) do
    dir = Path.dirname(base)

    with :ok <- File.mkdir_p(dir),
         :ok <- write_map(base <> ".map", map_index),
         :ok <- Table.dump(table, base <> ".table") do
      keep = [Path.basename(base) <> ".map", Path.basename(base) <> ".table"]

      for name <- File.ls!(dir),
          String.starts_with?(name, "prices-"),
          Path.extname(name) in [".map", ".prices", ".table"],
          name not in keep,
          do: File.rm(Path.join(dir, name))

      :ok
    end
  end

  ## The map index file

  defp write_map(path, map_index) do
    payload = :erlang.term_to_binary(map_index)
    tmp = "#{path}.#{System.pid()}-#{System.unique_integer([:positive])}.tmp"

    result =
      with {:ok, io} <- File.open(tmp, [:write, :raw, :binary]) do
        try do
          with :ok <-
                 IO.binwrite(io, [@magic, @version, <<:erlang.crc32(payload)::32>>, payload]),
               :ok <- :file.sync(io) do
            File.close(io)
            File.rename(tmp, path)
          end
        after
          File.close(io)
        end
      end

    if result != :ok, do: File.rm(tmp)
    result
  end

  defp read_map(path) do
    with {:ok, data} <- RawFile.read(path),
         <<@magic, @version, crc::32, payload::binary>> <- data,
         true <- :erlang.crc32(payload) == crc,
         {:ok, index} <- decode(payload) do
      {:ok, index}
    else
      {:error, posix} when is_atom(posix) -> corrupt(path, "cannot read: #{posix}")
      _ -> corrupt(path, "not a map index snapshot, or damaged")
    end
  end

  # A damaged file that passed its checksum (forged) is refused by its
  # shape, or raises in binary_to_term: an error like any other bad file.
  # The heap is made big enough for the index first (about a word per two
  # bytes of payload: small integers), so binary_to_term decodes into it
  # and no collection copies the index to a second heap. `:safe` decodes
  # only atoms that exist: the index's keys are MapIndex's, which a VM in
  # interactive mode (`make serve`, `mix run`) has not loaded before its
  # first call, so it is loaded first; without it every warm start found
  # its snapshot "damaged" and parsed the CSV again.
  defp decode(payload) do
    {:module, MapIndex} = Code.ensure_loaded(MapIndex)
    Process.flag(:min_heap_size, div(byte_size(payload), 2))
    :erlang.garbage_collect()
    index = :erlang.binary_to_term(payload, [:safe])
    if MapIndex.valid?(index), do: {:ok, index}, else: :error
  rescue
    _ -> :error
  end

  defp corrupt(path, message),
    do: {:error, Larder.Error.new(:corrupt_snapshot, message, path: path)}
end
