# The PostgreSQL frontend/backend wire protocol (3.0) and its streaming
# replication sub-protocol: encodes what a client sends, decodes what a
# server sends from a byte buffer, incrementally, every length and field
# untrusted.
defmodule Larder.Postgres.Protocol do
  @moduledoc false

  # Contract (internal).
  #
  # decode/2 takes the bytes received so far and the largest message body
  # the caller accepts, and returns
  #
  #   {:ok, message, rest}  one whole message, and the bytes after it
  #   :more                 the buffer holds only part of a message whose
  #                         declared length is within the bound
  #   {:error, reason}      the bytes cannot be the protocol: a length below
  #                         4 or above the bound (refused from its header,
  #                         before its body is buffered), an unknown type, or
  #                         a body of the wrong shape
  #
  # It never raises, whatever the bytes: every length is checked against
  # what the body holds, every count against what follows, every string
  # for its terminator, and no message is accepted with bytes left over.
  # header/2 gives a message's type and body length from its first 5
  # bytes, so a reader can receive exactly the rest.
  #
  # The messages (backend):
  #
  #   {:auth, :ok | :cleartext | {:md5, salt} | {:sasl, [mechanism]}
  #           | {:sasl_continue, data} | {:sasl_final, data}
  #           | {:unsupported, code}}
  #   {:parameter_status, name, value}
  #   {:backend_key_data, pid, secret}
  #   {:ready_for_query, :idle | :transaction | :failed}
  #   {:row_description, [{name, type_oid}]}
  #   {:data_row, [binary | nil]}
  #   {:command_complete, tag}
  #   :empty_query
  #   {:error_response, fields} and {:notice_response, fields}, `fields` a
  #       map of the known field codes (below) to their text
  #   {:copy_out_response | :copy_in_response | :copy_both_response,
  #       format, [column_format]}        (format 0 text, 1 binary)
  #   {:copy_data, data}
  #   :copy_done
  #   {:notification, pid, channel, payload}
  #   {:negotiate_protocol_version, newest_minor, [unrecognized_option]}
  #
  # The replication sub-protocol's messages travel inside CopyData:
  # decode_replication/1 takes one CopyData body from the server
  # (XLogData 'w' or primary keepalive 'k'), standby_status/5 builds the
  # client's Standby Status Update 'r'.

  import Bitwise

  @type message :: tuple() | atom()
  @type reason ::
          {:bad_length, byte(), integer()}
          | {:too_large, byte(), non_neg_integer()}
          | {:unknown_message, byte()}
          | {:malformed, byte()}

  # The protocol version of the startup message (3.0) and the request
  # codes that take its place.
  @protocol_3_0 196_608
  @ssl_request 80_877_103

  # The error and notice fields a client can use, by their codes.
  @fields %{
    ?S => :severity,
    ?V => :severity_nonlocalized,
    ?C => :code,
    ?M => :message,
    ?D => :detail,
    ?H => :hint,
    ?P => :position,
    ?p => :internal_position,
    ?q => :internal_query,
    ?W => :where,
    ?s => :schema,
    ?t => :table,
    ?c => :column,
    ?d => :data_type,
    ?n => :constraint,
    ?F => :file,
    ?L => :line,
    ?R => :routine
  }

  ## Frontend messages

  @doc """
  `value` (a column's bytes, a part of a buffer read from the socket) as a
  binary of its own when it is larger than 64 bytes and its buffer is
  more than twice its size; `value` itself otherwise. A value kept in an
  ETS table or a process holds the whole buffer it is part of (a read
  takes up to 64 KiB): one long value kept per buffer would hold memory
  many times the data. A value of 64 bytes or less is copied by ETS when
  it is stored.
  """
  @spec detach(binary()) :: binary()
  def detach(value) when byte_size(value) > 64 do
    if :binary.referenced_byte_size(value) > 2 * byte_size(value),
      do: :binary.copy(value),
      else: value
  end

  def detach(value), do: value

  @doc "The StartupMessage: protocol 3.0 and `params` (`{name, value}` strings)."
  @spec startup([{String.t(), String.t()}]) :: iodata()
  def startup(params) do
    body = [<<@protocol_3_0::32>>, Enum.map(params, fn {k, v} -> [k, 0, v, 0] end), 0]
    [<<IO.iodata_length(body) + 4::32>> | body]
  end

  @doc "The SSLRequest, answered by one byte: `S` (go on with TLS) or `N`."
  @spec ssl_request() :: binary()
  def ssl_request, do: <<8::32, @ssl_request::32>>

  @doc "PasswordMessage (cleartext or MD5 hash)."
  @spec password(binary()) :: iodata()
  def password(password), do: message(?p, [password, 0])

  @doc "SASLInitialResponse: the mechanism and the client-first-message."
  @spec sasl_initial(binary(), binary()) :: iodata()
  def sasl_initial(mechanism, data),
    do: message(?p, [mechanism, 0, <<byte_size(data)::32>>, data])

  @doc "SASLResponse: the client-final-message."
  @spec sasl_response(binary()) :: iodata()
  def sasl_response(data), do: message(?p, data)

  @doc "Query (the simple query protocol). `sql` holds no NUL byte (see query_text?/1)."
  @spec query(binary()) :: iodata()
  def query(sql), do: message(?Q, [sql, 0])

  @doc "True when `sql` can be sent as a Query: a binary without a NUL byte."
  @spec query_text?(term()) :: boolean()
  def query_text?(sql), do: is_binary(sql) and :binary.match(sql, <<0>>) == :nomatch

  @doc "Terminate."
  @spec terminate() :: binary()
  def terminate, do: <<?X, 4::32>>

  @doc "CopyData from the client."
  @spec copy_data(iodata()) :: iodata()
  def copy_data(data), do: message(?d, data)

  @doc "CopyDone from the client."
  @spec copy_done() :: binary()
  def copy_done, do: <<?c, 4::32>>

  defp message(type, body), do: [type, <<IO.iodata_length(body) + 4::32>> | body]

  ## Backend messages

  @doc """
  The type and body length of the message at the head of `buffer`, from
  its 5-byte header: `{:ok, type, body_length}`, `:more` (fewer than 5
  bytes), or `{:error, reason}` when the length cannot be a message's or
  exceeds `max_bytes`.
  """
  @spec header(binary(), non_neg_integer()) ::
          {:ok, byte(), non_neg_integer()} | :more | {:error, reason()}
  def header(<<type, length::32-signed, _::binary>>, max_bytes) do
    cond do
      length < 4 -> {:error, {:bad_length, type, length}}
      length - 4 > max_bytes -> {:error, {:too_large, type, length - 4}}
      true -> {:ok, type, length - 4}
    end
  end

  def header(buffer, _max_bytes) when is_binary(buffer), do: :more

  @doc "Decodes the message at the head of `buffer` (see the contract above)."
  @spec decode(binary(), non_neg_integer()) ::
          {:ok, message(), binary()} | :more | {:error, reason()}
  def decode(buffer, max_bytes) do
    case header(buffer, max_bytes) do
      {:ok, type, length} ->
        case buffer do
          <<_type, _length::32, body::binary-size(length), rest::binary>> ->
            case parse(type, body) do
              {:ok, message} -> {:ok, message, rest}
              :error -> {:error, {:malformed, type}}
              {:error, _} = error -> error
            end

          _ ->
            :more
        end

      other ->
        other
    end
  end

  defp parse(?R, <<0::32>>), do: {:ok, {:auth, :ok}}
  defp parse(?R, <<3::32>>), do: {:ok, {:auth, :cleartext}}
  defp parse(?R, <<5::32, salt::binary-4>>), do: {:ok, {:auth, {:md5, salt}}}

  defp parse(?R, <<10::32, rest::binary>>) do
    case cstrings(rest, []) do
      {:ok, [_ | _] = mechanisms} -> {:ok, {:auth, {:sasl, mechanisms}}}
      _ -> :error
    end
  end

  defp parse(?R, <<11::32, data::binary>>), do: {:ok, {:auth, {:sasl_continue, data}}}
  defp parse(?R, <<12::32, data::binary>>), do: {:ok, {:auth, {:sasl_final, data}}}

  defp parse(?R, <<code::32, _::binary>>) when code not in [0, 3, 5, 10, 11, 12],
    do: {:ok, {:auth, {:unsupported, code}}}

  defp parse(?S, body) do
    with {:ok, name, rest} <- cstring(body),
         {:ok, value, ""} <- cstring(rest) do
      {:ok, {:parameter_status, name, value}}
    else
      _ -> :error
    end
  end

  defp parse(?K, <<pid::32, secret::32>>), do: {:ok, {:backend_key_data, pid, secret}}
  defp parse(?Z, <<?I>>), do: {:ok, {:ready_for_query, :idle}}
  defp parse(?Z, <<?T>>), do: {:ok, {:ready_for_query, :transaction}}
  defp parse(?Z, <<?E>>), do: {:ok, {:ready_for_query, :failed}}

  defp parse(?T, <<count::16, rest::binary>>) do
    case fields(rest, count, []) do
      {:ok, fields} -> {:ok, {:row_description, fields}}
      :error -> :error
    end
  end

  defp parse(?D, <<count::16, rest::binary>>) do
    case values(rest, count, []) do
      {:ok, values} -> {:ok, {:data_row, values}}
      :error -> :error
    end
  end

  defp parse(?C, body) do
    case cstring(body) do
      {:ok, tag, ""} -> {:ok, {:command_complete, tag}}
      _ -> :error
    end
  end

  defp parse(?I, ""), do: {:ok, :empty_query}

  defp parse(type, body) when type in [?E, ?N] do
    case error_fields(body, %{}) do
      {:ok, fields} when type == ?E -> {:ok, {:error_response, fields}}
      {:ok, fields} -> {:ok, {:notice_response, fields}}
      :error -> :error
    end
  end

  defp parse(type, <<format, count::16, rest::binary>>) when type in [?H, ?G, ?W] do
    with true <- format in [0, 1] and byte_size(rest) == 2 * count,
         formats = for(<<f::16 <- rest>>, do: f),
         true <- Enum.all?(formats, &(&1 in [0, 1])) do
      kind =
        case type do
          ?H -> :copy_out_response
          ?G -> :copy_in_response
          ?W -> :copy_both_response
        end

      {:ok, {kind, format, formats}}
    else
      _ -> :error
    end
  end

  defp parse(?d, data), do: {:ok, {:copy_data, data}}
  defp parse(?c, ""), do: {:ok, :copy_done}

  defp parse(?A, <<pid::32, rest::binary>>) do
    with {:ok, channel, rest} <- cstring(rest),
         {:ok, payload, ""} <- cstring(rest) do
      {:ok, {:notification, pid, channel, payload}}
    else
      _ -> :error
    end
  end

  defp parse(?v, <<minor::32, count::32, rest::binary>>) do
    case cstrings_counted(rest, count, []) do
      {:ok, options} -> {:ok, {:negotiate_protocol_version, minor, options}}
      :error -> :error
    end
  end

  defp parse(type, _body)
       when type in [?R, ?K, ?Z, ?T, ?D, ?I, ?H, ?G, ?W, ?c, ?A, ?v],
       do: :error

  defp parse(type, _body), do: {:error, {:unknown_message, type}}

  # A NUL-terminated string at the head of `binary`.
  defp cstring(binary) do
    case :binary.match(binary, <<0>>) do
      {at, 1} ->
        <<string::binary-size(at), 0, rest::binary>> = binary
        {:ok, string, rest}

      :nomatch ->
        :error
    end
  end

  # NUL-terminated strings ending with an empty one (SASL mechanisms).
  defp cstrings(<<0>>, acc), do: {:ok, Enum.reverse(acc)}

  defp cstrings(binary, acc) do
    case cstring(binary) do
      {:ok, "", _rest} -> :error
      {:ok, string, rest} -> cstrings(rest, [string | acc])
      :error -> :error
    end
  end

  defp cstrings_counted("", 0, acc), do: {:ok, Enum.reverse(acc)}
  defp cstrings_counted(_binary, 0, _acc), do: :error

  defp cstrings_counted(binary, n, acc) do
    case cstring(binary) do
      {:ok, string, rest} -> cstrings_counted(rest, n - 1, [string | acc])
      :error -> :error
    end
  end

  defp fields("", 0, acc), do: {:ok, Enum.reverse(acc)}
  defp fields(_binary, 0, _acc), do: :error

  defp fields(binary, n, acc) do
    with {:ok, name, rest} <- cstring(binary),
         <<_table::32, _attnum::16, type_oid::32, _typlen::16, _typmod::32, format::16,
           rest::binary>>
         when format in [0, 1] <- rest do
      fields(rest, n - 1, [{name, type_oid} | acc])
    else
      _ -> :error
    end
  end

  defp values("", 0, acc), do: {:ok, Enum.reverse(acc)}
  defp values(_binary, 0, _acc), do: :error
  defp values(<<-1::32-signed, rest::binary>>, n, acc), do: values(rest, n - 1, [nil | acc])

  defp values(<<length::32-signed, rest::binary>>, n, acc)
       when length >= 0 and byte_size(rest) >= length do
    <<value::binary-size(length), rest::binary>> = rest
    values(rest, n - 1, [value | acc])
  end

  defp values(_binary, _n, _acc), do: :error

  defp error_fields(<<0>>, acc), do: {:ok, acc}

  defp error_fields(<<code, rest::binary>>, acc) when code != 0 do
    case cstring(rest) do
      {:ok, text, rest} ->
        case Map.fetch(@fields, code) do
          {:ok, key} -> error_fields(rest, Map.put_new(acc, key, text))
          # unknown codes are to be ignored (the protocol may add some)
          :error -> error_fields(rest, acc)
        end

      :error ->
        :error
    end
  end

  defp error_fields(_binary, _acc), do: :error

  ## The streaming replication sub-protocol (inside CopyData)

  @doc """
  Decodes one CopyData body of a replication stream: `{:ok, {:xlog_data,
  wal_start, wal_end, time, data}}`, `{:ok, {:keepalive, wal_end, time,
  reply_requested}}`, or `{:error, reason}`.
  """
  @spec decode_replication(binary()) :: {:ok, tuple()} | {:error, reason()}
  def decode_replication(<<?w, wal_start::64, wal_end::64, time::64-signed, data::binary>>),
    do: {:ok, {:xlog_data, wal_start, wal_end, time, data}}

  def decode_replication(<<?k, wal_end::64, time::64-signed, reply>>) when reply in [0, 1],
    do: {:ok, {:keepalive, wal_end, time, reply == 1}}

  def decode_replication(<<type, _::binary>>) when type in [?w, ?k],
    do: {:error, {:malformed, type}}

  def decode_replication(<<type, _::binary>>), do: {:error, {:unknown_message, type}}
  def decode_replication(<<>>), do: {:error, {:malformed, ?d}}

  @doc """
  A Standby Status Update (as CopyData): the write, flush and apply LSNs,
  the client's clock, and whether the server should reply at once.
  """
  @spec standby_status(
          non_neg_integer(),
          non_neg_integer(),
          non_neg_integer(),
          integer(),
          boolean()
        ) :: iodata()
  def standby_status(write, flush, apply, time, reply?) do
    copy_data(<<?r, write::64, flush::64, apply::64, time::64-signed, bool(reply?)>>)
  end

  defp bool(true), do: 1
  defp bool(false), do: 0

  @doc """
  Now on the server's clock: microseconds since 2000-01-01 00:00:00 UTC
  (the `time` of replication messages).
  """
  @spec pg_time() :: integer()
  def pg_time, do: System.os_time(:microsecond) - 946_684_800_000_000

  ## LSNs

  @doc "An LSN as Postgres writes it: `\"16/B374D848\"` (hex, high/low 32 bits)."
  @spec format_lsn(non_neg_integer()) :: String.t()
  def format_lsn(lsn) when is_integer(lsn) and lsn >= 0 and lsn < 1 <<< 64 do
    Integer.to_string(lsn >>> 32, 16) <> "/" <> Integer.to_string(lsn &&& 0xFFFFFFFF, 16)
  end

  @doc "Parses `\"16/B374D848\"`: `{:ok, lsn}` or `:error`."
  @spec parse_lsn(term()) :: {:ok, non_neg_integer()} | :error
  def parse_lsn(text) when is_binary(text) and byte_size(text) <= 17 do
    with [high, low] <- :binary.split(text, "/"),
         {:ok, high} <- hex32(high),
         {:ok, low} <- hex32(low) do
      {:ok, high <<< 32 ||| low}
    else
      _ -> :error
    end
  end

  def parse_lsn(_text), do: :error

  defp hex32(text) when byte_size(text) in 1..8 do
    if text =~ ~r/\A[0-9A-Fa-f]+\z/, do: {:ok, String.to_integer(text, 16)}, else: :error
  end

  defp hex32(_text), do: :error
end
