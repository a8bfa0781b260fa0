defmodule PriceCatalogue.ChangesTest do
  use ExUnit.Case, async: true

  alias PriceCatalogue.Changes

  test "random/1 is a price of the tuple with a new value in 1..1_000_000" do
    prices = PriceCatalogue.generate(offerings: 1) |> Enum.take(10)
    tuple = List.to_tuple(prices)

    for _ <- 1..200 do
      change = Changes.random(tuple)
      assert change.value in 1..1_000_000
      assert Enum.any?(prices, &(%{&1 | value: change.value} == change))
    end

    assert_raise ArgumentError, ~r/non-empty tuple/, fn -> Changes.random({}) end
    assert_raise ArgumentError, ~r/non-empty tuple/, fn -> Changes.random(prices) end
  end

  test "paced/3 asks for what is due, never more than rate x duration, and returns the sum" do
    # The calls' sizes add up to what paced/3 returns, and what is due by
    # the deadline is at most rate x duration: bounds that hold however
    # loaded the machine is (no timing asserted).
    pid = self()
    sent = Changes.paced(2_000, 100, &send(pid, {:asked, &1}))
    asked = collect([])
    assert Enum.all?(asked, &(is_integer(&1) and &1 > 0))
    assert Enum.sum(asked) == sent
    assert sent <= 200
  end

  test "paced/3 with rate 0 or duration 0 asks for nothing" do
    fail = fn n -> flunk("asked for #{n}") end
    assert Changes.paced(0, 50, fail) == 0
    assert Changes.paced(1_000, 0, fail) == 0
  end

  test "paced/3 refuses bad arguments with ArgumentError" do
    assert_raise ArgumentError, ~r/paced/, fn -> Changes.paced(-1, 10, fn _ -> :ok end) end
    assert_raise ArgumentError, ~r/paced/, fn -> Changes.paced(1, :soon, fn _ -> :ok end) end
    assert_raise ArgumentError, ~r/paced/, fn -> Changes.paced(1, 10, fn -> :ok end) end
  end

  defp collect(acc) do
    receive do
      {:asked, n} -> collect([n | acc])
    after
      0 -> :lists.reverse(acc)
    end
  end
end
