# The RESP wire format for Larder's own Redis connections (the pub/sub
# connection and the Sentinel connections; command connections are
# eredis's): encoding a command, and reading replies with eredis's parser.
defmodule Larder.Cache.Redis.RESP do
  @moduledoc false

  @doc "A command as RESP iodata (an array of bulk strings)."
  @spec command([binary()]) :: iodata()
  def command(args) do
    ["*", Integer.to_string(length(args)), "\r\n"] ++
      Enum.map(args, &["$", Integer.to_string(byte_size(&1)), "\r\n", &1, "\r\n"])
  end

  @doc """
  Reads the whole replies in `data`, after what `parser` holds:
  `{:ok, replies, parser, bytes of an unfinished reply}`, or `:error` when
  the bytes are not RESP (the parser's own failure included).
  """
  @spec parse(term(), binary(), list()) ::
          {:ok, [{:ok | :error, term()}], term(), non_neg_integer()} | :error
  def parse(parser, data, replies \\ []) do
    case :eredis_parser.parse(parser, data) do
      {:continue, parser} -> {:ok, Enum.reverse(replies), parser, byte_size(data)}
      {kind, value, parser} -> {:ok, Enum.reverse([{kind, value} | replies]), parser, 0}
      {kind, value, rest, parser} -> parse(parser, rest, [{kind, value} | replies])
      _other -> :error
    end
  catch
    _kind, _reason -> :error
  end
end
