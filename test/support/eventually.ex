# Polls a condition that another process makes true asynchronously (a
# pub/sub message, a reconnection) until it holds or the tries run out.
defmodule Larder.Test.Eventually do
  @moduledoc false

  import ExUnit.Assertions, only: [flunk: 1]

  @doc "Calls `fun` until it returns true: once, then up to `tries` more times `sleep_ms` apart."
  def eventually(fun, tries \\ 100, sleep_ms \\ 20) do
    cond do
      fun.() ->
        :ok

      tries == 0 ->
        flunk("condition never became true")

      true ->
        Process.sleep(sleep_ms)
        eventually(fun, tries - 1, sleep_ms)
    end
  end

  @doc """
  Whether `fun` raises an `ArgumentError`: the condition to poll for a
  structure that another process is taking down (or bringing back).
  """
  def raises_argument_error?(fun) do
    fun.()
    false
  rescue
    ArgumentError -> true
  end
end
