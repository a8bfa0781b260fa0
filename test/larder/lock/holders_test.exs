defmodule Larder.Lock.HoldersTest do
  # Larder.Lock.Holders, the holder registry: an id per process, once; an
  # entry per live holder, deleted by the janitor when it exits; a janitor
  # killed any number of times stops nothing.
  use ExUnit.Case, async: true

  import Larder.Test.Eventually

  alias Larder.Lock
  alias Larder.Lock.Holders

  test "each process gets its own id once, and ids are never reused" do
    id = Holders.id()
    assert is_integer(id) and id > 0
    assert Holders.id() == id
    ids = for _ <- 1..20, do: Task.await(Task.async(&Holders.id/0))
    assert length(Enum.uniq([id | ids])) == 21
    assert Holders.alive?(id)
  end

  test "thousands of short-lived holders leave no entry behind" do
    lock = Lock.new(4)
    registry = Process.whereis(Holders)
    parent = self()

    ids =
      for i <- 1..5_000 do
        {pid, ref} =
          spawn_monitor(fn ->
            Lock.with_slot(lock, rem(i, 4) + 1, fn -> :ok end, fn -> :ok end)
            send(parent, {:id, Holders.id()})
          end)

        assert_receive {:id, id}, 5_000
        assert_receive {:DOWN, ^ref, :process, ^pid, _}, 5_000
        id
      end

    # The registry handles each exit asynchronously.
    eventually(fn -> Enum.all?(ids, &(:ets.lookup(Holders, &1) == [])) end)
    refute Enum.any?(ids, &Holders.alive?/1)
    # Other tests' processes register and exit meanwhile, so the mailbox
    # is not always empty, but it is drained.
    eventually(fn ->
      match?(
        {:message_queue_len, n} when n < 100,
        :erlang.process_info(registry, :message_queue_len)
      )
    end)

    :erlang.garbage_collect(registry)
    {:memory, memory} = :erlang.process_info(registry, :memory)
    assert memory < 100_000
  end

  test "a killed janitor: ids stay, the next registration starts one that watches them all" do
    # Isolated: killing the janitor must not disturb the other tests.
    result =
      Larder.Test.Isolated.run(
        quote do
          alias Larder.Lock.Holders
          parent = self()

          live =
            spawn(fn ->
              send(parent, {:id, Holders.id()})
              receive do: (:stop -> :ok)
            end)

          id = receive do: ({:id, id} -> id)
          old = Process.whereis(Holders)
          ref = Process.monitor(old)
          Process.exit(old, :kill)
          receive do: ({:DOWN, ^ref, _, _, _} -> :ok)
          alive_after_kill = Holders.alive?(id)

          # The holder exits while no janitor runs: it counts as dead at
          # once, though its entry, whose monitor went with the janitor,
          # stays.
          mref = Process.monitor(live)
          send(live, :stop)
          receive do: ({:DOWN, ^mref, _, _, _} -> :ok)

          without_janitor =
            {Process.whereis(Holders), Holders.alive?(id), :ets.lookup(Holders, id)}

          # The next registration starts a janitor, which watches every
          # entry again and so deletes that one.
          Task.await(Task.async(&Holders.id/0))
          janitor = Process.whereis(Holders)
          :sys.get_state(janitor)
          {alive_after_kill, without_janitor, janitor != old, :ets.lookup(Holders, id)}
        end
      )

    assert {:ok, {true, {nil, false, [{_, _}]}, true, []}} = result
  end

  # Killing the janitor any number of times stops nothing: with it as a
  # permanent child, four kills within five seconds exceeded
  # Larder.Supervisor's restart intensity and stopped the :larder
  # application, and writers raised "needs the :larder application to be
  # started" while it restarted. Isolated: the old behaviour would stop
  # the application for the rest of the suite.
  test "the janitor killed 50 times: no writer raises, the application runs, takeover works" do
    result =
      Larder.Test.Isolated.run(
        quote do
          alias Larder.Lock.Holders

          {:ok, _} = Larder.Cache.start_link(name: :isolated_cache)
          bag = Larder.Bag.new()
          reg = Larder.Register.new()
          table = Larder.Table.new(key: :id)
          stop = :atomics.new(1, [])
          parent = self()

          write = fn
            :bag, i -> :ok = Larder.Bag.insert(bag, rem(i, 50), i)
            :register, i -> :ok = Larder.Register.put(reg, rem(i, 50), i)
            :table, i -> :ok = Larder.Table.insert(table, %{id: rem(i, 50), n: i})
            :cache, i -> :ok = Larder.Cache.put(:isolated_cache, rem(i, 50), i)
          end

          # Each write in a fresh process, so that processes register
          # while the janitor is being killed.
          loop = fn loop, kind, i, failures ->
            if :atomics.get(stop, 1) == 1 do
              send(parent, {:writer, kind, i, failures})
            else
              {pid, ref} = spawn_monitor(fn -> write.(kind, i) end)

              failures =
                receive do
                  {:DOWN, ^ref, :process, ^pid, :normal} -> failures
                  {:DOWN, ^ref, :process, ^pid, reason} -> [reason | failures]
                end

              loop.(loop, kind, i + 1, Enum.take(failures, 3))
            end
          end

          kinds = [:bag, :register, :table, :cache]
          for kind <- kinds, do: spawn(fn -> loop.(loop, kind, 0, []) end)

          # Kill whichever janitor runs, 50 times, as fast as one appears.
          wait = fn wait, tries ->
            case Process.whereis(Holders) do
              nil when tries > 0 -> Process.sleep(1) && wait.(wait, tries - 1)
              other -> other
            end
          end

          kills =
            Enum.count(1..50, fn _ ->
              case wait.(wait, 5_000) do
                nil ->
                  false

                janitor ->
                  ref = Process.monitor(janitor)
                  Process.exit(janitor, :kill)
                  receive do: ({:DOWN, ^ref, _, _, _} -> true)
              end
            end)

          :atomics.put(stop, 1, 1)
          writers = for _ <- kinds, do: receive(do: ({:writer, kind, n, f} -> {kind, n, f}))

          # A holder killed while it holds a slot is taken over.
          lock = Lock.new(1)

          holder =
            spawn(fn ->
              :acquired = Lock.acquire(lock, 1)
              send(parent, :holding)
              receive do: (:never -> :ok)
            end)

          receive do: (:holding -> :ok)
          Process.exit(holder, :kill)

          {kills, Enum.map(writers, fn {kind, n, failures} -> {kind, n > 0, failures} end),
           List.keymember?(Application.started_applications(), :larder, 0), Lock.acquire(lock, 1)}
        end,
        120_000
      )

    assert {:ok, {kills, writers, started?, takeover}} = result
    assert kills == 50

    assert Enum.sort(writers) ==
             Enum.sort(for kind <- [:bag, :register, :table, :cache], do: {kind, true, []})

    assert started?
    assert takeover == :taken_over
  end

  test "alive?/1 is false for an id nobody registered and for a holder that exited" do
    refute Holders.alive?(0)
    id = Task.await(Task.async(&Holders.id/0))
    # The task has exited: dead at once, whether or not its entry is gone yet.
    refute Holders.alive?(id)
    eventually(fn -> :ets.lookup(Holders, id) == [] end)
  end

  test "the janitor is a temporary child of Larder.Supervisor" do
    assert %{restart: :temporary, id: Holders} = Holders.child_spec([])
    # This process, registered, counts while it lives.
    _ = Holders.id()
    assert Holders.size() >= 1
  end
end
