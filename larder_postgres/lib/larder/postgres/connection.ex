# One connection to a Postgres server, held by the process that uses it:
# opens the socket (TCP, TLS through an SSLRequest when asked), runs the
# startup and the authentication (cleartext, MD5, SCRAM-SHA-256), and
# speaks the simple query protocol and COPY ... TO STDOUT over it, each
# call within a deadline. The replication client runs its CopyBoth stream
# over the same struct.
defmodule Larder.Postgres.Connection do
  @moduledoc false

  # Contract (internal).
  #
  # A connection is a struct, not a process: its socket is passive and
  # belongs to the process that called connect/2, which alone may use it.
  # Every function that talks to the server takes a timeout (ms) or a
  # deadline and returns the connection to go on with:
  #
  #   connect(opts, replication?)    {:ok, conn} | {:error, error}
  #   query(conn, sql, timeout)      {:ok, [result], conn} | {:error, error, conn}
  #   copy_out(conn, sql, timeout)   {:ok, conn} | {:error, error, conn}
  #   copy_read(conn, max_rows, timeout)
  #                                  {:ok, rows, conn} | {:done, conn}
  #                                  | {:error, error, conn}
  #   close(conn)                    :ok
  #
  # `opts` are Larder.Postgres.Options' (validated). A result is
  # %{command: tag, columns: [name], rows: [[text | nil]]}, one per
  # statement of `sql`; a COPY's rows are lists of text or nil, in bounded
  # batches.
  #
  # Errors are %Larder.Error{} values, never raises, with a reason of
  # Larder.Replica.Source's vocabulary (this client exists for a source)
  # and `details.server` ("host:port"):
  #
  #   :source_unavailable  no connection, the connection closed or failed,
  #                        or no answer before the deadline (details.cause:
  #                        :timeout, :closed, or the socket's error)
  #   :source_failed       the server answered with an ErrorResponse
  #                        (details: code (SQLSTATE), severity, message,
  #                        detail, hint), refused the user, or wants what
  #                        the client cannot do (an authentication method,
  #                        TLS it refuses)
  #   :source_bad_reply    bytes that are not the protocol, a message out
  #                        of place, a message or result above
  #                        :max_message_bytes, a SCRAM server signature that
  #                        proves nothing (details.cause)
  #
  # A server error inside a query or a COPY leaves the connection usable
  # (the server ends the command with ReadyForQuery, which is awaited);
  # any other error leaves it closed (state :closed): the protocol's
  # place is lost, so nothing more is read from it, and every later call
  # returns :source_unavailable. A function called in the wrong state (a
  # query during a COPY) raises ArgumentError: that is a bug of the
  # caller, which this client's callers are.
  #
  # Memory: the receive buffer holds at most one message (its length is
  # checked against :max_message_bytes from its 5-byte header, before its
  # body is read) and what one read of the socket returned (at most
  # @socket_buffer bytes, or the rest of a larger message); a query's
  # result is bounded by :max_message_bytes in all; a COPY is read in
  # batches of the caller's size; at most @max_parameters ParameterStatus
  # names are kept.

  import Kernel, except: [send: 2]

  alias Larder.Postgres.{CopyText, Protocol, SCRAM}

  @max_parameters 256

  # One receive of a known length reads at most this much at a time
  # (inet's driver refuses a single recv above 64 MiB).
  @recv_chunk 8_388_608

  # The socket driver's buffer: the most one read of whatever is there
  # returns (inet's default, 1,460 bytes, makes a read of a few rows).
  # The rest of a message shorter than this is read the same way, with
  # what follows it, rather than by a read of exactly its length.
  @socket_buffer 65_536

  @type state :: :ready | :copy_out | :copy_both | :closed
  @type result :: %{command: binary(), columns: [binary()], rows: [[binary() | nil]]}
  @type t :: %__MODULE__{
          socket: term(),
          transport: :gen_tcp | :ssl,
          server: String.t(),
          user: String.t(),
          database: String.t(),
          max_message_bytes: pos_integer(),
          buffer: binary(),
          parameters: %{binary() => binary()},
          backend_pid: non_neg_integer() | nil,
          secret: non_neg_integer() | nil,
          state: state(),
          copy: map() | nil
        }

  @derive {Inspect, only: [:server, :user, :database, :state, :backend_pid]}
  @enforce_keys [:socket, :transport, :server, :user, :database, :max_message_bytes]
  defstruct [
    :socket,
    :transport,
    :server,
    :user,
    :database,
    :max_message_bytes,
    buffer: "",
    parameters: %{},
    backend_pid: nil,
    secret: nil,
    state: :ready,
    copy: nil
  ]

  ## Connecting

  @doc """
  Connects, authenticates and waits for the server to be ready, within
  `opts[:timeout]` in all. `replication?` opens a logical replication
  connection (`replication=database`): it takes replication commands and
  SQL.
  """
  @spec connect(keyword(), boolean()) :: {:ok, t()} | {:error, Larder.Error.t()}
  def connect(opts, replication? \\ false) do
    host = Keyword.fetch!(opts, :host)
    port = Keyword.fetch!(opts, :port)
    timeout = Keyword.fetch!(opts, :timeout)
    deadline = deadline(timeout)
    server = server_name(host, port)

    case tcp_connect(host, port, timeout) do
      {:ok, socket} ->
        conn = %__MODULE__{
          socket: socket,
          transport: :gen_tcp,
          server: server,
          user: Keyword.fetch!(opts, :username),
          database: Keyword.fetch!(opts, :database),
          max_message_bytes: Keyword.fetch!(opts, :max_message_bytes)
        }

        with {:ok, conn} <- tls(conn, host, opts, deadline),
             {:ok, conn} <- send(conn, Protocol.startup(startup_params(opts, replication?))),
             {:ok, conn} <- authenticate(conn, opts[:password], nil, deadline),
             {:ok, conn} <- await_ready(conn, deadline) do
          {:ok, conn}
        else
          {:error, error, conn} ->
            close(conn)
            {:error, error}
        end

      {:error, :timeout} ->
        {:error,
         error(:source_unavailable, server, :timeout, "no connection within #{timeout} ms")}

      {:error, reason} ->
        {:error,
         error(:source_unavailable, server, reason, "could not connect: #{format_cause(reason)}")}
    end
  end

  defp server_name(host, port) do
    if String.contains?(host, ":"), do: "[#{host}]:#{port}", else: "#{host}:#{port}"
  end

  defp tcp_connect(host, port, timeout) do
    host = :binary.bin_to_list(host)

    {address, family} =
      case :inet.parse_address(host) do
        {:ok, {_, _, _, _} = ip} -> {ip, [:inet]}
        {:ok, ip} -> {ip, [:inet6]}
        {:error, _} -> {host, []}
      end

    options =
      family ++
        [
          :binary,
          active: false,
          packet: :raw,
          nodelay: true,
          keepalive: true,
          buffer: @socket_buffer,
          send_timeout: timeout,
          send_timeout_close: true
        ]

    :gen_tcp.connect(address, port, options, timeout)
  catch
    # a host name :inet cannot take (it checks more than bytes)
    _, _ -> {:error, :einval}
  end

  defp startup_params(opts, replication?) do
    [
      {"user", opts[:username]},
      {"database", opts[:database]},
      {"application_name", opts[:application_name]},
      {"client_encoding", "UTF8"},
      {"DateStyle", "ISO, MDY"}
    ] ++ if(replication?, do: [{"replication", "database"}], else: [])
  end

  ## TLS

  defp tls(conn, host, opts, deadline) do
    case Keyword.fetch!(opts, :sslmode) do
      :disable ->
        {:ok, conn}

      mode ->
        with {:ok, conn} <- send(conn, Protocol.ssl_request()),
             {:ok, answer, conn} <- recv_exact(conn, 1, deadline) do
          case answer do
            "S" ->
              ssl_connect(conn, host, mode, Keyword.fetch!(opts, :ssl_options), deadline)

            "N" ->
              {:error,
               error(
                 :source_failed,
                 conn.server,
                 :tls_refused,
                 "the server does not accept TLS connections (sslmode #{inspect(mode)})"
               ), conn}

            other ->
              bad_reply(conn, {:ssl_answer, other})
          end
        else
          {:timeout, conn} -> timed_out(conn, deadline)
          error -> error
        end
    end
  end

  defp ssl_connect(conn, host, mode, user_options, deadline) do
    options = Keyword.merge(ssl_defaults(host, mode), user_options)

    case :ssl.connect(conn.socket, options, remaining(deadline)) do
      {:ok, socket} ->
        {:ok, %{conn | socket: socket, transport: :ssl}}

      {:error, reason} ->
        {:error,
         error(
           :source_failed,
           conn.server,
           {:tls, reason},
           "TLS handshake failed: #{format_cause(reason)}"
         ), conn}
    end
  catch
    _, reason ->
      {:error,
       error(
         :source_failed,
         conn.server,
         {:tls, reason},
         "TLS could not start: #{format_cause(reason)}"
       ), conn}
  end

  defp ssl_defaults(_host, :require), do: [verify: :verify_none, active: false, mode: :binary]

  defp ssl_defaults(host, :verify_full) do
    [
      verify: :verify_peer,
      cacerts: :public_key.cacerts_get(),
      server_name_indication: :binary.bin_to_list(host),
      customize_hostname_check: [match_fun: :public_key.pkix_verify_hostname_match_fun(:https)],
      active: false,
      mode: :binary
    ]
  end

  ## Authentication

  # `scram` is nil before a SASL exchange, a SCRAM state during one, and
  # :verified once the server proved it knows the password: a server may
  # not end a SASL exchange with AuthenticationOk before that.
  defp authenticate(conn, password, scram, deadline) do
    case next(conn, deadline) do
      {:ok, {:auth, :ok}, conn} when scram in [nil, :verified] ->
        {:ok, conn}

      {:ok, {:auth, :cleartext}, conn} when scram == nil ->
        with {:ok, password} <- password(conn, password, "a cleartext password"),
             {:ok, conn} <- send(conn, Protocol.password(password)) do
          authenticate(conn, password, nil, deadline)
        end

      {:ok, {:auth, {:md5, salt}}, conn} when scram == nil ->
        with {:ok, password} <- password(conn, password, "an MD5 password") do
          inner = md5_hex(password <> conn.user)

          with {:ok, conn} <- send(conn, Protocol.password("md5" <> md5_hex(inner <> salt))) do
            authenticate(conn, password, nil, deadline)
          end
        end

      {:ok, {:auth, {:sasl, mechanisms}}, conn} when scram == nil ->
        with true <- "SCRAM-SHA-256" in mechanisms || :unsupported,
             {:ok, password} <- password(conn, password, "a SCRAM-SHA-256 password") do
          {first, state} = SCRAM.client_first()

          with {:ok, conn} <- send(conn, Protocol.sasl_initial("SCRAM-SHA-256", first)) do
            authenticate(conn, password, state, deadline)
          end
        else
          :unsupported ->
            unsupported_auth(conn, "SASL mechanisms #{inspect(mechanisms, limit: 10)}")

          error ->
            error
        end

      {:ok, {:auth, {:sasl_continue, data}}, conn}
      when is_struct(scram, SCRAM) and scram.server_signature == nil ->
        case SCRAM.client_final(scram, password, data) do
          {:ok, final, state} ->
            with {:ok, conn} <- send(conn, Protocol.sasl_response(final)) do
              authenticate(conn, password, state, deadline)
            end

          {:error, text} ->
            bad_reply(conn, {:scram, text})
        end

      {:ok, {:auth, {:sasl_final, data}}, conn}
      when is_struct(scram, SCRAM) and is_binary(scram.server_signature) ->
        case SCRAM.verify_server_final(scram, data) do
          :ok -> authenticate(conn, password, :verified, deadline)
          {:error, text} -> bad_reply(conn, {:scram, text})
        end

      {:ok, {:auth, {:unsupported, code}}, conn} when scram == nil ->
        unsupported_auth(conn, auth_method(code))

      {:ok, {:error_response, fields}, conn} ->
        {:error, startup_error(conn, fields), conn}

      {:ok, {:negotiate_protocol_version, _minor, _options}, conn} ->
        authenticate(conn, password, scram, deadline)

      {:ok, message, conn} ->
        bad_reply(conn, {:unexpected, kind(message), :authentication})

      {:timeout, conn} ->
        timed_out(conn, deadline)

      {:error, _, _} = error ->
        error
    end
  end

  defp password(conn, nil, what) do
    {:error,
     error(
       :source_failed,
       conn.server,
       :no_password,
       "the server asks #{what} for user #{inspect(conn.user)} and none was given " <>
         "(the :password option)"
     ), conn}
  end

  defp password(_conn, password, _what), do: {:ok, password}

  defp md5_hex(data), do: :crypto.hash(:md5, data) |> Base.encode16(case: :lower)

  defp unsupported_auth(conn, method) do
    {:error,
     error(
       :source_failed,
       conn.server,
       :unsupported_authentication,
       "the server asks user #{inspect(conn.user)} for authentication by #{method}, " <>
         "which this client does not do (it does SCRAM-SHA-256, MD5 and cleartext passwords)"
     ), conn}
  end

  defp auth_method(2), do: "Kerberos V5"
  defp auth_method(6), do: "SCM credentials"
  defp auth_method(7), do: "GSSAPI"
  defp auth_method(8), do: "GSSAPI"
  defp auth_method(9), do: "SSPI"
  defp auth_method(code), do: "method #{code}"

  # After AuthenticationOk: parameters, the key data, then ReadyForQuery;
  # an ErrorResponse here is a refusal too (no such database, too many
  # connections, not allowed to replicate).
  defp await_ready(conn, deadline) do
    case next(conn, deadline) do
      {:ok, {:backend_key_data, pid, secret}, conn} ->
        await_ready(%{conn | backend_pid: pid, secret: secret}, deadline)

      {:ok, {:ready_for_query, _status}, conn} ->
        {:ok, conn}

      {:ok, {:error_response, fields}, conn} ->
        {:error, startup_error(conn, fields), conn}

      {:ok, message, conn} ->
        bad_reply(conn, {:unexpected, kind(message), :startup})

      {:timeout, conn} ->
        timed_out(conn, deadline)

      {:error, _, _} = error ->
        error
    end
  end

  defp startup_error(conn, fields) do
    server_error(
      conn,
      fields,
      "refused user #{inspect(conn.user)} on database #{inspect(conn.database)}: "
    )
  end

  ## The simple query protocol

  @doc """
  Runs `sql` (one or more statements) with the simple query protocol:
  a result per statement, values as text, NULL as nil. A COPY is refused
  (copy_out/3 runs one).
  """
  @spec query(t(), binary(), timeout()) ::
          {:ok, [result()], t()} | {:error, Larder.Error.t(), t()}
  def query(conn, sql, timeout) do
    with {:ok, conn} <- ready(conn, :ready),
         :ok <- query_text!(sql),
         deadline = deadline(timeout),
         {:ok, conn} <- send(conn, Protocol.query(sql)) do
      collect(conn, deadline, %{results: [], current: nil, error: nil, bytes: 0})
    end
  end

  defp query_text!(sql) do
    if Protocol.query_text?(sql),
      do: :ok,
      else:
        raise(
          ArgumentError,
          "expected sql to be a binary without NUL bytes, got: #{inspect(sql, limit: 10)}"
        )
  end

  defp collect(conn, deadline, acc) do
    case next(conn, deadline) do
      {:ok, {:row_description, fields}, conn} when acc.current == nil ->
        collect(conn, deadline, %{acc | current: {Enum.map(fields, &elem(&1, 0)), []}})

      {:ok, {:data_row, values}, conn} ->
        with {columns, rows} <- acc.current,
             true <- length(values) == length(columns) do
          bytes = acc.bytes + Enum.reduce(values, 0, &(byte_size(&1 || "") + &2))

          if bytes > conn.max_message_bytes do
            bad_reply(conn, {:result_too_large, conn.max_message_bytes})
          else
            collect(conn, deadline, %{acc | current: {columns, [values | rows]}, bytes: bytes})
          end
        else
          _ -> bad_reply(conn, {:unexpected, :data_row, :query})
        end

      {:ok, {:command_complete, tag}, conn} ->
        {columns, rows} = acc.current || {[], []}
        result = %{command: tag, columns: columns, rows: Enum.reverse(rows)}
        collect(conn, deadline, %{acc | results: [result | acc.results], current: nil})

      {:ok, :empty_query, conn} ->
        collect(conn, deadline, acc)

      {:ok, {:error_response, fields}, conn} when acc.error == nil ->
        collect(conn, deadline, %{acc | error: server_error(conn, fields, ""), current: nil})

      {:ok, {:ready_for_query, _status}, conn} ->
        if acc.error,
          do: {:error, acc.error, conn},
          else: {:ok, Enum.reverse(acc.results), conn}

      {:ok, {kind, _, _}, conn}
      when kind in [:copy_out_response, :copy_in_response, :copy_both_response] ->
        {:error,
         error(
           :source_failed,
           conn.server,
           kind,
           "the query started a COPY, which a simple query does not run"
         ), broken(conn)}

      {:ok, message, conn} ->
        bad_reply(conn, {:unexpected, kind(message), :query})

      {:timeout, conn} ->
        timed_out(conn, deadline)

      {:error, _, _} = error ->
        error
    end
  end

  ## COPY ... TO STDOUT

  @doc """
  Starts `sql`, a `COPY ... TO STDOUT` in text format; its rows are then
  read with copy_read/3.
  """
  @spec copy_out(t(), binary(), timeout()) :: {:ok, t()} | {:error, Larder.Error.t(), t()}
  def copy_out(conn, sql, timeout) do
    with {:ok, conn} <- ready(conn, :ready),
         :ok <- query_text!(sql),
         deadline = deadline(timeout),
         {:ok, conn} <- send(conn, Protocol.query(sql)) do
      await_copy_out(conn, deadline, nil)
    end
  end

  defp await_copy_out(conn, deadline, error) do
    case next(conn, deadline) do
      {:ok, {:copy_out_response, 0, formats}, conn} when error == nil ->
        copy = %{columns: length(formats), pending: [], rest: "", done: false}
        {:ok, %{conn | state: :copy_out, copy: copy}}

      {:ok, {:copy_out_response, _binary, _formats}, conn} ->
        bad_reply(conn, {:unexpected, :binary_copy, :copy})

      {:ok, {:error_response, fields}, conn} when error == nil ->
        await_copy_out(conn, deadline, server_error(conn, fields, ""))

      {:ok, {:ready_for_query, _status}, conn} when error != nil ->
        {:error, error, conn}

      {:ok, message, conn} when error == nil ->
        {:error,
         error(
           :source_failed,
           conn.server,
           {:not_copy_out, kind(message)},
           "the statement is not a COPY ... TO STDOUT"
         ), broken(conn)}

      {:ok, message, conn} ->
        bad_reply(conn, {:unexpected, kind(message), :copy})

      {:timeout, conn} ->
        timed_out(conn, deadline)

      {:error, _, _} = error ->
        error
    end
  end

  @doc """
  Up to `max_rows` rows of the COPY that copy_out/3 started: `{:ok, rows,
  conn}` with at least one row, or `{:done, conn}` once every row was
  read and the command completed (the connection is then ready again).
  A server error ends the COPY: `{:error, error, conn}`, the connection
  ready.
  """
  @spec copy_read(t(), pos_integer(), timeout()) ::
          {:ok, [[binary() | nil]], t()} | {:done, t()} | {:error, Larder.Error.t(), t()}
  def copy_read(conn, max_rows, timeout) when is_integer(max_rows) and max_rows > 0 do
    with {:ok, conn} <- ready(conn, :copy_out) do
      copy_collect(conn, max_rows, deadline(timeout), {[], 0})
    end
  end

  def copy_read(_conn, max_rows, _timeout) do
    raise ArgumentError,
          "expected max_rows to be a positive integer, got: #{inspect(max_rows, limit: 10)}"
  end

  # `acc` holds `n` rows, in reverse; `copy.pending`, the parsed rows of
  # a CopyData past the last batch's end (a server sends each row in a
  # CopyData of its own, so there are seldom any).
  defp copy_collect(%{copy: copy} = conn, max_rows, deadline, {acc, n}) do
    {acc, n, pending} = take(copy.pending, acc, n, max_rows)
    conn = %{conn | copy: %{copy | pending: pending}}

    cond do
      n == max_rows or (copy.done and n > 0) -> {:ok, :lists.reverse(acc), conn}
      copy.done -> {:done, %{conn | state: :ready, copy: nil}}
      true -> copy_receive(conn, max_rows, deadline, {acc, n})
    end
  end

  # CopyData after CopyData, each row parsed as it comes, until the batch
  # is full.
  defp copy_receive(%{copy: copy} = conn, max_rows, deadline, {acc, n}) do
    case next(conn, deadline) do
      {:ok, {:copy_data, data}, conn} ->
        {rows, rest} = CopyText.split_rows(if copy.rest == "", do: data, else: copy.rest <> data)

        with true <- byte_size(rest) <= conn.max_message_bytes || :too_large,
             {:ok, rows} <- parse_rows(rows, copy.columns, []) do
          {acc, n, pending} = take(rows, acc, n, max_rows)

          conn =
            if pending == [] and rest == "" and copy.rest == "",
              do: conn,
              else: %{conn | copy: %{copy | pending: pending, rest: rest}}

          if n == max_rows,
            do: {:ok, :lists.reverse(acc), conn},
            else: copy_receive(conn, max_rows, deadline, {acc, n})
        else
          :too_large -> bad_reply(conn, {:row_too_large, conn.max_message_bytes})
          :error -> bad_reply(conn, :bad_copy_row)
        end

      {:ok, :copy_done, conn} when copy.rest == "" ->
        copy_finish(conn, max_rows, deadline, {acc, n}, :copy_done)

      {:ok, {:error_response, fields}, conn} ->
        copy_finish(conn, max_rows, deadline, {acc, n}, {:error, server_error(conn, fields, "")})

      {:ok, message, conn} ->
        bad_reply(conn, {:unexpected, kind(message), :copy})

      {:timeout, conn} ->
        timed_out(conn, deadline)

      {:error, _, _} = error ->
        error
    end
  end

  # After CopyDone: CommandComplete, then ReadyForQuery. After an error:
  # ReadyForQuery.
  defp copy_finish(conn, max_rows, deadline, acc, stage) do
    case {stage, next(conn, deadline)} do
      {:copy_done, {:ok, {:command_complete, "COPY " <> _}, conn}} ->
        copy_finish(conn, max_rows, deadline, acc, :complete)

      {:complete, {:ok, {:ready_for_query, _}, conn}} ->
        copy_collect(%{conn | copy: %{conn.copy | done: true}}, max_rows, deadline, acc)

      {:copy_done, {:ok, {:error_response, fields}, conn}} ->
        copy_finish(conn, max_rows, deadline, acc, {:error, server_error(conn, fields, "")})

      {{:error, error}, {:ok, {:ready_for_query, _}, conn}} ->
        {:error, error, %{conn | state: :ready, copy: nil}}

      {_, {:ok, message, conn}} ->
        bad_reply(conn, {:unexpected, kind(message), :copy})

      {_, {:timeout, conn}} ->
        timed_out(conn, deadline)

      {_, {:error, _, _} = error} ->
        error
    end
  end

  # Up to `max` rows in `acc` (reversed, holding `n`); the rest of `rows`.
  defp take(rows, acc, max, max), do: {acc, max, rows}
  defp take([row | rows], acc, n, max), do: take(rows, [row | acc], n + 1, max)
  defp take([], acc, n, _max), do: {acc, n, []}

  defp parse_rows([], _columns, acc), do: {:ok, :lists.reverse(acc)}

  defp parse_rows([row | rows], columns, acc) do
    case CopyText.parse_row(row, columns) do
      {:ok, fields} -> parse_rows(rows, columns, [fields | acc])
      :error -> :error
    end
  end

  ## CopyBoth (the replication stream runs over it)

  @doc """
  Sends `sql` (START_REPLICATION) and waits for CopyBothResponse, within
  `timeout`; the connection is then in state :copy_both.
  """
  @spec copy_both(t(), binary(), timeout()) :: {:ok, t()} | {:error, Larder.Error.t(), t()}
  def copy_both(conn, sql, timeout) do
    with {:ok, conn} <- ready(conn, :ready),
         :ok <- query_text!(sql),
         deadline = deadline(timeout),
         {:ok, conn} <- send(conn, Protocol.query(sql)) do
      await_copy_both(conn, deadline, nil)
    end
  end

  defp await_copy_both(conn, deadline, error) do
    case next(conn, deadline) do
      {:ok, {:copy_both_response, _format, _formats}, conn} when error == nil ->
        {:ok, %{conn | state: :copy_both}}

      {:ok, {:error_response, fields}, conn} when error == nil ->
        await_copy_both(conn, deadline, server_error(conn, fields, ""))

      {:ok, {:ready_for_query, _}, conn} when error != nil ->
        {:error, error, conn}

      {:ok, message, conn} ->
        bad_reply(conn, {:unexpected, kind(message), :start_replication})

      {:timeout, conn} ->
        timed_out(conn, deadline)

      {:error, _, _} = e ->
        e
    end
  end

  @doc """
  The next CopyData of a CopyBoth stream, waiting until `deadline` (a
  monotonic ms time): `{:ok, data, conn}`, `{:timeout, conn}` (nothing
  whole arrived: not an error, the stream goes on), or `{:error, error,
  conn}`; the server ending the stream or sending an error closes it.
  """
  @spec copy_both_recv(t(), integer()) ::
          {:ok, binary(), t()} | {:timeout, t()} | {:error, Larder.Error.t(), t()}
  def copy_both_recv(conn, deadline) do
    with {:ok, conn} <- ready(conn, :copy_both) do
      case next(conn, deadline) do
        {:ok, {:copy_data, data}, conn} ->
          {:ok, data, conn}

        {:ok, :copy_done, conn} ->
          {:error,
           error(:source_unavailable, conn.server, :copy_done, "the server ended the stream"),
           broken(conn)}

        {:ok, {:error_response, fields}, conn} ->
          {:error, server_error(conn, fields, ""), broken(conn)}

        {:ok, message, conn} ->
          bad_reply(conn, {:unexpected, kind(message), :replication})

        other ->
          other
      end
    end
  end

  @doc "Sends CopyData on a CopyBoth stream."
  @spec copy_both_send(t(), iodata()) :: {:ok, t()} | {:error, Larder.Error.t(), t()}
  def copy_both_send(conn, data) do
    with {:ok, conn} <- ready(conn, :copy_both), do: send(conn, data)
  end

  ## Closing

  @doc "Sends Terminate (best effort) and closes the socket. Never fails."
  @spec close(t()) :: :ok
  def close(%__MODULE__{state: :closed}), do: :ok

  def close(%__MODULE__{socket: socket, transport: transport}) do
    _ = transport.send(socket, Protocol.terminate())
    _ = transport.close(socket)
    :ok
  catch
    _, _ -> :ok
  end

  ## Receiving

  # The next message that is not asynchronous (ParameterStatus, which is
  # recorded; NoticeResponse and NotificationResponse, which are dropped),
  # waiting until `deadline`.
  defp next(conn, deadline) do
    case recv(conn, deadline) do
      {:ok, {:parameter_status, name, value}, conn} ->
        params = conn.parameters

        params =
          if map_size(params) < @max_parameters or Map.has_key?(params, name),
            do: Map.put(params, name, value),
            else: params

        next(%{conn | parameters: params}, deadline)

      {:ok, {:notice_response, _}, conn} ->
        next(conn, deadline)

      {:ok, {:notification, _, _, _}, conn} ->
        next(conn, deadline)

      other ->
        other
    end
  end

  defp recv(%__MODULE__{state: :closed} = conn, _deadline), do: closed(conn)

  defp recv(conn, deadline) do
    case Protocol.decode(conn.buffer, conn.max_message_bytes) do
      {:ok, message, rest} ->
        {:ok, message, %{conn | buffer: rest}}

      :more ->
        want =
          case Protocol.header(conn.buffer, conn.max_message_bytes) do
            {:ok, _type, length} -> 5 + length - byte_size(conn.buffer)
            :more -> 0
          end

        case receive_bytes(conn, want, deadline) do
          {:ok, conn} -> recv(conn, deadline)
          other -> other
        end

      {:error, reason} ->
        bad_reply(conn, reason)
    end
  end

  # Appends what the socket has to the buffer: whatever one read returns
  # (want 0, or the rest of a message that one read can hold), or exactly
  # `want` bytes, in chunks.
  defp receive_bytes(conn, want, deadline) when want < @socket_buffer do
    case conn.transport.recv(conn.socket, 0, remaining(deadline)) do
      {:ok, data} -> {:ok, %{conn | buffer: conn.buffer <> data}}
      {:error, reason} -> socket_error(conn, reason)
    end
  end

  defp receive_bytes(conn, want, deadline), do: receive_chunks(conn, want, deadline, [])

  defp receive_chunks(conn, 0, _deadline, chunks),
    do: {:ok, %{conn | buffer: IO.iodata_to_binary([conn.buffer | Enum.reverse(chunks)])}}

  defp receive_chunks(conn, want, deadline, chunks) do
    case conn.transport.recv(conn.socket, min(want, @recv_chunk), remaining(deadline)) do
      {:ok, data} ->
        receive_chunks(conn, want - byte_size(data), deadline, [data | chunks])

      {:error, reason} ->
        # what arrived stays buffered: a later call reads on from there
        conn = %{conn | buffer: IO.iodata_to_binary([conn.buffer | Enum.reverse(chunks)])}
        socket_error(conn, reason)
    end
  end

  # Exactly `n` raw bytes (the one-byte answer to an SSLRequest).
  defp recv_exact(conn, n, deadline) do
    case conn.transport.recv(conn.socket, n, remaining(deadline)) do
      {:ok, data} -> {:ok, data, conn}
      {:error, reason} -> socket_error(conn, reason)
    end
  end

  defp socket_error(conn, :timeout), do: {:timeout, conn}

  defp socket_error(conn, :closed) do
    {:error, error(:source_unavailable, conn.server, :closed, "the server closed the connection"),
     broken(conn)}
  end

  defp socket_error(conn, reason) do
    {:error,
     error(
       :source_unavailable,
       conn.server,
       reason,
       "the connection failed: #{format_cause(reason)}"
     ), broken(conn)}
  end

  ## Sending

  defp send(%__MODULE__{state: :closed} = conn, _data), do: closed(conn)

  defp send(conn, data) do
    case conn.transport.send(conn.socket, data) do
      :ok ->
        {:ok, conn}

      {:error, reason} ->
        socket_error(conn, if(reason == :timeout, do: :send_timeout, else: reason))
    end
  end

  ## States and errors

  defp ready(%__MODULE__{state: state} = conn, state), do: {:ok, conn}
  defp ready(%__MODULE__{state: :closed} = conn, _state), do: closed(conn)

  defp ready(%__MODULE__{state: state}, wanted) do
    raise ArgumentError,
          "expected a Postgres connection in state #{inspect(wanted)}, got one in #{inspect(state)}"
  end

  defp closed(conn) do
    {:error, error(:source_unavailable, conn.server, :closed, "the connection is closed"), conn}
  end

  # Closes the socket of a connection whose protocol state is lost.
  defp broken(%__MODULE__{state: :closed} = conn), do: conn

  defp broken(conn) do
    _ =
      try do
        conn.transport.close(conn.socket)
      catch
        _, _ -> :ok
      end

    %{conn | state: :closed, buffer: "", copy: nil}
  end

  @doc "Closes the connection and returns a :source_bad_reply error for `cause`."
  @spec bad_reply(t(), term()) :: {:error, Larder.Error.t(), t()}
  def bad_reply(conn, cause) do
    {:error,
     error(
       :source_bad_reply,
       conn.server,
       cause,
       "the server sent what the Postgres protocol does not allow here: #{describe(cause)}"
     ), broken(conn)}
  end

  defp timed_out(conn, _deadline) do
    {:error, error(:source_unavailable, conn.server, :timeout, "no answer in time"), broken(conn)}
  end

  @doc """
  A `Larder.Error` of `reason` about `server` ("host:port"), with
  `details.cause`; its message names the server.
  """
  @spec error(atom(), String.t(), term(), String.t()) :: Larder.Error.t()
  def error(reason, server, cause, text) do
    Larder.Error.new(reason, "postgres at #{server}: " <> text, %{server: server, cause: cause})
  end

  @doc """
  The :source_failed error of an ErrorResponse's `fields`; `prefix` says
  what was refused.
  """
  @spec server_error(t(), map(), String.t()) :: Larder.Error.t()
  def server_error(conn, fields, prefix) do
    severity = fields[:severity] || "ERROR"
    code = fields[:code]
    message = fields[:message] || "(no message)"
    detail = fields[:detail]

    text =
      "#{prefix}#{severity} #{code}: #{message}" <>
        if(detail, do: " (#{detail})", else: "")

    Larder.Error.new(:source_failed, "postgres at #{conn.server}: " <> text, %{
      server: conn.server,
      code: code,
      severity: severity,
      message: message,
      detail: detail,
      hint: fields[:hint]
    })
  end

  defp describe({:bad_length, type, length}),
    do: "a message #{inspect(<<type>>)} of length #{length}"

  defp describe({:too_large, type, length}),
    do: "a message #{inspect(<<type>>)} of #{length} bytes, above :max_message_bytes"

  defp describe({:unknown_message, type}), do: "a message of unknown type #{inspect(<<type>>)}"
  defp describe({:malformed, type}), do: "a malformed message #{inspect(<<type>>)}"

  defp describe({:unexpected, kind, stage}),
    do: "an unexpected message #{inspect(kind)} during #{stage}"

  defp describe({:result_too_large, max}), do: "a query result above #{max} bytes"
  defp describe({:row_too_large, max}), do: "a COPY row above #{max} bytes"
  defp describe(:bad_copy_row), do: "a COPY row that is not COPY's text format"

  defp describe({:copy_columns, count}),
    do: "a COPY row whose field count is not the statement's #{count} columns"

  defp describe({:ssl_answer, byte}), do: "#{inspect(byte)} as the answer to an SSLRequest"
  defp describe({:scram, text}), do: "SCRAM: " <> text
  defp describe(other), do: inspect(other, limit: 10)

  defp kind(message) when is_tuple(message), do: elem(message, 0)
  defp kind(message), do: message

  defp format_cause(reason) when is_atom(reason) do
    case :inet.format_error(reason) do
      ~c"unknown POSIX error" ++ _ -> Atom.to_string(reason)
      text -> List.to_string(text)
    end
  end

  defp format_cause(reason), do: inspect(reason, limit: 10)

  ## Deadlines

  defp deadline(timeout) when is_integer(timeout) and timeout >= 0,
    do: System.monotonic_time(:millisecond) + timeout

  defp deadline(timeout) do
    raise ArgumentError,
          "expected timeout to be a non-negative integer (ms), got: #{inspect(timeout, limit: 10)}"
  end

  defp remaining(deadline), do: max(deadline - System.monotonic_time(:millisecond), 0)
end
