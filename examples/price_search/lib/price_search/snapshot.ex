defmodule PriceSearch.Snapshot do
  @moduledoc """
  The catalogue's snapshot, so that a restart does not parse and index the
  CSV again: the `Larder.Table` (`Larder.Table.dump/2`) and the prices the
  Go-style map index is built from, in two files named by the CSV's
  SHA-256, in a directory of their own:

      <dir>/prices-<sha256 of the CSV file>.table
      <dir>/prices-<sha256 of the CSV file>.prices

  A snapshot is used only for the CSV file whose bytes it was made from; a
  changed CSV has another name, so the old snapshot is never served for it
  (and is deleted by the next `save/4`).

  The `.prices` file is `"PSPRICES" <<1, crc32::32>>` and then
  `term_to_binary/1` of `{strings, chars, rows}`: each distinct string
  once, each distinct list of characteristics once (as string numbers),
  and each price as a tuple of numbers, so that reading it rebuilds prices
  that share their strings and characteristic lists as the CSV loader's
  do, without parsing text. It is written to a temporary file, fsynced and
  renamed.

  ## Failures

  `load/3` returns `{:error, %Larder.Error{}}` for a missing, damaged or
  foreign snapshot (a checksum, shape or definition that does not match);
  the caller then loads the CSV. Nothing raises on a bad file.
  """

  alias Larder.Table

  @magic "PSPRICES"
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
    with {:ok, data} <- File.read(csv) do
      {:ok, Base.encode16(:crypto.hash(:sha256, data), case: :lower)}
    end
  end

  @doc "The base path (without extension) of the snapshot of a CSV with checksum `sum`."
  @spec base(Path.t(), String.t()) :: Path.t()
  def base(dir, sum), do: Path.join(dir, "prices-" <> sum)

  @doc """
  Loads the snapshot at `base` into a new table made with `table_opts`
  (owned by the caller): `{:ok, table, prices}` or an error.
  """
  @spec load(Path.t(), keyword()) :: {:ok, Table.t(), [map()]} | {:error, Larder.Error.t()}
  def load(base, table_opts) do
    with {:ok, prices} <- read_prices(base <> ".prices"),
         {:ok, table} <- Table.load(base <> ".table", table_opts) do
      if Table.size(table) == length(prices) do
        {:ok, table, prices}
      else
        Table.drop(table)
        corrupt(base, "the table and the prices hold different counts")
      end
    end
  end

  @doc """
  Writes the snapshot of `table` and `prices` at `base`, then deletes the
  other snapshots in its directory (of CSV files that changed).
  """
  @spec save(Path.t(), Table.t(), [map()]) :: :ok | {:error, term()}
  def save(base, table, prices) do
    dir = Path.dirname(base)

    with :ok <- File.mkdir_p(dir),
         :ok <- write_prices(base <> ".prices", prices),
         :ok <- Table.dump(table, base <> ".table") do
      keep = [Path.basename(base) <> ".prices", Path.basename(base) <> ".table"]

      for name <- File.ls!(dir),
          String.starts_with?(name, "prices-"),
          Path.extname(name) in [".prices", ".table"],
          name not in keep,
          do: File.rm(Path.join(dir, name))

      :ok
    end
  end

  ## The prices file

  defp write_prices(path, prices) do
    payload = :erlang.term_to_binary(compact(prices))
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

  # Strings and characteristic lists numbered once each; a price becomes
  # {idx, offering, group, spec, chars, value, is_default, currency}.
  defp compact(prices) do
    {rows, {strings, _, lists, _}} =
      Enum.map_reduce(prices, {%{}, 0, %{}, 0}, fn p, acc ->
        {o, acc} = number_string(p.offering_id, acc)
        {g, acc} = number_string(p.group_id, acc)
        {s, acc} = number_string(p.spec, acc)
        {cur, acc} = number_string(p.currency, acc)
        {c, acc} = number_chars(p.chars, acc)
        {{p.idx, o, g, s, c, p.value, p.is_default, cur}, acc}
      end)

    {by_number(strings), by_number(lists), rows}
  end

  defp number_string(string, {strings, n, lists, m} = acc) do
    case strings do
      %{^string => i} -> {i, acc}
      _ -> {n, {Map.put(strings, string, n), n + 1, lists, m}}
    end
  end

  defp number_chars(chars, {_, _, lists, _} = acc) do
    case lists do
      %{^chars => {i, _numbered}} ->
        {i, acc}

      _ ->
        {numbered, {strings, n, lists, m}} =
          Enum.map_reduce(chars, acc, fn %{char: c, value: v}, acc ->
            {ci, acc} = number_string(c, acc)
            {vi, acc} = number_string(v, acc)
            {{ci, vi}, acc}
          end)

        {m, {strings, n, Map.put(lists, chars, {m, numbered}), m + 1}}
    end
  end

  defp by_number(map) do
    map
    |> Enum.map(fn
      {_chars, {i, numbered}} -> {i, numbered}
      {string, i} -> {i, string}
    end)
    |> Enum.sort()
    |> Enum.map(&elem(&1, 1))
    |> List.to_tuple()
  end

  defp read_prices(path) do
    with {:ok, data} <- File.read(path),
         <<@magic, @version, crc::32, payload::binary>> <- data,
         true <- :erlang.crc32(payload) == crc,
         {:ok, prices} <- expand(payload) do
      {:ok, prices}
    else
      {:error, posix} when is_atom(posix) -> corrupt(path, "cannot read: #{posix}")
      _ -> corrupt(path, "not a price snapshot, or damaged")
    end
  end

  # A damaged file that passed its checksum (forged) raises somewhere in
  # here: it is an error like any other bad file.
  defp expand(payload) do
    {strings, lists, rows} = :erlang.binary_to_term(payload, [:safe])

    chars =
      lists
      |> Tuple.to_list()
      |> Enum.map(fn numbered ->
        for {c, v} <- numbered, do: %{char: elem(strings, c), value: elem(strings, v)}
      end)
      |> List.to_tuple()

    {:ok,
     for {idx, o, g, s, c, value, default, cur} <- rows,
         is_integer(idx) and is_integer(value) and is_boolean(default) do
       %{
         idx: idx,
         offering_id: elem(strings, o),
         group_id: elem(strings, g),
         spec: elem(strings, s),
         chars: elem(chars, c),
         value: value,
         is_default: default,
         currency: elem(strings, cur)
       }
     end}
  rescue
    _ -> :error
  end

  defp corrupt(path, message),
    do: {:error, Larder.Error.new(:corrupt_snapshot, message, path: path)}
end
