# Calls a public function with the arguments a bad-input property made,
# and turns what happens into a value the property can check.
defmodule Larder.Test.BadCall do
  @moduledoc false

  @doc """
  `apply(mod, fun, args)`: its result; `:argument_error` when it raises an
  `ArgumentError`; `{:raised, exception, stacktrace}` for any other
  exception. A `start_link` that started a process (the options happened
  to be valid) has it stopped, and gives `:ok`; exits are trapped
  meanwhile, as a supervisor traps them: such a process may stop on its
  own first, with a reason that would end the caller (a replica whose
  arbitrary `:apply` fails on an entry stops with `{:shutdown, error}`).
  """
  def run(mod, :start_link, args) do
    trapping = Process.flag(:trap_exit, true)

    try do
      call(mod, :start_link, args)
    after
      Process.flag(:trap_exit, trapping)
    end
  end

  def run(mod, fun, args), do: call(mod, fun, args)

  defp call(mod, fun, args) do
    apply(mod, fun, args)
  rescue
    ArgumentError -> :argument_error
    other -> {:raised, other, __STACKTRACE__}
  else
    {:ok, pid} when fun == :start_link and is_pid(pid) ->
      stop(pid)
      :ok

    result ->
      result
  end

  defp stop(pid) do
    GenServer.stop(pid)
  catch
    # it stopped on its own first
    :exit, _ -> :ok
  after
    receive do
      {:EXIT, ^pid, _} -> :ok
    after
      0 -> :ok
    end
  end

  @doc """
  The failures of one call to `fun` with `args`, for a property that
  collects them: `call` makes the call and returns the failures it sees in
  the result (a list). What it raises or throws is a failure too, except an
  `ArgumentError` of ours (one that names the argument, where a BIF's bare
  badarg does not) and an exception `allowed?` accepts.
  """
  @spec failures(atom(), list(), (() -> list()), (Exception.t() -> boolean())) :: list()
  def failures(fun, args, call, allowed? \\ fn _ -> false end) do
    call.()
  rescue
    e in ArgumentError ->
      message = Exception.message(e)

      if message =~ ~r/^(errors were found at the given arguments|argument error)/,
        do: [{fun, summary(args), :bare_badarg, message}],
        else: []

    e ->
      if allowed?.(e), do: [], else: [{fun, summary(args), e}]
  catch
    kind, reason -> [{fun, summary(args), kind, reason}]
  end

  defp summary(args), do: inspect(args, limit: 5, printable_limit: 50)
end
