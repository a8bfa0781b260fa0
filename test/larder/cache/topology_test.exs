defmodule Larder.Cache.TopologyTest do
  # The cache as a supervision tree (Larder.Cache's "Processes"): an L2's
  # processes come from the child spec its init/3 returns and run beside the
  # cache's process; their exits, however many, cost L1 nothing and never
  # stop the cache, and an L2 that cannot start is an error of start_link/1.
  use ExUnit.Case, async: true

  import Larder.Test.Eventually

  alias Larder.Cache
  alias Larder.Test.MemoryL2

  # An L2 whose commands go to a MemoryL2 server and whose one process (an
  # idle loop) can be told to crash, to crash at once on every start, or
  # not to start at all.
  defmodule ProcessL2 do
    @moduledoc false
    @behaviour Larder.Cache.L2

    @impl true
    def init(opts, subscriber, channel) do
      {:ok, server} = MemoryL2.init(opts, subscriber, channel)
      mode = Keyword.get(opts, :mode, :idle)
      test = Keyword.fetch!(opts, :test)
      {:ok, server, %{id: __MODULE__, start: {__MODULE__, :start_link, [mode, test]}}}
    end

    def start_link(:no_start, _test), do: {:error, :refused}

    def start_link(mode, test) do
      pid =
        spawn_link(fn ->
          send(test, {:l2_process, self()})
          if mode == :crash_loop, do: exit(:crashed_at_once)

          receive do
            :crash -> exit(:crashed)
          end
        end)

      {:ok, pid}
    end

    @impl true
    def get(s, k), do: MemoryL2.get(s, k)
    @impl true
    def put(s, k, v, t, m), do: MemoryL2.put(s, k, v, t, m)
    @impl true
    def delete(s, k), do: MemoryL2.delete(s, k)
    @impl true
    def incr(s, k), do: MemoryL2.incr(s, k)
    @impl true
    def publish(s, c, p), do: MemoryL2.publish(s, c, p)
    @impl true
    def stop(_s), do: :ok
  end

  setup ctx do
    server = start_supervised!(MemoryL2, id: {MemoryL2, make_ref()})
    %{server: server, name: :"#{ctx.module}.#{ctx.test}"}
  end

  defp start(ctx, mode) do
    Cache.start_link(
      name: ctx.name,
      l2: {ProcessL2, server: ctx.server, mode: mode, test: self()}
    )
  end

  @tag :capture_log
  test "an L2 process killed again and again is restarted; the owner, its tables and L1 stay",
       ctx do
    {:ok, sup} = start(ctx, :idle)
    owner = Process.whereis(ctx.name)
    :ok = Cache.put(ctx.name, :k, 1)
    data = Larder.Cache.Runtime.get(ctx.name).data

    for round <- 1..6 do
      assert_receive {:l2_process, pid}, 10_000
      if rem(round, 2) == 0, do: send(pid, :crash), else: Process.exit(pid, :kill)
      # L1 serves while the L2's processes are away
      assert Cache.get(ctx.name, :k) == 1
    end

    assert_receive {:l2_process, _pid}, 10_000
    assert Process.alive?(sup)
    assert Process.whereis(ctx.name) == owner
    assert Larder.Cache.Runtime.get(ctx.name).data == data
    assert Cache.stats(ctx.name).l2_errors >= 6
    eventually(fn -> Cache.put(ctx.name, :k, 2) == :ok end)
    assert Cache.get(ctx.name, :k) == 2
    Supervisor.stop(sup)
  end

  @tag :capture_log
  test "an L2 process in a crash loop does not stop the cache: its restarts back off", ctx do
    {:ok, sup} = start(ctx, :crash_loop)
    owner = Process.whereis(ctx.name)
    ref = Process.monitor(sup)
    # a supervisor's own intensity (5 restarts in 5 s) would have stopped
    # the cache by the 7th start
    for _ <- 1..7, do: assert_receive({:l2_process, _}, 10_000)
    refute_received {:DOWN, ^ref, _, _, _}
    assert Process.whereis(ctx.name) == owner
    assert Cache.fetch(ctx.name, :l1, fn -> {:ok, :served} end) == {:ok, :served}
    assert Cache.get(ctx.name, :l1) == :served
    Supervisor.stop(sup)
  end

  # (the test process does not trap exits: the failed start must not kill it)
  test "an L2 whose processes cannot start makes start_link/1 an :l2_failed error", ctx do
    assert {:error, %Larder.Error{reason: :l2_failed}} = start(ctx, :no_start)
    assert Process.whereis(ctx.name) == nil

    assert_raise ArgumentError, ~r/unknown Larder.Cache #{inspect(ctx.name)}/, fn ->
      Cache.get(ctx.name, :k)
    end
  end

  test "the tree: the owner first, then the L2's processes and the clock", ctx do
    {:ok, sup} = start(ctx, :idle)
    ids = for {id, pid, _, _} <- Supervisor.which_children(sup), is_pid(pid), do: id
    assert Enum.sort(ids) == [:clock, :l2, :owner]
    assert Larder.Cache.Supervisor.child(ctx.name, :owner) == Process.whereis(ctx.name)
    # a stop ends every process of the cache
    pids = for {_, pid, _, _} <- Supervisor.which_children(sup), do: pid
    refs = for pid <- pids, do: Process.monitor(pid)
    :ok = Supervisor.stop(sup)
    for ref <- refs, do: assert_receive({:DOWN, ^ref, _, _, _})
  end
end
