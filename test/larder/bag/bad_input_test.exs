defmodule Larder.Bag.BadInputTest do
  # PropEr bad-input property: every public function of Larder.Bag gets
  # arbitrary terms (deep, improper, huge, maps, funs, forged and deleted
  # handles, hostile paths, options and snapshot files) for each argument.
  # Only a normal result, an ArgumentError or an {:error, %Larder.Error{}}
  # may come back (the bang variants may raise the Larder.Error), and the
  # bags under test still hold their data afterwards.
  use ExUnit.Case, async: true

  alias Larder.Bag
  alias Larder.Test.BadCall
  alias Larder.Test.Hostile
  alias Larder.Test.PropEr

  @bang [:dump!, :load!]
  @bad_handles [:deleted, :forged_ref, :foreign, :unknown_name]

  ## Generators

  defp hostile_gen do
    Hostile.term([
      {2, {:"$bag", :proper_types.oneof([:live, :named, :deleted, :forged_ref, :foreign])}}
    ])
  end

  defp opts_gen do
    value =
      :proper_types.frequency([
        {3, :proper_types.oneof([true, false, :auto, nil, 0, -1, 2 ** 64, "x"])},
        {1, {:"$name"}},
        {2, hostile_gen()}
      ])

    Hostile.options(
      [:name, :dedup, :read_concurrency, :write_concurrency, :compressed, :create_atoms],
      value,
      hostile_gen()
    )
  end

  # A hostile binary would be a real path (relative to the working
  # directory, or absolute): call/2 turns it into a file name in the test's
  # directory. Every other hostile term is passed as it is.
  defp path_gen do
    :proper_types.frequency([
      {2, hostile_gen()},
      {3, {:"$path", :proper_types.oneof([:file, :dir, :missing_dir, :null])}},
      {2, {:"$path", {:named, :proper_types.binary()}}}
    ])
  end

  # Snapshot files: random bytes, or a forged file with valid checksums.
  defp file_gen do
    :proper_types.oneof([
      {:"$file", :proper_types.binary()},
      {:"$file",
       {:forged, :proper_types.integer(0, 3),
        :proper_types.list(
          :proper_types.oneof([hostile_gen(), :proper_types.list(hostile_gen())])
        )}}
    ])
  end

  defp call_gen do
    t = hostile_gen()
    h = Hostile.handle(:"$bag", @bad_handles, t)

    :proper_types.oneof(
      Hostile.creations(opts_gen()) ++
        [
          {:insert, [h, t, t]},
          {:insert_many,
           [h, :proper_types.oneof([t, :proper_types.list({t, t}), :proper_types.list(t)])]},
          {:delete, [h, t]},
          {:delete, [h, t, t]},
          # Never the bags under test: deleting them is legitimate.
          {:drop, [:proper_types.oneof([t, {:"$bag", :proper_types.oneof(@bad_handles)}])]},
          {:lookup, [h, t]},
          {:member?, [h, t, t]},
          {:count, [h, t]},
          {:size, [h]},
          {:memory, [h]},
          {:keys, [h]},
          {:stream, [h]},
          {:dump, [h, path_gen()]},
          {:dump!, [h, path_gen()]},
          {:load, [:proper_types.oneof([path_gen(), file_gen()]), opts_gen()]},
          {:load!, [:proper_types.oneof([path_gen(), file_gen()]), opts_gen()]}
        ]
    )
  end

  ## The property

  test "bad input to any public function gives ArgumentError or a Larder.Error, and loses nothing",
       context do
    dir =
      Path.join(System.tmp_dir!(), "larder_bag_bad_input_#{System.unique_integer([:positive])}")

    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf!(dir) end)

    Process.flag(:trap_exit, true)
    holder = spawn_link(fn -> receive(do: (:never -> :ok)) end)
    foreign = :ets.new(:foreign, [:set, :protected, heir: :none])
    :ets.give_away(foreign, holder, nil)

    property =
      PropEr.forall(
        {:proper_types.bool(), :proper_types.non_empty(:proper_types.list(call_gen()))},
        fn {dedup, calls} -> run(calls, dedup, dir, foreign, context.test) end
      )

    PropEr.check(property, numtests: 300, max_size: 12)
  end

  defp run(calls, dedup, dir, foreign, test) do
    n = System.unique_integer([:positive])
    name = :"#{test} #{n}"
    live = Bag.new(dedup: dedup)
    named = Bag.new(dedup: dedup, name: name)
    deleted = Bag.new()
    Bag.drop(deleted)
    reserved = {:reserved, make_ref()}
    data = for v <- 1..20, do: {reserved, v}
    Bag.insert_many(live, data)
    Bag.insert_many(named, data)

    env = %{
      live: live,
      named: name,
      deleted: deleted,
      forged_ref: struct(Bag, tab: make_ref(), dedup: true),
      foreign: struct(Bag, tab: foreign, dedup: dedup),
      unknown_name: :"no bag #{n}",
      dir: dir,
      n: n
    }

    failures = Enum.flat_map(calls, &call(&1, env))
    flush_exits()

    failures =
      for bag <- [live, name],
          Enum.sort(Bag.lookup(bag, reserved)) != Enum.to_list(1..20),
          into: failures,
          do: {:lost_data, bag}

    Bag.drop(live)
    Bag.drop(name)
    :proper.equals(failures, [])
  end

  # Deleting the bags under test is legitimate: drop gets others.
  defp call({:drop, [{:"$bag", which}]}, env) when which in [:live, :named],
    do: call({:drop, [{:"$bag", :deleted}]}, env)

  defp call({fun, args}, env) do
    args = fun |> path_position() |> confine(Enum.map(args, &resolve(&1, env)), env)

    BadCall.failures(
      fun,
      args,
      fn -> apply(Bag, fun, args) |> force() |> check(fun) end,
      # The bang functions raise a Larder.Error for a bad file.
      &(fun in @bang and is_struct(&1, Larder.Error))
    )
  end

  defp force(%Stream{} = stream), do: Enum.to_list(stream)
  defp force(fun) when is_function(fun), do: Enum.to_list(fun)
  defp force(other), do: other

  # What a call returned; cleans up what it created. Returns failures.
  defp check({:error, %Larder.Error{}}, fun) when fun in [:dump, :load], do: []
  defp check({:error, other}, fun) when fun in [:dump, :load], do: [{fun, :error, other}]
  defp check({:ok, %Bag{} = bag}, :load), do: Bag.drop(bag) && []
  defp check(%Bag{} = bag, fun) when fun in [:new, :load!], do: Bag.drop(bag) && []

  defp check({:ok, pid}, :start_link) do
    GenServer.stop(pid)
    []
  end

  # A taken name: GenServer's {:error, reason} with the ArgumentError.
  defp check({:error, %ArgumentError{}}, :start_link), do: []
  defp check(_result, _fun), do: []

  # Hostile descriptors and the test's placeholders may sit anywhere in a
  # generated argument (pairs, options, lists).
  defp resolve(term, env), do: Hostile.build(term, &placeholder(&1, env))

  defp placeholder({:"$bag", which}, env), do: {:ok, Map.fetch!(env, which)}
  defp placeholder({:"$name"}, env), do: {:ok, :"larder_bad_input_#{env.n}"}
  defp placeholder({:"$path", which}, env), do: {:ok, path(which, env)}

  defp placeholder({:"$file", content}, env) do
    path = Path.join(env.dir, "file-#{System.unique_integer([:positive])}.bag")
    File.write!(path, file_bytes(resolve(content, env)))
    {:ok, path}
  end

  defp placeholder(_term, _env), do: :error

  defp path(:file, env), do: Path.join(env.dir, "snap.bag")
  defp path(:dir, env), do: env.dir
  defp path(:missing_dir, env), do: Path.join([env.dir, "gone", "x.bag"])
  defp path(:null, env), do: Path.join(env.dir, "a\0b")
  defp path({:named, bin}, env) when not is_binary(bin), do: path({:named, inspect(bin)}, env)

  defp path({:named, bin}, env) do
    name = Base.url_encode64(bin)
    Path.join(env.dir, binary_part(name, 0, min(byte_size(name), 100)) <> ".bag")
  end

  # Which argument of `fun` is a path (0-based), if any.
  defp path_position(fun) when fun in [:dump, :dump!], do: 1
  defp path_position(fun) when fun in [:load, :load!], do: 0
  defp path_position(_fun), do: nil

  # A binary path outside the test's directory is moved into it.
  defp confine(nil, args, _env), do: args

  defp confine(at, args, env) do
    List.update_at(args, at, fn
      path when is_binary(path) ->
        if String.starts_with?(path, env.dir),
          do: path,
          else: resolve({:"$path", {:named, path}}, env)

      other ->
        other
    end)
  end

  defp proper_list?([_ | tail]), do: proper_list?(tail)
  defp proper_list?([]), do: true
  defp proper_list?(_), do: false

  defp file_bytes({:forged, dedup, payloads}) do
    chunks =
      for term <- payloads do
        bin = :erlang.term_to_binary(term)
        count = if proper_list?(term), do: length(term), else: 1
        [<<byte_size(bin)::32, count::32, :erlang.crc32(bin)::32>>, bin]
      end

    total = payloads |> Enum.map(&if(proper_list?(&1), do: length(&1), else: 1)) |> Enum.sum()

    ["LARDERBAG", 2, dedup, chunks, <<0::32, total::64>>]
  end

  defp file_bytes(bytes), do: bytes

  defp flush_exits do
    receive do
      {:EXIT, _, _} -> flush_exits()
    after
      0 -> :ok
    end
  end
end
