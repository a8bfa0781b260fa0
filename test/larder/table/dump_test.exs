defmodule Larder.Table.DumpTest do
  # Larder.Table.Dump, a dump the writer does not wait for: the file is the
  # table at the cut; the writer saves what it changes first, once per id
  # and key; a dump's end reaches the process that asked and frees what was
  # saved.
  use ExUnit.Case, async: true

  alias Larder.Table
  alias Larder.Table.Dump

  @moduletag :tmp_dir
  # Each load logs a line at info (checked in Larder.Table.SnapshotTest).
  @moduletag :capture_log

  # A dump is one state of the table. One
  # process inserts records 1, 2, 3, ... one write each (up to 50,000, a
  # pause of a millisecond every 100: writes no longer wait for dumps, and
  # an unpaced writer would grow the table faster than it is loaded);
  # every snapshot must hold exactly 1..k for some k, indexed alike.
  test "dumps during writes are consistent cuts", %{tmp_dir: dir} do
    table = Table.new(key: :id, index: [:even, {:tag, &[&1.id, :all]}], store: [:even])
    parent = self()

    writer =
      spawn_link(fn ->
        Enum.each(1..50_000, fn i ->
          if rem(i, 50) == 0, do: send(parent, {:at, i})
          if rem(i, 100) == 0, do: Process.sleep(1)
          Table.insert(table, %{id: i, even: rem(i, 2) == 0})
        end)
      end)

    assert_receive {:at, 50}, 5_000

    for round <- 1..30 do
      path = Path.join(dir, "cut#{round}")
      :ok = Table.dump(table, path)
      copy = Table.load!(path, key: :id, index: [:even, {:tag, &[&1.id, :all]}], store: [:even])
      k = Table.size(copy)
      assert Table.search_keys(copy, tag: :all) == Enum.to_list(1..k//1)
      assert Table.count(copy, even: true) == div(k, 2)

      assert Enum.sort(Larder.Index.terms_of(copy.index, k)) ==
               Enum.sort([{:tag, k}, {:tag, :all}, {:even, rem(k, 2) == 0}])

      Table.drop(copy)
    end

    Process.unlink(writer)
    Process.exit(writer, :kill)
  end

  defp dump(top, notify \\ self()) do
    %Dump{
      ref: make_ref(),
      pid: self(),
      monitor: make_ref(),
      notify: notify,
      rows: :ets.new(:rows, [:set, :public]),
      keys: :ets.new(:keys, [:set, :public]),
      top: top
    }
  end

  test "save_rows/3 keeps each id's first state; rows made after the cut are not saved" do
    live = :ets.new(:live, [:set, :public])
    :ets.insert(live, [{1, :one}, {50, :fifty}, {0x80000001, :keyed}])
    d = dump(10)

    assert Dump.save_rows([d], live, [1, 2, 50, 0x80000001]) == :ok
    :ets.insert(live, {1, :changed})
    Dump.save_rows([d], live, [1])

    # Id 1 as it was (the first save), id 2 absent at the cut, id 50 at or
    # above the cut's top below 2^31 (made after the cut: skipped), a
    # keyed row's id above 2^31 saved.
    assert Enum.sort(:ets.tab2list(d.rows)) ==
             [{1, [{1, :one}]}, {2, []}, {0x80000001, [{0x80000001, :keyed}]}]

    assert Dump.save_rows([], live, [1]) == :ok
  end

  test "save_keys/3 keeps each key's first state, for every dump running" do
    keys = :ets.new(:keys_live, [:set, :public])
    :ets.insert(keys, {"a", 7})
    [d1, d2] = [dump(0), dump(0)]
    Dump.save_keys([d1, d2], keys, ["a", "b"])
    :ets.insert(keys, {"a", 8})
    Dump.save_keys([d1, d2], keys, ["a"])

    for d <- [d1, d2] do
      assert Enum.sort(:ets.tab2list(d.keys)) == [{"a", [{"a", 7}]}, {"b", []}]
    end
  end

  test "finish/3 tells the process that asked, frees the saved objects and returns the rest" do
    [d1, d2] = [dump(0), dump(0)]
    assert Dump.finish([d1, d2], d1.ref, :ok) == [d2]
    ref = d1.ref
    assert_received {Dump, ^ref, :ok}
    assert :ets.info(d1.rows) == :undefined and :ets.info(d1.keys) == :undefined
    assert :ets.info(d2.rows, :size) == 0
    assert Dump.finish([d2], make_ref(), :ok) == [d2]
    assert Dump.down([d1, d2], d2.monitor) == d2
    assert Dump.down([d1, d2], make_ref()) == nil
  end

  test "await/2 answers :gone when the writer goes before the result" do
    writer = spawn(fn -> :ok end)
    assert Dump.await(writer, make_ref()) == :gone
  end

  test "request/3 of a dropped table is :gone", %{tmp_dir: dir} do
    table = Table.new(key: :id)
    Table.drop(table)
    assert Dump.request(table, Path.join(dir, "x"), self()) == :gone
  end
end
