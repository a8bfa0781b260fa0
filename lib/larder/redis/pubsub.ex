# One pub/sub connection of the Redis client: a process that subscribes to
# its channels on one server (AUTH, CLIENT ID when asked, SUBSCRIBE or
# SSUBSCRIBE), reports what happens to its owner in its own messages, and
# connects again on its own, with the one backoff (Larder.Backoff), when
# the connection fails or cannot be opened. It never exits because of the
# server: a server that refuses or is down costs one attempt per backoff.
defmodule Larder.Redis.PubSub do
  @moduledoc false

  # Contract (internal).
  #
  # start_link/1 options:
  #
  #   :owner        the pid that gets the events (required; the process
  #                 stops when it goes)
  #   :ref          a term put in every event (default nil)
  #   :node         {host, port} to subscribe on, or nil: idle until move/2
  #   :auth         the AUTH command(s) of the handshake (default [])
  #   :client_id    true: CLIENT ID before the subscription, its id in the
  #                 :subscribed event (a tracking redirect's target)
  #   :command      "SUBSCRIBE" (default) or "SSUBSCRIBE" (sharded)
  #   :channels     1 to 16 channels (binaries)
  #   :timeout      ms for the connect and the whole handshake
  #   :max_message_bytes  the largest reply read (a larger one closes the
  #                 connection, as bytes that are not RESP do)
  #   :backoff      {min, max} ms between attempts
  #   :label        what log lines call it ("the pub/sub connection of
  #                 channel \"x\""), followed by the server's address
  #
  # Events, each `{:larder_redis, pid, ref, kind, props}` to the owner:
  #
  #   :subscribed    %{node, client_id}  the handshake is done (client_id
  #                  nil without :client_id)
  #   :message       %{node, channel, payload}  a message on one of the
  #                  channels (`message` or `smessage`); the payload is
  #                  untrusted: a binary when a client PUBLISHed it, any
  #                  RESP value Redis sends on its own channels (a list of
  #                  keys, :undefined for nil on __redis__:invalidate)
  #   :disconnected  %{node, reason}  a subscribed connection was lost (a
  #                  closed socket, an error reply, bytes that are not
  #                  RESP, a reply over :max_message_bytes, or
  #                  `-sunsubscribe` for a channel: reason :slot_moved)
  #   :failed        %{node, reason}  an attempt that did not subscribe:
  #                  a Socket reason, :timeout (the handshake), or
  #                  {:refused, command, reply} when Redis answered a step
  #                  of the handshake ("AUTH", "CLIENT ID", the command)
  #                  with an error reply
  #
  # After :disconnected the next attempt comes after the backoff's min;
  # after each :failed the wait doubles up to its max; a subscription
  # resets it. move/2 closes the connection (no event: the owner knows) and
  # connects to the new node at once, whatever wait was under way.
  #
  # Logs: the first :failed of a run is one warning naming the server, the
  # reason in words and what comes next; the subscription that ends the run
  # is one info line. A subscribed connection's loss is an event, not a
  # warning (the owner reports it).
  #
  # Replies that are not messages on the channels are ignored once
  # subscribed; during the handshake they fail the attempt (a message on
  # one of the channels is delivered then too).

  use GenServer

  require Logger

  alias Larder.Backoff
  alias Larder.Redis.{RESP, Socket, Tracking}

  @max_channels 16

  @doc "Starts the connection, linked to the caller (see the contract)."
  @spec start_link(keyword()) :: GenServer.on_start()
  def start_link(opts), do: GenServer.start_link(__MODULE__, opts)

  @doc """
  Subscribes on `node` (`{host, port}`, or nil to stay idle) from now on:
  the connection to another node is closed and a new one opened at once.
  Nothing is done when `node` is the one in use and the connection is up
  or opening.
  """
  @spec move(pid(), {String.t(), 1..65_535} | nil) :: :ok
  def move(pid, node), do: GenServer.cast(pid, {:move, node})

  @doc "Stops the connection."
  @spec stop(pid()) :: :ok
  def stop(pid), do: GenServer.stop(pid, :normal, :infinity)

  @impl true
  def init(opts) do
    owner = Keyword.fetch!(opts, :owner)
    channels = Keyword.fetch!(opts, :channels)

    unless is_list(channels) and channels != [] and length(channels) <= @max_channels and
             Enum.all?(channels, &is_binary/1) do
      raise ArgumentError, "expected 1 to #{@max_channels} channels, got: #{inspect(channels)}"
    end

    {min, max} = Keyword.fetch!(opts, :backoff)
    Process.monitor(owner)

    state = %{
      owner: owner,
      ref: Keyword.get(opts, :ref),
      node: Keyword.get(opts, :node),
      auth: Keyword.get(opts, :auth, []),
      client_id: Keyword.get(opts, :client_id, false),
      command: Keyword.get(opts, :command, "SUBSCRIBE"),
      channels: channels,
      timeout: Keyword.fetch!(opts, :timeout),
      max_bytes: Keyword.fetch!(opts, :max_message_bytes),
      label: Keyword.fetch!(opts, :label),
      backoff: Backoff.new(min, max),
      # :idle (no node), :waiting (a retry timer), :handshake, :subscribed
      phase: :idle,
      socket: nil,
      parser: nil,
      expect: [],
      id: nil,
      timer: nil,
      retry: nil,
      failing: false
    }

    if state.node, do: {:ok, state, {:continue, :connect}}, else: {:ok, state}
  end

  @impl true
  def handle_continue(:connect, state), do: {:noreply, connect(state)}

  @impl true
  def handle_cast({:move, node}, %{node: node, phase: phase} = state)
      when phase in [:handshake, :subscribed],
      do: {:noreply, state}

  def handle_cast({:move, node}, state) do
    state = state |> close() |> cancel_retry()
    state = %{state | node: node, backoff: Backoff.reset(state.backoff)}
    {:noreply, if(node, do: connect(state), else: %{state | phase: :idle})}
  end

  @impl true
  def handle_info({:tcp, socket, data}, %{socket: socket} = state),
    do: {:noreply, data(state, data)}

  def handle_info({:tcp_closed, socket}, %{socket: socket} = state),
    do: {:noreply, down(state, :closed)}

  def handle_info({:tcp_error, socket, reason}, %{socket: socket} = state),
    do: {:noreply, down(state, {:tcp_error, reason})}

  def handle_info({:handshake_timeout, socket}, %{socket: socket, phase: :handshake} = state),
    do: {:noreply, down(%{state | timer: nil}, :timeout)}

  def handle_info({:reconnect, ref}, %{retry: {ref, _timer}} = state),
    do: {:noreply, connect(%{state | retry: nil})}

  def handle_info({:DOWN, _, :process, owner, _reason}, %{owner: owner} = state),
    do: {:stop, :normal, state}

  # (a timer of a connection closed since, a socket's late message)
  def handle_info(_other, state), do: {:noreply, state}

  @impl true
  def terminate(_reason, state), do: close(state)

  ## Connecting

  defp connect(%{node: {host, port}} = state) do
    client_id = if state.client_id, do: [["CLIENT", "ID"]], else: []
    commands = state.auth ++ client_id ++ [[state.command | state.channels]]

    expect =
      Enum.map(state.auth, fn _ -> :auth end) ++
        Enum.map(client_id, fn _ -> :client_id end) ++
        Enum.map(state.channels, &{:subscribe, &1})

    with {:ok, socket} <- Socket.connect(host, port, timeout: state.timeout),
         :ok <- send_handshake(socket, commands) do
      timer = Process.send_after(self(), {:handshake_timeout, socket}, state.timeout)

      %{
        state
        | phase: :handshake,
          socket: socket,
          parser: RESP.new(state.max_bytes),
          expect: expect,
          id: nil,
          timer: timer
      }
    else
      {:error, reason} -> failed(state, reason)
    end
  end

  defp send_handshake(socket, commands) do
    with :ok <- Socket.send(socket, commands),
         :ok <- setopts(socket) do
      :ok
    else
      {:error, _} = error ->
        Socket.close(socket)
        error
    end
  end

  defp setopts(socket) do
    case :inet.setopts(socket, active: :once) do
      :ok -> :ok
      {:error, reason} -> {:error, {:tcp_error, reason}}
    end
  end

  ## What arrives

  defp data(state, data) do
    case Socket.parse(state.parser, data) do
      {:ok, replies, parser} ->
        state = %{state | parser: parser}

        case Enum.reduce_while(replies, state, &reply/2) do
          %{socket: nil} = state ->
            state

          state ->
            case setopts(state.socket) do
              :ok -> state
              {:error, reason} -> down(state, reason)
            end
        end

      {:error, reason} ->
        down(state, reason)
    end
  end

  # An error reply: a step of the handshake refused, or (subscribed) a
  # failure of the connection.
  defp reply({:error, text}, %{expect: [step | _]} = state) do
    {:halt, down(state, {:refused, command(step, state), bounded(text)})}
  end

  defp reply({:error, text}, state), do: {:halt, down(state, {:error_reply, bounded(text)})}

  defp reply({:ok, "OK"}, %{expect: [:auth | expect]} = state),
    do: {:cont, step(state, expect)}

  defp reply({:ok, id}, %{expect: [:client_id | expect]} = state) do
    case Tracking.parse_id(id) do
      {:ok, id} -> {:cont, step(%{state | id: id}, expect)}
      :error -> {:halt, down(state, {:bad_reply, inspect(id, limit: 5)})}
    end
  end

  defp reply({:ok, [kind, channel, _count]}, %{expect: [{:subscribe, channel} | expect]} = state)
       when is_binary(kind) do
    if String.downcase(state.command) == kind,
      do: {:cont, step(state, expect)},
      else: {:halt, down(state, {:bad_reply, bounded(kind)})}
  end

  # (also before the subscription is confirmed: a message on one of the
  # channels is one, whatever came before it)
  defp reply({:ok, [kind, channel, payload]}, state) when kind in ["message", "smessage"] do
    if channel in state.channels do
      event(state, :message, %{node: state.node, channel: channel, payload: payload})
    end

    {:cont, state}
  end

  # The slot of a sharded channel moved to another master.
  defp reply({:ok, ["sunsubscribe", channel | _]}, %{phase: :subscribed} = state) do
    if channel in state.channels,
      do: {:halt, down(state, :slot_moved)},
      else: {:cont, state}
  end

  # (anything else once subscribed is not ours: ignored)
  defp reply(_reply, %{phase: :subscribed} = state), do: {:cont, state}

  defp reply(other, state),
    do: {:halt, down(state, {:bad_reply, inspect(other, limit: 5, printable_limit: 64)})}

  defp step(state, [_ | _] = expect), do: %{state | expect: expect}

  defp step(state, []) do
    if state.timer, do: Process.cancel_timer(state.timer)

    if state.failing,
      do: Logger.info("Larder.Redis: #{state.label} subscribed again at #{address(state)}")

    event(state, :subscribed, %{node: state.node, client_id: state.id})

    %{
      state
      | phase: :subscribed,
        expect: [],
        timer: nil,
        failing: false,
        backoff: Backoff.reset(state.backoff)
    }
  end

  defp command(:auth, _state), do: "AUTH"
  defp command(:client_id, _state), do: "CLIENT ID"
  defp command({:subscribe, _}, state), do: state.command

  ## Failures

  # The connection failed: lost if it was subscribed, else a failed attempt.
  defp down(%{phase: :subscribed} = state, reason) do
    state = close(state)
    event(state, :disconnected, %{node: state.node, reason: reason})
    retry(%{state | backoff: Backoff.reset(state.backoff)})
  end

  defp down(state, reason), do: failed(close(state), reason)

  defp failed(state, reason) do
    event(state, :failed, %{node: state.node, reason: reason})
    {wait, backoff} = Backoff.wait(state.backoff)

    unless state.failing do
      Logger.warning(
        "Larder.Redis: #{state.label} failed at #{address(state)} (#{describe(reason)}); " <>
          "connecting again in #{wait} ms, backing off to #{backoff.max} ms, until it subscribes"
      )
    end

    retry(%{state | backoff: backoff, failing: true}, wait)
  end

  defp retry(state, wait \\ nil) do
    wait = wait || state.backoff.min
    ref = make_ref()
    timer = Process.send_after(self(), {:reconnect, ref}, wait)
    %{state | phase: :waiting, retry: {ref, timer}}
  end

  defp cancel_retry(%{retry: {_ref, timer}} = state) do
    Process.cancel_timer(timer)
    %{state | retry: nil}
  end

  defp cancel_retry(state), do: state

  defp close(%{socket: nil} = state), do: state

  defp close(state) do
    if state.timer, do: Process.cancel_timer(state.timer)
    Socket.close(state.socket)
    %{state | socket: nil, parser: nil, expect: [], timer: nil, phase: :idle}
  end

  defp event(state, kind, props) do
    send(state.owner, {:larder_redis, self(), state.ref, kind, props})
    :ok
  end

  defp describe({:refused, command, reply}), do: "Redis refused #{command}: #{reply}"
  defp describe({:error_reply, reply}), do: "Redis replied with an error: #{reply}"
  defp describe({:bad_reply, reply}), do: "a reply that is not Redis's: #{reply}"

  defp describe(:timeout),
    do: "the connection and its handshake did not complete within the timeout"

  defp describe(reason), do: Socket.describe(reason)

  defp address(%{node: {host, port}}), do: Socket.address(host, port)

  defp bounded(text) when is_binary(text), do: binary_part(text, 0, min(byte_size(text), 200))
  defp bounded(other), do: inspect(other, limit: 5, printable_limit: 64)
end
