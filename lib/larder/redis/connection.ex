# One command connection of the Redis client: a process that owns a TCP
# socket to a data node, pipelines its callers' commands and answers them
# in order; it exits when the connection fails, and its owner (the process
# that started it, linked: a Larder.Redis.Pool) replaces it.
defmodule Larder.Redis.Connection do
  @moduledoc false

  # Contract (internal).
  #
  # start_link/3 connects through Larder.Redis.Socket (AUTH, SELECT of a
  # :database other than 0, their replies checked, all within :timeout),
  # then returns {:ok, pid}; or {:error, reason}. The process is linked to
  # its caller (the owner of a pool).
  #
  # q/3 and qp/3 send a command (or several, pipelined on this connection,
  # as ASKING then a command) and wait at most `timeout` ms for the
  # replies: a reply is {:ok, value} or {:error, text} (an error reply,
  # see Larder.Redis.RESP), and a failure {:error, reason} with a reason
  # of Larder.Redis.Socket's vocabulary (:timeout, :closed, {:tcp_error, _},
  # :bad_reply - also a reply nobody asked for -, :reply_too_large), or
  # :no_connection (no such process, or it exited).
  #
  # The handshake's AUTH is a RESP array (:username and :password, any
  # bytes sent as they are), and each handshake reply must be OK.
  #
  # Replies are read incrementally, whatever the TCP segments: an error
  # reply is an error however its bytes arrive, and a value is never taken
  # for an error. Nothing is buffered beyond :max_reply_bytes per reply: a
  # bulk string's declared length is checked against it (with the rest of
  # its reply) before any of its bytes is kept. A reply nests at most 16
  # arrays of at most 2^24 elements each, and a line (a header, a status,
  # an error) is at most 64 KB (Larder.Redis.RESP).
  #
  # A failure of the connection fails every caller waiting on it at once
  # with that reason, closes the socket and ends the process (exit reason
  # {:shutdown, reason}): it never reconnects; its owner starts another.
  #
  # A caller whose reply does not come within its timeout gets
  # {:error, :timeout}; a reply that comes later is dropped (GenServer's
  # call alias).
  #
  # Cost per command: one GenServer.call. The caller encodes the command;
  # this process does one gen_tcp.send of it, one queue entry, one parse
  # of what arrives (the socket delivers up to @active reads before it is
  # re-armed), one reply. A bulk string read in one TCP read is a
  # sub-binary of it, one spread over several reads is joined once.

  use GenServer

  alias Larder.Redis.{RESP, Socket}

  # TCP messages delivered before the socket goes passive again.
  @active 100

  @doc """
  Connects to `host` (a charlist) and `port`. Options: `:timeout` (default
  5,000 ms), `:database` (default 0), `:auth` (AUTH commands, see
  Larder.Redis.Socket.handshake/1; default none) and `:max_reply_bytes` (default
  128 MB).
  """
  @spec start_link(charlist(), 1..65_535, keyword()) :: {:ok, pid()} | {:error, term()}
  def start_link(host, port, opts \\ []) do
    opts =
      Keyword.merge([timeout: 5_000, database: 0, auth: [], max_reply_bytes: 134_217_728], opts)

    GenServer.start_link(__MODULE__, {host, port, opts})
  catch
    :exit, reason -> {:error, reason}
  end

  @doc "One command: its reply, or `{:error, reason}` within `timeout` ms."
  @spec q(pid() | atom(), [binary()], timeout()) :: RESP.reply() | {:error, term()}
  def q(conn, command, timeout \\ 5_000), do: call(conn, {:q, RESP.command(command), 1}, timeout)

  @doc "Commands pipelined: their replies in order, or `{:error, reason}`."
  @spec qp(pid() | atom(), [[binary()]], timeout()) :: [RESP.reply()] | {:error, term()}
  def qp(conn, [_ | _] = commands, timeout \\ 5_000),
    do: call(conn, {:q, Enum.map(commands, &RESP.command/1), length(commands)}, timeout)

  defp call(conn, request, timeout) when is_pid(conn) do
    GenServer.call(conn, request, timeout)
  catch
    :exit, {:timeout, _} -> {:error, :timeout}
    :exit, {{:shutdown, reason}, _} -> {:error, reason}
    :exit, _ -> {:error, :no_connection}
  end

  # (a pool slot being replaced holds :none)
  defp call(_conn, _request, _timeout), do: {:error, :no_connection}

  @impl true
  def init({host, port, opts}) do
    timeout = opts[:timeout]

    # (Nagle stays on: the commands of concurrent callers share segments;
    # one call's commands go out in one send, so none waits on an ACK)
    tcp = [
      keepalive: true,
      # reads of up to 64 KB (the default, 1,460 bytes, cuts a 1 MB value
      # into ~700 messages); each read is delivered at its own size
      buffer: 65_536
    ]

    socket_opts = [
      timeout: timeout,
      tcp: tcp,
      handshake: opts[:auth] ++ Socket.handshake(database: opts[:database]),
      max_reply_bytes: opts[:max_reply_bytes]
    ]

    with {:ok, socket} <- Socket.connect(host, port, socket_opts),
         :ok <- :inet.setopts(socket, active: @active) do
      {:ok, %{socket: socket, parser: RESP.new(opts[:max_reply_bytes]), waiting: :queue.new()}}
    else
      {:error, reason} -> {:stop, {:shutdown, reason}}
    end
  end

  @impl true
  def handle_call({:q, data, n}, from, %{socket: socket, waiting: waiting} = state) do
    case :gen_tcp.send(socket, data) do
      :ok ->
        entry = if n == 1, do: from, else: {from, n, []}
        {:noreply, %{state | waiting: :queue.in(entry, waiting)}}

      {:error, reason} ->
        GenServer.reply(from, {:error, {:tcp_error, reason}})
        fail(state, {:tcp_error, reason})
    end
  end

  @impl true
  def handle_info({:tcp, socket, data}, %{socket: socket, parser: parser} = state) do
    case Socket.parse(parser, data) do
      {:ok, [], parser} -> {:noreply, %{state | parser: parser}}
      {:ok, replies, parser} -> answer(replies, %{state | parser: parser})
      {:error, reason} -> fail(state, reason)
    end
  end

  def handle_info({:tcp_passive, socket}, %{socket: socket} = state) do
    case :inet.setopts(socket, active: @active) do
      :ok -> {:noreply, state}
      {:error, reason} -> fail(state, {:tcp_error, reason})
    end
  end

  def handle_info({:tcp_closed, socket}, %{socket: socket} = state), do: fail(state, :closed)

  def handle_info({:tcp_error, socket, reason}, %{socket: socket} = state),
    do: fail(state, {:tcp_error, reason})

  def handle_info(_other, state), do: {:noreply, state}

  # Replies go to the waiting callers in order; a reply nobody waits for
  # is not Redis.
  defp answer([], state), do: {:noreply, state}

  defp answer([reply | replies], %{waiting: waiting} = state) do
    case :queue.out(waiting) do
      {{:value, {from, 1, acc}}, waiting} ->
        GenServer.reply(from, :lists.reverse(acc, [reply]))
        answer(replies, %{state | waiting: waiting})

      {{:value, {from, n, acc}}, waiting} ->
        answer(replies, %{state | waiting: :queue.in_r({from, n - 1, [reply | acc]}, waiting)})

      {{:value, from}, waiting} ->
        GenServer.reply(from, reply)
        answer(replies, %{state | waiting: waiting})

      {:empty, _} ->
        fail(state, :bad_reply)
    end
  end

  # Every caller waiting gets the failure now; the process ends.
  defp fail(%{socket: socket, waiting: waiting}, reason) do
    :gen_tcp.close(socket)

    for entry <- :queue.to_list(waiting) do
      from = if is_tuple(entry) and tuple_size(entry) == 3, do: elem(entry, 0), else: entry
      GenServer.reply(from, {:error, reason})
    end

    {:stop, {:shutdown, reason}, %{socket: nil, parser: nil, waiting: :queue.new()}}
  end
end
