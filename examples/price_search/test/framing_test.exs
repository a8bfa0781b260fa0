defmodule PriceSearch.FramingTest do
  # How a request's body is framed, read as Go's net/http (1.26) reads it,
  # over raw sockets against the application's listener. Each expected
  # answer is the one the Go reference answers (server.go writes the 400
  # and 501 itself; the 500 and the bulk answers are its handlers' answers
  # to the error its body reader returns). Not async: the application's one
  # listener.
  use ExUnit.Case

  alias PriceCatalogue, as: Catalogue
  alias PriceSearch.TestClient, as: C

  @single "/v1/search/bitmap/prices"
  @bulk "/v5/search/bitmap/bulk/prices"

  # server.go, for a request it cannot read.
  @go_400 "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n" <>
            "Connection: close\r\n\r\n400 Bad Request"
  @go_501 "HTTP/1.1 501 Not Implemented\r\nContent-Type: text/plain; charset=utf-8\r\n" <>
            "Connection: close\r\n\r\nUnsupported transfer encoding"

  setup_all do
    port = PriceSearch.port()
    :ok = C.await_loaded(port)
    {source, prices, _} = Catalogue.reference_or_generated()
    request = :jiffy.encode(Catalogue.request_json(Catalogue.single_request(prices, source)))
    {200, _, price} = C.post(port, String.to_charlist(@single), request)
    %{port: port, request: request, price: price}
  end

  # Sends `data` on a new connection (then shuts down the sending side when
  # asked) and reads everything until the server closes: {head, body}, the
  # head without its Date line.
  defp exchange(port, data, shut_write \\ false) do
    {:ok, socket} = :gen_tcp.connect({127, 0, 0, 1}, port, [:binary, active: false])
    :ok = :gen_tcp.send(socket, data)
    if shut_write, do: :ok = :gen_tcp.shutdown(socket, :write)
    answer = read_all(socket, "")
    :gen_tcp.close(socket)
    [head | body] = String.split(answer, "\r\n\r\n", parts: 2)
    {String.replace(head, ~r/\r\nDate: [^\r]*/, ""), Enum.join(body)}
  end

  # (a connection left open, or reset, shows at the end of what was read)
  defp read_all(socket, acc) do
    case :gen_tcp.recv(socket, 0, 15_000) do
      {:ok, data} -> read_all(socket, acc <> data)
      {:error, :closed} -> acc
      {:error, reason} -> acc <> "\r\n\r\n<#{reason}>"
    end
  end

  defp raw(port, data), do: exchange(port, data) |> then(fn {h, b} -> h <> "\r\n\r\n" <> b end)

  defp post(path, headers, body),
    do: [
      "POST ",
      path,
      " HTTP/1.1\r\nHost: x\r\n",
      Enum.map(headers, &[&1, "\r\n"]),
      "\r\n",
      body
    ]

  defp chunked(size_line, data), do: [size_line, "\r\n", data, "\r\n0\r\n\r\n"]

  defp hex(data), do: String.downcase(Integer.to_string(byte_size(data), 16))

  test "Content-Length 0 then another: Go's 400, where the last one once won", %{
    port: port,
    request: request
  } do
    length = "Content-Length: #{byte_size(request)}"
    answer = raw(port, post(@single, ["Content-Length: 0", length], request))
    assert answer == @go_400
  end

  test "repeated equal Content-Length fields are one (Go deduplicates them)", %{
    port: port,
    request: request,
    price: price
  } do
    n = byte_size(request)
    headers = ["Content-Length: #{n}", "Content-Length:  #{n} ", "Connection: close"]
    assert {"HTTP/1.1 200 OK" <> _, ^price} = exchange(port, post(@single, headers, request))
  end

  test "Content-Length +N: Go's 400 (decimal digits only)", %{port: port, request: request} do
    answer = raw(port, post(@single, ["Content-Length: +#{byte_size(request)}"], request))
    assert answer == @go_400
  end

  test "Content-Length empty, or two numbers in one field: Go's 400", %{
    port: port,
    request: request
  } do
    n = byte_size(request)

    for value <- ["", "#{n}, #{n}", "#{n} 0", "-#{n}", "0x#{hex(request)}", "9223372036854775808"] do
      assert raw(port, post(@single, ["Content-Length: #{value}"], request)) == @go_400,
             "Content-Length: #{value}"
    end
  end

  test "a Transfer-Encoding other than one chunked: Go's 501", %{port: port, request: request} do
    body = chunked(hex(request), request)
    assert raw(port, post(@single, ["Transfer-Encoding: gzip"], request)) == @go_501

    te = "Transfer-Encoding: chunked"
    assert raw(port, post(@single, [te, te], body)) == @go_501
  end

  test "chunked beside a valid Content-Length: chunked wins, as in Go", %{
    port: port,
    request: request,
    price: price
  } do
    headers = ["Transfer-Encoding: chunked", "Content-Length: 3", "Connection: close"]

    assert {"HTTP/1.1 200 OK" <> _, ^price} =
             exchange(port, post(@single, headers, chunked(hex(request), request)))
  end

  # Go's chunkedReader refuses the size line; the handler's decoder gets
  # that error before any data: HandleDecodeError's default, a 500.
  for {name, size} <- [
        {"0x prefix (once read as 0, the data taken for trailers)", "0xN"},
        {"-0 (once read as 0)", "-0"},
        {"a + sign (once accepted)", "+N"},
        {"trailing garbage (once accepted)", "Nzz"}
      ] do
    @size size
    test "chunk size with #{name}: Go's 500, the connection closed", %{
      port: port,
      request: request
    } do
      # N: the data's size in hex
      size = String.replace(@size, "N", hex(request))

      {head, body} =
        exchange(port, post(@single, ["Transfer-Encoding: chunked"], chunked(size, request)))

      assert "HTTP/1.1 500 Internal Server Error\r\n" <> _ = head
      assert head =~ "\r\nConnection: close"
      assert body == "Internal Server Error\n"
    end
  end

  test "a bulk body whose first chunk size is 0x...: Go's empty 200, no request read", %{
    port: port,
    request: request
  } do
    line = request <> "\n"
    body = chunked("0x" <> hex(line), line)
    {head, body} = exchange(port, post(@bulk, ["Transfer-Encoding: chunked"], body))
    assert "HTTP/1.1 200 OK\r\n" <> _ = head
    assert head =~ "\r\nConnection: close"
    assert body == "0\r\n\r\n"
  end

  test "chunk extensions and blanks after the size are allowed, as in Go", %{
    port: port,
    request: request,
    price: price
  } do
    for size <- [hex(request) <> ";a=b", hex(request) <> " \t", String.upcase(hex(request))] do
      headers = ["Transfer-Encoding: chunked", "Connection: close"]

      assert {"HTTP/1.1 200 OK" <> _, ^price} =
               exchange(port, post(@single, headers, chunked(size, request)))
    end
  end

  test "a client that shuts down its sending side after its request gets the answer", %{
    port: port,
    request: request,
    price: price
  } do
    data = post(@single, ["Content-Length: #{byte_size(request)}"], request)
    assert {"HTTP/1.1 200 OK" <> _, ^price} = exchange(port, data, true)

    # Two pipelined, then the shutdown: both answered.
    {"HTTP/1.1 200 OK" <> _, rest} = exchange(port, [data, data], true)

    assert [^price, second] =
             String.split(rest, "HTTP/1.1 200 OK", parts: 2) |> then(fn [a, b] -> [a, b] end)

    assert String.ends_with?(second, "\r\n\r\n" <> price)
  end

  test "a body cut short by the client's shutdown: Go's 400 for a body ending there", %{
    port: port,
    request: request
  } do
    data = post(@single, ["Content-Length: #{byte_size(request) + 10}"], request <> " ")
    {head, body} = exchange(port, binary_part(IO.iodata_to_binary(data), 0, 100), true)
    assert "HTTP/1.1 400 Bad Request\r\n" <> _ = head
    assert body == "Request body contains badly-formed JSON\n"
  end
end
