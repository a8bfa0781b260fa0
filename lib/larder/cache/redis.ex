defmodule Larder.Cache.Redis do
  @moduledoc """
  The Redis second level of `Larder.Cache` (a `Larder.Cache.L2`).

  Use it as `l2: {Larder.Cache.Redis, redis_opts}` in `Larder.Cache.start_link/1`.

  ## Options

    * `:host` - the server's host name or address (default `"127.0.0.1"`).
    * `:port` - its TCP port (default `6379`).
    * `:database` - the database index selected on connect (default `0`).
    * `:password` - sent with `AUTH` on connect (default none).
    * `:timeout` - the L2 timeout in milliseconds (default `1000`): no
      caller waits longer than this for Redis, whatever state Redis is in.
    * `:reconnect_sleep` - milliseconds between reconnection attempts
      (default `100`).
    * `:pool_size` - connections for commands (default `2`); callers are
      spread over them by scheduler. Pub/sub uses one more connection.

  ## Concurrency

  Callers send their commands straight to a connection process, never
  through the cache's process. A connection pipelines the commands of all
  the callers that use it and answers them in order, so a slow reply (a
  large value) delays the others on that connection only.

  ## Client

  This uses Debian's `erlang-redis-client` (eredis 1.2.0), which we checked
  against the fault requirements: `eredis:start_link/6` succeeds while Redis
  is down and keeps reconnecting in the background; a command sent while it
  is disconnected returns `{:error, :no_connection}` at once; a command to a
  server that does not answer is bounded by the call timeout. Its pub/sub
  client (`eredis_sub`) does reconnect mid-run but refuses to start while
  Redis is down, so a small relay process here retries starting it every
  `:reconnect_sleep` ms and subscribes again after every reconnection. No
  process crashes in a loop: reconnection is a timer, not a restart.

  ## Failures

  Every call returns within `:timeout` ms; an unreachable, slow or failing
  server gives `{:error, %Larder.Error{reason: :l2_unavailable}}` (or
  `:l2_failed` for an error reply), never an exit.
  """

  @behaviour Larder.Cache.L2

  require Logger

  alias Larder.Options

  @defaults [
    host: "127.0.0.1",
    port: 6379,
    database: 0,
    password: nil,
    timeout: 1000,
    reconnect_sleep: 100,
    pool_size: 2
  ]

  @doc """
  Starts the eredis client and the pub/sub relay, linked to the caller, and
  subscribes `subscriber` to `channel`. Succeeds while Redis is down.
  """
  @impl true
  @spec init(keyword(), pid(), binary()) :: {:ok, map()}
  def init(opts, subscriber, channel) do
    opts = validate_opts!(opts)
    host = String.to_charlist(opts[:host])
    password = String.to_charlist(opts[:password] || "")

    clients =
      for _ <- 1..opts[:pool_size] do
        {:ok, client} =
          :eredis.start_link(
            host,
            opts[:port],
            opts[:database],
            password,
            opts[:reconnect_sleep],
            opts[:timeout]
          )

        client
      end

    owner = self()
    sub_args = {host, opts[:port], password, opts[:reconnect_sleep]}
    relay = spawn_link(fn -> relay_init(owner, subscriber, channel, sub_args) end)
    {:ok, %{clients: List.to_tuple(clients), relay: relay, timeout: opts[:timeout]}}
  end

  @doc "`GET key`: `{:ok, binary}`, `:miss` or an error, within the timeout."
  @impl true
  @spec get(map(), binary()) :: {:ok, binary()} | :miss | {:error, Larder.Error.t()}
  def get(state, key) do
    case query(state, ["GET", key]) do
      {:ok, :undefined} -> :miss
      {:ok, bin} when is_binary(bin) -> {:ok, bin}
      {:error, _} = error -> error
    end
  end

  @doc "`SET key value [PX ttl] [NX]`, within the timeout."
  @impl true
  @spec put(map(), binary(), binary(), pos_integer() | :infinity, :always | :new) ::
          :ok | {:error, Larder.Error.t()}
  def put(state, key, value, ttl, mode) do
    expiry = if ttl == :infinity, do: [], else: ["PX", Integer.to_string(ttl)]
    cond_ = if mode == :new, do: ["NX"], else: []

    # "OK", or nil when NX found the key: both are :ok
    state |> query(["SET", key, value | expiry ++ cond_]) |> ok()
  end

  @doc "`DEL key`, within the timeout."
  @impl true
  @spec delete(map(), binary()) :: :ok | {:error, Larder.Error.t()}
  def delete(state, key) do
    state |> query(["DEL", key]) |> ok()
  end

  @doc "`INCR key`, within the timeout."
  @impl true
  @spec incr(map(), binary()) :: {:ok, integer()} | {:error, Larder.Error.t()}
  def incr(state, key) do
    case query(state, ["INCR", key]) do
      {:ok, n} -> {:ok, String.to_integer(n)}
      {:error, _} = error -> error
    end
  end

  @doc "`PUBLISH channel payload`, within the timeout."
  @impl true
  @spec publish(map(), binary(), binary()) :: :ok | {:error, Larder.Error.t()}
  def publish(state, channel, payload) do
    state |> query(["PUBLISH", channel, payload]) |> ok()
  end

  @doc "Stops the client and the relay."
  @impl true
  @spec stop(map()) :: :ok
  def stop(%{clients: clients, relay: relay}) do
    Process.unlink(relay)
    Process.exit(relay, :shutdown)
    clients |> Tuple.to_list() |> Enum.each(&stop_client/1)
  end

  defp stop_client(client) do
    :eredis.stop(client)
  catch
    :exit, _ -> :ok
  end

  # Commands on one connection are answered in order, so a large value
  # holds up whatever was sent after it: spread callers over the pool by
  # scheduler. A caller waits for each reply, so its own commands stay in
  # order whichever connection they take.
  defp query(%{clients: clients, timeout: timeout}, command) do
    client = elem(clients, rem(:erlang.system_info(:scheduler_id), tuple_size(clients)))

    case :eredis.q(client, command, timeout) do
      {:ok, value} ->
        {:ok, value}

      {:error, reason} when reason in [:no_connection, :tcp_closed] ->
        {:error, unavailable(reason)}

      {:error, reason} when is_binary(reason) ->
        {:error, Larder.Error.new(:l2_failed, "Redis replied with an error", error: reason)}

      {:error, reason} ->
        {:error, unavailable(reason)}
    end
  catch
    :exit, reason -> {:error, unavailable(exit_reason(reason))}
  end

  defp ok({:ok, _reply}), do: :ok
  defp ok({:error, _} = error), do: error

  defp exit_reason({:timeout, _}), do: :timeout
  defp exit_reason({:noproc, _}), do: :noproc
  defp exit_reason(other), do: other

  defp unavailable(reason),
    do: Larder.Error.new(:l2_unavailable, "Redis is unreachable", error: reason)

  @doc "Checks the options above; raises `ArgumentError` naming a bad one."
  @impl true
  @spec validate_opts!(keyword()) :: keyword()
  def validate_opts!(opts) do
    opts = Options.merge!(opts, @defaults, "Redis")

    check!(opts, :host, &is_binary/1, "a string")
    check!(opts, :port, &(is_integer(&1) and &1 in 1..65_535), "a TCP port number")
    check!(opts, :database, &(is_integer(&1) and &1 >= 0), "a non-negative integer")
    check!(opts, :password, &(is_nil(&1) or is_binary(&1)), "nil or a string")
    check!(opts, :timeout, &(is_integer(&1) and &1 > 0), "a positive integer (ms)")
    check!(opts, :reconnect_sleep, &(is_integer(&1) and &1 > 0), "a positive integer (ms)")
    check!(opts, :pool_size, &(is_integer(&1) and &1 > 0), "a positive integer")
    opts
  end

  defp check!(opts, key, valid?, expected),
    do: Options.check!(opts, key, valid?, expected, "Redis")

  ## The pub/sub relay: owns eredis_sub, acknowledges its messages and
  ## forwards them to the subscriber; restarts it on a timer while Redis is down.

  defp relay_init(owner, subscriber, channel, sub_args) do
    Process.flag(:trap_exit, true)

    relay_connect(%{
      owner: owner,
      subscriber: subscriber,
      channel: channel,
      args: sub_args,
      sub: nil
    })
  end

  defp relay_connect(state) do
    {host, port, password, sleep} = state.args

    case :eredis_sub.start_link(host, port, password, sleep, :infinity, :drop) do
      {:ok, sub} ->
        :eredis_sub.controlling_process(sub)
        :eredis_sub.subscribe(sub, [state.channel])
        relay_loop(%{state | sub: sub})

      {:error, _reason} ->
        Process.send_after(self(), :reconnect, sleep)
        relay_loop(%{state | sub: nil})
    end
  end

  defp relay_loop(%{sub: sub, owner: owner, subscriber: subscriber} = state) do
    receive do
      {:message, _channel, payload, ^sub} ->
        :eredis_sub.ack_message(sub)
        send(subscriber, {:larder_cache_l2, :message, payload})
        relay_loop(state)

      {:subscribed, _channel, ^sub} ->
        :eredis_sub.ack_message(sub)
        send(subscriber, {:larder_cache_l2, :connected})
        relay_loop(state)

      {:eredis_connected, ^sub} ->
        :eredis_sub.ack_message(sub)
        :eredis_sub.subscribe(sub, [state.channel])
        relay_loop(state)

      {tag, ^sub} when tag in [:eredis_disconnected, :eredis_reconnect_attempt] ->
        :eredis_sub.ack_message(sub)
        relay_loop(state)

      {:eredis_reconnect_failed, ^sub, _reason} ->
        :eredis_sub.ack_message(sub)
        relay_loop(state)

      :reconnect ->
        relay_connect(state)

      {:EXIT, ^owner, reason} ->
        exit(reason)

      {:EXIT, ^sub, reason} ->
        Logger.warning("Larder.Cache.Redis: pub/sub client exited: #{inspect(reason)}")
        Process.send_after(self(), :reconnect, elem(state.args, 3))
        relay_loop(%{state | sub: nil})

      _other ->
        relay_loop(state)
    end
  end
end
