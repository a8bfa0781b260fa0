defmodule Larder.OptionsTest do
  # Every public constructor checks its options with Larder.Options: an
  # unknown option, a value of the wrong type, a number out of its bounds,
  # something that is not a keyword list and a missing required option each
  # give a message of the same shape, naming the module and the option.
  use ExUnit.Case, async: true

  alias Larder.{Bag, Cache, Index, Register, Table}

  # {what, constructor, options it needs besides the one under test,
  #  {an option, a value of the wrong type}, {a numeric option, a value
  #  past its bound} or nil, required option or nil}
  defp constructors(ctx) do
    name = :"#{ctx.module}.#{ctx.test}"

    [
      {"Larder.Register", &Register.new/1, [], {:slots, "8"}, {:slots, 1_048_577}, nil},
      {"Larder.Register", &Register.start_link/1, [name: name], {:max_cached, :x},
       {:max_cached, 0}, :name},
      {"Larder.Register", &Register.child_spec/1, [name: name], {:telemetry, 1}, {:slots, 0},
       :name},
      {"Larder.Index", &Index.new/1, [], {:reverse, "yes"}, nil, nil},
      {"Larder.Cache", &Cache.start_link/1, [name: name], {:compressed, :yes},
       {:max_entries, 1_099_511_627_777}, :name},
      {"Larder.Cache", &Cache.child_spec/1, [name: name], {:ttl, "1s"}, {:ttl, 0}, :name},
      {"Larder.Cache.Redis", &Larder.Cache.Redis.validate_opts!/1, [], {:host, 'localhost'},
       {:port, 65_536}, nil},
      {"Larder.Bag", &Bag.new/1, [], {:dedup, :yes}, nil, nil},
      {"Larder.Bag", &Bag.start_link/1, [name: name], {:write_concurrency, 1}, nil, :name},
      {"Larder.Bag", &Bag.child_spec/1, [name: name], {:compressed, nil}, nil, :name},
      {"Larder.Bag", &Bag.load("/nonexistent/larder.bag", &1), [], {:create_atoms, "no"}, nil,
       nil},
      {"Larder.Table", &Table.new/1, [key: :id], {:index, :color}, nil, :key},
      {"Larder.Table", &Table.start_link/1, [key: :id, name: name], {:store, "f"}, nil, :name},
      {"Larder.Table", &Table.child_spec/1, [key: :id, name: name], {:telemetry, nil}, nil, :name}
    ]
  end

  test "an unknown option names it and lists the valid ones", ctx do
    for {what, fun, base, _, _, _} <- constructors(ctx) do
      message = ~r/^unknown #{Regex.escape(what)} options \[:bogus\]; valid options are: \[:/

      assert_raise ArgumentError, message, fn -> fun.(base ++ [bogus: 1]) end
    end
  end

  test "a value of the wrong type names the option, what it must be and the value", ctx do
    for {what, fun, base, {key, bad}, _, _} <- constructors(ctx) do
      message =
        ~r/^expected #{Regex.escape(what)} option #{inspect(key)} to be .+, got: #{Regex.escape(inspect(bad))}$/

      assert_raise ArgumentError, message, fn -> fun.(base ++ [{key, bad}]) end
    end
  end

  test "a number past its documented bound gives the bounds", ctx do
    for {what, fun, base, _, {key, bad}, _} <- constructors(ctx), key != nil do
      message =
        ~r/^expected #{Regex.escape(what)} option #{inspect(key)} to be an integer in -?\d+\.\.\d+.*, got: #{bad}$/

      assert_raise ArgumentError, message, fn -> fun.(base ++ [{key, bad}]) end
    end
  end

  test "options that are not a keyword list", ctx do
    for {what, fun, _, _, _, _} <- constructors(ctx), bad <- [[:x], %{slots: 1}, "opts"] do
      message = ~r/^expected #{Regex.escape(what)} options to be a keyword list, got: /
      assert_raise ArgumentError, message, fn -> fun.(bad) end
    end
  end

  test "a required option that is missing", ctx do
    for {what, fun, base, _, _, key} <- constructors(ctx), key != nil do
      message =
        ~r/^expected #{Regex.escape(what)} option #{inspect(key)} to be .+, got nothing \(it is required\)$/

      assert_raise ArgumentError, message, fn -> fun.(Keyword.delete(base, key)) end
    end
  end

  test "a key given twice has each of its values checked, and the first counts" do
    assert_raise ArgumentError, ~r/option :slots to be an integer/, fn ->
      Register.new(slots: 8, slots: :x)
    end

    assert [slots: 8, max: 1] =
             Larder.Options.validate!(
               [slots: 8, slots: 9],
               [slots: {{:integer, 1, 10}, 1}, max: {{:integer, 1, 10}, 1}],
               "T"
             )
  end
end
