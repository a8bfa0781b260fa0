# An in-memory Larder.Cache.L2 for unit tests: one process holds the keys and
# the subscribers, and can be switched "down" to exercise the fault paths.
defmodule Larder.Test.MemoryL2 do
  @moduledoc false

  @behaviour Larder.Cache.L2

  use GenServer

  def start_link(opts \\ []), do: GenServer.start_link(__MODULE__, :ok, opts)

  @doc "Makes every call fail as if the backend were unreachable (or back up)."
  def set_down(server, down?), do: GenServer.call(server, {:set_down, down?})

  @doc "Stores raw bytes under an L2 key, bypassing the cache (corrupt data)."
  def raw_put(server, key, bin), do: GenServer.call(server, {:put, key, bin, :infinity, :always})

  @doc "All keys, for inspection."
  def keys(server), do: GenServer.call(server, :keys)

  @impl Larder.Cache.L2
  def init(opts, subscriber, channel) do
    server = Keyword.fetch!(opts, :server)
    :ok = GenServer.call(server, {:subscribe, subscriber, channel})
    {:ok, server}
  end

  @impl Larder.Cache.L2
  def get(server, key), do: call(server, {:get, key})

  @impl Larder.Cache.L2
  def put(server, key, value, ttl, mode), do: call(server, {:put, key, value, ttl, mode})

  @impl Larder.Cache.L2
  def delete(server, key), do: call(server, {:delete, key})

  @impl Larder.Cache.L2
  def incr(server, key), do: call(server, {:incr, key})

  @impl Larder.Cache.L2
  def publish(server, channel, payload), do: call(server, {:publish, channel, payload})

  @impl Larder.Cache.L2
  def stop(_server), do: :ok

  defp call(server, request) do
    GenServer.call(server, request, 1_000)
  catch
    :exit, reason ->
      {:error, Larder.Error.new(:l2_unavailable, "memory L2 is gone", error: reason)}
  end

  @impl GenServer
  def init(:ok), do: {:ok, %{data: %{}, subscribers: [], down?: false}}

  @impl GenServer
  def handle_call({:set_down, down?}, _from, state), do: {:reply, :ok, %{state | down?: down?}}
  def handle_call(:keys, _from, state), do: {:reply, Map.keys(state.data), state}

  def handle_call({:subscribe, pid, channel}, _from, state) do
    send(pid, {:larder_cache_l2, :connected})
    {:reply, :ok, %{state | subscribers: [{pid, channel} | state.subscribers]}}
  end

  def handle_call(_request, _from, %{down?: true} = state) do
    {:reply, {:error, Larder.Error.new(:l2_unavailable, "memory L2 is down")}, state}
  end

  def handle_call({:get, key}, _from, state) do
    case live(state, key) do
      nil -> {:reply, :miss, state}
      value -> {:reply, {:ok, value}, state}
    end
  end

  def handle_call({:put, key, value, ttl, mode}, _from, state) do
    if mode == :new and live(state, key) != nil do
      {:reply, :ok, state}
    else
      expires = if ttl == :infinity, do: :infinity, else: now() + ttl
      {:reply, :ok, put_in(state.data[key], {value, expires})}
    end
  end

  def handle_call({:delete, key}, _from, state),
    do: {:reply, :ok, %{state | data: Map.delete(state.data, key)}}

  def handle_call({:incr, key}, _from, state) do
    n = String.to_integer(live(state, key) || "0") + 1
    {:reply, {:ok, n}, put_in(state.data[key], {Integer.to_string(n), :infinity})}
  end

  def handle_call({:publish, channel, payload}, _from, state) do
    for {pid, ^channel} <- state.subscribers, do: send(pid, {:larder_cache_l2, :message, payload})
    {:reply, :ok, state}
  end

  defp live(state, key) do
    case state.data do
      %{^key => {value, :infinity}} -> value
      %{^key => {value, expires}} -> if expires > now(), do: value
      _ -> nil
    end
  end

  defp now, do: System.monotonic_time(:millisecond)
end
