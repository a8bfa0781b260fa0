# One command connection of Larder.Cache.Redis: a process that owns a TCP
# socket to a data node, pipelines its callers' commands and answers them
# in order; it exits when the connection fails, and its keeper replaces it.
defmodule Larder.Cache.Redis.Connection do
  @moduledoc false

  # Contract (internal).
  #
  # start_link/3 connects, sends AUTH (:username, :password, as a RESP
  # array: any bytes) and SELECT (a :database other than 0) and checks
  # their replies, all within :timeout, then returns {:ok, pid}; or
  # {:error, reason}. The process is linked to its caller (the keeper).
  #
  # q/3 and qp/3 send a command (or several, pipelined on this connection,
  # as ASKING then a command) and wait at most `timeout` ms for the
  # replies: a reply is {:ok, value} or {:error, text} (an error reply,
  # see Larder.Redis.RESP), and a failure {:error, reason} with an
  # atom or tuple reason: :timeout, :no_connection (no such process, or it
  # exited), :closed, {:tcp_error, _}, :bad_reply (bytes that are not
  # RESP, or a reply nobody asked for), :reply_too_large (a reply whose
  # declared size is above :max_reply_bytes; nothing of it is buffered).
  #
  # A failure of the connection fails every caller waiting on it at once
  # with that reason, closes the socket and ends the process (exit reason
  # {:shutdown, reason}): it never reconnects; its keeper starts another.
  #
  # Cost per command, in this process: one gen_tcp.send of the iodata the
  # caller encoded, one queue entry, one parse of what arrives, one reply.

  use GenServer

  alias Larder.Redis.RESP

  # TCP messages delivered before the socket goes passive again.
  @active 100

  @doc """
  Connects to `host` (a charlist) and `port`. Options: `:timeout` (default
  5,000 ms), `:database` (default 0), `:auth` (AUTH commands, see
  Larder.Cache.Redis.Auth; default none) and `:max_reply_bytes` (default
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
    deadline = System.monotonic_time(:millisecond) + timeout

    # (Nagle stays on: the commands of concurrent callers share segments;
    # one call's commands go out in one send, so none waits on an ACK)
    tcp_opts = [
      :binary,
      active: false,
      packet: :raw,
      keepalive: true,
      # reads of up to 64 KB (the default, 1,460 bytes, cuts a 1 MB value
      # into ~700 messages); each read is delivered at its own size
      buffer: 65_536,
      send_timeout: timeout
    ]

    select =
      if opts[:database] == 0, do: [], else: [["SELECT", Integer.to_string(opts[:database])]]

    handshake = opts[:auth] ++ select

    with {:ok, socket} <- :gen_tcp.connect(host, port, tcp_opts, timeout),
         parser = RESP.new(opts[:max_reply_bytes]),
         {:ok, parser} <- handshake(socket, handshake, parser, deadline),
         :ok <- :inet.setopts(socket, active: @active) do
      {:ok, %{socket: socket, parser: parser, waiting: :queue.new()}}
    else
      {:error, reason} -> {:stop, {:shutdown, reason}}
    end
  end

  defp handshake(_socket, [], parser, _deadline), do: {:ok, parser}

  defp handshake(socket, commands, parser, deadline) do
    result =
      case :gen_tcp.send(socket, Enum.map(commands, &RESP.command/1)) do
        :ok -> handshake_replies(socket, length(commands), parser, deadline)
        {:error, reason} -> {:error, {:tcp_error, reason}}
      end

    with {:error, _} <- result, do: :gen_tcp.close(socket)
    result
  end

  # Every reply must be OK.
  defp handshake_replies(socket, n, parser, deadline) do
    left = deadline - System.monotonic_time(:millisecond)

    with true <- left > 0 || {:error, :timeout},
         {:ok, data} <- :gen_tcp.recv(socket, 0, left),
         {:ok, replies, parser} <- parse(parser, data) do
      case Enum.reject(replies, &(&1 == {:ok, "OK"})) do
        [] when length(replies) < n ->
          handshake_replies(socket, n - length(replies), parser, deadline)

        [] when length(replies) == n ->
          {:ok, parser}

        [{:error, text} | _] ->
          {:error, {:handshake, text}}

        _ ->
          {:error, :bad_reply}
      end
    else
      {:error, reason} when reason in [:bad_reply, :reply_too_large, :timeout] -> {:error, reason}
      {:error, reason} -> {:error, {:tcp_error, reason}}
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
    case parse(parser, data) do
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

  # (the reasons callers see)
  defp parse(parser, data) do
    case RESP.parse(parser, data) do
      {:ok, _replies, _parser} = ok -> ok
      {:error, :not_resp} -> {:error, :bad_reply}
      {:error, :too_large} -> {:error, :reply_too_large}
    end
  end

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
