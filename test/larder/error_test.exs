defmodule Larder.ErrorTest do
  use ExUnit.Case, async: true

  alias Larder.Test.Hostile
  alias Larder.Test.PropEr

  doctest Larder.Error

  test "new/1,3 builds errors from good arguments" do
    assert %Larder.Error{reason: :x, message: nil, details: %{}} = Larder.Error.new(:x)
    assert Larder.Error.new(:x, "m", %{a: 1}).details == %{a: 1}
    assert Larder.Error.new(:x, nil, [{"a", 1}, {2, 3}]).details == %{"a" => 1, 2 => 3}
    assert Exception.message(Larder.Error.new(:x, "m", a: 1)) == "x: m %{a: 1}"
  end

  test "new/1,3 names the bad argument" do
    for bad <- ["x", 1, {:x}, [], %{}, self()] do
      assert_raise ArgumentError, ~r/reason/, fn -> Larder.Error.new(bad) end
    end

    for bad <- [:m, 1, ~c"m", {"m"}, %{}] do
      assert_raise ArgumentError, ~r/message/, fn -> Larder.Error.new(:x, bad, []) end
    end

    for bad <- [:d, 1, "d", {:a, 1}, [:a], [{:a, 1} | :tail], [{:a, 1, 2}], 1..3, MapSet.new()] do
      assert_raise ArgumentError, ~r/details/, fn -> Larder.Error.new(:x, "m", bad) end
    end
  end

  # Only a Larder.Error or an ArgumentError that names the argument comes
  # back, whatever the arguments.
  test "bad input to new/1,3 raises ArgumentError naming the argument" do
    property =
      :proper.forall({Hostile.term(), Hostile.term(), Hostile.term()}, fn terms ->
        {r, m, d} = Hostile.build(terms)

        :proper.equals(
          {outcome(fn -> Larder.Error.new(r) end, r, nil, %{}),
           outcome(fn -> Larder.Error.new(r, m, d) end, r, m, d)},
          {:ok, :ok}
        )
      end)

    PropEr.check(property, numtests: 500)
  end

  defp outcome(fun, reason, message, details) do
    %Larder.Error{} = error = fun.()
    _ = Exception.message(error)
    expected = {reason, message, Map.new(details)}
    if {error.reason, error.message, error.details} == expected, do: :ok, else: {:built, error}
  rescue
    e in ArgumentError ->
      text = Exception.message(e)
      named? = text =~ ~r/^expected (reason|message|details) /
      if named? and not valid?(reason, message, details), do: :ok, else: {:raised, text}

    e ->
      {:raised, e}
  end

  defp valid?(reason, message, details),
    do: is_atom(reason) and (is_binary(message) or message == nil) and details?(details)

  defp details?(details) when is_map(details), do: not is_struct(details)
  defp details?([{_, _} | rest]), do: details?(rest)
  defp details?(other), do: other == []
end
