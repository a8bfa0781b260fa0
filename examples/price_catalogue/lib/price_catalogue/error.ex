defmodule PriceCatalogue.Error do
  @moduledoc """
  Why a catalogue file could not be read: `{:error, %PriceCatalogue.Error{}}`
  from `PriceCatalogue.load/1` and `PriceCatalogue.requests/1`.

  `:reason` is one of

    * `:file_error` - the file cannot be read (`:posix` holds the POSIX
      error, such as `:enoent`);
    * `:not_gzip` - a `.gz` file whose bytes are not gzip;
    * `:malformed` - the text is not the format's (`:message` says where).

  `:path` is the file's path.
  """

  defexception [:reason, :path, :message, posix: nil]

  @type t :: %__MODULE__{
          reason: :file_error | :not_gzip | :malformed,
          path: Path.t(),
          message: String.t(),
          posix: File.posix() | nil
        }

  @doc false
  @spec new(:file_error | :not_gzip | :malformed, Path.t(), String.t(), keyword()) :: t()
  def new(reason, path, message, opts \\ []) do
    %__MODULE__{
      reason: reason,
      path: path,
      message: "#{path}: #{message}",
      posix: Keyword.get(opts, :posix)
    }
  end
end
