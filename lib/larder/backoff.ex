# The one backoff of Larder's processes that try again after a failure:
# a Redis connection that could not be opened or was lost, a pub/sub
# connection, a cluster's slot map read while a master is down, and the
# cache's restart of an L2 whose processes stopped.
defmodule Larder.Backoff do
  @moduledoc false

  # Contract (internal).
  #
  # A backoff is a value its process keeps in its state. wait/1 gives the
  # wait before the next attempt: `min` first, then twice the last one
  # after each further failure, never above `max`; reset/1, after an
  # attempt that succeeded, starts again from `min`. With `jitter: true`
  # (the default) each wait is taken at random within +-25% of its value
  # (never below 1 ms), so that processes that failed together (the pools
  # of masters that went down together) do not try again together; the
  # doubling goes on from the value, not from the jittered wait.
  #
  # Bounds: 1 <= min <= max <= 3_600_000 (an hour); anything else is an
  # ArgumentError, since the bounds come from options checked before.

  @enforce_keys [:min, :max, :next]
  defstruct [:min, :max, :next, jitter: true]

  @type t :: %__MODULE__{
          min: pos_integer(),
          max: pos_integer(),
          next: pos_integer(),
          jitter: boolean()
        }

  @max_ms 3_600_000

  @doc "A backoff from `min` to `max` ms. Option: `:jitter` (default `true`)."
  @spec new(pos_integer(), pos_integer(), keyword()) :: t()
  def new(min, max, opts \\ []) do
    unless is_integer(min) and is_integer(max) and min >= 1 and min <= max and max <= @max_ms do
      raise ArgumentError,
            "expected a backoff from 1 to #{@max_ms} ms with min <= max, " <>
              "got: #{inspect(min)}..#{inspect(max)}"
    end

    %__MODULE__{min: min, max: max, next: min, jitter: Keyword.get(opts, :jitter, true)}
  end

  @doc """
  The wait before the next attempt (ms, jittered), and the backoff whose
  following wait is twice this one's value, up to `max`.
  """
  @spec wait(t()) :: {pos_integer(), t()}
  def wait(%__MODULE__{next: next, max: max} = backoff) do
    {jitter(next, backoff.jitter), %{backoff | next: min(next * 2, max)}}
  end

  @doc "The value of the next wait, without jitter (for a log line)."
  @spec peek(t()) :: pos_integer()
  def peek(%__MODULE__{next: next}), do: next

  @doc "Back to `min`, after an attempt that succeeded."
  @spec reset(t()) :: t()
  def reset(%__MODULE__{min: min} = backoff), do: %{backoff | next: min}

  @doc "Whether the next wait is the first one (nothing failed since the last reset)."
  @spec fresh?(t()) :: boolean()
  def fresh?(%__MODULE__{min: min, next: next}), do: next == min

  # `wait` +-25%: from 3/4 of it to 5/4 of it, uniformly.
  defp jitter(wait, false), do: wait
  defp jitter(wait, _true) when wait < 4, do: wait

  defp jitter(wait, _true) do
    quarter = div(wait, 4)
    wait - quarter + :rand.uniform(2 * quarter + 1) - 1
  end
end
