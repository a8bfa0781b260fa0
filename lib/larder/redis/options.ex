# The connection options of Larder's Redis client: one schema for every
# user of it (the cache's L2 adapter, the replica's stream source), so a
# server, a Sentinel set or a Cluster is named, authenticated and bounded
# the same way wherever Larder talks to Redis.
defmodule Larder.Redis.Options do
  @moduledoc false

  # Contract (internal).
  #
  # validate!/4 checks the connection keys below plus the caller's own
  # `extra` keys (Larder.Options' schema form), raising ArgumentError that
  # names `what` and the option; unknown keys are refused with the valid
  # ones listed. The connection keys:
  #
  #   :url             nil or "redis://[[user]:password@]host[:port][/database]":
  #                    the same as :host, :port, :username, :password and
  #                    :database (percent-decoded), which it excludes
  #   :host            a string of 1 to 255 bytes, default "127.0.0.1"
  #   :port            1..65_535, default 6379
  #   :username        nil or a string of 1 to 255 bytes (Redis 6 ACL)
  #   :password        nil or a string of 0 to 4,096 bytes
  #   :database        0..1_000_000, default 0 (SELECT)
  #   :timeout         ms, 1..600_000 (connect and handshake; each reply)
  #   :max_reply_bytes 1,024..2^32, the largest reply accepted
  #   :sentinel        nil or Larder.Redis.Sentinel's keyword list
  #   :cluster         nil or 1 to 16 {host, port} seeds; excludes :host,
  #                    :port and :sentinel given by the user, needs
  #                    :database 0, and removes :host and :port
  #
  # `defaults` gives the caller's defaults of :timeout and :max_reply_bytes.

  alias Larder.Redis.Sentinel

  @max_database 1_000_000
  @max_timeout 600_000
  @max_max_reply_bytes 4_294_967_296
  @max_seeds 16

  @doc "The largest `:timeout`."
  def max_timeout, do: @max_timeout

  @doc "The largest `:max_reply_bytes`."
  def max_max_reply_bytes, do: @max_max_reply_bytes

  @doc "The largest `:database`."
  def max_database, do: @max_database

  @doc "Checks `opts` (see the contract above); returns them with defaults."
  @spec validate!(keyword(), String.t(), keyword(), keyword()) :: keyword()
  def validate!(opts, what, extra, defaults) do
    opts = url!(opts, what)

    schema =
      [
        host: {{:string, 1, 255}, "127.0.0.1"},
        port: {{:integer, 1, 65_535}, 6379},
        database: {{:integer, 0, @max_database}, 0},
        password: {{:or_nil, {:string, 0, 4_096}}, nil},
        timeout: {{:integer, 1, @max_timeout}, Keyword.fetch!(defaults, :timeout)},
        max_reply_bytes:
          {{:integer, 1024, @max_max_reply_bytes}, Keyword.fetch!(defaults, :max_reply_bytes)},
        sentinel: {{:custom, "a keyword list", &(is_nil(&1) or is_list(&1))}, nil},
        cluster: {{:custom, "a list of {host, port} seeds", &(is_nil(&1) or is_list(&1))}, nil},
        username: {{:or_nil, {:string, 1, 255}}, nil},
        # (taken apart by url!/2 above: listed among the valid options)
        url: {{:or_nil, {:string, 1, 4_096}}, nil}
      ] ++ extra

    opts
    |> Larder.Options.validate!(schema, what)
    |> Keyword.delete(:url)
    |> Keyword.update!(:sentinel, &Sentinel.validate!(&1, what))
    |> cluster!(opts, what)
  end

  # :cluster against the options the user gave (`raw`).
  defp cluster!(validated, raw, what) do
    case validated[:cluster] do
      nil ->
        validated

      seeds ->
        unless is_list(seeds) and seeds != [] and length(seeds) <= @max_seeds and
                 Enum.all?(seeds, &address?/1) do
          raise ArgumentError,
                "expected #{what} option :cluster to be a list of 1 to " <>
                  "#{@max_seeds} {host, port} seed nodes (host a string of 1 to 255 bytes, " <>
                  "port 1 to 65535), got: #{inspect(seeds, limit: 20)}"
        end

        for key <- [:host, :port, :sentinel], raw[key] != nil do
          raise ArgumentError,
                "#{what} option :cluster excludes #{inspect(key)}: " <>
                  "the cluster's nodes come from its seeds"
        end

        if validated[:database] != 0 do
          raise ArgumentError,
                "expected #{what} option :database to be 0 with :cluster " <>
                  "(a Redis Cluster has one database), got: #{inspect(validated[:database])}"
        end

        validated |> Keyword.delete(:host) |> Keyword.delete(:port)
    end
  end

  @url_keys [:host, :port, :username, :password, :database]

  # :url, taken apart into the keys it stands for. (Options that are not a
  # keyword list, an improper list say, are left to Larder.Options, which
  # refuses them with an ArgumentError.)
  defp url!(opts, what) when is_list(opts) do
    case Keyword.keyword?(opts) && List.keytake(opts, :url, 0) do
      false ->
        opts

      nil ->
        opts

      {{:url, url}, rest} ->
        for key <- @url_keys ++ [:sentinel, :cluster], Keyword.has_key?(rest, key) do
          raise ArgumentError,
                "#{what} option :url excludes #{inspect(key)}: the url names the server " <>
                  "(give one or the other)"
        end

        parse_url(url, what) ++ rest
    end
  end

  defp url!(opts, _what), do: opts

  defp parse_url(url, what) do
    uri = if is_binary(url), do: URI.parse(url), else: %URI{}

    fields =
      with %URI{scheme: scheme, host: host, port: port, path: path, userinfo: info} = uri
           when scheme in ["redis", "rediss"] and is_binary(host) and host != "" and
                  is_nil(uri.query) and is_nil(uri.fragment) <- uri,
           {:ok, database} <- url_database(path),
           {:ok, auth} <- url_auth(info) do
        if scheme == "rediss" do
          raise ArgumentError,
                "expected #{what} option :url to be a redis:// url: rediss:// (TLS) " <>
                  "is not supported; got: #{inspect(redact(url))}"
        end

        [host: host, port: port || 6379, database: database] ++ auth
      else
        _ -> nil
      end

    fields ||
      raise ArgumentError,
            "expected #{what} option :url to be a string " <>
              ~s("redis://[[username]:password@]host[:port][/database]", got: ) <>
              inspect(redact(url), limit: 10)
  end

  defp url_database(path) when path in [nil, "", "/"], do: {:ok, 0}

  defp url_database("/" <> n) do
    case Integer.parse(n) do
      {database, ""} -> {:ok, database}
      _ -> :error
    end
  end

  defp url_database(_), do: :error

  defp url_auth(nil), do: {:ok, []}

  defp url_auth(info) do
    case String.split(info, ":", parts: 2) do
      [user] -> {:ok, [username: URI.decode(user)]}
      ["", password] -> {:ok, [password: URI.decode(password)]}
      [user, password] -> {:ok, [username: URI.decode(user), password: URI.decode(password)]}
    end
  rescue
    ArgumentError -> :error
  end

  # A url in an error message, without its password.
  defp redact(url) when is_binary(url), do: String.replace(url, ~r/:[^:@\/]*@/, ":***@")
  defp redact(other), do: other

  defp address?({host, port}),
    do: is_binary(host) and byte_size(host) in 1..255 and is_integer(port) and port in 1..65_535

  defp address?(_), do: false
end
