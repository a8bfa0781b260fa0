defmodule PriceSearch.HTTP do
  @moduledoc """
  The HTTP interface, on mochiweb, with the Go reference service's routes,
  status codes and bodies (the README's "Compatibility" section lists where
  it differs, and why).

  | route | answer |
  |---|---|
  | `POST /v1/search/bitmap/prices` | 200 `{"id","spec","value","currency"}`; 404 (text) when no price |
  | `POST /v1/search/map/prices` | the same, over the map index |
  | `POST /v5/search/bitmap/bulk/prices` | 200, chunked NDJSON: `{"price":{...},"error":{},"id":N}` or `{"error":{"message":"..."},"id":N}` per request |
  | `GET /health` | 200 once the catalogue is loaded, 503 before |

  Every route answers 503 until the catalogue is loaded; an unknown path
  404, a known path with another method 405 (with `Allow`). Errors are
  plain text, one line, the Go service's.

  Request bodies are read by `PriceSearch.Request` as Go reads them; the
  answers are built by `PriceSearch.JSON`. This module only moves bytes.

  ## Failures

  Every body is untrusted. A single search body that cannot be read is a 400
  with Go's message (`PriceSearch.Request`); a search that finds nothing a
  404 with Go's message (`PriceSearch.Search`). A bulk body is read as a
  stream of JSON values; at the first one that cannot be read it stops, as
  Go does: the requests before it are answered and the body ends with the
  line `Unable decode body` (a 400 with that text when there are none).

  Limits, which no Go client meets (Go has none): 1 MB per search body,
  32 MB and 65,536 requests per bulk body. A body over the limit is a 413,
  refused from its `Content-Length` before it is read (a chunked body is
  read up to the limit); the connection is then closed. Any other failure
  while handling a request is logged and answered 500; the listener and the
  other connections go on.

  ## Concurrency

  mochiweb runs each connection in its own process; a request is decoded,
  searched (straight on the `Larder.Table`, fetched from `PriceSearch.Store`
  through `:persistent_term`) and answered in that process.
  """

  require Logger
  alias PriceSearch.{JSON, Request, Search, Store}

  @single_limit 1024 * 1024
  @bulk_limit 32 * 1024 * 1024
  @bulk_lines 65_536
  @ndjson [{"Content-Type", "application/x-ndjson"}]
  @json [{"Content-Type", "application/json"}]
  @text [{"Content-Type", "text/plain; charset=utf-8"}, {"X-Content-Type-Options", "nosniff"}]

  @doc """
  Starts a listener.

  Options:

    * `:port` - the TCP port; `0` takes a free one (see `port/1`). Default 8091.
    * `:ip` - the address to listen on, a tuple. Default `{0, 0, 0, 0}`.
    * `:store` - the name of the `PriceSearch.Store` to search. Default
      `PriceSearch.Store`.
    * `:name` - an atom to register the listener under. Default: none.
  """
  @spec start_link(keyword()) :: {:ok, pid()} | {:error, term()}
  def start_link(opts \\ []) do
    valid = [:port, :ip, :store, :name]

    case Keyword.keys(opts) -- valid do
      [] ->
        :ok

      unknown ->
        raise ArgumentError, "unknown options #{inspect(unknown)}, valid: #{inspect(valid)}"
    end

    port = Keyword.get(opts, :port, 8091)
    store = Keyword.get(opts, :store, Store)

    unless is_integer(port) and port in 0..65_535,
      do: raise(ArgumentError, ":port must be an integer in 0..65535, got: #{inspect(port)}")

    :mochiweb_http.start_link(
      name: Keyword.get(opts, :name, :undefined),
      ip: Keyword.get(opts, :ip, {0, 0, 0, 0}),
      port: port,
      backlog: 1024,
      nodelay: true,
      acceptor_pool_size: 16,
      loop: fn req -> handle(req, store) end
    )
  end

  @doc "A child spec for `start_link/1`."
  @spec child_spec(keyword()) :: Supervisor.child_spec()
  def child_spec(opts) do
    %{id: Keyword.get(opts, :name, __MODULE__), start: {__MODULE__, :start_link, [opts]}}
  end

  @doc "The port a listener serves on."
  @spec port(pid() | atom()) :: :inet.port_number()
  def port(listener), do: :mochiweb_socket_server.get(listener, :port)

  ## Routing

  @doc false
  # mochiweb's loop: runs in the connection's process, once per request.
  def handle(req, store) do
    route(
      path(:mochiweb_request.get(:raw_path, req)),
      :mochiweb_request.get(:method, req),
      req,
      store
    )
  catch
    # The client went away (mochiweb's own exit): nothing to answer.
    :exit, :normal ->
      exit(:normal)

    kind, reason ->
      Logger.error(
        "price search: #{Exception.format(kind, reason, __STACKTRACE__)}",
        crash_reason: {reason, __STACKTRACE__}
      )

      force_close()
      text(req, 500, "internal error")
  end

  defp path(raw_path) do
    case :string.split(raw_path, '?') do
      [path | _] -> path
    end
  end

  defp route('/v1/search/bitmap/prices', :POST, req, store), do: single(req, store, :bitmap)
  defp route('/v5/search/bitmap/bulk/prices', :POST, req, store), do: bulk(req, store)
  defp route('/v1/search/map/prices', :POST, req, store), do: single(req, store, :map)
  defp route('/health', :GET, req, store), do: health(req, store)
  defp route('/v1/search/bitmap/prices', _, req, _), do: not_allowed(req, "POST")
  defp route('/v5/search/bitmap/bulk/prices', _, req, _), do: not_allowed(req, "POST")
  defp route('/v1/search/map/prices', _, req, _), do: not_allowed(req, "POST")
  defp route('/health', _, req, _), do: not_allowed(req, "GET")
  defp route(_, _, req, _), do: text(req, 404, "404 page not found")

  # Go answers 405 with an empty body; Allow is ours.
  defp not_allowed(req, allow),
    do: respond(req, 405, [{"Allow", allow}], [])

  defp health(req, store) do
    case Store.fetch(store) do
      {:ok, _} -> respond(req, 200, [], [])
      :loading -> text(req, 503, "loading the catalogue")
    end
  end

  ## One search

  defp single(req, store_name, kind) do
    with {:ok, store} <- loaded(store_name),
         {:ok, body} <- body(req, @single_limit),
         {:ok, request} <- decode(body) do
      case apply(Search, kind, [store, request]) do
        {:ok, price} -> respond(req, 200, @json, JSON.price_line(price))
        {:error, message} -> text(req, 404, message)
      end
    else
      {:error, status, message} -> error(req, status, message)
    end
  end

  defp decode(body) do
    case Request.single(body) do
      {:ok, request} -> {:ok, request}
      {:error, message} -> {:error, 400, message}
    end
  end

  ## Bulk

  defp bulk(req, store_name) do
    with {:ok, store} <- loaded(store_name),
         {:ok, body} <- body(req, @bulk_limit) do
      case Request.bulk(body, @bulk_lines) do
        {:too_many, max} -> error(req, 413, "a bulk body holds at most #{max} requests")
        {:error, []} -> respond(req, 400, @text, JSON.bulk_stopped())
        {status, requests} -> bulk_answer(req, store, requests, status)
      end
    else
      {:error, status, message} -> error(req, status, message)
    end
  end

  defp bulk_answer(req, store, requests, status) do
    answers = Search.bitmap_many(store, requests)
    resp = :mochiweb_request.respond({200, @ndjson, :chunked}, req)
    write_lines(requests, answers, resp, 0, [])
    if status == :error, do: :mochiweb_response.write_chunk(JSON.bulk_stopped(), resp)
    :mochiweb_response.write_chunk("", resp)
  end

  @chunk_lines 1_000

  # Writes the answers in chunks of 1,000 lines.
  defp write_lines([], [], resp, _n, acc), do: write_chunk(acc, resp)

  defp write_lines(requests, answers, resp, @chunk_lines, acc) do
    write_chunk(acc, resp)
    write_lines(requests, answers, resp, 0, [])
  end

  defp write_lines([request | requests], [answer | answers], resp, n, acc),
    do: write_lines(requests, answers, resp, n + 1, [acc | JSON.bulk_line(request.id, answer)])

  defp write_chunk([], _resp), do: :ok
  defp write_chunk(data, resp), do: :mochiweb_response.write_chunk(data, resp)

  ## Helpers

  defp loaded(store) do
    case Store.fetch(store) do
      {:ok, store} -> {:ok, store}
      :loading -> {:error, 503, "loading the catalogue"}
    end
  end

  defp body(req, limit) do
    case :mochiweb_request.recv_body(limit, req) do
      :undefined -> {:ok, ""}
      body -> {:ok, body}
    end
  catch
    :exit, :normal ->
      exit(:normal)

    :exit, {:body_too_large, _} ->
      # The rest of the body is not read: the connection cannot be reused.
      force_close()
      {:error, 413, "Request body must not be larger than #{div(limit, 1024 * 1024)}MB"}

    _, _ ->
      force_close()
      {:error, 400, "unreadable request body (Content-Length or Transfer-Encoding)"}
  end

  defp error(req, 413, message) do
    response = text(req, 413, message)

    # Set by body/2 when the body was refused before it was read.
    if Process.get(:mochiweb_request_force_close),
      do: linger(:mochiweb_request.get(:socket, req), 0)

    response
  end

  defp error(req, status, message), do: text(req, status, message)

  # After a 413 the client may still be sending the body it announced: read
  # and drop up to 8 MB of it (for at most 1 s without data) before mochiweb
  # closes, so the close does not reset the connection under the response.
  @linger_bytes 8 * 1024 * 1024
  defp linger(socket, read) when read < @linger_bytes do
    case :mochiweb_socket.recv(socket, 0, 1_000) do
      {:ok, data} -> linger(socket, read + byte_size(data))
      {:error, _} -> :ok
    end
  end

  defp linger(_socket, _read), do: :ok

  # mochiweb closes the connection after the response when this key is set.
  defp force_close, do: Process.put(:mochiweb_request_force_close, true)

  # Go's http.Error: the message and a newline, as text nobody should sniff.
  defp text(req, status, message),
    do: respond(req, status, @text, [message, ?\n])

  # A whole response in one send, with the headers mochiweb's respond/2 would
  # write (Server, Date, Content-Length, Connection: close when it will close),
  # without building its header tree for each response.
  defp respond(req, status, headers, body) do
    close = if :mochiweb_request.should_close(req), do: "Connection: close\r\n", else: []

    :mochiweb_request.send(
      [
        version(:mochiweb_request.get(:version, req)),
        status_line(status),
        "Server: MochiWeb/1.0\r\nDate: ",
        :mochiweb_clock.rfc1123(),
        "\r\nContent-Length: ",
        Integer.to_string(IO.iodata_length(body)),
        "\r\n",
        close,
        for({name, value} <- headers, do: [name, ": ", value, "\r\n"]),
        "\r\n",
        body
      ],
      req
    )
  end

  defp version({1, 1}), do: "HTTP/1.1 "
  defp version({1, 0}), do: "HTTP/1.0 "
  defp version({major, minor}), do: "HTTP/#{major}.#{minor} "

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
