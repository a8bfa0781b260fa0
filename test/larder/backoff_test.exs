defmodule Larder.BackoffTest do
  # The one backoff: each wait within +-25% of its value, the value
  # doubling from min to max, back to min after reset/1; checked against a
  # plain model over random sequences of failures and resets.
  use ExUnit.Case, async: true

  alias Larder.Backoff

  test "waits double from min to max, each within +-25%, and reset starts over" do
    for _ <- 1..200 do
      min = Enum.random(1..500)
      max = min * Enum.random(1..64)
      steps = for _ <- 1..30, do: Enum.random([:fail, :fail, :fail, :reset])

      Enum.reduce(steps, {Backoff.new(min, max), min}, fn
        :reset, {backoff, _model} ->
          {Backoff.reset(backoff), min}

        :fail, {backoff, model} ->
          assert Backoff.peek(backoff) == model
          {wait, backoff} = Backoff.wait(backoff)
          low = if model < 4, do: model, else: model - div(model, 4)
          high = if model < 4, do: model, else: model + div(model, 4)
          assert wait >= low and wait <= high, "#{wait} outside #{low}..#{high}"
          {backoff, min(model * 2, max)}
      end)
    end
  end

  test "without jitter, the waits are the values" do
    backoff = Backoff.new(100, 5_000, jitter: false)
    {waits, _} = Enum.map_reduce(1..8, backoff, fn _, b -> Backoff.wait(b) end)
    assert waits == [100, 200, 400, 800, 1_600, 3_200, 5_000, 5_000]
  end

  test "bounds out of range are an ArgumentError" do
    for {min, max} <- [{0, 10}, {10, 5}, {1, 3_600_001}, {1.5, 10}, {:a, 10}] do
      assert_raise ArgumentError, ~r/expected a backoff/, fn -> Backoff.new(min, max) end
    end
  end
end
