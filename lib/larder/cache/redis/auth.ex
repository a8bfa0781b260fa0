# What Larder.Cache.Redis sends to authenticate on a data node (its
# :username and :password): the AUTH command for Larder's own connections,
# and the argument eredis 1.2.0 puts in its own AUTH on every (re)connect.
defmodule Larder.Cache.Redis.Auth do
  @moduledoc false

  import Bitwise, only: [>>>: 2, &&&: 2]

  @doc "The AUTH command for `opts` (`[]` without a password or username)."
  @spec commands(keyword()) :: [[binary()]]
  def commands(opts) do
    case {opts[:username], opts[:password]} do
      {nil, nil} -> []
      {nil, password} -> [["AUTH", password]]
      {username, password} -> [["AUTH", username, password || ""]]
    end
  end

  @doc """
  The password argument of `:eredis.start_link/6`. eredis 1.2.0 sends it as
  an inline command, `AUTH "<password>"`, on every connect and reconnect, and
  has no username. Redis reads an inline command's double-quoted arguments
  with `\\xHH` escapes, so every byte is sent as one: no byte of a password
  can end the quoted argument, and a username becomes a first argument,
  `AUTH "<username>" "<password>"` (a Redis 6 ACL user), on every connect.
  """
  @spec eredis_password(keyword()) :: charlist()
  def eredis_password(opts) do
    case {opts[:username], opts[:password]} do
      {nil, nil} -> ~c""
      {nil, password} -> escape(password)
      {username, password} -> escape(username) ++ ~c"\" \"" ++ escape(password || "")
    end
  end

  defp escape(bin) do
    for <<byte <- bin>>, c <- [?\\, ?x, hex(byte >>> 4), hex(byte &&& 15)], do: c
  end

  defp hex(n) when n < 10, do: ?0 + n
  defp hex(n), do: ?a + n - 10
end
