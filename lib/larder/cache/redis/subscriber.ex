# The process of Larder.Cache.Redis (the child spec its init/3 returns):
# it starts the Redis client's topology (Larder.Redis.Topology), linked,
# as its subscriber, and turns the topology's messages into the cache's
# (Larder.Cache.L2, "Messages"), which it sends the cache's process.
defmodule Larder.Cache.Redis.Subscriber do
  @moduledoc false

  # Contract (internal).
  #
  # start_link/1 returns once the topology's manager has started (its
  # first connections opened, each within :timeout; see
  # Larder.Redis.Topology.start_link/3), or {:error, %Larder.Error{}} when
  # the server refused the subscription at the first start (tracking, or
  # an ACL without the channel: see refused/1), with nothing left running.
  #
  # The topology's processes exit only when killed or on a bug, and then
  # take the manager, and this process, with them (the same reason): the
  # cache's L2 runner starts this child again after its backoff and tells
  # the cache (Larder.Cache.L2, "Lifecycle"). This process stops the
  # topology before it exits (within @stop_ms, then killed).
  #
  # The translation (the topology's kind => the cache's message):
  #
  #   :subscribed   => {:larder_cache_l2, :connected}
  #   :disconnected => {:larder_cache_l2, :disconnected}
  #   :message      => {:larder_cache_l2, :message, payload}
  #   :invalidated  => {:larder_cache_l2, :invalidated, keys | :all | :bad}
  #   :failover     => {:larder_cache_l2, :invalidated, :all}
  #   :bad_event    => {:larder_cache_l2, :invalidated, :bad}
  #   :moved        => {:larder_cache_l2, :replaced}
  #   :refused      => {:larder_cache_l2, :refused, %Larder.Error{}}

  use GenServer

  alias Larder.Redis.Topology

  @stop_ms 4_000

  @doc "Starts the topology of `state` (Larder.Cache.Redis.init/3's), linked to the caller."
  @spec start_link(map()) :: GenServer.on_start()
  def start_link(state), do: GenServer.start_link(__MODULE__, state, timeout: :infinity)

  @impl true
  def init(state) do
    Process.flag(:trap_exit, true)
    subscription = [channel: state.channel, tracking: state.opts[:tracking_prefix]]

    case Topology.start_link(state, self(), subscription) do
      {:ok, topology} ->
        {:ok, %{topology: topology, ref: state.ref, cache: state.subscriber}}

      {:error, reason} ->
        # (the manager's exit, linked)
        receive do
          {:EXIT, _pid, ^reason} -> :ok
        after
          0 -> :ok
        end

        {:stop, error(reason)}
    end
  end

  @impl true
  def handle_info({:larder_redis, pid, ref, kind, props}, %{topology: pid, ref: ref} = state) do
    case message(kind, props) do
      nil -> :ok
      message -> send(state.cache, message)
    end

    {:noreply, state}
  end

  def handle_info({:EXIT, pid, reason}, %{topology: pid} = state),
    do: {:stop, reason, %{state | topology: nil}}

  def handle_info(_other, state), do: {:noreply, state}

  @impl true
  def terminate(_reason, %{topology: topology}) when is_pid(topology) do
    ref = Process.monitor(topology)
    Process.unlink(topology)
    Process.exit(topology, :shutdown)

    receive do
      {:DOWN, ^ref, :process, _, _} -> :ok
    after
      @stop_ms ->
        Process.exit(topology, :kill)

        receive do
          {:DOWN, ^ref, :process, _, _} -> :ok
        end
    end
  end

  def terminate(_reason, _state), do: :ok

  defp message(:subscribed, _props), do: {:larder_cache_l2, :connected}
  defp message(:disconnected, _props), do: {:larder_cache_l2, :disconnected}
  defp message(:message, %{payload: payload}), do: {:larder_cache_l2, :message, payload}
  defp message(:invalidated, %{keys: keys}), do: {:larder_cache_l2, :invalidated, keys}
  defp message(:failover, _props), do: {:larder_cache_l2, :invalidated, :all}
  defp message(:bad_event, _props), do: {:larder_cache_l2, :invalidated, :bad}
  defp message(:moved, _props), do: {:larder_cache_l2, :replaced}
  defp message(:refused, props), do: {:larder_cache_l2, :refused, refused(props)}
  defp message(_kind, _props), do: nil

  defp error({:refused, props}), do: refused(props)

  defp error(reason),
    do: Larder.Error.new(:l2_failed, "the Redis client did not start", reason: reason)

  @doc """
  The error of a server that refuses what the cache's invalidation needs
  (the topology's :refused): it names the server, the user (`"default"`
  without `:username`), the command and Redis's reply, what to grant, and
  the other way out.
  """
  @spec refused(map()) :: Larder.Error.t()
  def refused(%{server: server, user: user, command: command, reply: reply} = props) do
    details = [server: server, user: user, command: command, reply: reply]

    cond do
      command == "AUTH" ->
        Larder.Error.new(
          :l2_failed,
          "Redis at #{server} refused AUTH to user #{inspect(user)} (#{reply}): " <>
            "invalidation: :tracking cannot learn of other programs' writes; " <>
            "check :username and :password",
          details
        )

      props.tracking ->
        tracking = Larder.Redis.Tracking.channel()
        needs = "+client|id +client|tracking +subscribe &#{tracking} &#{props.channel}"

        Larder.Error.new(
          :l2_failed,
          "Redis at #{server} refused #{command} to user #{inspect(user)} (#{reply}). " <>
            "invalidation: :tracking needs the commands CLIENT ID, CLIENT TRACKING and " <>
            "SUBSCRIBE and the channels #{tracking} and #{props.channel}: grant them with " <>
            "`ACL SETUSER #{user} #{needs}`, or use invalidation: :pubsub",
          details ++ [needs: needs]
        )

      true ->
        needs = "+#{String.downcase(command)} &#{props.channel}"

        Larder.Error.new(
          :l2_failed,
          "Redis at #{server} refused #{command} to user #{inspect(user)} (#{reply}). " <>
            "The cache hears the other nodes' writes on the channel #{props.channel}, " <>
            "which needs the command #{command} and that channel: grant them with " <>
            "`ACL SETUSER #{user} #{needs}`",
          details ++ [needs: needs]
        )
    end
  end
end
