defmodule PriceCatalogue.Changes do
  @moduledoc """
  Price changes for a producer of the `prices` stream: a random price with
  a new value, and a pacer that keeps a rate however long each send takes.
  The sending itself (a Redis `XADD`, a Kafka produce) is the caller's.
  """

  @doc """
  A random price of `prices` (a non-empty tuple) with a new `value` in
  1..1,000,000, drawn from the calling process's random state (`:rand`).
  """
  @spec random(tuple()) :: PriceCatalogue.price()
  def random(prices) when is_tuple(prices) and tuple_size(prices) > 0 do
    price = elem(prices, :rand.uniform(tuple_size(prices)) - 1)
    %{price | value: :rand.uniform(1_000_000)}
  end

  def random(prices),
    do:
      raise(
        ArgumentError,
        "prices: expected a non-empty tuple, got: #{inspect(prices, limit: 3)}"
      )

  @doc """
  Calls `send.(n)` about every 10 ms for `duration_ms` with the `n` items
  due since the last call at `rate` per second (none due: no call), so
  that `rate` holds on average however long each call takes (a slow call
  makes the next one larger). Returns the number of items due in all,
  which `send` was asked for. Runs in the caller.
  """
  @spec paced(non_neg_integer(), non_neg_integer(), (pos_integer() -> term())) ::
          non_neg_integer()
  def paced(rate, duration_ms, send)
      when is_integer(rate) and rate >= 0 and is_integer(duration_ms) and duration_ms >= 0 and
             is_function(send, 1) do
    started = System.monotonic_time(:millisecond)
    paced(rate, send, started, started + duration_ms, 0)
  end

  def paced(rate, duration_ms, send) do
    raise ArgumentError,
          "paced/3 takes a rate and a duration (non-negative integers) and a function of " <>
            "arity 1, got: #{inspect(rate)}, #{inspect(duration_ms)}, #{inspect(send)}"
  end

  defp paced(rate, send, started, deadline, sent) do
    now = System.monotonic_time(:millisecond)

    if now >= deadline do
      sent
    else
      due = div((now - started) * rate, 1_000)
      if due > sent, do: send.(due - sent)
      Process.sleep(min(10, max(0, deadline - now)))
      paced(rate, send, started, deadline, max(due, sent))
    end
  end
end
