defmodule PriceSearch.HostileTest do
  # Clients that hold connections, dribble or hang up, against a real
  # listener (short timeouts) on the application's loaded store. Not async:
  # they hold thousands of sockets.
  use ExUnit.Case

  import ExUnit.CaptureLog

  alias PriceSearch.TestClient, as: C

  @bitmap '/v1/search/bitmap/prices'
  @bulk "/v5/search/bitmap/bulk/prices"

  setup_all do
    :ok = C.await_loaded(PriceSearch.port())
    # The reference's single request, on the catalogue the service loaded.
    {source, prices, _} = PriceCatalogue.reference_or_generated()
    single = PriceCatalogue.single_request(prices, source)
    request = :jiffy.encode(PriceCatalogue.request_json(single))

    %{request: request}
  end

  defp listener(opts) do
    {:ok, pid} = PriceSearch.HTTP.start_link([port: 0, ip: {127, 0, 0, 1}] ++ opts)
    Process.unlink(pid)

    on_exit(fn ->
      try do
        PriceSearch.HTTP.stop(pid)
      catch
        :exit, _ -> :ok
      end
    end)

    {pid, PriceSearch.HTTP.port(pid)}
  end

  defp connect(port),
    do: :gen_tcp.connect({127, 0, 0, 1}, port, [:binary, active: false], 5_000)

  # Polls until fun returns true (the server's side may lag the client's).
  defp eventually(fun, tries \\ 200) do
    cond do
      fun.() -> true
      tries == 0 -> false
      true -> Process.sleep(25) && eventually(fun, tries - 1)
    end
  end

  # Each connection takes two descriptors here (client and server side).
  defp idle_count do
    limit =
      case Integer.parse(to_string(:os.cmd('ulimit -n'))) do
        {n, _} -> n
        :error -> 1024
      end

    min(3_000, div(limit - 400, 2))
  end

  test "thousands of idle connections: /health and a search are still answered", %{
    request: request
  } do
    {listener, port} = listener([])
    n = idle_count()
    # more than mochiweb's cap (2,048 connections), which the service once had.
    if n < 2_100, do: IO.puts("# file descriptor limit: holding #{n} idle connections")

    sockets =
      for i <- 1..n do
        {:ok, socket} = connect(port)
        # Some half-sent requests among the silent ones.
        if rem(i, 3) == 0, do: :ok = :gen_tcp.send(socket, "GET /hea")
        socket
      end

    assert eventually(fn -> PriceSearch.HTTP.stats(listener).open == n end)

    assert {200, _, ""} = C.get(port, '/health')
    assert {200, _, "{\"id\"" <> _} = C.post(port, @bitmap, request)
    assert {200, _, _} = C.post(port, '/v1/search/map/prices', request)

    # The idle ones gone, only httpc's kept-alive sessions (at most 3) stay.
    Enum.each(sockets, &:gen_tcp.close/1)
    assert eventually(fn -> PriceSearch.HTTP.stats(listener).open <= 3 end)
  end

  test "an idle connection is closed after :idle_timeout, between requests too" do
    {listener, port} = listener(idle_timeout: 200)
    {:ok, silent} = connect(port)
    {:ok, kept} = connect(port)
    :ok = :gen_tcp.send(kept, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert {:ok, "HTTP/1.1 200 OK\r\n" <> _} = :gen_tcp.recv(kept, 0, 5_000)

    assert {:error, :closed} = :gen_tcp.recv(silent, 0, 10_000)
    assert {:error, :closed} = :gen_tcp.recv(kept, 0, 10_000)
    assert eventually(fn -> PriceSearch.HTTP.stats(listener).idle_closed == 2 end)
  end

  test "slowloris: headers dribbled past :request_timeout are cut off" do
    {listener, port} = listener(request_timeout: 300)
    {:ok, socket} = connect(port)
    :ok = :gen_tcp.send(socket, "POST /v1/search/bitmap/prices HTTP/1.1\r\n")

    # One header line every 50 ms, never the end of the head.
    dribble =
      Enum.reduce_while(1..200, :ok, fn i, :ok ->
        Process.sleep(50)

        case :gen_tcp.send(socket, "X-#{i}: y\r\n") do
          :ok -> {:cont, :ok}
          {:error, _} -> {:halt, :closed}
        end
      end)

    assert dribble == :closed or :gen_tcp.recv(socket, 0, 5_000) == {:error, :closed}
    assert PriceSearch.HTTP.stats(listener).timed_out == 1
  end

  test "slowloris: a body announced but never sent is refused after :request_timeout" do
    {listener, port} = listener(request_timeout: 300)
    {:ok, socket} = connect(port)

    :ok =
      :gen_tcp.send(
        socket,
        "POST /v1/search/bitmap/prices HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"
      )

    assert {:ok, answer} = :gen_tcp.recv(socket, 0, 5_000)
    assert answer =~ ~r"^HTTP/1.1 400 Bad Request\r\n"
    assert answer =~ "Connection: close\r\n"
    assert answer =~ "request body not received in time\n"
    assert {:error, :closed} = :gen_tcp.recv(socket, 0, 5_000)
    assert PriceSearch.HTTP.stats(listener).timed_out == 1
  end

  # The listener reads sockets in {active, N} mode: a request sent a byte
  # per packet makes the socket turn passive many times over, and each time
  # it must be re-armed; bytes after a body stay for the next request.
  defp recv_answers(socket, n, acc \\ "") do
    if length(String.split(acc, "HTTP/1.1 ")) > n and String.ends_with?(acc, "}\n"),
      do: acc,
      else:
        (
          {:ok, data} = :gen_tcp.recv(socket, 0, 5_000)
          recv_answers(socket, n, acc <> data)
        )
  end

  # A request dribbled a packet per millisecond-sleep takes 0.4 s on a quiet
  # machine and 10 s beside two busy loops (a sleeping scheduler is woken
  # some 25 ms late), past the default :request_timeout: these tests are
  # about reading across packets, not that timeout, so they get 2 minutes.
  @dribble_timeout 120_000

  test "a request sent a byte at a time, then two pipelined in one packet, are all answered", %{
    request: request
  } do
    {_listener, port} = listener(request_timeout: @dribble_timeout)

    {:ok, socket} =
      :gen_tcp.connect({127, 0, 0, 1}, port, [:binary, active: false, nodelay: true])

    head = "POST /v1/search/bitmap/prices HTTP/1.1\r\nHost: x\r\nContent-Length: "
    one = head <> "#{byte_size(request)}\r\n\r\n" <> request

    for <<byte <- one>> do
      :ok = :gen_tcp.send(socket, <<byte>>)
      Process.sleep(1)
    end

    first = recv_answers(socket, 1)
    assert first =~ ~r"^HTTP/1.1 200 OK\r\n"
    [_, price] = String.split(first, "\r\n\r\n", parts: 2)

    # A body split over two packets, the second also carrying the whole
    # next request: the bytes after the first body are the second request.
    {part, rest} = String.split_at(one, byte_size(one) - 5)
    :ok = :gen_tcp.send(socket, part)
    Process.sleep(20)
    :ok = :gen_tcp.send(socket, rest <> one)

    answers = recv_answers(socket, 2)
    assert [_, a, b] = String.split(answers, "HTTP/1.1 200 OK\r\n")
    assert String.ends_with?(a, price) and String.ends_with?(b, price)
    :gen_tcp.close(socket)
  end

  test "a chunked body dribbled in small packets is read whole", %{request: request} do
    {_listener, port} = listener(request_timeout: @dribble_timeout)

    {:ok, socket} =
      :gen_tcp.connect({127, 0, 0, 1}, port, [:binary, active: false, nodelay: true])

    chunks =
      for <<piece::binary-size(7) <- binary_part(request, 0, div(byte_size(request), 7) * 7)>>,
        do: piece

    tail = binary_part(request, length(chunks) * 7, byte_size(request) - length(chunks) * 7)

    body =
      Enum.map_join(chunks ++ [tail], fn piece ->
        if piece == "",
          do: "",
          else: Integer.to_string(byte_size(piece), 16) <> "\r\n" <> piece <> "\r\n"
      end) <> "0\r\n\r\n"

    :ok =
      :gen_tcp.send(
        socket,
        "POST /v1/search/bitmap/prices HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
      )

    for <<piece::binary-size(3) <- binary_part(body, 0, div(byte_size(body), 3) * 3)>> do
      :ok = :gen_tcp.send(socket, piece)
      Process.sleep(1)
    end

    :ok =
      :gen_tcp.send(
        socket,
        binary_part(body, div(byte_size(body), 3) * 3, rem(byte_size(body), 3))
      )

    answer = recv_answers(socket, 1)
    assert answer =~ ~r"^HTTP/1.1 200 OK\r\n"
    assert answer =~ ~s("currency")
    :gen_tcp.close(socket)
  end

  test "a client that hangs up in the middle of a bulk reply is counted, not logged", %{
    request: request
  } do
    {listener, port} = listener([])
    # 65,536 answers, about 6 MB: more than the socket buffers hold.
    body = String.duplicate(request <> "\n", 65_536)

    log =
      capture_log(fn ->
        for _ <- 1..3 do
          {:ok, socket} =
            :gen_tcp.connect({127, 0, 0, 1}, port, [:binary, active: false, recbuf: 4096])

          head = "POST #{@bulk} HTTP/1.1\r\nHost: x\r\nContent-Length: #{byte_size(body)}\r\n\r\n"
          :ok = :gen_tcp.send(socket, [head, body])
          assert {:ok, "HTTP/1.1 200 OK\r\n" <> _} = :gen_tcp.recv(socket, 0, 30_000)
          # Gone, with most of the reply unread.
          :gen_tcp.close(socket)
        end

        assert eventually(fn -> PriceSearch.HTTP.stats(listener).hangups == 3 end)
        assert eventually(fn -> PriceSearch.HTTP.stats(listener).open == 0 end)
      end)

    refute log =~ "[error]"
    refute log =~ "stacktrace"

    # Still serving.
    assert {200, _, _} = C.post(port, @bitmap, request)
  end

  # The listener's side of a client's connection: its socket, found by the
  # client's address, and the process that owns it.
  defp server_side(client, port) do
    {:ok, client_address} = :inet.sockname(client)

    Enum.find_value(:erlang.ports(), fn socket ->
      with {:name, 'tcp_inet'} <- Port.info(socket, :name),
           {:ok, {_, ^port}} <- :inet.sockname(socket),
           {:ok, ^client_address} <- :inet.peername(socket),
           {:connected, pid} <- Port.info(socket, :connected) do
        {socket, pid}
      else
        _ -> nil
      end
    end)
  end

  # The off-heap binaries `pid` references, as {address, size} pairs,
  # counted from the process itself so that what other processes (the
  # application's, ExUnit's, other test modules') allocate or free
  # meanwhile does not count.
  defp binaries_of(pid) do
    case Process.info(pid, :binary) do
      {:binary, list} -> MapSet.new(for {address, size, _refs} <- list, do: {address, size})
      nil -> MapSet.new()
    end
  end

  # Whether any live process still references one of `binaries`, every
  # process collected first so that garbage does not count.
  defp still_referenced?(binaries) do
    Enum.any?(Process.list(), fn pid ->
      :erlang.garbage_collect(pid)
      not MapSet.disjoint?(binaries_of(pid), binaries)
    end)
  end

  # Sends a bulk request of `n` copies of `request` (built here, so that
  # nothing of it is left in the caller once the socket has sent it).
  defp send_bulk(client, request, n) do
    body = bulk_body(request, n)
    head = "POST #{@bulk} HTTP/1.1\r\nHost: x\r\nContent-Length: #{byte_size(body)}\r\n\r\n"
    :ok = :gen_tcp.send(client, [head, body])
  end

  defp bulk_body(request, n), do: String.duplicate(request <> "\n", n)

  test "a client that never reads its bulk answer is closed after :send_timeout, its memory freed",
       %{request: request} do
    {listener, port} = listener(send_timeout: 1_000)

    # The size of the answer to 65,536 copies of the request, from a bulk
    # of 1,024 read whole (it depends on the catalogue the service loaded:
    # the shared data's or the generated one), asked of the application's
    # own listener (httpc keeps its connection open).
    {200, _, sample} = C.post(PriceSearch.port(), @bulk, bulk_body(request, 1_024))
    answer_bytes = div(byte_size(sample), 1_024) * 65_536

    {:ok, client} = :gen_tcp.connect({127, 0, 0, 1}, port, [:binary, active: false, recbuf: 4096])

    # The connection's process, and its socket, whose send buffer is set
    # small before anything is sent: a buffer set explicitly is not grown
    # by the kernel's autotuning (several MB on loopback), so the kernel
    # takes a few KB of the answer whatever the machine, and the rest stays
    # in the process.
    assert eventually(fn -> server_side(client, port) != nil end)
    {socket, _} = server_side(client, port)
    :ok = :inet.setopts(socket, sndbuf: 4096)

    send_bulk(client, request, 65_536)
    {^socket, pid} = server_side(client, port)
    ref = Process.monitor(pid)

    # Blocked in a send the client never takes (after reading, decoding and
    # searching 65,536 requests: up to a minute on a loaded machine; while
    # it reads, it is in prim_inet only for a moment, re-arming {active, N})
    assert eventually(
             fn ->
               match?(
                 {:current_function, {:prim_inet, f, _}} when f in [:send, :send_recv_reply],
                 Process.info(pid, :current_function)
               )
             end,
             2_400
           )

    # What the connection's process holds (its garbage included: it goes
    # with the process): the answer, less the few KB the socket buffers
    # took. Half the answer is the bar, so it holds by design; a process
    # that let its answer go (or never built it) holds next to none of it.
    # (Binaries of 4 KB or more: the answer's chunks, not a short string
    # of the catalogue that another process may rightly share.)
    binaries = MapSet.filter(binaries_of(pid), fn {_address, size} -> size >= 4096 end)
    held = binaries |> Enum.map(&elem(&1, 1)) |> Enum.sum()
    assert held > div(answer_bytes, 2), "held #{held} of a #{answer_bytes}-byte answer"

    # Closed once a send has waited :send_timeout, though the client is
    # still there: the process ends and what it held is freed.
    assert_receive {:DOWN, ^ref, :process, ^pid, :normal}, 30_000
    assert Port.info(socket) == nil
    assert eventually(fn -> PriceSearch.HTTP.stats(listener).open == 0 end)
    assert PriceSearch.HTTP.stats(listener).send_timed_out == 1
    # and no other process (the listener, a searcher) kept the answer's
    # binaries: with the port closed, nothing references them
    assert eventually(fn -> not still_referenced?(binaries) end)

    :gen_tcp.close(client)
    assert {200, _, _} = C.post(port, @bitmap, request)
  end

  test "the listener refuses bad limits with an ArgumentError naming them" do
    for {key, bad} <- [
          idle_timeout: 0,
          request_timeout: 3_600_001,
          send_timeout: 0,
          max_connections: 0,
          backlog: :many,
          acceptors: 2_000
        ] do
      assert_raise ArgumentError, ~r/option #{inspect(key)} to be an integer/, fn ->
        PriceSearch.HTTP.start_link([{key, bad}])
      end
    end
  end

  test "connections over :max_connections are closed and counted; the others are served" do
    {listener, port} = listener(max_connections: 2)
    {:ok, a} = connect(port)
    {:ok, b} = connect(port)
    assert eventually(fn -> PriceSearch.HTTP.stats(listener).open == 2 end)
    {:ok, c} = connect(port)
    assert {:error, :closed} = :gen_tcp.recv(c, 0, 5_000)
    assert PriceSearch.HTTP.stats(listener).refused == 1

    :ok = :gen_tcp.send(a, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert {:ok, "HTTP/1.1 200 OK\r\n" <> _} = :gen_tcp.recv(a, 0, 5_000)
    :gen_tcp.close(b)
  end
end
