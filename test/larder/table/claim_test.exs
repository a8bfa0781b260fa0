defmodule Larder.Table.ClaimTest do
  # Larder.Table.Claim, the build claim: a caller inserts a chunk of fresh
  # rows into ETS itself while the writer holds every other write back; the
  # chunk is whole whether the caller releases the claim or dies holding
  # it; a claim is asked for only for a chunk it can serve, and granted
  # only above every row the table has held.
  use ExUnit.Case, async: true

  import Larder.Test.Eventually
  import Larder.Test.TableCheck

  alias Larder.Table
  alias Larder.Table.Claim

  # A build's chunks of fresh integer keys go into ETS from the caller,
  # under a claim the writer holds: a caller killed while holding it
  # leaves its chunk all there (and indexed) or not there at all.
  test "callers killed mid-build leave each chunk whole" do
    table = table()

    for round <- 1..60 do
      killed_midway(round, fn ->
        records = for i <- 0..299, do: %{id: round * 1000 + i, a: round, tags: [round]}
        Table.insert_many(table, records)
      end)
    end

    :ok = Table.delete(table, :barrier)
    records = table |> Table.stream() |> Enum.to_list()

    for round <- 1..60 do
      held = Enum.count(records, &(&1.a == round))
      assert held in [0, 300]
      assert Table.count(table, a: round) == held
      assert length(Table.search_keys(table, m: round)) == held
    end
  end

  test "the writer completes a claim whose rows are in ETS and drops one whose are not" do
    table = table()
    ops = fn ids -> [{:add, {:a, :claimed}, ids}] end

    for {ids, insert?} <- [{[10, 11], true}, {[20, 21], false}] do
      {pid, ref} =
        spawn_monitor(fn ->
          span = {hd(ids), List.last(ids)}
          {:claimed, _} = GenServer.call(table.writer, {:claim, span, ops.(ids), ids})

          if insert?,
            do:
              :ets.insert(
                table.rows,
                for(id <- ids, do: {id, %{id: id, a: :claimed, tags: []}})
              )

          # Dies holding the claim, without releasing it.
        end)

      assert_receive {:DOWN, ^ref, :process, ^pid, :normal}
    end

    :ok = Table.delete(table, :barrier)
    assert Table.search_keys(table, a: :claimed) == [10, 11]
    assert Table.size(table) == 2
    assert consistent?(table, [:claimed])
  end

  test "writes sent during a claim wait for its release, then run in order" do
    table = table()
    test = self()

    claimant =
      spawn_link(fn ->
        {:claimed, ref} =
          GenServer.call(
            table.writer,
            {:claim, {10, 11}, [{:add, {:a, 1}, [10, 11]}], [10, 11]}
          )

        send(test, :claimed)
        receive do: (:fill -> :ok)
        :ets.insert(table.rows, for(id <- [10, 11], do: {id, %{id: id, a: 1, tags: []}}))
        send(test, {:released, GenServer.call(table.writer, {:release, ref})})
      end)

    assert_receive :claimed

    # The writer is not blocked in the claim: it answers system messages
    # and holds each write back (key 10 has no row before the release).
    held = fn -> :queue.len(:sys.get_state(table.writer).held) end

    writes =
      for n <- 2..4 do
        task = Task.async(fn -> Table.merge(table, 10, %{a: n}) end)
        eventually(fn -> held.() == n - 1 end)
        task
      end

    send(claimant, :fill)
    assert_receive {:released, :ok}
    assert [{:ok, %{a: 2}}, {:ok, %{a: 3}}, {:ok, %{a: 4}}] = Enum.map(writes, &Task.await/1)
    assert Table.search_keys(table, a: 4) == [10] and Table.search_keys(table, a: 1) == [11]
    assert held.() == 0 and consistent?(table, [1, 2, 3, 4])
  end

  # The owner's exit deletes the table while a build may hold a claim: the
  # caller's own insert into ETS then fails, and must say the table is
  # gone rather than let ETS's bare badarg out.
  test "a build whose table's owner exits raises unknown Larder.Table, never a bare badarg" do
    for round <- 1..300 do
      parent = self()

      owner =
        spawn(fn ->
          send(parent, {:table, table()})
          receive do: (:never -> :ok)
        end)

      table = receive do: ({:table, table} -> table)
      records = for i <- 0..2_999, do: %{id: i, a: rem(i, 3), tags: []}

      caller =
        Task.async(fn ->
          try do
            Table.insert_many(table, records)
          rescue
            e -> e
          end
        end)

      for _ <- 1..rem(round * 37, 400), do: :erlang.yield()
      Process.exit(owner, :kill)

      case Task.await(caller) do
        :ok -> :ok
        %ArgumentError{} = e -> assert Exception.message(e) =~ "unknown Larder.Table"
      end
    end
  end

  test "a claim below the highest key the table has held is refused, and the rows are sent" do
    table = table()
    :ok = Table.insert_many(table, for(i <- 0..299, do: %{id: i, a: 1, tags: []}))
    :stale = GenServer.call(table.writer, {:claim, {0, 1}, [], [0, 1]})
    :ok = Table.insert_many(table, for(i <- 0..299, do: %{id: i, a: 2, tags: []}))
    assert Table.count(table, a: 1) == 0
    assert Table.count(table, a: 2) == 300
  end

  test "request/1 asks for a claim only for 256 or more fresh rows of integer keys" do
    rows = for id <- 1..256, do: {id, %{id: id}}
    ops = [{:add, {:a, 1}, [1]}]

    assert Claim.request({rows, ops, [], {1, 256}}) ==
             {:claim, {1, 256}, ops, Enum.to_list(1..256)}

    # Too few rows, keys that are not row ids, rows it replaces.
    assert Claim.request({tl(rows), ops, [], {2, 256}}) == nil
    assert Claim.request({rows, ops, [{"k", 1}], {1, 256}}) == nil
    assert Claim.request({rows, [{:set_terms, [], 1} | ops], [], {1, 256}}) == nil
    assert Claim.request({rows, ops, [], nil}) == nil
  end

  test "grant/5 grants a span at or above the top, monitoring the caller; below it is stale" do
    caller = spawn(fn -> receive do: (:stop -> :ok) end)
    assert Claim.grant({10, 20}, [], [10], caller, 11) == :stale

    assert {:ok, %Claim{low: 10, high: 20, ref: ref}} =
             Claim.grant({10, 20}, [], [10], caller, 10)

    send(caller, :stop)
    assert_receive {:DOWN, ^ref, :process, ^caller, :normal}
  end
end
