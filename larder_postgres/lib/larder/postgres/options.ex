# The connection options of Larder's Postgres client: one schema for every
# connection it opens (a replication connection, the normal connection
# that copies tables and reads the catalog), given as a :url or as keys.
defmodule Larder.Postgres.Options do
  @moduledoc false

  # Contract (internal).
  #
  # validate!/3 checks the connection keys below plus the caller's own
  # `extra` keys (Larder.Options' schema form), raising ArgumentError that
  # names `what` and the option; unknown keys are refused with the valid
  # ones listed. It returns every key, with its default, :url taken apart.
  #
  #   :url               nil or "postgres://[user[:password]@]host[:port][/database]
  #                      [?sslmode=disable|require|verify-full]" (or
  #                      postgresql://), percent-decoded: the same as :host,
  #                      :port (default 5432), and the :username, :password,
  #                      :database and :sslmode it gives, which it excludes
  #                      (a password may come as its own option)
  #   :host              a name or an IP address, 1 to 255 bytes, default
  #                      "127.0.0.1"
  #   :port              1..65_535, default 5432
  #   :username          required: 1 to 63 bytes (longer names are cut by
  #                      the server, so they are refused here)
  #   :database          nil (the username, as libpq does) or 1 to 63 bytes
  #   :password          nil or 0 to 4,096 bytes, no NUL byte
  #   :sslmode           :disable (default), :require (TLS, the server's
  #                      certificate not checked, as libpq's "require"),
  #                      :verify_full (TLS, the certificate checked against
  #                      the system's CAs or :ssl_options' and the host name)
  #   :ssl_options       more :ssl client options (keyword list), default []
  #   :timeout           ms, 1..600_000, default 15_000: connect, TLS and
  #                      authentication together
  #   :max_message_bytes 1,024..1 GiB, default 64 MiB: the largest message
  #                      accepted from the server (a row, a replication
  #                      message), and the largest result of a simple query
  #   :application_name  0 to 63 bytes, no NUL, default "larder"
  #
  # A password is never shown in a message.

  @max_timeout 600_000
  @max_max_message_bytes 1_073_741_824
  @default_max_message_bytes 67_108_864

  @doc "The largest `:timeout`."
  def max_timeout, do: @max_timeout

  @doc "The largest `:max_message_bytes`."
  def max_max_message_bytes, do: @max_max_message_bytes

  @doc "Checks `opts` (see the contract above); returns them with defaults."
  @spec validate!(term(), String.t(), Larder.Options.schema()) :: keyword()
  def validate!(opts, what, extra \\ []) do
    opts = url!(opts, what)

    schema =
      [
        host: {{:string, 1, 255}, "127.0.0.1"},
        port: {{:integer, 1, 65_535}, 5432},
        username: {name(), :required},
        database: {{:or_nil, name()}, nil},
        password: {{:or_nil, no_nul(0, 4_096)}, nil},
        sslmode: {{:in, [:disable, :require, :verify_full]}, :disable},
        ssl_options: {{:custom, "a keyword list of :ssl options", &ssl_options?/1}, []},
        timeout: {{:integer, 1, @max_timeout}, 15_000},
        max_message_bytes: {{:integer, 1024, @max_max_message_bytes}, @default_max_message_bytes},
        application_name: {no_nul(0, 63), "larder"},
        # (taken apart by url!/2 above: listed among the valid options)
        url: {{:or_nil, {:string, 1, 4_096}}, nil}
      ] ++ extra

    validated = opts |> Larder.Options.validate!(schema, what) |> Keyword.delete(:url)
    Keyword.update!(validated, :database, &(&1 || validated[:username]))
  end

  defp name, do: no_nul(1, 63)

  defp no_nul(min, max) do
    {:custom, "a string of #{min} to #{max} bytes without a NUL byte",
     &(is_binary(&1) and byte_size(&1) in min..max and :binary.match(&1, <<0>>) == :nomatch)}
  end

  defp ssl_options?(opts), do: is_list(opts) and Keyword.keyword?(opts)

  defp url!(opts, what) when is_list(opts) do
    case List.keytake(opts, :url, 0) do
      nil ->
        opts

      {{:url, nil}, rest} ->
        rest

      {{:url, url}, rest} ->
        fields = parse_url(url, what)

        for {key, _} <- fields, Keyword.has_key?(rest, key) do
          raise ArgumentError,
                "#{what} option :url excludes #{inspect(key)}, which it gives " <>
                  "(give one or the other)"
        end

        fields ++ rest
    end
  end

  defp url!(opts, _what), do: opts

  defp parse_url(url, what) do
    fields =
      with true <- is_binary(url) and byte_size(url) <= 4_096,
           %URI{scheme: scheme, host: host, port: port, path: path, userinfo: info} = uri
           when scheme in ["postgres", "postgresql"] and is_binary(host) and host != "" and
                  is_nil(uri.fragment) <- URI.parse(url),
           {:ok, database} <- url_database(path),
           {:ok, auth} <- url_auth(info),
           {:ok, query} <- url_query(uri.query, what) do
        [host: host, port: port || 5432] ++ database ++ auth ++ query
      else
        _ -> nil
      end

    fields ||
      raise ArgumentError,
            "expected #{what} option :url to be a string " <>
              ~s("postgres://[username[:password]@]host[:port][/database][?sslmode=...]", ) <>
              "got: " <> inspect(redact(url), limit: 10)
  end

  defp url_database(path) when path in [nil, "", "/"], do: {:ok, []}

  defp url_database("/" <> name) do
    case decode(name) do
      {:ok, name} when name != "" -> {:ok, [database: name]}
      _ -> :error
    end
  end

  defp url_database(_), do: :error

  defp url_auth(nil), do: {:ok, []}

  defp url_auth(info) do
    case String.split(info, ":", parts: 2) do
      [user] ->
        with {:ok, user} <- decode(user), do: {:ok, [username: user]}

      [user, password] ->
        with {:ok, user} <- decode(user), {:ok, password} <- decode(password) do
          {:ok, if(user == "", do: [], else: [username: user]) ++ [password: password]}
        end
    end
  end

  defp url_query(nil, _what), do: {:ok, []}

  defp url_query(query, what) do
    params =
      try do
        URI.decode_query(query)
      rescue
        ArgumentError -> :error
      end

    case params do
      :error ->
        :error

      params ->
        Enum.reduce_while(params, {:ok, []}, fn
          {"sslmode", mode}, {:ok, acc} when mode in ["disable", "require", "verify-full"] ->
            mode = mode |> String.replace("-", "_") |> String.to_existing_atom()
            {:cont, {:ok, [{:sslmode, mode} | acc]}}

          {"sslmode", mode}, _ ->
            raise ArgumentError,
                  "expected #{what} option :url's sslmode to be disable, require or " <>
                    "verify-full, got: #{inspect(mode, limit: 10)}"

          {key, _}, _ ->
            raise ArgumentError,
                  "unknown #{what} option :url parameter #{inspect(key, limit: 10)}; " <>
                    "the only one is sslmode"
        end)
    end
  end

  defp decode(text) do
    {:ok, URI.decode(text)}
  rescue
    ArgumentError -> :error
  end

  # A url in an error message, without its password.
  defp redact(url) when is_binary(url), do: String.replace(url, ~r/:[^:@\/]*@/, ":***@")
  defp redact(other), do: other
end
