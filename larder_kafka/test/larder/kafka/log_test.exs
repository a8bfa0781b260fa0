defmodule Larder.Kafka.LogTest do
  # librdkafka's log goes to Logger through the source, never to the VM's
  # stderr. A consumer whose broker refuses connections (as a SIGKILLed
  # broker does) is polled in another OS process whose stdout and stderr
  # are captured: librdkafka's "%3|...|FAIL|... Connection refused" lines
  # must not be there, and consumer_logs/1 must hand them over instead.
  use ExUnit.Case, async: true

  @moduletag :kafka

  defp closed_port do
    {:ok, socket} = :gen_tcp.listen(0, ip: {127, 0, 0, 1})
    {:ok, port} = :inet.port(socket)
    :ok = :gen_tcp.close(socket)
    port
  end

  test "a refused connection writes nothing to stderr and its log reaches consumer_logs/1" do
    port = closed_port()

    script = """
    alias Larder.Kafka.Native
    {:ok, c} = Native.consumer_open([{"bootstrap.servers", "127.0.0.1:#{port}"},
                                     {"reconnect.backoff.ms", "50"},
                                     {"reconnect.backoff.max.ms", "200"}])
    :ok = Native.consumer_assign(c, "t", [{0, 0}])
    deadline = System.monotonic_time(:millisecond) + 4_000
    Stream.repeatedly(fn -> Native.consumer_poll(c, 10, 200, 1_024) end)
    |> Enum.find(fn _ -> System.monotonic_time(:millisecond) > deadline end)
    logs =
      try do
        Native.consumer_logs(c)
      rescue
        e -> {:no_consumer_logs, Exception.message(e)}
      end
    :ok = Native.consumer_close(c)
    # the close runs on a thread of its own: give it time to log, if it did
    Process.sleep(1_000)
    IO.puts("LOGS=" <> Base.encode64(:erlang.term_to_binary(logs)))
    """

    paths = Enum.flat_map(:code.get_path(), &["-pa", List.to_string(&1)])

    {output, status} =
      System.cmd(System.find_executable("elixir"), paths ++ ["-e", script], stderr_to_stdout: true)

    assert status == 0, output
    [before, encoded] = String.split(output, "LOGS=", parts: 2)
    refute before =~ "%3|", "librdkafka wrote to stderr:\n" <> before
    refute before =~ "Connection refused", "librdkafka wrote to stderr:\n" <> before

    logs = encoded |> String.trim() |> Base.decode64!() |> :erlang.binary_to_term()
    assert {:ok, lines, dropped} = logs
    assert is_integer(dropped) and dropped >= 0

    assert Enum.any?(lines, fn {level, _fac, message} -> level <= 3 and message =~ "refused" end),
           inspect(lines)
  end
end
