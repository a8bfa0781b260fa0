defmodule Larder.Replica.ApplyTest do
  # Applying a batch to a Table target, with no replica around it: an
  # arity-1 function's results prepared beforehand (as the reader does) and
  # written in runs, an arity-2 function that writes the table itself and
  # sees what the entries before it queued, rejected entries skipped or
  # stopping the batch at the position before them, and a write that raises
  # (an index function) rejecting that entry only.
  use ExUnit.Case, async: true

  alias Larder.Replica.Apply
  alias Larder.Replica.Target
  alias Larder.Table

  setup ctx do
    target =
      Target.new!(
        {Table,
         key: :id,
         index: [:v, {:odd, fn %{v: v} -> if v == :bad, do: raise("no"), else: rem(v, 2) end}]}
      )

    table = Target.create(target)

    apply = %Apply{
      fun: fn fields -> fields end,
      target: target,
      handle: table,
      source: Larder.Test.ScriptedSource,
      on_error: :stop,
      name: ctx.test,
      telemetry: true
    }

    %{apply: apply, table: table}
  end

  defp contents(table), do: table |> Table.stream() |> Map.new(&{&1.id, &1.v})

  defp put(id, v), do: {:insert, %{id: id, v: v}}

  test "an arity-1 function's results, prepared, are written in order, in runs", ctx do
    apply = %{ctx.apply | fun: fn fields -> fields["ops"] end}
    prepare = Apply.prepare(apply)

    entries =
      prepare.(
        for {id, ops} <- [
              {1, [put(1, 1), put(2, 2)]},
              {2, {:delete, 1}},
              {3, :ok},
              {4, put(1, 5)}
            ],
            do: {id, %{"ops" => ops}}
      )

    assert {:entries, [_, _, _, _]} = entries
    assert Apply.batch(apply, entries, 0, 9, true) == {:ok, 9, 4, 0}
    assert contents(ctx.table) == %{1 => 5, 2 => 2}
  end

  test "an arity-2 function gets the handle and sees what the entries before it queued", ctx do
    me = self()

    apply = %{
      ctx.apply
      | fun: fn
          %{"write" => true}, table ->
            send(me, {:saw, contents(table)})
            Table.insert(table, %{id: 9, v: 9})

          fields, _table ->
            fields["ops"]
        end
    }

    assert Apply.prepare(apply) == nil
    entries = [{1, %{"ops" => put(1, 1)}}, {2, %{"write" => true}}, {3, %{"ops" => put(2, 2)}}]
    assert Apply.batch(apply, entries, 0, 3, false) == {:ok, 3, 3, 0}
    assert_received {:saw, %{1 => 1}}
    assert contents(ctx.table) == %{1 => 1, 2 => 2, 9 => 9}
  end

  test "rejected entries: skipped with on_error: :skip, reported", ctx do
    Larder.Test.TelemetryEvents.forward(ctx.test, [[:larder, :replica, :rejected]])

    fun = fn
      %{"k" => 2} -> raise "poison"
      %{"k" => 3} -> {:insert, %{no_key: true}}
      %{"k" => 4} -> {:bogus}
      %{"k" => k} -> put(k, k)
    end

    apply = %{ctx.apply | fun: fun, on_error: :skip}
    prepare = Apply.prepare(apply)
    entries = prepare.(for k <- 1..5, do: {k, %{"k" => k}})

    assert Apply.batch(apply, entries, 0, 5, true) == {:ok, 5, 2, 3}
    assert contents(ctx.table) == %{1 => 1, 5 => 5}

    name = ctx.test

    assert_received {:event, [:larder, :replica, :rejected], %{count: 1},
                     %{replica: ^name, id: 2, reason: {:error, %RuntimeError{}}, action: :skip}}

    assert_received {:event, _, _, %{id: 3, reason: {:returned, _}}}
    assert_received {:event, _, _, %{id: 4, reason: {:returned, {:bogus}}}}
  end

  test "with on_error: :stop the batch stops at the rejected entry, the ones before it written",
       ctx do
    fun = fn
      %{"k" => 3} -> throw(:no)
      %{"k" => k} -> put(k, k)
    end

    apply = %{ctx.apply | fun: fun}
    prepare = Apply.prepare(apply)
    entries = prepare.(for k <- 1..5, do: {k, %{"k" => k}})

    assert {:stop, %Larder.Error{reason: :apply_failed, details: %{id: 3}}, 2} =
             Apply.batch(apply, entries, 0, 5, true)

    assert contents(ctx.table) == %{1 => 1, 2 => 2}
  end

  test "a write that raises rejects its entry alone: the others are written", ctx do
    apply = %{ctx.apply | fun: fn %{"k" => k, "v" => v} -> put(k, v) end, on_error: :skip}
    prepare = Apply.prepare(apply)
    entries = prepare.(for {k, v} <- [{1, 1}, {2, :bad}, {3, 3}], do: {k, %{"k" => k, "v" => v}})

    # one op each: the batch's ops are written in one go, then one by one
    assert {:single, [1, 2, 3], [_, _, _]} = entries
    assert Apply.batch(apply, entries, 0, 3, true) == {:ok, 3, 2, 1}
    assert contents(ctx.table) == %{1 => 1, 3 => 3}
  end

  test "with on_error: :stop a write that raises stops the batch at its entry", ctx do
    apply = %{ctx.apply | fun: fn %{"k" => k, "v" => v} -> put(k, v) end}
    prepare = Apply.prepare(apply)
    entries = prepare.(for {k, v} <- [{1, 1}, {2, :bad}, {3, 3}], do: {k, %{"k" => k, "v" => v}})

    assert {:stop, %Larder.Error{reason: :apply_failed, details: %{id: 2}}, 1} =
             Apply.batch(apply, entries, 0, 3, true)
  end

  test "a batch whose entries give one op each is prepared as its ids and ops", ctx do
    prepare = Apply.prepare(%{ctx.apply | fun: fn %{"k" => k} -> put(k, k) end})

    assert prepare.(for k <- 1..3, do: {k, %{"k" => k}}) ==
             {:single, [1, 2, 3], [put(1, 1), put(2, 2), put(3, 3)]}

    assert prepare.([]) == {:single, [], []}
    assert Apply.batch(ctx.apply, prepare.([]), 0, 7, true) == {:ok, 7, 0, 0}
  end
end
