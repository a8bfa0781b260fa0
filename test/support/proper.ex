# Runs PropEr (Debian's erlang-proper) properties from ExUnit and turns a
# failure into an ExUnit assertion error that shows the shrunk counterexample.
defmodule Larder.Test.PropEr do
  @moduledoc false

  import ExUnit.Assertions, only: [flunk: 1]

  @doc """
  Checks `property` (built with `:proper.forall/2` and friends).

  Options: `:numtests` (default 100, or `PROPER_NUMTESTS` from the
  environment), `:max_size`.
  """
  def check(property, opts \\ []) do
    numtests = Keyword.get_lazy(opts, :numtests, &default_numtests/0)

    proper_opts =
      [{:numtests, numtests}, {:on_output, &quiet_output/2}] ++
        Enum.flat_map(Keyword.take(opts, [:max_size]), fn {k, v} -> [{k, v}] end)

    case :proper.quickcheck(property, proper_opts) do
      true ->
        :ok

      false ->
        counterexample = :proper.counterexample()
        :proper.clean_garbage()

        flunk(
          "property failed; shrunk counterexample:\n#{inspect(counterexample, pretty: true, limit: :infinity)}"
        )

      {:error, reason} ->
        flunk("PropEr error: #{inspect(reason)}")
    end
  end

  @doc """
  `:proper.forall(gen, fun)`, where an exception raised by `fun` fails the
  property with `{:raised, exception, stacktrace}` as its result (PropEr
  cannot report an exception itself on this OTP).
  """
  def forall(gen, fun) do
    :proper.forall(gen, fn value ->
      try do
        fun.(value)
      rescue
        e -> :proper.equals({:raised, e, __STACKTRACE__}, :ok)
      end
    end)
  end

  defp default_numtests do
    case System.get_env("PROPER_NUMTESTS") do
      nil -> 100
      n -> String.to_integer(n)
    end
  end

  # PropEr prints a dot per test and a line when all pass (its formats are
  # charlists); keep test output readable, but show what it says on failure.
  defp quiet_output(~c".", _args), do: :ok
  defp quiet_output(~c"~n", _args), do: :ok

  defp quiet_output(format, args) do
    text = IO.iodata_to_binary(:io_lib.format(format, args))
    unless text =~ "OK: Passed", do: IO.write(text)
  end
end
