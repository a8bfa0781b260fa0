defmodule Larder.TableTelemetryTest do
  # The Larder.Table events of Larder.Telemetry (search and write spans),
  # through the test stand-in for :telemetry (test/support/telemetry.ex).
  # Events of other tests' tables are told apart by the :table metadata.
  use ExUnit.Case, async: true

  alias Larder.Table

  @events for op <- [:search, :write],
              kind <- [:start, :stop, :exception],
              do: [:larder, :table, op, kind]

  setup ctx do
    Larder.Test.TelemetryEvents.forward({__MODULE__, ctx.test}, @events)
  end

  defp new_table(opts \\ []) do
    table = Table.new([key: :id, index: [:color]] ++ opts)

    :ok =
      Table.insert_many(table, [
        %{id: 1, color: :red},
        %{id: 2, color: :blue},
        %{id: 3, color: :red}
      ])

    flush()
    table
  end

  defp flush do
    receive do
      {:event, _, _, _} -> flush()
    after
      0 -> :ok
    end
  end

  # The start and stop of one search span of `table`; returns the stop's
  # metadata.
  defp assert_search(table, op, conditions) do
    assert_receive {:event, [:larder, :table, :search, :start], start,
                    %{
                      table: ^table,
                      op: ^op,
                      conditions: ^conditions,
                      telemetry_span_context: ctx
                    }}

    assert is_integer(start.system_time) and is_integer(start.monotonic_time)

    assert_receive {:event, [:larder, :table, :search, :stop], %{duration: duration},
                    %{
                      table: ^table,
                      op: ^op,
                      conditions: ^conditions,
                      telemetry_span_context: ^ctx
                    } = meta}

    assert is_integer(duration) and duration >= 0
    meta
  end

  test "search/2, search_keys/2, count/2 and search_many/2 are search spans with their results" do
    table = new_table()

    assert [_, _] = Table.search(table, color: :red)
    assert %{results: 2} = assert_search(table, :search, color: :red)

    assert Table.search_keys(table, %{color: :blue}) == [2]
    assert %{results: 1} = assert_search(table, :search_keys, %{color: :blue})

    assert Table.count(table, color: :red) == 2
    assert %{results: 2} = assert_search(table, :count, color: :red)

    many = [[color: :red], [color: :blue], [color: :green]]
    assert [[_, _], [_], []] = Table.search_many(table, many)
    assert %{results: 3} = assert_search(table, :search_many, many)
    Table.drop(table)
  end

  test "a named table is its name in the metadata", ctx do
    name = :"#{__MODULE__}.#{ctx.test}"
    table = new_table(name: name)
    assert Table.count(name, []) == 3
    assert %{results: 3} = assert_search(name, :count, [])
    :ok = Table.insert(table, %{id: 4, color: :red})
    assert_receive {:event, [:larder, :table, :write, :stop], _, %{table: ^name, op: :insert}}
    Table.drop(name)
  end

  test "a search that raises emits :exception" do
    table = new_table()
    assert_raise ArgumentError, ~r/no index named :size/, fn -> Table.search(table, size: 1) end

    assert_receive {:event, [:larder, :table, :search, :exception], %{duration: _},
                    %{table: ^table, op: :search, kind: :error, reason: %ArgumentError{}}}

    Table.drop(table)
  end

  test "every write is a write span, with its key where it has one" do
    table = new_table()

    :ok = Table.insert(table, %{id: 4, color: :red})
    :ok = Table.insert_many(table, [%{id: 5, color: :blue}])
    {:ok, _} = Table.merge(table, 4, %{color: :blue})
    :error = Table.merge(table, 9, %{color: :blue})
    :ok = Table.update(table, 6, %{id: 6, color: :red}, & &1)
    :ok = Table.delete(table, 5)

    for {op, meta} <- [
          insert: %{},
          insert_many: %{},
          merge: %{key: 4},
          merge: %{key: 9},
          update: %{key: 6},
          delete: %{key: 5}
        ] do
      assert_receive {:event, [:larder, :table, :write, :start], _,
                      %{table: ^table, op: ^op, telemetry_span_context: ctx} = start}

      assert Map.take(start, [:key]) == meta

      assert_receive {:event, [:larder, :table, :write, :stop], %{duration: _},
                      %{table: ^table, op: ^op, telemetry_span_context: ^ctx} = stop}

      expected = if meta == %{key: 9}, do: :not_found, else: :ok
      assert stop.result == expected
    end

    Table.drop(table)
  end

  test "a write that raises emits :exception" do
    table = new_table()

    assert_raise RuntimeError, fn ->
      :ok = Table.insert(table, %{id: 1, color: :red})
      Table.update(table, 1, %{id: 1}, fn _ -> raise "no" end)
    end

    assert_receive {:event, [:larder, :table, :write, :exception], _,
                    %{table: ^table, op: :update, key: 1, kind: :error}}

    Table.drop(table)
  end

  test "telemetry: false turns a table's events off" do
    table = new_table(telemetry: false)
    Table.search(table, color: :red)
    Table.search_keys(table, color: :red)
    Table.count(table, color: :red)
    Table.search_many(table, [[color: :red]])
    :ok = Table.insert(table, %{id: 9, color: :red})
    :ok = Table.delete(table, 9)

    refute_received {:event, _, _, %{table: ^table}}
    Table.drop(table)
  end
end
