# A TCP proxy on a free loopback port in front of a server (a redis-server
# a test started), which a test turns slow or refusing mid-run: every
# server-to-client chunk held back `delay` ms, or the listener and every
# connection closed (new connections refused) until it listens again.
# Not part of the library.
defmodule Larder.Test.TcpProxy do
  @moduledoc false

  use GenServer

  defstruct [:port, :pid]

  @doc """
  Starts a proxy to `upstream_port` on 127.0.0.1, linked to the caller, on a
  free port (`%TcpProxy{port: port}`). Options: `:delay` (ms, default 0).
  """
  def start(upstream_port, opts \\ []) do
    {:ok, pid} = GenServer.start_link(__MODULE__, {upstream_port, opts[:delay] || 0})
    %__MODULE__{port: GenServer.call(pid, :port), pid: pid}
  end

  @doc """
  Holds back every chunk the server sends from now on `ms` ms before the
  client gets it (each chunk by `ms` from when it arrived, in order): a
  server that answers `ms` late.
  """
  def delay(%__MODULE__{pid: pid}, ms), do: GenServer.call(pid, {:delay, ms})

  @doc "Closes the listener and every connection: connecting is refused until `listen/1`."
  def refuse(%__MODULE__{pid: pid}), do: GenServer.call(pid, :refuse)

  @doc "Listens again on the same port."
  def listen(%__MODULE__{pid: pid}), do: GenServer.call(pid, :listen)

  @doc "Stops the proxy and closes every connection."
  def stop(%__MODULE__{pid: pid}) do
    GenServer.stop(pid)
  catch
    :exit, _ -> :ok
  end

  @impl true
  def init({upstream, delay}) do
    Process.flag(:trap_exit, true)
    delay_ref = :atomics.new(1, signed: false)
    :atomics.put(delay_ref, 1, delay)
    state = %{upstream: upstream, delay: delay_ref, port: 0, listener: nil, acceptor: nil}
    {:ok, open(state)}
  end

  @impl true
  def handle_call(:port, _from, state), do: {:reply, state.port, state}

  def handle_call({:delay, ms}, _from, state) do
    :atomics.put(state.delay, 1, ms)
    {:reply, :ok, state}
  end

  def handle_call(:refuse, _from, state), do: {:reply, :ok, close(state)}

  def handle_call(:listen, _from, %{listener: nil} = state), do: {:reply, :ok, open(state)}
  def handle_call(:listen, _from, state), do: {:reply, :ok, state}

  @impl true
  def handle_info({:EXIT, _pid, _reason}, state), do: {:noreply, state}
  def handle_info(_other, state), do: {:noreply, state}

  @impl true
  def terminate(_reason, state), do: close(state)

  defp open(state) do
    opts = [:binary, ip: {127, 0, 0, 1}, active: false, reuseaddr: true, backlog: 1024]
    {:ok, listener} = :gen_tcp.listen(state.port, opts)
    {:ok, port} = :inet.port(listener)
    %{upstream: upstream, delay: delay} = state
    acceptor = spawn_link(fn -> accept(listener, upstream, delay) end)
    :ok = :gen_tcp.controlling_process(listener, acceptor)
    %{state | port: port, listener: listener, acceptor: acceptor}
  end

  # The acceptor is linked to every pump it starts: killing it takes them
  # (and their sockets) down.
  defp close(%{acceptor: nil} = state), do: state

  defp close(state) do
    Process.unlink(state.acceptor)
    Process.exit(state.acceptor, :kill)
    ref = Process.monitor(state.acceptor)
    receive do: ({:DOWN, ^ref, _, _, _} -> :ok)
    %{state | listener: nil, acceptor: nil}
  end

  defp accept(listener, upstream, delay) do
    case :gen_tcp.accept(listener) do
      {:ok, client} ->
        case :gen_tcp.connect(~c"127.0.0.1", upstream, [:binary, active: false], 5_000) do
          {:ok, server} ->
            up = spawn_link(fn -> pump(client, server, nil) end)
            down = spawn_link(fn -> pump(server, client, delay) end)
            :ok = :gen_tcp.controlling_process(client, up)
            :ok = :gen_tcp.controlling_process(server, down)
            send(up, :go)
            send(down, :go)

          {:error, _} ->
            :gen_tcp.close(client)
        end

        accept(listener, upstream, delay)

      {:error, _} ->
        :ok
    end
  end

  # Reads `from` and writes `to`; with a delay, through a sender that holds
  # each chunk until its time. Either side closing closes both.
  defp pump(from, to, delay) do
    receive do: (:go -> :ok)
    pump = self()

    sender =
      if delay do
        spawn(fn ->
          ref = Process.monitor(pump)
          send_later(to, ref)
        end)
      end

    pump_loop(from, to, delay, sender)
  end

  defp pump_loop(from, to, delay, sender) do
    case :gen_tcp.recv(from, 0) do
      {:ok, data} ->
        if sender do
          due = System.monotonic_time(:millisecond) + :atomics.get(delay, 1)
          send(sender, {:chunk, due, data})
        else
          :gen_tcp.send(to, data)
        end

        pump_loop(from, to, delay, sender)

      {:error, _} ->
        # (a normal end: the acceptor, linked, lives on; the sender, which
        # watches this process, ends with it)
        :gen_tcp.close(from)
        :gen_tcp.close(to)
    end
  end

  defp send_later(to, ref) do
    receive do
      {:chunk, due, data} ->
        wait = due - System.monotonic_time(:millisecond)
        if wait > 0, do: Process.sleep(wait)
        :gen_tcp.send(to, data)
        send_later(to, ref)

      {:DOWN, ^ref, _, _, _} ->
        :ok
    end
  end
end
