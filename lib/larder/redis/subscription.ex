# The socket of a pub/sub connection of the Redis client, held in the
# state of the process that owns it (a keeper of a single server, a
# Sentinel-managed master or a Cluster's masters): opening it with its
# handshake sent, reading what arrives, and closing it. What the replies
# mean, and what a failure costs, is the owner's own.
defmodule Larder.Redis.Subscription do
  @moduledoc false

  alias Larder.Redis.{RESP, Socket}

  @typedoc """
  An open subscription connection: its socket, its reply parser, the
  handshake replies still expected, and the timer that bounds the
  handshake (nil once the keeper has cancelled it).
  """
  @type t :: %{
          required(:socket) => :gen_tcp.socket(),
          required(:parser) => term(),
          required(:expect) => [atom()],
          required(:timer) => reference() | nil,
          optional(atom()) => term()
        }

  @doc """
  Connects to `host` (a charlist) and `port`, sends `commands` (the
  handshake, each a list of binaries) and arms the socket for one message;
  the handshake must be done within `timeout` ms, when the keeper gets
  `{tag, socket}`. Replies are bounded by `max_bytes`. `{:ok,
  subscription}`, or `{:error, {:connection_error, reason}}` with the
  socket closed.
  """
  @spec open(charlist(), 1..65_535, [[binary()]], [atom()], pos_integer(), timeout(), atom()) ::
          {:ok, t()} | {:error, {:connection_error, term()}}
  def open(host, port, commands, expect, max_bytes, timeout, tag \\ :sub_timeout) do
    with {:ok, socket} <- Socket.connect(host, port, timeout: timeout) do
      with :ok <- Socket.send(socket, commands),
           :ok <- :inet.setopts(socket, active: :once) do
        timer = Process.send_after(self(), {tag, socket}, timeout)
        {:ok, %{socket: socket, parser: RESP.new(max_bytes), expect: expect, timer: timer}}
      else
        {:error, reason} ->
          Socket.close(socket)
          {:error, {:connection_error, reason}}
      end
    else
      {:error, reason} -> {:error, {:connection_error, reason}}
    end
  end

  @doc """
  Reads `data` that arrived on the socket, and arms it for the next
  message: `{:ok, replies, subscription}`, or `{:error, :reply_too_large}`
  (a reply above the bound) or `{:error, :bad_reply}` (bytes that are not
  RESP).
  """
  @spec read(t(), binary()) ::
          {:ok, [RESP.reply()], t()} | {:error, :reply_too_large | :bad_reply}
  def read(%{socket: socket, parser: parser} = sub, data) do
    :inet.setopts(socket, active: :once)

    with {:ok, replies, parser} <- Socket.parse(parser, data),
         do: {:ok, replies, %{sub | parser: parser}}
  end

  @doc "Cancels the handshake timer and closes the socket."
  @spec close(t()) :: :ok
  def close(%{socket: socket, timer: timer}) do
    if timer, do: Process.cancel_timer(timer)
    Socket.close(socket)
  end
end
