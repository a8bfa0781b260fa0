# The one socket layer of Larder's Redis client: every connection to a
# Redis server or sentinel (the cache's command and pub/sub connections,
# Sentinel discovery, the cluster's slot map, the replica's stream reads)
# is opened here, with its handshake, and its replies are read here.
defmodule Larder.Redis.Socket do
  @moduledoc false

  # Contract (internal).
  #
  # connect/3 is the only :gen_tcp.connect of lib/: it opens a passive
  # binary socket to `host` (a string or charlist) and `port`, sends the
  # handshake (handshake/1: AUTH with or without a username, SELECT,
  # CLIENT SETNAME) and checks that every reply is OK, all within one
  # :timeout. The handshake's replies are parsed by a parser bounded by
  # :max_reply_bytes. A host :gen_tcp cannot take is an error, not a raise.
  #
  # Every failure is `{:error, reason}` with a reason of one vocabulary:
  #
  #   :timeout             nothing (or not all) arrived within the time
  #   :closed              the peer closed the connection
  #   {:tcp_error, posix}  connect, send or recv failed (:econnrefused...)
  #   :bad_reply           bytes that are not RESP, more replies than
  #                        commands, or a handshake reply that is not OK
  #                        and not an error reply
  #   :reply_too_large     a reply (or a round trip, with :max_total_bytes)
  #                        above its bound; nothing of it is buffered
  #   {:handshake, text}   the server refused the handshake (an error
  #                        reply to AUTH, SELECT or CLIENT SETNAME)
  #
  # Callers turn these into their own %Larder.Error{} (with the reason in
  # its details) or keep them as exit reasons of a connection process.
  #
  # Nothing here keeps state or spawns: the socket belongs to the caller,
  # which reads it passively (recv/5, request/4) or switches it to active
  # mode and feeds what arrives to parse/2.

  import Kernel, except: [send: 2]

  alias Larder.Redis.RESP

  @type reason ::
          :timeout
          | :closed
          | {:tcp_error, term()}
          | :bad_reply
          | :reply_too_large
          | {:handshake, binary()}

  # Handshake replies are OKs: a small parser bound unless told otherwise.
  @handshake_reply_bytes 65_536

  @doc """
  The handshake commands for `opts`: `AUTH` (with `:password`, and
  `:username` when given; any bytes, sent as a RESP array), `SELECT` (a
  `:database` other than 0) and `CLIENT SETNAME` (a `:client_name`).
  """
  @spec handshake(keyword()) :: [[binary()]]
  def handshake(opts) do
    auth =
      case {opts[:username], opts[:password]} do
        {nil, nil} -> []
        {nil, password} -> [["AUTH", password]]
        {username, password} -> [["AUTH", username, password || ""]]
      end

    select =
      case opts[:database] do
        db when db in [nil, 0] -> []
        db -> [["SELECT", Integer.to_string(db)]]
      end

    name =
      case opts[:client_name] do
        nil -> []
        name -> [["CLIENT", "SETNAME", name]]
      end

    auth ++ select ++ name
  end

  @doc """
  Connects and runs the handshake. Options: `:timeout` (required, ms: the
  connect and the handshake together), `:handshake` (commands, default
  none: see `handshake/1`), `:tcp` (extra `:gen_tcp` options), and
  `:max_reply_bytes` (the bound of each handshake reply). `{:ok, socket}`,
  passive, or `{:error, reason}` with nothing left open.
  """
  @spec connect(String.t() | charlist(), 1..65_535, keyword()) ::
          {:ok, :gen_tcp.socket()} | {:error, reason()}
  def connect(host, port, opts) do
    timeout = Keyword.fetch!(opts, :timeout)
    deadline = now() + timeout
    host = if is_binary(host), do: String.to_charlist(host), else: host

    tcp =
      [:binary, active: false, packet: :raw, send_timeout: timeout] ++
        Keyword.get(opts, :tcp, [])

    case tcp_connect(host, port, tcp, timeout) do
      {:ok, socket} ->
        case handshake(socket, Keyword.get(opts, :handshake, []), opts, deadline) do
          :ok ->
            {:ok, socket}

          {:error, _} = error ->
            :gen_tcp.close(socket)
            error
        end

      {:error, _} = error ->
        error
    end
  end

  defp tcp_connect(host, port, tcp, timeout) do
    case :gen_tcp.connect(host, port, tcp, timeout) do
      {:ok, socket} -> {:ok, socket}
      {:error, :timeout} -> {:error, :timeout}
      {:error, reason} -> {:error, {:tcp_error, reason}}
    end
  catch
    # (:gen_tcp.connect/4 raises on a host it cannot take)
    _kind, _reason -> {:error, {:tcp_error, :einval}}
  end

  defp handshake(_socket, [], _opts, _deadline), do: :ok

  defp handshake(socket, commands, opts, deadline) do
    parser = RESP.new(Keyword.get(opts, :max_reply_bytes, @handshake_reply_bytes))

    with :ok <- send(socket, commands),
         {:ok, replies, _parser} <- recv(socket, parser, length(commands), deadline) do
      case Enum.reject(replies, &(&1 == {:ok, "OK"})) do
        [] -> :ok
        [{:error, text} | _] -> {:error, {:handshake, text}}
        _ -> {:error, :bad_reply}
      end
    end
  end

  @doc "Sends `commands` (each a list of binaries) in one write."
  @spec send(:gen_tcp.socket(), [[binary()]]) :: :ok | {:error, reason()}
  def send(socket, commands) do
    case :gen_tcp.send(socket, Enum.map(commands, &RESP.command/1)) do
      :ok -> :ok
      {:error, :closed} -> {:error, :closed}
      {:error, :timeout} -> {:error, :timeout}
      {:error, reason} -> {:error, {:tcp_error, reason}}
    end
  end

  @doc """
  Reads exactly `n` replies from a passive socket before `deadline` (a
  monotonic time in ms): `{:ok, replies, parser}` or `{:error, reason}`.
  More replies than `n` is `:bad_reply`. With `max_total_bytes`, the bytes
  read in all are bounded too (checked before they are buffered).
  """
  @spec recv(:gen_tcp.socket(), RESP.t(), non_neg_integer(), integer(), pos_integer() | nil) ::
          {:ok, [RESP.reply()], RESP.t()} | {:error, reason()}
  def recv(socket, parser, n, deadline, max_total_bytes \\ nil),
    do: recv(socket, parser, n, deadline, max_total_bytes, 0, [])

  defp recv(_socket, parser, 0, _deadline, _max, _bytes, acc),
    do: {:ok, Enum.reverse(acc), parser}

  defp recv(socket, parser, left, deadline, max, bytes, acc) do
    wait = deadline - now()

    with true <- wait > 0 || {:error, :timeout},
         {:ok, data} <- tcp_recv(socket, wait),
         bytes = bytes + byte_size(data),
         true <- max == nil or bytes <= max || {:error, :reply_too_large},
         {:ok, replies, parser} <- parse(parser, data) do
      case length(replies) do
        k when k > left -> {:error, :bad_reply}
        k -> recv(socket, parser, left - k, deadline, max, bytes, Enum.reverse(replies, acc))
      end
    end
  end

  defp tcp_recv(socket, wait) do
    case :gen_tcp.recv(socket, 0, wait) do
      {:ok, data} -> {:ok, data}
      {:error, reason} when reason in [:closed, :timeout] -> {:error, reason}
      {:error, reason} -> {:error, {:tcp_error, reason}}
    end
  end

  @doc """
  Parses bytes that arrived (from an active socket): `{:ok, replies,
  parser}`, or `{:error, :bad_reply | :reply_too_large}`.
  """
  @spec parse(RESP.t(), binary()) ::
          {:ok, [RESP.reply()], RESP.t()} | {:error, :bad_reply | :reply_too_large}
  def parse(parser, data) do
    case RESP.parse(parser, data) do
      {:ok, _replies, _parser} = ok -> ok
      {:error, :not_resp} -> {:error, :bad_reply}
      {:error, :too_large} -> {:error, :reply_too_large}
    end
  end

  @doc """
  One request on a connection of its own: connects (with the handshake of
  `opts`, see `connect/3`), sends `commands`, reads their replies (each
  bounded by `:max_reply_bytes`) and closes, all within `:timeout`:
  `{:ok, replies}` (one per command; an error reply is a reply) or
  `{:error, reason}`.
  """
  @spec request(String.t() | charlist(), 1..65_535, [[binary()]], keyword()) ::
          {:ok, [RESP.reply()]} | {:error, reason()}
  def request(host, port, commands, opts) do
    deadline = now() + Keyword.fetch!(opts, :timeout)

    with {:ok, socket} <- connect(host, port, opts) do
      try do
        parser = RESP.new(Keyword.get(opts, :max_reply_bytes, @handshake_reply_bytes))

        with :ok <- send(socket, commands),
             {:ok, replies, _parser} <- recv(socket, parser, length(commands), deadline),
             do: {:ok, replies}
      after
        :gen_tcp.close(socket)
      end
    end
  end

  @doc "Closes the socket."
  @spec close(:gen_tcp.socket()) :: :ok
  def close(socket), do: :gen_tcp.close(socket)

  @doc """
  A server's address as a log line or an error names it: `"host:port"`
  (`"[host]:port"` for an IPv6 address).
  """
  @spec address(String.t() | charlist(), 1..65_535) :: String.t()
  def address(host, port) do
    host = to_string(host)
    if String.contains?(host, ":"), do: "[#{host}]:#{port}", else: "#{host}:#{port}"
  end

  @doc """
  A failure's `reason` (this module's vocabulary, or `:no_connection`) in
  words, for a log line: `{:tcp_error, :econnrefused}` is "connection
  refused", `{:tcp_error, :nxdomain}` "the host name does not resolve".
  """
  @spec describe(term()) :: String.t()
  def describe(:timeout), do: "no answer within the timeout"
  def describe(:closed), do: "the server closed the connection"
  def describe(:no_connection), do: "no connection"
  def describe({:tcp_error, :econnrefused}), do: "connection refused"
  def describe({:tcp_error, :nxdomain}), do: "the host name does not resolve"
  def describe({:tcp_error, :einval}), do: "the host is not a valid host name or address"
  def describe({:tcp_error, :ehostunreach}), do: "the host is unreachable"
  def describe({:tcp_error, :enetunreach}), do: "the network is unreachable"
  def describe({:tcp_error, :econnreset}), do: "the connection was reset by the server"
  def describe({:tcp_error, :etimedout}), do: "the connection timed out"

  def describe({:tcp_error, posix}) when is_atom(posix),
    do: "a TCP error (#{:inet.format_error(posix)})"

  def describe(:bad_reply),
    do: "bytes that are not a Redis reply (not RESP, or a reply nobody asked for)"

  def describe(:reply_too_large), do: "a reply above its size bound"

  def describe({:handshake, text}) when is_binary(text),
    do: "the server refused the handshake: #{bounded(text)}"

  def describe(other), do: inspect(other, limit: 10, printable_limit: 200)

  defp bounded(text), do: binary_part(text, 0, min(byte_size(text), 200))

  defp now, do: System.monotonic_time(:millisecond)
end
