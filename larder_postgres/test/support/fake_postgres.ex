# A scripted fake "Postgres" on a free loopback port, for the hostile
# tests: each connection is handed to the test's function, which reads
# the client's messages and sends whatever it likes (garbage, huge
# lengths, truncated messages, endless streams). Nothing it sends need be
# Postgres.
defmodule Larder.Test.FakePostgres do
  @moduledoc false

  defstruct [:port, :pid]

  @doc """
  Starts the server; `handler` is called with each accepted socket
  (passive, binary), in a process of its own.
  """
  def start(handler) when is_function(handler, 1) do
    parent = self()

    pid =
      spawn(fn ->
        {:ok, listen} =
          :gen_tcp.listen(0, [:binary, ip: {127, 0, 0, 1}, active: false, reuseaddr: true])

        {:ok, port} = :inet.port(listen)
        send(parent, {:fake_postgres, self(), port})
        accept(listen, handler)
      end)

    receive do
      {:fake_postgres, ^pid, port} -> %__MODULE__{port: port, pid: pid}
    after
      5_000 -> raise "fake postgres did not start"
    end
  end

  def stop(%__MODULE__{pid: pid}) do
    Process.exit(pid, :kill)
    :ok
  end

  defp accept(listen, handler) do
    case :gen_tcp.accept(listen) do
      {:ok, socket} ->
        child =
          spawn(fn ->
            receive do
              :go -> handler.(socket)
            end
          end)

        :gen_tcp.controlling_process(socket, child)
        send(child, :go)
        accept(listen, handler)

      {:error, _} ->
        :ok
    end
  end

  @doc "A backend message."
  def msg(type, body), do: <<type, byte_size(body) + 4::32, body::binary>>

  @doc "AuthenticationOk, server_version 15, ReadyForQuery."
  def ready do
    msg(?R, <<0::32>>) <> msg(?S, "server_version\x0015.0\0") <> msg(?Z, "I")
  end

  @doc "The startup message (length-prefixed, no type byte)."
  def recv_startup(socket) do
    {:ok, <<length::32>>} = :gen_tcp.recv(socket, 4, 10_000)
    {:ok, body} = :gen_tcp.recv(socket, length - 4, 10_000)
    body
  end

  @doc "One frontend message: {type, body}, or :closed."
  def recv_message(socket) do
    with {:ok, <<type, length::32>>} <- :gen_tcp.recv(socket, 5, 30_000),
         {:ok, body} <- recv_body(socket, length - 4) do
      {type, body}
    else
      _ -> :closed
    end
  end

  defp recv_body(_socket, 0), do: {:ok, ""}
  defp recv_body(socket, n), do: :gen_tcp.recv(socket, n, 30_000)

  @doc "A simple query's result: one text column, rows, CommandComplete, ReadyForQuery."
  def result(column, rows) do
    data =
      for row <- rows, into: "" do
        msg(?D, <<1::16, byte_size(row)::32, row::binary>>)
      end

    description(column) <> data <> msg(?C, "SELECT #{length(rows)}\0") <> msg(?Z, "I")
  end

  @doc "A RowDescription of one text column."
  def description(column) do
    msg(?T, <<1::16, column::binary, 0, 0::32, 0::16, 25::32, -1::16, -1::32, 0::16>>)
  end

  @doc """
  A handler for `start/1`: accepts the startup, answers ready, waits for
  one query and sends `answer` to it, then holds the connection open.
  """
  def answering(answer) do
    fn socket ->
      recv_startup(socket)
      :gen_tcp.send(socket, ready())
      {?Q, _} = recv_message(socket)
      :gen_tcp.send(socket, answer)
      Process.sleep(:infinity)
    end
  end

  @doc "Sends `data` until the client goes away."
  def send_forever(socket, data) do
    case :gen_tcp.send(socket, data) do
      :ok -> send_forever(socket, data)
      {:error, _} -> :ok
    end
  end
end
