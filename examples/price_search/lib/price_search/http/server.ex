defmodule PriceSearch.HTTP.Server do
  # The HTTP/1.1 listener under PriceSearch.HTTP: acceptors on gen_tcp, one
  # process per connection, OTP's http_bin parsing (erlang:decode_packet/3 on
  # what one read brought, not a read per line), idle and request timeouts,
  # a connection cap and counters (see PriceSearch.HTTP).
  #
  # Sockets are read in {active, N} mode: the data comes as messages, N
  # packets at most before the socket turns passive and is re-armed when
  # more is wanted (so a client cannot fill the mailbox). A recv per request
  # (active: false) cost a select and a deselect of the socket and a wake-up
  # of the scheduler by the poll thread each time: about a quarter of a
  # search's CPU time on one core, with wrk on another.
  @moduledoc false

  use GenServer

  @max_headers 100
  # Packets delivered as messages before the socket turns passive.
  @active 64
  # A request or header line longer than this is a 400.
  @max_line 16_384
  # A body with more than @large_body bytes still to come is read in
  # @large_reads-byte reads (gen_tcp's `buffer`), then the socket goes back
  # to its default (1,460): at the default, a 330 KB bulk body came as about
  # 230 messages, each appended to the last, and took 4 ms of a 17 ms answer
  # to read; small requests keep small reads, and no buffer is held by an
  # idle connection.
  @large_body 16_384
  @large_reads 65_536

  # Counter indexes.
  @open 1
  @hangups 2
  @idle_closed 3
  @timed_out 4
  @refused 5
  @send_timed_out 6

  defstruct [
    :socket,
    :method,
    :path,
    :version,
    :deadline,
    :counters,
    :opts,
    headers: [],
    # The request's body: :none, its Content-Length, or :chunked.
    body: :none,
    close: false
  ]

  ## Listener

  def start_link(opts) do
    case Keyword.get(opts, :name) do
      nil -> GenServer.start_link(__MODULE__, opts)
      name -> GenServer.start_link(__MODULE__, opts, name: name)
    end
  end

  def port(server), do: GenServer.call(server, :port)

  def stats(server) do
    counters = GenServer.call(server, :counters)

    %{
      open: :counters.get(counters, @open),
      hangups: :counters.get(counters, @hangups),
      idle_closed: :counters.get(counters, @idle_closed),
      timed_out: :counters.get(counters, @timed_out),
      refused: :counters.get(counters, @refused),
      send_timed_out: :counters.get(counters, @send_timed_out)
    }
  end

  @impl true
  def init(opts) do
    Process.flag(:trap_exit, true)

    # Accepted sockets inherit these. A send that cannot queue its data
    # within :send_timeout (a client that does not read) fails and closes
    # the socket, so its answer's memory is freed; without it the send, and
    # all the request held, wait for as long as the client stays.
    # exit_on_close: false keeps the socket writable after the client has
    # shut down its sending side: the requests it sent are still answered.
    listen_opts = [
      :binary,
      ip: Keyword.fetch!(opts, :ip),
      backlog: Keyword.fetch!(opts, :backlog),
      reuseaddr: true,
      nodelay: true,
      active: false,
      packet: :raw,
      send_timeout: Keyword.fetch!(opts, :send_timeout),
      send_timeout_close: true,
      exit_on_close: false
    ]

    case :gen_tcp.listen(Keyword.fetch!(opts, :port), listen_opts) do
      {:ok, listen} ->
        counters = :counters.new(6, [:write_concurrency])

        conn = %{
          handler: Keyword.fetch!(opts, :handler),
          idle_timeout: Keyword.fetch!(opts, :idle_timeout),
          request_timeout: Keyword.fetch!(opts, :request_timeout),
          max_connections: Keyword.fetch!(opts, :max_connections),
          counters: counters
        }

        for _ <- 1..Keyword.fetch!(opts, :acceptors), do: spawn_acceptor(listen, conn)
        {:ok, port} = :inet.port(listen)
        {:ok, %{listen: listen, port: port, counters: counters}}

      {:error, reason} ->
        {:stop, reason}
    end
  end

  @impl true
  def handle_call(:port, _from, state), do: {:reply, state.port, state}
  def handle_call(:counters, _from, state), do: {:reply, state.counters, state}

  @impl true
  def handle_info(_message, state), do: {:noreply, state}

  @impl true
  def terminate(_reason, state), do: :gen_tcp.close(state.listen)

  ## Acceptors: each accepts one connection, starts its replacement, then
  ## serves the connection itself.

  defp spawn_acceptor(listen, conn), do: spawn(fn -> accept(listen, conn) end)

  defp accept(listen, conn) do
    case :gen_tcp.accept(listen) do
      {:ok, socket} ->
        spawn_acceptor(listen, conn)
        connection(socket, conn)

      {:error, :closed} ->
        :ok

      {:error, _} ->
        # Out of file descriptors, or the like: try again shortly.
        Process.sleep(10)
        accept(listen, conn)
    end
  end

  defp connection(socket, %{counters: counters} = conn) do
    :counters.add(counters, @open, 1)

    if :counters.get(counters, @open) > conn.max_connections do
      :counters.add(counters, @refused, 1)
      :gen_tcp.close(socket)
    else
      try do
        # An error here is a client already gone: nothing to serve.
        if :inet.setopts(socket, active: @active) == :ok,
          do: request_line(%__MODULE__{socket: socket, counters: counters, opts: conn})
      after
        :gen_tcp.close(socket)
      end
    end
  after
    :counters.sub(counters, @open, 1)
  end

  ## One request
  # What was received but not yet parsed is in the process dictionary
  # (:price_search_buffer), so that the handler's read_body/2 can use it.

  defp request_line(%{opts: opts} = req) do
    buffer = Process.get(:price_search_buffer, "")

    case :erlang.decode_packet(:http_bin, buffer, packet_size: @max_line) do
      {:ok, {:http_request, method, path, version}, rest} ->
        Process.put(:price_search_buffer, rest)
        req = %{req | method: method, path: abs_path(path), version: version}
        req = if req.deadline, do: req, else: %{req | deadline: deadline(opts)}
        headers(req, [], 0)

      # Blank lines before a request are allowed.
      {:ok, {:http_error, line}, rest} when line in ["\r\n", "\n"] ->
        Process.put(:price_search_buffer, rest)
        request_line(req)

      {:more, _} when byte_size(buffer) > @max_line ->
        bad_request(%{req | version: {1, 1}})

      {:more, _} ->
        # Idle until the first byte; then the request's deadline runs.
        {timeout, counter} =
          if buffer == "",
            do: {opts.idle_timeout, @idle_closed},
            else: {remaining(req), @timed_out}

        if read_head(req, buffer, timeout, counter) do
          req = if req.deadline, do: req, else: %{req | deadline: deadline(opts)}
          request_line(req)
        else
          :ok
        end

      _ ->
        bad_request(%{req | version: {1, 1}})
    end
  end

  # Reads more of a request's head after `buffer`, within `timeout` ms:
  # true, or false once the connection is done (a timeout, counted under
  # `counter`, or the client gone).
  defp read_head(req, buffer, timeout, counter) do
    case read(req, timeout) do
      {:ok, data} ->
        Process.put(:price_search_buffer, buffer <> data)
        true

      {:error, :timeout} ->
        :counters.add(req.counters, counter, 1)
        false

      {:error, :closed} ->
        false
    end
  end

  # The next data on the socket, within `timeout` ms: {:ok, data},
  # {:error, :timeout} or {:error, :closed} (the client gone or done
  # sending, or an error). The end of input is put back in the mailbox, so
  # every later read sees it at once, while answers can still be sent.
  defp read(%{socket: socket} = req, timeout) do
    receive do
      {:tcp, ^socket, data} ->
        {:ok, data}

      {:tcp_passive, ^socket} ->
        case :inet.setopts(socket, active: @active) do
          :ok -> read(req, timeout)
          {:error, _} -> {:error, :closed}
        end

      {:tcp_closed, ^socket} = closed ->
        send(self(), closed)
        {:error, :closed}

      {:tcp_error, ^socket, _} ->
        send(self(), {:tcp_closed, socket})
        {:error, :closed}
    after
      timeout -> {:error, :timeout}
    end
  end

  defp deadline(opts), do: System.monotonic_time(:millisecond) + opts.request_timeout

  defp abs_path({:abs_path, path}), do: path
  defp abs_path(_), do: "*"

  defp headers(req, _acc, @max_headers), do: bad_request(req)

  defp headers(req, acc, n) do
    buffer = Process.get(:price_search_buffer)

    case :erlang.decode_packet(:httph_bin, buffer, packet_size: @max_line) do
      {:ok, {:http_header, _, name, _, value}, rest} ->
        Process.put(:price_search_buffer, rest)

        case kept(name) do
          nil -> headers(req, acc, n + 1)
          name -> headers(req, [{name, value} | acc], n + 1)
        end

      {:ok, :http_eoh, rest} ->
        Process.put(:price_search_buffer, rest)

        case framing(acc, req.version) do
          {:ok, body} ->
            req = %{req | headers: acc, body: body}
            req = %{req | close: closes?(req)}
            # A body the handler does not read leaves the connection unusable.
            Process.put(:price_search_close, body not in [:none, 0])
            req.opts.handler.(req)
            next(req)

          :bad ->
            refuse(req, "400 Bad Request", "400 Bad Request")

          :unsupported ->
            refuse(req, "501 Not Implemented", "Unsupported transfer encoding")
        end

      {:more, _} when byte_size(buffer) > @max_line ->
        bad_request(req)

      {:more, _} ->
        if read_head(req, buffer, remaining(req), @timed_out),
          do: headers(req, acc, n),
          else: :ok

      _ ->
        bad_request(req)
    end
  end

  defp next(req) do
    if close?(req) do
      :ok
    else
      request_line(%{req | method: nil, path: nil, headers: [], deadline: nil, close: false})
    end
  end

  # How the body is framed, by Go's readTransfer (net/http/transfer.go):
  # Transfer-Encoding first, on HTTP/1.1 only (ignored on 1.0): one field,
  # "chunked" in any case, else :unsupported (501). Then Content-Length,
  # even beside chunked: repeated fields must agree once trimmed, and the
  # value is decimal digits only (no sign, no blank inside, not empty),
  # below 2^63, else :bad (400). A valid length beside chunked is dropped.
  # `headers` is the kept headers, last first.
  defp framing(headers, version) do
    {lengths, encodings} = framing_fields(headers, [], [])

    with {:ok, chunked?} <- transfer_encoding(encodings, version),
         {:ok, length} <- content_length(lengths) do
      {:ok, if(chunked?, do: :chunked, else: length)}
    end
  end

  defp framing_fields([], lengths, encodings), do: {lengths, encodings}

  defp framing_fields([{"content-length", value} | rest], lengths, encodings),
    do: framing_fields(rest, [value | lengths], encodings)

  defp framing_fields([{"transfer-encoding", value} | rest], lengths, encodings),
    do: framing_fields(rest, lengths, [value | encodings])

  defp framing_fields([_ | rest], lengths, encodings),
    do: framing_fields(rest, lengths, encodings)

  defp transfer_encoding([], _version), do: {:ok, false}
  defp transfer_encoding(_, {major, minor}) when {major, minor} < {1, 1}, do: {:ok, false}

  defp transfer_encoding([value], _version) do
    if String.downcase(trim(value), :ascii) == "chunked", do: {:ok, true}, else: :unsupported
  end

  defp transfer_encoding(_several, _version), do: :unsupported

  defp content_length([]), do: {:ok, :none}

  defp content_length([first | others]) do
    first = trim(first)

    if Enum.all?(others, &(trim(&1) == first)),
      do: decimal(first, 0, 0),
      else: :bad
  end

  # strconv.ParseUint(value, 10, 63); stops at the first digit past the
  # bound (a 16 KB field of digits costs no big-integer arithmetic).
  defp decimal(_, _digits, n) when n >= 0x8000000000000000, do: :bad
  defp decimal(<<>>, 0, _n), do: :bad
  defp decimal(<<>>, _digits, n), do: {:ok, n}

  defp decimal(<<c, rest::binary>>, digits, n) when c in ?0..?9,
    do: decimal(rest, digits + 1, n * 10 + c - ?0)

  defp decimal(_, _digits, _n), do: :bad

  # textproto.TrimString: ASCII blanks at both ends.
  defp trim(value), do: value |> trim_leading() |> trim_trailing()

  defp trim_leading(<<c, rest::binary>>) when c in ' \t\r\n', do: trim_leading(rest)
  defp trim_leading(value), do: value

  defp trim_trailing(value) do
    case byte_size(value) - 1 do
      -1 ->
        value

      last ->
        if :binary.at(value, last) in ' \t\r\n',
          do: trim_trailing(binary_part(value, 0, last)),
          else: value
    end
  end

  # Go's answer to a request it cannot frame, byte for byte (server.go:
  # no Date, no Content-Length), then the connection closes. What the
  # client still sends is read and dropped for a moment, so that closing
  # does not reset the connection under the answer.
  defp refuse(req, status, text) do
    send!(req, [
      "HTTP/1.1 ",
      status,
      "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n",
      text
    ])

    :gen_tcp.shutdown(req.socket, :write)
    linger(req, 64 * 1024, 100)
  end

  defp bad_request(req) do
    close_after()
    respond(req, 400, [{"Content-Type", "text/plain; charset=utf-8"}], "400 Bad Request\n")
  end

  # The headers the server reads, by their lower-case names; the others are
  # dropped. decode_packet gives known names as atoms, others capitalised.
  defp kept(:"Content-Length"), do: "content-length"
  defp kept(:"Transfer-Encoding"), do: "transfer-encoding"
  defp kept(:Connection), do: "connection"
  defp kept("Expect"), do: "expect"
  defp kept(_), do: nil

  defp remaining(%{deadline: deadline}),
    do: max(deadline - System.monotonic_time(:millisecond), 0)

  ## For the handler

  def header(%{headers: headers}, name) do
    case List.keyfind(headers, name, 0) do
      {_, value} -> value
      nil -> nil
    end
  end

  # Whether the connection closes after this response.
  def close?(req), do: req.close or Process.get(:price_search_close, false)

  defp closes?(req) do
    case {req.version, header(req, "connection")} do
      {{1, 1}, nil} -> false
      {{1, 1}, value} -> String.downcase(value) =~ "close"
      {_, nil} -> true
      {_, value} -> not (String.downcase(value) =~ "keep-alive")
    end
  end

  # The connection is closed after the response.
  def close_after, do: Process.put(:price_search_close, true)

  @doc false
  # Reads the body, up to `limit` bytes, within the request's deadline:
  # {:ok, body} | {:error, :too_large} | {:error, :timeout} |
  # {:error, :broken, partial} (chunked framing Go's reader refuses) |
  # {:error, :truncated, partial} (the client stopped sending before the
  # body's end). `partial` is the body's data before the fault: what Go's
  # body reader hands its handler before it reports the error.
  def read_body(%{body: body} = req, limit) do
    Process.put(:price_search_close, false)

    case body do
      :none -> {:ok, ""}
      0 -> {:ok, ""}
      n when is_integer(n) and n > limit -> too_large()
      n when is_integer(n) -> continue(req, n, fn -> exactly(req, n) end)
      :chunked -> continue(req, limit, fn -> chunked(req, take_buffer(), [], 0, 0, limit) end)
    end
  end

  defp too_large do
    close_after()
    {:error, :too_large}
  end

  defp broken(partial) do
    close_after()
    {:error, :broken, IO.iodata_to_binary(partial)}
  end

  defp truncated(partial) do
    close_after()
    {:error, :truncated, IO.iodata_to_binary(partial)}
  end

  # `read` reads a body of at most `most` bytes.
  defp continue(req, most, read) do
    with expect when expect != nil <- header(req, "expect"),
         true <- String.downcase(expect) == "100-continue" and req.version == {1, 1} do
      :gen_tcp.send(req.socket, "HTTP/1.1 100 Continue\r\n\r\n")
    end

    large(req, most, read)
  end

  # Runs `read` with large reads when more than @large_body bytes may be
  # still to come.
  defp large(%{socket: socket}, most, read) do
    with true <- most - byte_size(Process.get(:price_search_buffer, "")) > @large_body,
         {:ok, [buffer: default]} <- :inet.getopts(socket, [:buffer]),
         :ok <- :inet.setopts(socket, buffer: @large_reads) do
      try do
        read.()
      after
        :inet.setopts(socket, buffer: default)
      end
    else
      _ -> read.()
    end
  end

  defp take_buffer do
    buffer = Process.get(:price_search_buffer, "")
    Process.put(:price_search_buffer, "")
    buffer
  end

  # n bytes of body: what the buffer holds, then the socket's; what came
  # after them stays in the buffer (a pipelined next request).
  defp exactly(req, n) do
    case take(req, take_buffer(), n) do
      {:ok, body, rest} ->
        Process.put(:price_search_buffer, rest)
        {:ok, body}

      {:eof, partial} ->
        truncated(partial)

      {:error, :timeout} = error ->
        error
    end
  end

  # Data from the socket within the request's deadline; a timeout is
  # counted and closes the connection after the answer.
  defp recv(req) do
    case read(req, remaining(req)) do
      {:ok, data} ->
        {:ok, data}

      {:error, :timeout} ->
        :counters.add(req.counters, @timed_out, 1)
        close_after()
        {:error, :timeout}

      {:error, :closed} ->
        {:error, :closed}
    end
  end

  # A chunked body, as Go's chunkedReader (net/http/internal/chunked.go)
  # reads it. A size line ends in CRLF, holds no other CR and is under
  # 4 KB; blanks at its end, then any ";extension", are cut off; what is
  # left is 1 to 16 hex digits, nothing else (no sign, no "0x", no blank
  # before). Then the data and CRLF. A 0 chunk and the trailer end it.
  # `excess` is Go's bound on bytes that are not data (16 KB beyond 16
  # bytes and twice the data per chunk).
  defp chunked(req, buffer, acc, size, excess, limit) do
    case :binary.split(buffer, "\n") do
      [line, rest] ->
        case chunk_size(line, excess) do
          {0, _excess} ->
            trailer(req, rest, acc)

          {n, _excess} when size + n > limit ->
            too_large()

          {n, excess} ->
            case take(req, rest, n + 2) do
              {:ok, <<chunk::binary-size(n), "\r\n">>, rest} ->
                chunked(req, rest, [acc | chunk], size + n, excess, limit)

              {:ok, <<chunk::binary-size(n), _::binary>>, _rest} ->
                broken([acc | chunk])

              {:eof, data} ->
                truncated([acc | binary_part(data, 0, min(n, byte_size(data)))])

              {:error, :timeout} = error ->
                error
            end

          :error ->
            broken(acc)
        end

      [_] when byte_size(buffer) >= 4096 ->
        broken(acc)

      [_] ->
        case recv(req) do
          {:ok, more} -> chunked(req, buffer <> more, acc, size, excess, limit)
          {:error, :closed} -> truncated(acc)
          error -> error
        end
    end
  end

  # A size line (without its LF): {size, excess} or :error.
  defp chunk_size(line, excess) do
    last = byte_size(line) - 1

    with true <- last in 0..4095,
         {^last, 1} <- :binary.match(line, "\r"),
         [digits | _] <- :binary.split(trim_blanks(binary_part(line, 0, last)), ";"),
         {:ok, n} <- hex(digits, 0, 0),
         excess = max(excess + last + 2 - 16 - 2 * n, 0),
         true <- excess <= 16 * 1024 do
      {n, excess}
    else
      _ -> :error
    end
  end

  # Spaces and tabs at the end.
  defp trim_blanks(value) do
    case byte_size(value) - 1 do
      -1 ->
        value

      last ->
        if :binary.at(value, last) in ' \t',
          do: trim_blanks(binary_part(value, 0, last)),
          else: value
    end
  end

  defp hex(<<>>, 0, _n), do: :error
  defp hex(<<>>, _digits, n), do: {:ok, n}
  defp hex(_, 16, _n), do: :error
  defp hex(<<c, rest::binary>>, i, n) when c in ?0..?9, do: hex(rest, i + 1, n * 16 + c - ?0)
  defp hex(<<c, rest::binary>>, i, n) when c in ?a..?f, do: hex(rest, i + 1, n * 16 + c - ?a + 10)
  defp hex(<<c, rest::binary>>, i, n) when c in ?A..?F, do: hex(rest, i + 1, n * 16 + c - ?A + 10)
  defp hex(_, _i, _n), do: :error

  # After the 0 chunk: CRLF, or header fields ending in a blank line within
  # 4 KB (Go's readTrailer); an end of input here is a broken body in Go.
  defp trailer(req, buffer, acc) do
    case buffer do
      "\r\n" <> rest ->
        body_done(rest, acc)

      <<_, _, _::binary>> ->
        case :binary.split(buffer, "\r\n\r\n") do
          [fields, rest] when byte_size(fields) <= 4092 ->
            if trailer_fields?(fields), do: body_done(rest, acc), else: broken(acc)

          [_, _] ->
            broken(acc)

          [_] when byte_size(buffer) >= 4096 ->
            broken(acc)

          [_] ->
            trailer_more(req, buffer, acc)
        end

      _ ->
        trailer_more(req, buffer, acc)
    end
  end

  defp trailer_more(req, buffer, acc) do
    case recv(req) do
      {:ok, more} -> trailer(req, buffer <> more, acc)
      {:error, :closed} -> broken(acc)
      error -> error
    end
  end

  defp trailer_fields?(fields) do
    fields
    |> :binary.split("\r\n", [:global])
    |> Enum.all?(fn field ->
      # (decode_packet wants the next line's start: a field may continue)
      match?(
        {:ok, {:http_header, _, _, _, _}, "\r\n"},
        :erlang.decode_packet(:httph_bin, field <> "\r\n\r\n", [])
      )
    end)
  end

  defp body_done(rest, acc) do
    Process.put(:price_search_buffer, rest)
    {:ok, IO.iodata_to_binary(acc)}
  end

  defp take(_req, buffer, n) when byte_size(buffer) >= n do
    <<data::binary-size(n), rest::binary>> = buffer
    {:ok, data, rest}
  end

  defp take(req, buffer, n) do
    case recv(req) do
      {:ok, more} -> take(req, buffer <> more, n)
      {:error, :closed} -> {:eof, buffer}
      {:error, :timeout} = error -> error
    end
  end

  @doc false
  # After a refused body the client may still be sending it: read and drop
  # up to `bytes` of it, for at most `ms` without data, so that closing does
  # not reset the connection under the response.
  def linger(req, bytes, ms) when bytes > 0 do
    Process.put(:price_search_buffer, "")

    case read(req, ms) do
      {:ok, data} -> linger(req, bytes - byte_size(data), ms)
      {:error, _} -> :ok
    end
  end

  def linger(_req, _bytes, _ms), do: :ok

  @doc false
  # A whole response in one send.
  def respond(req, status, headers, body) do
    send!(req, [
      head(req, status, headers),
      "Content-Length: ",
      Integer.to_string(IO.iodata_length(body)),
      "\r\n\r\n",
      body
    ])
  end

  @doc false
  # The head of a chunked response; then chunk/2 for each part, "" to end.
  def chunked_head(req, status, headers),
    do: send!(req, [head(req, status, headers), "Transfer-Encoding: chunked\r\n\r\n"])

  @doc false
  def chunk(req, ""), do: send!(req, "0\r\n\r\n")

  def chunk(req, data) do
    send!(req, [Integer.to_string(IO.iodata_length(data), 16), "\r\n", data, "\r\n"])
  end

  defp head(req, status, headers) do
    [
      version(req.version),
      status_line(status),
      "Date: ",
      date(),
      "\r\n",
      if(close?(req), do: "Connection: close\r\n", else: []),
      for({name, value} <- headers, do: [name, ": ", value, "\r\n"])
    ]
  end

  # A client that hangs up before its answer is sent is normal, and so is
  # one that does not read it within :send_timeout (the socket is then
  # closed by send_timeout_close): counted, and the connection's process
  # ends, which frees what the request held.
  defp send!(req, data) do
    case :gen_tcp.send(req.socket, data) do
      :ok ->
        :ok

      {:error, :timeout} ->
        :counters.add(req.counters, @send_timed_out, 1)
        exit(:normal)

      {:error, _} ->
        :counters.add(req.counters, @hangups, 1)
        exit(:normal)
    end
  end

  # The Date header, made once a second per connection.
  defp date do
    now = System.os_time(:second)

    case Process.get(:price_search_date) do
      {^now, date} ->
        date

      _ ->
        date = rfc1123(:calendar.system_time_to_universal_time(now, :second))
        Process.put(:price_search_date, {now, date})
        date
    end
  end

  @days {"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"}
  @months {"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"}

  defp rfc1123({{y, mo, d} = day, {h, mi, s}}) do
    pad = fn n -> String.pad_leading(Integer.to_string(n), 2, "0") end

    IO.iodata_to_binary([
      elem(@days, :calendar.day_of_the_week(day) - 1),
      ", ",
      pad.(d),
      " ",
      elem(@months, mo - 1),
      " ",
      Integer.to_string(y),
      " ",
      pad.(h),
      ":",
      pad.(mi),
      ":",
      pad.(s),
      " GMT"
    ])
  end

  defp version({1, 0}), do: "HTTP/1.0 "
  defp version(_), do: "HTTP/1.1 "

  for {status, reason} <- [
        {200, "OK"},
        {400, "Bad Request"},
        {404, "Not Found"},
        {405, "Method Not Allowed"},
        {413, "Request Entity Too Large"},
        {500, "Internal Server Error"},
        {503, "Service Unavailable"}
      ] do
    defp status_line(unquote(status)), do: unquote("#{status} #{reason}\r\n")
  end
end
