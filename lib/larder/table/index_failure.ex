# An index function that raised, threw or exited on a record, as
# Larder.Table.Records reports it: Larder.Table turns it into the
# ArgumentError its caller gets, which adds the table, the operation and
# what was written. It does not reach a user.
defmodule Larder.Table.IndexFailure do
  @moduledoc false

  @enforce_keys [:index, :key, :kind, :reason, :stacktrace]
  defexception @enforce_keys

  @type t :: %__MODULE__{
          index: term(),
          key: term(),
          kind: :error | :exit | :throw,
          reason: term(),
          stacktrace: Exception.stacktrace()
        }

  @impl true
  def message(%__MODULE__{} = failure) do
    "the index function of #{inspect(failure.index, limit: 10)} failed on the record with key " <>
      "#{inspect(failure.key, limit: 10)}: " <> banner(failure)
  end

  @doc "What the index function did, as Elixir prints it: `** (KeyError) key :x not found in: ...`."
  @spec banner(t()) :: String.t()
  def banner(%__MODULE__{kind: kind, reason: reason, stacktrace: stacktrace}),
    do: Exception.format_banner(kind, reason, stacktrace)
end
