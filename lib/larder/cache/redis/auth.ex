# What Larder.Cache.Redis sends to authenticate on a data node (its
# :username and :password): the AUTH command of every connection, sent as
# a RESP array, so any bytes of a password or username are sent as they are.
defmodule Larder.Cache.Redis.Auth do
  @moduledoc false

  @doc "The AUTH command for `opts` (`[]` without a password or username)."
  @spec commands(keyword()) :: [[binary()]]
  def commands(opts) do
    case {opts[:username], opts[:password]} do
      {nil, nil} -> []
      {nil, password} -> [["AUTH", password]]
      {username, password} -> [["AUTH", username, password || ""]]
    end
  end
end
