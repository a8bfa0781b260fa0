defmodule Larder.Table.RowIdScanTest do
  # Larder.Table.load/2 imports the index while the rows are decoded, with
  # the row ids the NIF reads from each rows chunk's bytes
  # (table_payload_row_ids). The scan must agree with decoding on every
  # term a record can hold, say :unsupported for what it cannot skip (and
  # the load then decodes first), and never crash on bytes from a file.
  use ExUnit.Case, async: true

  alias Larder.Native
  alias Larder.Table
  alias Larder.Test.Hostile
  alias Larder.Test.PropEr
  alias Larder.Test.TableSnapshotFile

  @moduletag :tmp_dir

  defp let(gen, fun), do: :proper_types.bind(gen, fun, false)

  # Rows as a dump writes them: {id, record}, ids of 32 bits (small
  # integers, integers and bignums in the external format).
  defp rows_gen do
    id = :proper_types.oneof([:proper_types.range(0, 255), :proper_types.range(0, 0xFFFFFFFF)])
    :proper_types.list(:proper_types.tuple([id, Hostile.term()]))
  end

  defp build(rows), do: for({id, record} <- rows, do: {id, Hostile.build(record)})

  defp scan(payload), do: Native.table_payload_row_ids(payload)

  test "the scanned ids are the decoded rows' ids, or the scan says it cannot skip a record" do
    property =
      PropEr.forall(let(rows_gen(), &build/1), fn rows ->
        case scan(:erlang.term_to_binary(rows)) do
          ids when is_binary(ids) -> ids == Native.table_row_ids(rows)
          :unsupported -> true
          other -> :proper.equals(other, :a_binary_or_unsupported)
        end
      end)

    PropEr.check(property, numtests: 300)
  end

  test "a pid, a port, a reference or a fun in a record is :unsupported" do
    for value <- [self(), hd(Port.list()), make_ref(), fn -> :ok end, &Enum.map/2] do
      assert scan(:erlang.term_to_binary([{1, %{v: [value]}}])) == :unsupported
    end
  end

  # The ids of the rows that `bytes` decode to, or :undecodable (the scan
  # skips records without checking all that decoding checks, such as the
  # bits of a bit string's last byte: loading then fails on decoding).
  defp decoded_ids(bytes) do
    Native.table_row_ids(:erlang.binary_to_term(bytes))
  rescue
    ArgumentError -> :undecodable
  end

  test "bytes cut short, changed or grown give no ids but those they decode to" do
    property =
      PropEr.forall(
        {let(rows_gen(), &build/1), :proper_types.non_neg_integer(), :proper_types.byte()},
        fn {rows, at, byte} ->
          payload = :erlang.term_to_binary(rows)
          at = rem(at, byte_size(payload))
          <<head::binary-size(at), old, tail::binary>> = payload

          Enum.all?(
            [
              binary_part(payload, 0, at),
              head <> <<byte>> <> tail,
              payload <> <<byte>>,
              head <> <<old, byte>> <> tail
            ],
            fn bytes ->
              case scan(bytes) do
                ids when is_binary(ids) -> decoded_ids(bytes) in [ids, :undecodable]
                :unsupported -> true
                {:error, :bad_snapshot} -> true
              end
            end
          )
        end
      )

    PropEr.check(property, numtests: 300)
  end

  test "the largest and odd ids, and bytes that are not a list of rows" do
    ids = [0, 255, 256, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]
    rows = for id <- ids, do: {id, %{id: id}}
    assert scan(:erlang.term_to_binary(rows)) == Native.table_row_ids(rows)
    assert scan(:erlang.term_to_binary([])) == <<>>

    for bad <- [[{-1, %{}}], [{0x100000000, %{}}], [{1.0, %{}}], [{1, %{}, 2}], [1], {1, 2}] do
      assert scan(:erlang.term_to_binary(bad)) == {:error, :bad_snapshot}, inspect(bad)
    end

    for bytes <- [<<>>, <<131>>, <<131, 108, 255, 255, 255, 255>>, <<130, 106>>] do
      assert scan(bytes) == {:error, :bad_snapshot}
    end

    # a compressed term is not scanned (nor loaded)
    assert scan(:erlang.term_to_binary([{1, String.duplicate("x", 1000)}], compressed: 9)) ==
             {:error, :bad_snapshot}
  end

  # A forged rows chunk whose bytes scan (so the index import starts) but
  # do not decode: the load fails as for any bad chunk, and the process
  # that imported is gone with it.
  test "a rows chunk that scans but does not decode: :corrupt_snapshot, nothing left", %{
    tmp_dir: dir
  } do
    path = Path.join(dir, "bits")
    table = Table.new(key: :id, index: [:kind])

    :ok =
      Table.insert_many(table, for(i <- 1..10_000, do: %{id: i, kind: rem(i, 3), b: <<1::1>>}))

    :ok = Table.dump(table, path)

    # a bit string's used bits set to 0 in one row of the last rows chunk
    <<"LARDERTAB", 2, rest::binary>> = File.read!(path)
    chunks = TableSnapshotFile.parse(rest)
    last = chunks |> Enum.filter(&(elem(&1, 0) == 2)) |> List.last()
    {2, n, payload} = last
    [head, tail] = :binary.split(payload, <<77, 1::32, 1>>)
    forged = {2, n, head <> <<77, 1::32, 0>> <> tail}
    assert is_binary(scan(elem(forged, 2)))

    File.write!(
      path,
      TableSnapshotFile.frame(Enum.map(chunks, &if(&1 == last, do: forged, else: &1)))
    )

    before = length(Process.list())

    assert {:error, %Larder.Error{reason: :corrupt_snapshot}} =
             Table.load(path, key: :id, index: [:kind])

    Larder.Test.Eventually.eventually(fn -> length(Process.list()) <= before end)
  end

  test "a table whose records hold references loads (the rows decoded first)", %{tmp_dir: dir} do
    path = Path.join(dir, "refs")
    table = Table.new(key: :id, index: [:kind])
    refs = for i <- 1..5_000, do: %{id: i, kind: rem(i, 3), ref: make_ref()}
    :ok = Table.insert_many(table, refs)
    :ok = Table.dump(table, path)
    copy = Table.load!(path, key: :id, index: [:kind])
    assert Enum.sort_by(Table.stream(copy), & &1.id) == refs
    assert Table.count(copy, kind: 1) == Table.count(table, kind: 1)
  end
end
