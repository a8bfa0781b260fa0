defmodule Larder.LocalCopiesTest do
  # Larder.LocalCopies: a process's copies of a structure are dropped at its
  # first sweep after the structure dies (reclaim/1 when a death was
  # counted, hold/4 always), never while it lives, and once.
  use ExUnit.Case, async: true

  import Bitwise, only: [<<<: 2]
  require Larder.LocalCopies

  alias Larder.LocalCopies

  # A kind of structure for the test: alive while its atomics holds 1; its
  # copies are a process-dictionary entry, and dropping them is reported.
  defmodule Kind do
    @behaviour Larder.LocalCopies

    def new do
      live = :atomics.new(1, [])
      :atomics.put(live, 1, 1)
      live
    end

    def kill(live), do: :atomics.put(live, 1, 0)

    @impl true
    def live?(live), do: :atomics.get(live, 1) == 1

    @impl true
    def drop_copies(id) do
      Process.delete({__MODULE__, id})
      send(self(), {:dropped, id})
      :ok
    end

    def copy(deaths, id, live) do
      Process.put({__MODULE__, id}, :copy)
      LocalCopies.hold(deaths, id, __MODULE__, live)
    end
  end

  # A counter of this test's own: other tests' deaths do not move it.
  defp deaths, do: :atomics.new(1, signed: false)

  test "copies of a live structure stay; after its death, the next reclaim drops them once" do
    deaths = deaths()
    live = Kind.new()
    :ok = Kind.copy(deaths, :a, live)

    assert LocalCopies.reclaim(deaths) == :ok
    refute_received {:dropped, _}

    Kind.kill(live)
    # No death counted yet: reclaim looks at nothing.
    LocalCopies.reclaim(deaths)
    refute_received {:dropped, _}

    LocalCopies.died(deaths)
    LocalCopies.reclaim(deaths)
    assert_received {:dropped, :a}
    assert Process.get({Kind, :a}) == nil

    LocalCopies.died(deaths)
    LocalCopies.reclaim(deaths)
    refute_received {:dropped, :a}
  end

  test "only the dead structures' copies are dropped" do
    deaths = deaths()
    [a, b] = [Kind.new(), Kind.new()]
    Kind.copy(deaths, :a, a)
    Kind.copy(deaths, :b, b)
    Kind.kill(a)
    LocalCopies.died(deaths)
    LocalCopies.reclaim(deaths)
    assert_received {:dropped, :a}
    refute_received {:dropped, :b}
    assert Process.get({Kind, :b}) == :copy
  end

  test "hold/4 sweeps: a structure that died without a count is dropped at the next first copy" do
    deaths = deaths()
    a = Kind.new()
    Kind.copy(deaths, :a, a)
    Kind.kill(a)
    Kind.copy(deaths, :b, Kind.new())
    assert_received {:dropped, :a}
    refute_received {:dropped, :b}
  end

  test "hold/4 of a structure already dead drops its copies at once" do
    deaths = deaths()
    a = Kind.new()
    Kind.kill(a)
    Kind.copy(deaths, :a, a)
    assert_received {:dropped, :a}
  end

  test "release/1 forgets a structure: its death drops nothing" do
    deaths = deaths()
    a = Kind.new()
    Kind.copy(deaths, :a, a)
    assert LocalCopies.release(:a) == :ok
    assert LocalCopies.release(:never_held) == :ok
    Kind.kill(a)
    LocalCopies.died(deaths)
    LocalCopies.reclaim(deaths)
    refute_received {:dropped, :a}
  end

  test "each process sweeps its own copies" do
    deaths = deaths()
    a = Kind.new()
    Kind.copy(deaths, :a, a)

    other =
      Task.async(fn ->
        Kind.copy(deaths, :a, a)
        receive do: (:sweep -> LocalCopies.reclaim(deaths))
        receive do: ({:dropped, id} -> id)
      end)

    Kind.kill(a)
    LocalCopies.died(deaths)
    send(other.pid, :sweep)
    assert Task.await(other) == :a
    # This process has not swept yet.
    assert Process.get({Kind, :a}) == :copy
    LocalCopies.reclaim(deaths)
    assert_received {:dropped, :a}
  end

  test "new_key/0 gives distinct keys that key?/1 tells from other terms" do
    keys = for _ <- 1..100, do: LocalCopies.new_key()
    assert length(Enum.uniq(keys)) == 100

    for key <- keys do
      assert LocalCopies.key?(key)
      assert is_integer(LocalCopies.key_number(key)) and LocalCopies.key_number(key) > 0
    end

    for other <- [0, -1, 1 <<< 60, -(1 <<< 62), {:a, 1}, :key, "k"] do
      refute LocalCopies.key?(other)
    end
  end

  test "deaths/0 is the VM-wide counter the :larder application made" do
    deaths = LocalCopies.deaths()
    assert deaths == LocalCopies.deaths()
    before = :atomics.get(deaths, 1)
    # Counting a death here is harmless: the others only sweep once more.
    LocalCopies.died(deaths)
    assert :atomics.get(deaths, 1) >= before + 1
  end
end
