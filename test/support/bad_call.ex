# Calls a public function with the arguments a bad-input property made,
# and turns what happens into a value the property can check.
defmodule Larder.Test.BadCall do
  @moduledoc false

  @doc """
  `apply(mod, fun, args)`: its result; `:argument_error` when it raises an
  `ArgumentError`; `{:raised, exception, stacktrace}` for any other
  exception. A `start_link` that started a process (the options happened
  to be valid) has it stopped, and gives `:ok`.
  """
  def run(mod, fun, args) do
    apply(mod, fun, args)
  rescue
    ArgumentError -> :argument_error
    other -> {:raised, other, __STACKTRACE__}
  else
    {:ok, pid} when fun == :start_link and is_pid(pid) ->
      GenServer.stop(pid)
      :ok

    result ->
      result
  end
end
