defmodule Larder.Table.OptionsTest do
  # Larder.Table.Options: a table's definition from new/1's, start_link/1's
  # and load/2's options; unknown, missing and invalid options, repeated
  # and reserved index names raise ArgumentError naming them.
  use ExUnit.Case, async: true

  alias Larder.Table
  alias Larder.Table.Options
  alias Larder.Test.PropEr

  test "options are validated" do
    assert_raise ArgumentError,
                 ~r/unknown Larder.Table options \[:keys\]; valid options are: \[:key, :index, :store, :name, :telemetry\]/,
                 fn ->
                   Table.new(keys: :id)
                 end

    assert_raise ArgumentError,
                 ~r/expected Larder.Table option :key to be a field name, got nothing \(it is required\)/,
                 fn -> Table.new(index: []) end

    assert_raise ArgumentError, ~r/reserved/, fn -> Table.new(key: :id, index: [:and]) end
    assert_raise ArgumentError, ~r/:index entry/, fn -> Table.new(key: :id, index: ["s"]) end
  end

  test "duplicate index names raise, naming the duplicate" do
    assert_raise ArgumentError, ~r/option :index names :a more than once/, fn ->
      Table.new(key: :id, index: [:a, {:a, & &1.b}])
    end

    assert_raise ArgumentError, ~r/option :index names :b more than once/, fn ->
      Table.new(key: :id, index: [:b, :c, :b])
    end
  end

  test "config!/2 builds the definition: fields and functions as entries, the key stored" do
    fun = &Map.get(&1, :tags, [])

    assert Options.config!([key: :id, index: [:a, {:m, fun}], store: [:a]], :new) == %{
             key: :id,
             entries: [{:a, {:field, :a}}, {:m, fun}],
             store: [:id, :a],
             name: nil,
             telemetry: true
           }

    assert %{store: nil, entries: [], telemetry: false} =
             Options.config!([key: :id, telemetry: false], :new)

    assert %{store: [:id]} = Options.config!([key: :id, store: [:id, :id]], :new)
    assert %{name: :t} = Options.config!([key: :id, name: :t], :start_link)
    assert_raise ArgumentError, ~r/:name/, fn -> Options.config!([key: :id], :start_link) end
  end

  test "a reserved name is refused as a field or as a function's name" do
    for name <- [:and, :or, :not, :term] do
      assert_raise ArgumentError, ~r/index name #{inspect(name)} is reserved/, fn ->
        Options.config!([key: :id, index: [{name, & &1}]], :new)
      end

      assert_raise ArgumentError, ~r/reserved/, fn ->
        Options.config!([key: :id, index: [name]], :new)
      end
    end

    assert_raise ArgumentError, ~r/:index entry/, fn ->
      Options.config!([key: :id, index: [{:m, fn a, b -> {a, b} end}]], :new)
    end

    assert_raise ArgumentError, ~r/:index/, fn ->
      Options.config!([key: :id, index: [:a | :b]], :new)
    end

    assert_raise ArgumentError, ~r/:store/, fn -> Options.config!([key: :id, store: :a], :new) end
  end

  test "property: any options give a definition or raise ArgumentError, nothing else" do
    entry =
      :proper_types.oneof([:a, :b, :and, "s", {:m, :proper_types.any()}, :proper_types.any()])

    value =
      :proper_types.oneof([
        :id,
        nil,
        true,
        :proper_types.list(entry),
        :proper_types.list(:proper_types.atom()),
        :proper_types.any()
      ])

    keys = [:key, :index, :store, :name, :telemetry]
    gen = Larder.Test.Hostile.options(keys, value, Larder.Test.Hostile.term())

    PropEr.check(
      PropEr.forall({gen, :proper_types.oneof([:new, :start_link])}, fn {opts, kind} ->
        opts = Larder.Test.Hostile.build(opts)

        try do
          is_map(Options.config!(opts, kind))
        rescue
          ArgumentError -> true
        end
      end),
      max_size: 20
    )
  end

  test "new/1 checks through it" do
    assert_raise ArgumentError, ~r/Larder.Table option/, fn -> Table.new(key: :id, store: 1) end
  end
end
