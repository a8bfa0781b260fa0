defmodule Larder.Postgres.PgoutputTest do
  use ExUnit.Case, async: true

  alias Larder.Postgres.Pgoutput
  alias Larder.Test.PropEr

  # pgoutput messages as the server writes them.
  defp begin(lsn), do: <<?B, lsn::64, 0::64, 7::32>>
  defp commit(lsn, end_lsn), do: <<?C, 0, lsn::64, end_lsn::64, 0::64>>

  defp relation(id, schema, table, identity, columns) do
    cols =
      for {key?, name} <- columns,
          into: "",
          do: <<if(key?, do: 1, else: 0), name::binary, 0, 25::32, -1::32>>

    <<?R, id::32, schema::binary, 0, table::binary, 0, identity, length(columns)::16,
      cols::binary>>
  end

  defp tuple(values) do
    for v <- values, into: <<length(values)::16>> do
      case v do
        nil -> "n"
        :unchanged_toast -> "u"
        text -> <<?t, byte_size(text)::32, text::binary>>
      end
    end
  end

  defp fold(messages) do
    Enum.reduce(messages, {Pgoutput.new(), []}, fn bytes, {state, out} ->
      {:ok, message} = Pgoutput.decode(bytes)

      case Pgoutput.handle(state, message) do
        {:ok, result, state} -> {state, [result | out]}
        {:error, reason} -> {state, [{:error, reason} | out]}
      end
    end)
    |> then(fn {_state, out} -> Enum.reverse(out) end)
  end

  defp items,
    do: relation(16_390, "public", "items", ?d, [{true, "id"}, {false, "name"}, {false, "body"}])

  # A message is part of a 64 KiB read: a value kept from it must not
  # hold the whole read in memory.
  test "a value over 64 bytes is a binary of its own" do
    long = String.duplicate("x", 100)
    insert = <<?I, 16_390::32, ?N>> <> tuple(["1", long, "short"])
    bytes = binary_part(insert <> :binary.copy("z", 65_536), 0, byte_size(insert))
    assert {:ok, message} = Pgoutput.decode(bytes)
    values = message |> Tuple.to_list() |> List.last()
    assert [_, ^long, "short"] = values
    assert :binary.referenced_byte_size(Enum.at(values, 1)) == 100
  end

  test "a transaction's changes become entries of the documented shape" do
    out =
      fold([
        items(),
        begin(100),
        <<?I, 16_390::32, ?N>> <> tuple(["1", "a", nil]),
        # the key did not change: no old tuple
        <<?U, 16_390::32, ?N>> <> tuple(["1", "b", :unchanged_toast]),
        # the key changed: the old key
        <<?U, 16_390::32, ?K>> <> tuple(["1", nil, nil]) <> "N" <> tuple(["2", "b", "x"]),
        <<?D, 16_390::32, ?K>> <> tuple(["2", nil, nil]),
        <<?T, 1::32, 3, 16_390::32>>,
        commit(100, 180)
      ])

    assert out == [
             :none,
             {:begin, 100},
             {:changes,
              [
                %{
                  "op" => "insert",
                  "table" => "public.items",
                  "new" => %{"id" => "1", "name" => "a", "body" => nil}
                }
              ]},
             {:changes,
              [
                %{
                  "op" => "update",
                  "table" => "public.items",
                  "new" => %{"id" => "1", "name" => "b", "body" => :unchanged_toast},
                  "old" => %{"id" => "1"}
                }
              ]},
             {:changes,
              [
                %{
                  "op" => "update",
                  "table" => "public.items",
                  "new" => %{"id" => "2", "name" => "b", "body" => "x"},
                  "old" => %{"id" => "1"}
                }
              ]},
             {:changes,
              [%{"op" => "delete", "table" => "public.items", "old" => %{"id" => "2"}}]},
             {:changes, [%{"op" => "truncate", "table" => "public.items"}]},
             {:commit, 100, 180}
           ]
  end

  test "REPLICA IDENTITY FULL: the old row is the key" do
    full = relation(5, "s", "t", ?f, [{true, "a"}, {true, "b"}])

    out =
      fold([
        full,
        begin(1),
        <<?U, 5::32, ?O>> <> tuple(["1", "x"]) <> "N" <> tuple(["1", "y"]),
        <<?D, 5::32, ?O>> <> tuple(["1", "y"]),
        commit(1, 2)
      ])

    assert Enum.at(out, 2) ==
             {:changes,
              [
                %{
                  "op" => "update",
                  "table" => "s.t",
                  "new" => %{"a" => "1", "b" => "y"},
                  "old" => %{"a" => "1", "b" => "x"}
                }
              ]}

    assert Enum.at(out, 3) ==
             {:changes,
              [%{"op" => "delete", "table" => "s.t", "old" => %{"a" => "1", "b" => "y"}}]}
  end

  test "a truncate of several tables is one entry per table, with its flags decoded" do
    a = relation(1, "s", "a", ?d, [{true, "id"}])
    b = relation(2, "", "b", ?d, [{true, "id"}])

    assert {:ok, {:truncate, [1, 2], true, false}} =
             Pgoutput.decode(<<?T, 2::32, 1, 1::32, 2::32>>)

    assert {:ok, {:truncate, [2], false, true}} = Pgoutput.decode(<<?T, 1::32, 2, 2::32>>)

    assert [:none, :none, {:begin, 9}, {:changes, entries}, {:commit, 9, 10}] =
             fold([a, b, begin(9), <<?T, 2::32, 1, 1::32, 2::32>>, commit(9, 10)])

    # the empty namespace is pg_catalog's
    assert entries == [
             %{"op" => "truncate", "table" => "s.a"},
             %{"op" => "truncate", "table" => "pg_catalog.b"}
           ]
  end

  test "origins, types and messages are decoded and do not make entries" do
    assert {:ok, {:origin, 5, "node"}} = Pgoutput.decode(<<?O, 5::64, "node", 0>>)

    assert {:ok, {:type, 77, "public", "mood"}} =
             Pgoutput.decode(<<?Y, 77::32, "public", 0, "mood", 0>>)

    assert {:ok, {:message, true, 3, "pfx", "hello"}} =
             Pgoutput.decode(<<?M, 1, 3::64, "pfx", 0, 5::32, "hello">>)

    assert [:none, :none, :ignored] =
             fold([
               <<?O, 5::64, "node", 0>>,
               <<?Y, 77::32, "public", 0, "mood", 0>>,
               <<?M, 0, 3::64, "pfx", 0, 5::32, "hello">>
             ])
  end

  test "messages out of place are errors" do
    insert = <<?I, 16_390::32, ?N>> <> tuple(["1", "a", nil])

    assert fold([items(), insert]) == [:none, {:error, {:change_outside_transaction, :insert}}]
    assert fold([begin(1), begin(2)]) |> List.last() == {:error, :begin_inside_transaction}
    assert fold([commit(1, 2)]) == [{:error, :commit_outside_transaction}]
    assert fold([begin(1), commit(3, 4)]) |> List.last() == {:error, :commit_lsn_mismatch}
    assert fold([begin(1), insert]) |> List.last() == {:error, {:unknown_relation, 16_390}}

    assert fold([items(), begin(1), <<?I, 16_390::32, ?N>> <> tuple(["1"])]) |> List.last() ==
             {:error, :tuple_column_count}
  end

  test "malformed messages are errors" do
    for bytes <- [
          "",
          <<?B, 1::64>>,
          <<?C, 0, 1::64>>,
          <<?R, 1::32, "s", 0, "t", 0, ?x, 0::16>>,
          <<?R, 1::32, "s", 0, "t", 0, ?d, 2::16, 1, "a", 0, 25::32, -1::32>>,
          <<?R, 1::32, "s", 0, "t", 0, ?d, 1::16, 2, "a", 0, 25::32, -1::32>>,
          <<?I, 1::32, ?N, 1::16, ?t, 10::32, "abc">>,
          <<?I, 1::32, ?N, 1::16, ?b, 3::32, "abc">>,
          <<?I, 1::32, ?N, 1::16, ?t, 3::32, "abc", "extra">>,
          <<?U, 1::32, ?K, 1::16, ?n>>,
          <<?D, 1::32, ?N, 1::16, ?n>>,
          <<?T, 0::32, 0>>,
          <<?T, 2::32, 0, 1::32>>,
          <<?T, 1::32, 4, 1::32>>,
          <<?M, 1, 3::64, "pfx", 0, 9::32, "hello">>,
          <<?S, 1, 2, 3>>,
          <<?Z>>
        ] do
      assert {:error, _reason} = Pgoutput.decode(bytes)
    end
  end

  test "never raises on random bytes, nor on random messages after a relation" do
    type = :proper_types.oneof(Enum.map(~c"BCORYIUDTMZ", &{&1}))
    gen = {type, :proper_types.binary()}

    PropEr.check(
      PropEr.forall(:proper_types.list(gen), fn messages ->
        Enum.reduce(messages, Pgoutput.new(), fn {{type}, body}, state ->
          case Pgoutput.decode(<<type, body::binary>>) do
            {:ok, message} ->
              case Pgoutput.handle(state, message) do
                {:ok, _out, state} -> state
                {:error, _} -> state
              end

            {:error, _} ->
              state
          end
        end)

        true
      end),
      numtests: 2_000
    )
  end

  test "never raises on changes of any shape for known relations" do
    value = :proper_types.oneof([nil, :unchanged_toast, :proper_types.binary()])
    values = :proper_types.list(value)

    change =
      :proper_types.oneof([
        {:insert, :proper_types.integer(1, 3), values},
        {:update, :proper_types.integer(1, 3), values, values},
        {:delete, :proper_types.integer(1, 3), values}
      ])

    PropEr.check(
      PropEr.forall(:proper_types.list(change), fn changes ->
        {:ok, :none, state} =
          Pgoutput.handle(
            Pgoutput.new(),
            {:relation, 1, "s", "t", ?d, [{true, "a", 25, -1}, {false, "b", 25, -1}]}
          )

        {:ok, _, state} = Pgoutput.handle(state, {:begin, 1, 0, 1})

        Enum.all?(changes, fn change ->
          bytes =
            case change do
              {:insert, id, v} -> <<?I, id::32, ?N>> <> tuple(v)
              {:update, id, old, new} -> <<?U, id::32, ?O>> <> tuple(old) <> "N" <> tuple(new)
              {:delete, id, v} -> <<?D, id::32, ?K>> <> tuple(v)
            end

          {:ok, message} = Pgoutput.decode(bytes)

          case Pgoutput.handle(state, message) do
            {:ok, {:changes, [%{"op" => _, "table" => "s.t"}]}, _} ->
              true

            {:error, reason} ->
              reason in [:tuple_column_count, {:unknown_relation, 2}, {:unknown_relation, 3}]
          end
        end)
      end),
      numtests: 500
    )
  end
end
