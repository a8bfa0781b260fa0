# A loopback TCP port for a server that a test, a benchmark or the demo
# starts: the one helper behind every starter here (Redis, Sentinel,
# Cluster, Kafka); not part of the library.
defmodule Larder.Test.FreePort do
  @moduledoc false

  @doc """
  A TCP port on 127.0.0.1 that nothing listens on right now (the kernel's
  pick for a listener on port 0, closed again). Another process may still
  take it before the caller binds it.
  """
  @spec get() :: :inet.port_number()
  def get do
    {:ok, socket} = :gen_tcp.listen(0, ip: {127, 0, 0, 1})
    {:ok, port} = :inet.port(socket)
    :gen_tcp.close(socket)
    port
  end
end
