defmodule Larder.Table.BadInputTest do
  # PropEr bad-input property: every public function of Larder.Table gets
  # arbitrary terms (deep, improper, huge, maps, funs, forged, dropped and
  # unknown handles, options) for each argument. Only a normal result or an
  # ArgumentError may come back, and the tables under test still hold their
  # data, with every search of it agreeing with the records.
  use ExUnit.Case, async: true

  alias Larder.Table
  alias Larder.Test.BadCall
  alias Larder.Test.Hostile
  alias Larder.Test.PropEr

  @seeds 10
  @bad_handles [:dropped, :forged, :unknown_name]

  ## Generators

  # PropEr's ?LET: a generator of fun.(value) for values of `gen`.
  defp let(gen, fun), do: :proper_types.bind(gen, fun, false)

  defp hostile_gen do
    Hostile.term([
      {2, {:"$table", :proper_types.oneof([:live, :named, :dropped, :forged, :unknown_name])}}
    ])
  end

  # Records: maps with a key (never a seed's) and hostile fields.
  defp record_gen do
    t = hostile_gen()

    :proper_types.frequency([
      {3, let({t, t, t}, fn {k, a, tags} -> %{id: {:k, k}, a: a, tags: tags} end)},
      {1, let({t, t}, fn {k, a} -> %{id: {:k, k}, a: a} end)},
      {1, t}
    ])
  end

  defp conditions_gen do
    t = hostile_gen()
    name = :proper_types.oneof([:a, :m, :nope, t])
    value = :proper_types.oneof([t, {:in, t}, {:in, :proper_types.list(t)}])

    :proper_types.frequency([
      {3, :proper_types.list({name, value})},
      {1, let(:proper_types.list({name, value}), &Map.new/1)},
      {1, let(:proper_types.list({name, value}), &(&1 ++ :tail))},
      {1, t}
    ])
  end

  defp opts_gen do
    entry =
      :proper_types.oneof([:a, :b, :and, {:a, &Function.identity/1}, {:f, :x}, hostile_gen()])

    value =
      :proper_types.frequency([
        # (an improper list as a literal would be taken for a list type, which
        # PropEr's shrinker calls length/1 on)
        {2,
         :proper_types.oneof([
           :id,
           nil,
           0,
           -1,
           2 ** 64,
           "x",
           [:a, :a],
           :proper_types.exactly([:a | :b])
         ])},
        {2, :proper_types.list(entry)},
        {1, {:"$name"}},
        {2, hostile_gen()}
      ])

    Hostile.options([:key, :index, :store, :name], value, hostile_gen())
  end

  defp fun_gen do
    :proper_types.oneof([
      hostile_gen(),
      let(hostile_gen(), fn t ->
        # built here: the table calls the fun, the test's resolve never sees it
        term = Hostile.build(t)
        fn _ -> term end
      end),
      :proper_types.exactly(fn _ -> raise ArgumentError, "from the fun" end)
    ])
  end

  defp call_gen do
    t = hostile_gen()
    h = Hostile.handle(:"$table", @bad_handles, t)

    :proper_types.oneof(
      Hostile.creations(opts_gen()) ++
        [
          {:insert, [h, record_gen()]},
          {:insert_many,
           [h, :proper_types.oneof([t, :proper_types.list(record_gen()), Hostile.improper()])]},
          {:merge, [h, t, :proper_types.oneof([t, let(t, &%{a: &1}), let(t, &%{id: &1})])]},
          {:update, [h, t, :proper_types.oneof([t, record_gen()]), fun_gen()]},
          # A default that fits its key, so that the function runs once it exists.
          {:update,
           let({h, t, fun_gen()}, fn {h, k, f} -> [h, k, %{id: k, a: 1, tags: []}, f] end)},
          {:delete, [h, t]},
          {:get, [h, t]},
          {:get, [h, t, t]},
          {:search, [h, conditions_gen()]},
          {:search_keys, [h, conditions_gen()]},
          {:count, [h, conditions_gen()]},
          {:search_many,
           [h, :proper_types.oneof([t, :proper_types.list(conditions_gen()), Hostile.improper()])]},
          {:stream, [h]},
          {:size, [h]},
          {:memory, [h]},
          # Never the tables under test: dropping them is legitimate.
          {:drop, [:proper_types.oneof([t, {:"$table", :proper_types.oneof(@bad_handles)}])]}
        ]
    )
  end

  ## The property

  @tag timeout: :timer.minutes(10)
  test "bad input to any public function gives ArgumentError and loses nothing", context do
    # start_link/1 links the writers it starts (and a refused one exits).
    Process.flag(:trap_exit, true)

    property =
      PropEr.forall(
        {:proper_types.oneof([nil, [:a, :tags]]),
         :proper_types.non_empty(:proper_types.list(call_gen()))},
        fn {store, calls} -> run(calls, store, context.test) end
      )

    PropEr.check(property, numtests: 150, max_size: 10)
  end

  defp run(calls, store, test) do
    n = System.unique_integer([:positive])
    name = :"#{test} #{n}"
    opts = [key: :id, index: [:a, {:m, &Map.get(&1, :tags, [])}], store: store]
    live = Table.new(opts)
    _named = Table.new([name: name] ++ opts)
    dropped = Table.new(key: :id)
    :ok = Table.drop(dropped)
    seeds = for i <- 1..@seeds, do: %{id: {:seed, i}, a: rem(i, 3), tags: [i]}
    :ok = Table.insert_many(live, seeds)
    :ok = Table.insert_many(name, seeds)

    env = %{
      live: live,
      named: name,
      dropped: dropped,
      forged: struct(live, rows: make_ref(), writer: self()),
      unknown_name: :"no table #{n}",
      n: n
    }

    failures = Enum.flat_map(calls, &call(&1, env))

    failures =
      for table <- [live, name],
          not intact?(table, seeds),
          into: failures,
          do: {:lost_data, table}

    :ok = Table.drop(live)
    :ok = Table.drop(name)
    :proper.equals(failures, [])
  end

  # The seeds are there, and every search for their terms returns records
  # that hold the term (the index never points at a record that does not).
  defp intact?(table, seeds) do
    Enum.all?(seeds, &(Table.get(table, &1.id) == &1)) and
      Enum.all?(0..2, fn v ->
        found = Table.search(table, a: v)
        Enum.all?(found, &(&1.a === v)) and Enum.count(found, &match?({:seed, _}, &1.id)) > 0
      end) and
      Enum.all?(seeds, fn %{tags: [tag]} = seed ->
        found = Table.search(table, m: tag)
        seed in found and Enum.all?(found, &(tag in List.wrap(Map.get(&1, :tags, []))))
      end)
  end

  # Dropping the tables under test is legitimate: drop gets others.
  defp call({:drop, [{:"$table", which}]}, env) when which in [:live, :named],
    do: call({:drop, [{:"$table", :dropped}]}, env)

  defp call({fun, args}, env) do
    args = Enum.map(args, &resolve(&1, env))

    BadCall.failures(fun, args, fn -> apply(Table, fun, args) |> force(fun) |> check(fun) end)
  end

  # Only stream/1 returns a lazy result to run.
  defp force(stream, :stream), do: Enum.to_list(stream)
  defp force(other, _fun), do: other

  # What a call returned; cleans up what it created. Returns failures.
  defp check(%Table{} = table, :new), do: Table.drop(table) && []

  defp check({:ok, pid}, :start_link) do
    Process.unlink(pid)
    GenServer.stop(pid)
    []
  end

  # A taken name: GenServer's {:error, reason} with the ArgumentError.
  defp check({:error, %ArgumentError{}}, :start_link), do: []

  # The name of a live table (a generated option may name the test's own
  # named table): start_link/1's documented answer, naming its holder.
  defp check({:error, {:already_started, pid}} = error, :start_link) when is_pid(pid),
    do: if(Process.alive?(pid), do: [], else: [{:start_link, error}])

  defp check({:error, other}, fun), do: [{fun, :error, other}]
  defp check(_result, _fun), do: []

  # Hostile descriptors and the test's placeholders may sit anywhere in a
  # generated argument (records, conditions, options).
  defp resolve(term, env), do: Hostile.build(term, &placeholder(&1, env))

  defp placeholder({:"$table", which}, env), do: {:ok, Map.fetch!(env, which)}
  defp placeholder({:"$name"}, env), do: {:ok, :"larder_table_bad_input_#{env.n}"}
  defp placeholder(_term, _env), do: :error
end
