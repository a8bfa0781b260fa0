defmodule PriceSearch.HTTP do
  @moduledoc """
  The HTTP interface, on OTP's `gen_tcp` and its `{packet, :http_bin}`
  parsing (`PriceSearch.HTTP.Server`), with the Go reference service's routes,
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

  Every request is untrusted. Its framing is read as Go's `net/http` reads
  it, and refused with Go's answers: `Content-Length` fields that differ,
  or a value that is not plain decimal digits (`+421`, `0x1a5`, empty), are
  `400 Bad Request`; a `Transfer-Encoding` other than one `chunked` is `501
  Not Implemented` (on HTTP/1.1; HTTP/1.0 ignores it); both answered as
  Go's server writes them (body `400 Bad Request` or `Unsupported transfer
  encoding`, no `Content-Length`) and the connection closed. Repeated equal
  `Content-Length` fields are one; `chunked` beside a valid
  `Content-Length` wins. A chunk size is 1 to 16 hex digits after any
  `;extension` and trailing blanks are cut, on a line ending in CRLF:
  anything else (`0x1a5`, `-0`, `+1a5`, `1a5zz`, a bare LF) breaks the
  body where it stands, as Go's reader does, and the handler answers as
  Go's handler does with the data read before it (a search: its value if
  complete, else 500 `Internal Server Error`; a bulk body: the values
  before it); the connection then closes. A client that shuts down its
  sending side after its requests still gets their answers; a body cut
  short by it is answered as Go answers a body ending there.

  A single search body that cannot be read is a 400
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

  Hostile clients. A connection waiting for its next request is closed after
  `:idle_timeout` (60 s). A request's head and body must arrive within
  `:request_timeout` (10 s) of its first line: a head dribbled past it is cut
  off, a body announced but not sent in time is a 400 and the connection
  closes. A client that does not read its answer holds it (a bulk answer
  and the body it answers, tens of MB) only while each write of it waits
  less than `:send_timeout` (10 s) for the client to take data; then the
  connection is closed, counted (`:send_timed_out`), and its memory freed.
  Connections over `:max_connections` (100,000) are closed at once;
  in practice the process's file descriptor limit (`ulimit -n`) binds first,
  two descriptors for each connection held by a client on the same host, one
  otherwise. A client that hangs up before its answer is sent is normal: it
  is counted (`stats/1`, `:hangups`) and its connection's process ends
  without a log. A request line or header longer than 16 KB, or more than
  100 headers, is a 400 and closes the connection.

  ## Concurrency

  16 acceptor processes wait in `accept`; each, given a connection, starts
  its replacement and serves that connection's requests (HTTP/1.1
  keep-alive, pipelined requests in order), reading its socket in
  `{active, N}` mode (at most 64 packets queued as messages, then the
  socket turns passive until more is wanted). A request is decoded, searched
  (straight on the `Larder.Table`, fetched from `PriceSearch.Store` through
  `:persistent_term`) and answered in that process; a bulk body of 16 KB
  or more, with more than one scheduler online, is cut after newlines into
  up to four slices per scheduler (of at least 4 KB), each read, searched
  and written in a short-lived process of its own, so that one body uses
  every scheduler, and a slice whose search waits on a dirty scheduler
  leaves its own to another (each piece of at most 1,000 requests is one
  `Larder.Table.search_many/2` and sees one state of the table; the body as
  a whole may see writes made between its pieces). Idle connections cost a
  process waiting for the socket's next message (about 3 KB) and a socket;
  they take no scheduler time, so held connections do not slow the others.

  ## Performance

  `make bench-http` runs wrk against the service (and against the Go
  reference when given its address): see the example's README.
  """

  require Logger
  alias PriceSearch.{JSON, Options, Request, Search, Store}
  alias PriceSearch.HTTP.Server

  @single_limit 1024 * 1024
  @bulk_limit 32 * 1024 * 1024
  @bulk_lines 65_536
  @ndjson [{"Content-Type", "application/x-ndjson"}]
  @json [{"Content-Type", "application/json"}]
  @text [{"Content-Type", "text/plain; charset=utf-8"}, {"X-Content-Type-Options", "nosniff"}]

  @max_timeout 3_600_000
  @max_connections 1_000_000

  @doc """
  Starts a listener.

  Options:

    * `:port` - the TCP port; `0` takes a free one (see `port/1`). Default 8091.
    * `:ip` - the address to listen on, a tuple. Default `{0, 0, 0, 0}`.
    * `:store` - the name of the `PriceSearch.Store` to search. Default
      `PriceSearch.Store`.
    * `:name` - an atom to register the listener under. Default: none.
    * `:idle_timeout` - ms a connection may wait for its next request before
      it is closed, 1..3,600,000. Default 60,000.
    * `:request_timeout` - ms a request's head and body may take to arrive,
      from its first line, 1..3,600,000. Default 10,000.
    * `:send_timeout` - ms one write of an answer may wait for the client
      to take data (a full socket send queue) before the connection is
      closed, 1..3,600,000. Default 10,000.
    * `:max_connections` - open connections at most, 1..1,000,000; one over
      it is closed at once. Default 100,000 (the process's file descriptor
      limit usually binds first).
    * `:backlog` - the listen backlog, 1..65,535. Default 4,096.
    * `:acceptors` - processes waiting in accept, 1..1,024. Default 16.
  """
  @spec start_link(keyword()) :: GenServer.on_start()
  def start_link(opts \\ []) do
    opts =
      Options.validate!(
        opts,
        [
          port: 8091,
          ip: {0, 0, 0, 0},
          store: Store,
          name: nil,
          idle_timeout: 60_000,
          request_timeout: 10_000,
          send_timeout: 10_000,
          max_connections: 100_000,
          backlog: 4_096,
          acceptors: 16
        ],
        [
          port: Options.integer(0..65_535),
          ip: {"an IP address tuple", &(is_tuple(&1) and tuple_size(&1) in [4, 8])},
          store: {"an atom", &is_atom/1},
          name: {"an atom", &is_atom/1},
          idle_timeout: Options.integer(1..@max_timeout),
          request_timeout: Options.integer(1..@max_timeout),
          send_timeout: Options.integer(1..@max_timeout),
          max_connections: Options.integer(1..@max_connections),
          backlog: Options.integer(1..65_535),
          acceptors: Options.integer(1..1_024)
        ],
        "PriceSearch.HTTP"
      )

    {store, opts} = Keyword.pop!(opts, :store)
    Server.start_link([handler: fn req -> handle(req, store) end] ++ opts)
  end

  @doc "A child spec for `start_link/1`."
  @spec child_spec(keyword()) :: Supervisor.child_spec()
  def child_spec(opts) do
    %{id: Keyword.get(opts, :name, __MODULE__), start: {__MODULE__, :start_link, [opts]}}
  end

  @doc "The port a listener serves on."
  @spec port(GenServer.server()) :: :inet.port_number()
  def port(listener), do: Server.port(listener)

  @doc """
  A listener's counters: `:open` connections now; since it started,
  `:hangups` (clients gone before their answer was sent), `:idle_closed`
  (connections closed after `:idle_timeout`), `:timed_out` (requests whose
  head or body did not arrive within `:request_timeout`), `:send_timed_out`
  (connections closed because the client took none of its answer within
  `:send_timeout`), `:refused` (connections over `:max_connections`).
  """
  @spec stats(GenServer.server()) :: %{atom() => non_neg_integer()}
  def stats(listener), do: Server.stats(listener)

  @doc "Stops a listener: it accepts no more; open connections end at their next idle timeout."
  @spec stop(GenServer.server()) :: :ok
  def stop(listener), do: GenServer.stop(listener)

  ## Routing

  @doc false
  # Server's handler: runs in the connection's process, once per request.
  def handle(req, store) do
    route(path(req.path), req.method, req, store)
  catch
    # The client went away (Server's own exit): nothing to answer.
    :exit, :normal ->
      exit(:normal)

    kind, reason ->
      Logger.error(
        "price search: #{Exception.format(kind, reason, __STACKTRACE__)}",
        crash_reason: {reason, __STACKTRACE__}
      )

      Server.close_after()
      text(req, 500, "internal error")
  end

  defp path(raw_path) do
    case :binary.split(raw_path, "?") do
      [path | _] -> path
    end
  end

  defp route("/v1/search/bitmap/prices", :POST, req, store), do: single(req, store, :bitmap)
  defp route("/v5/search/bitmap/bulk/prices", :POST, req, store), do: bulk(req, store)
  defp route("/v1/search/map/prices", :POST, req, store), do: single(req, store, :map)
  defp route("/health", :GET, req, store), do: health(req, store)
  defp route("/v1/search/bitmap/prices", _, req, _), do: not_allowed(req, "POST")
  defp route("/v5/search/bitmap/bulk/prices", _, req, _), do: not_allowed(req, "POST")
  defp route("/v1/search/map/prices", _, req, _), do: not_allowed(req, "POST")
  defp route("/health", _, req, _), do: not_allowed(req, "GET")
  defp route(_, _, req, _), do: text(req, 404, "404 page not found")

  # Go answers 405 with an empty body; Allow is ours.
  defp not_allowed(req, allow),
    do: Server.respond(req, 405, [{"Allow", allow}], [])

  defp health(req, store) do
    case Store.fetch(store) do
      {:ok, _} -> Server.respond(req, 200, [], [])
      :loading -> text(req, 503, "loading the catalogue")
    end
  end

  ## One search

  defp single(req, store_name, kind) do
    with {:ok, store} <- loaded(store_name),
         {:ok, request} <- single_request(req) do
      case apply(Search, kind, [store, request]) do
        {:ok, price} -> Server.respond(req, 200, @json, JSON.price_line(price))
        {:error, message} -> text(req, 404, message)
      end
    else
      {:error, status, message} -> error(req, status, message)
    end
  end

  defp single_request(req) do
    case body(req, @single_limit) do
      {:ok, body} -> decode(body)
      {:cut, fault, partial} -> decode_cut(fault, partial)
      {:error, _status, _message} = error -> error
    end
  end

  @incomplete ["Request body must not be empty", "Request body contains badly-formed JSON"]

  # Go's decoder reads the body up to the fault: a value complete before it
  # is used, a syntax error before it is reported, and otherwise the read's
  # error is: io.ErrUnexpectedEOF for a body cut short (400, "badly-formed
  # JSON"), another error for chunked framing it refuses (500, the default
  # of the reference's HandleDecodeError).
  defp decode_cut(fault, partial) do
    case decode(partial) do
      {:error, 400, message} when message in @incomplete and fault == :truncated ->
        {:error, 400, "Request body contains badly-formed JSON"}

      {:error, 400, message} when message in @incomplete ->
        {:error, 500, "Internal Server Error"}

      decoded ->
        decoded
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
         {:ok, body} <- bulk_body(req) do
      case bulk_answer(store, body) do
        {:too_many, max} ->
          error(req, 413, "a bulk body holds at most #{max} requests")

        {:error, 0, _} ->
          Server.respond(req, 400, @text, JSON.bulk_stopped())

        {status, _count, chunks} ->
          # One write a chunk: a client that takes none of its answer blocks
          # the next write, which :send_timeout then ends.
          Server.chunked_head(req, 200, @ndjson)
          Enum.each(chunks, &Server.chunk(req, &1))
          if status == :error, do: Server.chunk(req, JSON.bulk_stopped())
          Server.chunk(req, "")
      end
    else
      {:error, status, message} -> error(req, status, message)
    end
  end

  # At most 1,000 lines per chunk of the answer.
  @chunk_lines 1_000
  # A smaller body is read and searched on the connection's scheduler alone.
  @parallel_bytes 16 * 1024
  # A larger one is cut into slices of at least @slice_bytes, at most
  # @slices_per_scheduler for each scheduler online.
  @slice_bytes 4 * 1024
  @slices_per_scheduler 4

  # A bulk body's answer: {:ok | :error, requests read, chunks} or
  # {:too_many, max}, as `PriceSearch.Request.bulk/2` reads the body.
  #
  # With more than one scheduler online and a body of @parallel_bytes or
  # more, the body is cut after newlines into slices, and each slice is
  # read, searched and written as lines by a process of its own (which reads
  # the store from `:persistent_term` by its name, so it is not copied, and
  # hands back its lines as binaries). There are several slices for each
  # scheduler: while one slice's search runs on a dirty scheduler, or one
  # slice ends before the others, another takes its scheduler. With one
  # slice per scheduler, the schedulers slept a third of the time under a
  # stream of 1,000-request bodies (msacc); with four, a sixth, for about
  # 1.3x the bodies answered. That is the same answer as reading the whole
  # body when every slice but the last holds whole values
  # (`Request.bulk_slice/2`) and the body holds fewer than the most requests
  # allowed; otherwise, a body Go would read across a cut, the body is read
  # again as a whole.
  defp bulk_answer(store, body) do
    schedulers = :erlang.system_info(:schedulers_online)

    if schedulers > 1 and byte_size(body) >= @parallel_bytes do
      name = store.name
      parts = min(schedulers * @slices_per_scheduler, div(byte_size(body), @slice_bytes))
      slices = slices(body, parts)
      last = length(slices) - 1

      shares =
        for {slice, i} <- Enum.with_index(slices) do
          spawn_monitor(fn -> exit({:bulk_share, bulk_share(name, slice, i == last)}) end)
        end

      combine(Enum.map(shares, &await_share/1), 0, []) || bulk_whole(store, body)
    else
      bulk_whole(store, body)
    end
  end

  defp bulk_whole(store, body) do
    case Request.bulk(body, @bulk_lines) do
      {:too_many, max} ->
        {:too_many, max}

      {status, requests} ->
        chunks = requests |> Enum.chunk_every(@chunk_lines) |> Enum.map(&bulk_lines(store, &1))
        {status, length(requests), chunks}
    end
  end

  # `parts` slices of `body`, each but the last ending just after a newline
  # (fewer when the body has fewer newlines).
  defp slices(body, parts) do
    size = byte_size(body)

    cuts =
      Enum.reduce(1..(parts - 1), [0], fn k, [previous | _] = cuts ->
        from = max(previous, div(k * size, parts))

        case :binary.match(body, "\n", scope: {from, size - from}) do
          {at, 1} when at + 1 < size -> [at + 1 | cuts]
          _ -> cuts
        end
      end)

    [size | cuts]
    |> Enum.reverse()
    |> Enum.chunk_every(2, 1, :discard)
    |> Enum.map(fn [from, to] -> binary_part(body, from, to - from) end)
  end

  # A slice's {status, requests read, chunks}: searched only when its answer
  # can be used (a slice before the last must hold whole values).
  defp bulk_slice(store, slice, last?) do
    case Request.bulk_slice(slice, @bulk_lines) do
      {status, requests} when status == :whole or (last? and status in [:stopped, :error]) ->
        chunks =
          requests
          |> Enum.chunk_every(@chunk_lines)
          |> Enum.map(&IO.iodata_to_binary(bulk_lines(store, &1)))

        {status, length(requests), chunks}

      _unusable ->
        :unusable
    end
  end

  defp bulk_share(name, slice, last?) do
    {:ok, store} = Store.fetch(name)
    bulk_slice(store, slice, last?)
  end

  # A share's answer comes back as its exit reason; a share that fails
  # raises here, in the connection's process, which answers 500 as for any
  # failure. The shares are not linked: a client gone mid-answer leaves
  # them to finish their bounded work (a slice of a 32 MB body) and end.
  defp await_share({pid, ref}) do
    receive do
      {:DOWN, ^ref, :process, ^pid, {:bulk_share, answer}} -> answer
      {:DOWN, ^ref, :process, ^pid, reason} -> raise "a bulk share failed: #{inspect(reason)}"
    end
  end

  # The slices' answers as the body's, or nil when they cannot stand for it.
  # (Reading the whole body, a value that starts after the most requests
  # allowed makes it too many, even a value that cannot be read.)
  defp combine([{status, n, chunks}], count, acc)
       when count + n < @bulk_lines or (count + n == @bulk_lines and status != :error) do
    status = if status == :error, do: :error, else: :ok
    {status, count + n, Enum.concat(:lists.reverse([chunks | acc]))}
  end

  defp combine([{:whole, n, chunks} | rest], count, acc) when rest != [],
    do: combine(rest, count + n, [chunks | acc])

  defp combine(_answers, _count, _acc), do: nil

  defp bulk_lines(store, requests) do
    answers = Search.bitmap_many(store, requests)
    Enum.zip_with(requests, answers, &JSON.bulk_line(&1.id, &2))
  end

  ## Helpers

  defp loaded(store) do
    case Store.fetch(store) do
      {:ok, store} -> {:ok, store}
      :loading -> {:error, 503, "loading the catalogue"}
    end
  end

  # Go's bulk handler reads values until its decoder fails: a body cut
  # short, or chunked framing it refuses, is read as if it ended at the
  # fault (the values before it answered; one cut inside ends the answer
  # with "Unable decode body").
  defp bulk_body(req) do
    case body(req, @bulk_limit) do
      {:cut, _fault, partial} -> {:ok, partial}
      other -> other
    end
  end

  defp body(req, limit) do
    case Server.read_body(req, limit) do
      {:ok, body} ->
        {:ok, body}

      {:error, fault, partial} ->
        {:cut, fault, partial}

      {:error, :too_large} ->
        {:error, 413, "Request body must not be larger than #{div(limit, 1024 * 1024)}MB"}

      {:error, :timeout} ->
        {:error, 400, "request body not received in time"}
    end
  end

  defp error(req, 413, message) do
    response = text(req, 413, message)
    if Server.close?(req), do: Server.linger(req, 8 * 1024 * 1024, 1_000)
    response
  end

  defp error(req, status, message), do: text(req, status, message)

  # A refused body (the only 413 that closes) is not read: the connection
  # closes after the answer. The rest of the body is not read: the connection closes after
  # the answer. The client may still be sending the body: read and drop up
  # to 8 MB of it (for at most 1 s without data), so the close does not
  # reset the connection under the response.

  # Go's http.Error: the message and a newline, as text nobody should sniff.
  defp text(req, status, message),
    do: Server.respond(req, status, @text, [message, ?\n])
end
