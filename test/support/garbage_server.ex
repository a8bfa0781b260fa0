# A fake "Redis" on a free loopback port that answers every connection with
# what a test asks for: random bytes, wrong RESP types, an endless bulk
# string, or a close in the middle of a reply. Nothing it sends is Redis.
defmodule Larder.Test.GarbageServer do
  @moduledoc false

  defstruct [:port, :pid]

  @doc """
  Starts the server. `mode` is one of `:random` (random bytes that are not
  RESP from the first byte on), `:wrong_types`, `:endless`,
  `:close_mid_reply`, `:silent`, or a function `(request_bytes -> iodata)`
  (or `{:chunks, [iodata]}`, sent 20 ms apart).
  """
  def start(mode) do
    parent = self()

    pid =
      spawn(fn ->
        {:ok, listen} =
          :gen_tcp.listen(0, [:binary, ip: {127, 0, 0, 1}, active: false, reuseaddr: true])

        {:ok, port} = :inet.port(listen)
        send(parent, {:garbage_port, self(), port})
        accept(listen, mode)
      end)

    receive do
      {:garbage_port, ^pid, port} -> %__MODULE__{port: port, pid: pid}
    after
      5_000 -> raise "garbage server did not start"
    end
  end

  def stop(%__MODULE__{pid: pid}) do
    Process.exit(pid, :kill)
    :ok
  end

  defp accept(listen, mode) do
    case :gen_tcp.accept(listen) do
      {:ok, socket} ->
        handler = spawn(fn -> serve(socket, mode) end)
        :gen_tcp.controlling_process(socket, handler)
        send(handler, :go)
        accept(listen, mode)

      {:error, _} ->
        :ok
    end
  end

  defp serve(socket, mode) do
    receive do
      :go -> :ok
    end

    loop(socket, mode)
  end

  defp loop(socket, mode) do
    case :gen_tcp.recv(socket, 0, 30_000) do
      {:ok, request} ->
        case reply(mode, request) do
          :close ->
            :gen_tcp.close(socket)

          {:close, data} ->
            :gen_tcp.send(socket, data)
            :gen_tcp.close(socket)

          :endless ->
            :gen_tcp.send(socket, "$1073741824\r\n")
            endless(socket)

          {:chunks, chunks} ->
            # one reply in several TCP segments
            for chunk <- chunks do
              :gen_tcp.send(socket, chunk)
              Process.sleep(20)
            end

            loop(socket, mode)

          data ->
            :gen_tcp.send(socket, data)
            loop(socket, mode)
        end

      {:error, _} ->
        :gen_tcp.close(socket)
    end
  end

  defp endless(socket) do
    case :gen_tcp.send(socket, :binary.copy("x", 65_536)) do
      :ok ->
        Process.sleep(1)
        endless(socket)

      {:error, _} ->
        :ok
    end
  end

  # Random bytes that are not RESP from the first byte on: random bytes
  # that began with a type byte ($ * + - :, 5 in 256) would be the start of
  # a reply, and a client would wait out its timeout for the rest of it
  # instead of refusing them (a timeout is :silent's case).
  defp reply(:random, _request) do
    <<first, rest::binary>> = :crypto.strong_rand_bytes(:rand.uniform(64))
    if first in ~c"$*+-:", do: reply(:random, nil), else: <<first, rest::binary>>
  end

  defp reply(:silent, _request), do: ""

  # Well-formed RESP, but never the type a command expects.
  defp reply(:wrong_types, _request) do
    Enum.random([
      "*2\r\n:1\r\n:2\r\n",
      ":12345678901234567890123456789\r\n",
      "+QUEUED\r\n",
      "$3\r\nabc\r\n",
      "$-1\r\n",
      "*-1\r\n",
      "-ERR nope\r\n",
      ":-5\r\n",
      "*3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$1\r\nx\r\n"
    ])
  end

  # A bulk string that declares 1 GB and never ends.
  defp reply(:endless, _request), do: :endless
  defp reply(:close_mid_reply, _request), do: {:close, "$10\r\nabc"}
  defp reply(fun, request) when is_function(fun, 1), do: fun.(request)
end
