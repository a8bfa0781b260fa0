defmodule Larder.InstanceTest do
  # The life cycle every structure shares (Larder.Instance), checked the
  # same way for Bag, Register, Table, Cache and Replica: one message for an
  # unknown structure and one for a term that is not one, one winner among
  # racing creators of a name, new/1 structures dying with their caller,
  # start_link/1 structures restarted after a crash but not after drop/1.
  use ExUnit.Case, async: true

  import Larder.Test.Eventually

  alias Larder.{Bag, Cache, Register, Replica, Table}

  defp unknown(kind, name) do
    "unknown #{inspect(kind)} #{inspect(name)}: it was never created, it was dropped, " <>
      "or the process that owned it exited"
  end

  defp replica_opts(name) do
    [
      name: name,
      into: {Table, name: :"#{name}.table", key: :id},
      source: {Larder.Test.EmptySource, []},
      apply: fn _fields -> :skip end
    ]
  end

  # {kind, a call by name or handle that raises once the structure is gone}
  defp calls do
    [
      {Bag, &Bag.size/1},
      {Register, &Register.size/1},
      {Table, &Table.size/1},
      {Cache, &Cache.get(&1, :k)},
      {Replica, &Replica.offset/1}
    ]
  end

  describe "one error message for every structure" do
    test "an unknown name", ctx do
      for {kind, call} <- calls() do
        name = :"#{ctx.test} #{inspect(kind)}"
        assert_raise ArgumentError, unknown(kind, name), fn -> call.(name) end
      end
    end

    test "a term that is neither a handle nor a name" do
      for {kind, call} <- calls(), bad <- ["x", 42, {:a}, nil] do
        message =
          "expected a #{inspect(kind)} (a handle or the name of one), got: #{inspect(bad)}"

        assert_raise ArgumentError, message, fn -> call.(bad) end
      end
    end

    test "a structure dropped or stopped, by name", ctx do
      for {kind, call} <- calls() do
        name = :"#{ctx.test} #{inspect(kind)}"

        case kind do
          Cache ->
            {:ok, sup} = Cache.start_link(name: name)
            :ok = Supervisor.stop(sup)

          Replica ->
            {:ok, _pid} = Replica.start_link(replica_opts(name))
            :ok = Replica.drop(name)

          _ ->
            kind.new(if kind == Table, do: [key: :id, name: name], else: [name: name])
            :ok = kind.drop(name)
        end

        assert_raise ArgumentError, unknown(kind, name), fn -> call.(name) end
      end
    end

    test "a handle whose structure was dropped names it", ctx do
      for kind <- [Bag, Register, Table] do
        name = :"#{ctx.test} #{inspect(kind)}"
        opts = if kind == Table, do: [key: :id, name: name], else: [name: name]
        handle = kind.new(opts)
        :ok = kind.drop(handle)
        assert_raise ArgumentError, unknown(kind, name), fn -> kind.size(handle) end
      end
    end
  end

  describe "one line for a dropped handle" do
    test "Bag, Register and Table show a handle without a name compactly" do
      for kind <- [Bag, Register, Table] do
        handle = kind.new(if kind == Table, do: [key: :id], else: [])
        :ok = kind.drop(handle)

        message =
          try do
            kind.size(handle)
            flunk("#{inspect(kind)}.size/1 of a dropped handle returned")
          rescue
            error in ArgumentError -> error.message
          end

        assert message =~
                 ~r/^unknown #{inspect(kind)} ##{inspect(kind)}<[^%\n]+>: it was dropped, or the process that owned it exited$/
      end
    end
  end

  describe "the :larder application not started" do
    # In a peer VM (another OS process): the application is stopped there,
    # never in the VM that runs the other tests.
    test "every way to create a structure, and a snapshot write, says so and what to do" do
      {:ok, {results, supervised, restarted}} =
        Larder.Test.Isolated.run(
          quote do
            alias Larder.{Bag, Cache, Register, Replica, Table}

            bag = Bag.new()
            table = Table.new(key: :id)

            path =
              Path.join(
                System.tmp_dir!(),
                "larder_not_started_#{System.unique_integer([:positive])}"
              )

            :ok = Bag.dump(bag, path <> ".bag")
            :ok = Table.dump(table, path <> ".table")

            # (Quiet: the application's exit is logged at notice.)
            Logger.configure(level: :warning)
            :ok = Application.stop(:larder)

            replica = [
              name: :replica,
              into: {Table, name: :replica_table, key: :id},
              source: {Larder.Test.EmptySource, []},
              apply: fn _ -> :skip end
            ]

            calls = [
              {"Larder.Bag", fn -> Bag.new() end},
              {"Larder.Bag", fn -> Bag.new(name: :roles) end},
              {"Larder.Bag", fn -> Bag.start_link(name: :roles) end},
              {"Larder.Bag", fn -> Bag.load(path <> ".bag") end},
              {"Larder.Bag.dump/2", fn -> Bag.dump(bag, path <> ".again") end},
              {"Larder.Register", fn -> Register.new() end},
              {"Larder.Register", fn -> Register.start_link(name: :reg) end},
              {"Larder.Table", fn -> Table.new(key: :id) end},
              {"Larder.Table", fn -> Table.start_link(key: :id, name: :prices) end},
              {"Larder.Table", fn -> Table.load(path <> ".table", key: :id) end},
              {"Larder.Table.dump/2", fn -> Table.dump(table, path <> ".again") end},
              {"Larder.Cache", fn -> Cache.start_link(name: :cache) end},
              {"Larder.Replica", fn -> Replica.start_link(replica) end}
            ]

            results =
              for {what, call} <- calls do
                try do
                  {what, {:returned, call.()}}
                rescue
                  error -> {what, {error.__struct__, Exception.message(error)}}
                end
              end

            # As a supervisor's child: its start fails with the same error.
            Process.flag(:trap_exit, true)

            supervised =
              case Supervisor.start_link([{Bag, name: :roles}], strategy: :one_for_one) do
                {:error, {:shutdown, {:failed_to_start_child, _, {:EXIT, {error, _stack}}}}}
                when is_exception(error) ->
                  {error.__struct__, Exception.message(error)}

                other ->
                  other
              end

            {:ok, _} = Application.ensure_all_started(:larder)
            restarted = Bag.size(Bag.new(name: :roles))
            for file <- Path.wildcard(path <> "*"), do: File.rm!(file)
            {results, supervised, restarted}
          end
        )

      for {what, result} <- results do
        assert result == {RuntimeError, not_started(what)}
      end

      assert supervised == {RuntimeError, not_started("Larder.Bag")}
      assert restarted == 0
    end
  end

  defp not_started(what) do
    "#{what}: the :larder application is not started: add :larder to your project's deps " <>
      "(it starts with your application), or call Application.ensure_all_started(:larder) " <>
      "in a script"
  end

  describe "a name is held by one structure" do
    # Each racer waits for :go, tries to create `name`, reports, and stays
    # alive (holding what it created) until :done.
    defp race(n, create) do
      test = self()

      racers =
        for _ <- 1..n do
          spawn(fn ->
            Process.flag(:trap_exit, true)

            receive do
              :go -> send(test, {self(), create.()})
            end

            receive do
              :done -> :ok
            end
          end)
        end

      Enum.each(racers, &send(&1, :go))
      results = for pid <- racers, do: receive(do: ({^pid, result} -> result))
      {racers, results}
    end

    defp finish(racers) do
      refs = for pid <- racers, do: {Process.monitor(pid), send(pid, :done)}
      for {ref, _} <- refs, do: assert_receive({:DOWN, ^ref, _, _, _})
    end

    defp taken?(create) do
      create.()
      false
    rescue
      e in ArgumentError -> e.message =~ "already exists"
    end

    test "racing new/1 callers: exactly one gets the name", ctx do
      for kind <- [Bag, Register, Table], round <- 1..60 do
        name = :"#{ctx.test} #{inspect(kind)} #{round}"
        opts = if kind == Table, do: [key: :id, name: name], else: [name: name]
        create = fn -> if taken?(fn -> kind.new(opts) end), do: :taken, else: :won end

        {racers, results} = race(8, create)
        assert Enum.count(results, &(&1 == :won)) == 1, "#{inspect(kind)}: #{inspect(results)}"
        assert Enum.count(results, &(&1 == :taken)) == 7
        finish(racers)
      end
    end

    test "racing start_link/1 callers: exactly one gets the name", ctx do
      starts = [
        {Bag, 40, &Bag.start_link(name: &1)},
        {Register, 40, &Register.start_link(name: &1)},
        {Table, 40, &Table.start_link(key: :id, name: &1)},
        {Cache, 10, &Cache.start_link(name: &1)},
        {Replica, 10, &Replica.start_link(replica_opts(&1))}
      ]

      for {kind, rounds, start} <- starts, round <- 1..rounds do
        name = :"#{ctx.test} #{inspect(kind)} #{round}"
        {racers, results} = race(6, fn -> start.(name) end)
        assert [{:ok, _}] = Enum.filter(results, &match?({:ok, _}, &1)), inspect(results)
        owner = Larder.Instance.whereis(kind, name)
        assert is_pid(owner)

        for result <- results, not match?({:ok, _}, result) do
          assert result == {:error, {:already_started, owner}}
        end

        finish(racers)
      end
    end
  end

  describe "ownership" do
    test "a new/1 structure dies with its caller; its name is free again", ctx do
      for kind <- [Bag, Register, Table] do
        name = :"#{ctx.test} #{inspect(kind)}"
        opts = if kind == Table, do: [key: :id, name: name], else: [name: name]
        test = self()

        caller =
          spawn(fn ->
            send(test, {:handle, kind.new(opts)})
            receive(do: (:never -> :ok))
          end)

        assert_receive {:handle, handle}
        ref = Process.monitor(caller)
        Process.exit(caller, :kill)
        assert_receive {:DOWN, ^ref, _, _, :killed}

        # Register and Table owners see the caller's death a moment later.
        eventually(fn -> raises_argument_error?(fn -> kind.size(handle) end) end)
        assert_raise ArgumentError, unknown(kind, name), fn -> kind.size(handle) end
        eventually(fn -> not taken?(fn -> kind.new(opts) end) end)
        assert kind.size(name) == 0
        :ok = kind.drop(name)
      end
    end

    test "a supervised replica: restarted after a crash, not after drop/1; drop/1 twice", ctx do
      name = :"#{ctx.test}"
      {:ok, sup} = Supervisor.start_link([{Replica, replica_opts(name)}], strategy: :one_for_one)
      [{{Replica, ^name}, pid, :worker, _}] = Supervisor.which_children(sup)
      ref = Process.monitor(pid)
      Process.exit(pid, :kill)
      assert_receive {:DOWN, ^ref, _, _, :killed}

      eventually(fn ->
        match?([{_, new, _, _}] when is_pid(new) and new != pid, Supervisor.which_children(sup))
      end)

      eventually(fn -> not raises_argument_error?(fn -> Replica.offset(name) end) end)
      [{_, pid, _, _}] = Supervisor.which_children(sup)
      ref = Process.monitor(pid)
      assert Replica.drop(name) == :ok
      assert_receive {:DOWN, ^ref, _, _, :normal}
      eventually(fn -> match?([{_, :undefined, _, _}], Supervisor.which_children(sup)) end)
      assert_raise ArgumentError, unknown(Replica, name), fn -> Replica.offset(name) end
      assert Replica.drop(name) == :ok
      assert Replica.drop(pid) == :ok
      :ok = Supervisor.stop(sup)
    end

    test "drop/1 of a pid that runs no replica does not touch it" do
      assert Replica.drop(self()) == :ok
      refute_received _
    end

    test "a cache and a replica started by a process that is not a supervisor: drop/1 " <>
           "stops them and never calls that process",
         ctx do
      parent = self()

      # a GenServer that answers only its own calls: a supervisor's call
      # would crash it
      {:ok, starter} =
        Agent.start(fn ->
          {:ok, cache} = Cache.start_link(name: :"#{ctx.test}.cache")
          {:ok, replica} = Replica.start_link(replica_opts(:"#{ctx.test}.replica"))
          send(parent, {:started, cache, replica})
          :ok
        end)

      assert_receive {:started, cache, replica}
      refs = for pid <- [cache, replica], do: Process.monitor(pid)
      assert Cache.drop(:"#{ctx.test}.cache") == :ok
      assert Replica.drop(:"#{ctx.test}.replica") == :ok
      for ref <- refs, do: assert_receive({:DOWN, ^ref, _, _, :normal})
      assert Process.alive?(starter)
      Agent.stop(starter)
    end

    test "no module of lib/ tells processes apart by how they were started " <>
           "(their :proc_lib initial call, their ancestors)" do
      files = Path.wildcard(Path.expand("../../lib/**/*.ex", __DIR__))
      assert files != []

      for file <- files,
          text = File.read!(file),
          probe <- ["initial_call", "$initial_call", "$ancestors"] do
        refute String.contains?(text, probe), "#{Path.relative_to_cwd(file)} uses #{probe}"
      end
    end
  end
end
