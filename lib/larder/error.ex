defmodule Larder.Error do
  @moduledoc """
  An error that comes from the world rather than from the caller: a corrupt
  snapshot, a Redis server that is down, a loader that failed.

  Functions that can fail this way return `{:error, %Larder.Error{}}`; their
  bang variants raise it. Bad arguments are not `Larder.Error`s: they raise
  `ArgumentError`.

  ## Fields

    * `:reason` - an atom that classifies the error, for matching
      (for example `:corrupt_snapshot`, `:l2_unavailable`, `:loader_failed`).
    * `:message` - a human-readable explanation, or `nil` to derive one.
    * `:details` - a map of context (a path, a key, the underlying error).
  """

  @type reason :: atom()
  @type t :: %__MODULE__{reason: reason(), message: String.t() | nil, details: map()}

  defexception reason: :unknown, message: nil, details: %{}

  @doc """
  Builds an error.

      iex> Larder.Error.new(:corrupt_snapshot, "bad checksum", path: "x.snap").details
      %{path: "x.snap"}
  """
  @spec new(reason(), String.t() | nil, Enumerable.t()) :: t()
  def new(reason, message \\ nil, details \\ %{}) when is_atom(reason) do
    %__MODULE__{reason: reason, message: message, details: Map.new(details)}
  end

  @impl true
  def message(%__MODULE__{reason: reason, message: nil, details: details}) do
    "#{reason}" <> format_details(details)
  end

  def message(%__MODULE__{reason: reason, message: message, details: details}) do
    "#{reason}: #{message}" <> format_details(details)
  end

  defp format_details(details) when map_size(details) == 0, do: ""
  defp format_details(details), do: " " <> inspect(details)
end
