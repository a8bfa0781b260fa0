defmodule PriceSearch.SnapshotTest do
  # The store's snapshot: a second start loads it instead of the CSV and
  # serves the same answers; a changed CSV is never served from the old
  # snapshot; a damaged snapshot falls back to the CSV with a warning.
  use ExUnit.Case, async: true

  import ExUnit.CaptureLog

  alias Larder.Table
  alias PriceCatalogue.{CSV, MapIndex}
  alias PriceSearch.{Snapshot, Store}

  @moduletag :tmp_dir

  defp write_csv(path, prices), do: File.write!(path, :zlib.gzip(CSV.encode(prices)))

  # Starts a store on `csv`, waits until it has loaded and written its
  # snapshot (the save runs in the continue after publishing), stops it.
  defp start(context, csv) do
    name = :"#{context.test} #{System.unique_integer([:positive])}"

    pid =
      start_supervised!({Store, name: name, csv: csv, snapshot_dir: context.snapshots}, id: name)

    store = await(name)
    _ = :sys.get_state(pid)
    answers = answers(store, context.requests)
    first = Table.get(store.table, hd(context.prices).idx)
    stop_supervised!(name)
    known = Map.take(store, [:offerings, :groups, :specs, :chars, :size])
    {store.origin, answers, Map.put(known, :first, first)}
  end

  defp await(name) do
    case Store.fetch(name) do
      {:ok, store} -> store
      :loading -> Process.sleep(20) && await(name)
    end
  end

  defp answers(store, requests) do
    for conditions <- requests do
      {Table.search(store.table, conditions), MapIndex.search(store.map_index, conditions)}
    end
  end

  setup %{tmp_dir: dir} do
    prices = PriceCatalogue.generate(offerings: 1)
    csv = Path.join(dir, "prices.csv.gz")
    write_csv(csv, prices)

    %{
      csv: csv,
      prices: prices,
      snapshots: Path.join(dir, "snapshots"),
      requests: PriceCatalogue.sample_requests(prices, 30)
    }
  end

  test "a second start loads the snapshot and answers the same", context do
    {:csv, first, known} = start(context, context.csv)
    assert [_, _] = File.ls!(context.snapshots)
    assert {:snapshot, ^first, ^known} = start(context, context.csv)
    assert Enum.all?(first, fn {bitmap, map} -> bitmap != [] and map != [] end)
  end

  test "a changed CSV is loaded, not the old snapshot, and replaces it", context do
    {:csv, _, _} = start(context, context.csv)
    [p | rest] = context.prices
    write_csv(context.csv, [%{p | value: p.value + 1} | rest])
    {origin, answers, known} = start(context, context.csv)
    assert origin == :csv
    assert known.first.value == p.value + 1
    # The old snapshot is gone; the new one is used next.
    assert [_, _] = File.ls!(context.snapshots)
    assert {:snapshot, ^answers, ^known} = start(context, context.csv)
  end

  for {ext, what} <- [{".table", "table"}, {".map", "map index"}] do
    test "a damaged #{what} file falls back to the CSV with a warning", context do
      {:csv, answers, _} = start(context, context.csv)
      {:ok, sum} = Snapshot.checksum(context.csv)
      file = Snapshot.base(context.snapshots, sum) <> unquote(ext)
      data = File.read!(file)
      at = div(byte_size(data), 2)
      <<before::binary-size(at), byte, after_::binary>> = data
      File.write!(file, <<before::binary, Bitwise.bxor(byte, 1), after_::binary>>)

      log = capture_log(fn -> assert {:csv, ^answers, _} = start(context, context.csv) end)
      assert log =~ "snapshot not used, loading the CSV"
      # Written again, whole.
      assert {:snapshot, ^answers, _} = start(context, context.csv)
    end
  end

  # A file with a good checksum whose term is not a map index (forged, or
  # written by another version) is refused by its shape, never served.
  for {what, term} <- [
        {"not a map index", %{ids: %{}}},
        {"an answer that is not an integer", :forged_answer},
        {"a count other than the table's", :short}
      ] do
    test "a map index file with #{what} falls back to the CSV with a warning", context do
      {:csv, answers, _} = start(context, context.csv)
      {:ok, sum} = Snapshot.checksum(context.csv)
      file = Snapshot.base(context.snapshots, sum) <> ".map"
      <<"PSMAPIDX", 1, _crc::32, payload::binary>> = File.read!(file)
      index = :erlang.binary_to_term(payload)

      term =
        case unquote(Macro.escape(term)) do
          :forged_answer ->
            update_in(index.offerings, fn offerings ->
              Map.new(offerings, fn {o, {codes, stride, chars, answers}} ->
                {o, {codes, stride, chars, put_elem(answers, 0, "1")}}
              end)
            end)

          :short ->
            update_in(index.offerings, fn offerings ->
              Map.new(offerings, fn {o, {[_ | codes], stride, chars, answers}} ->
                n = length(codes)

                {o,
                 {codes, stride,
                  chars |> Tuple.to_list() |> Enum.take(n * stride) |> List.to_tuple(),
                  answers |> Tuple.to_list() |> Enum.take(3 * n) |> List.to_tuple()}}
              end)
            end)

          other ->
            other
        end

      payload = :erlang.term_to_binary(term)
      File.write!(file, ["PSMAPIDX", 1, <<:erlang.crc32(payload)::32>>, payload])

      log = capture_log(fn -> assert {:csv, ^answers, _} = start(context, context.csv) end)
      assert log =~ "snapshot not used, loading the CSV"
      assert {:snapshot, ^answers, _} = start(context, context.csv)
    end
  end

  test "snapshots of the earlier format (.prices) are deleted when one is written", context do
    File.mkdir_p!(context.snapshots)
    old = Path.join(context.snapshots, "prices-0123.prices")
    File.write!(old, "PSPRICES")
    {:csv, _, _} = start(context, context.csv)
    refute File.exists?(old)
    assert [_, _] = File.ls!(context.snapshots)
  end

  # The earlier format kept a .table and a .prices file: for this version
  # that is no snapshot (nothing to warn about), not a damaged one.
  test "a snapshot of the earlier format is replaced without a warning", context do
    File.mkdir_p!(context.snapshots)
    {:ok, sum} = Snapshot.checksum(context.csv)
    base = Snapshot.base(context.snapshots, sum)
    File.write!(base <> ".table", "LARDER-TABLE of an earlier run")
    File.write!(base <> ".prices", "PSPRICES")

    log = capture_log(fn -> assert {:csv, _, _} = start(context, context.csv) end)
    refute log =~ "snapshot not used"

    assert Enum.sort(File.ls!(context.snapshots)) == [
             Path.basename(base) <> ".map",
             Path.basename(base) <> ".table"
           ]

    assert {:snapshot, _, _} = start(context, context.csv)
  end

  test "snapshot_dir: false keeps none; bad options raise", context do
    name = :"#{context.test}"
    start_supervised!({Store, name: name, csv: context.csv, snapshot_dir: false})
    assert await(name).origin == :csv
    refute File.exists?(context.snapshots)

    assert_raise ArgumentError, ~r/:snapshot_dir/, fn ->
      Store.start_link(name: :y, snapshot_dir: 1)
    end

    assert_raise ArgumentError, ~r/:csv/, fn -> Store.start_link(name: :y, csv: 1) end

    assert_raise ArgumentError, ~r/not both/, fn ->
      Store.start_link(name: :y, csv: "a", load: fn -> nil end)
    end
  end
end
