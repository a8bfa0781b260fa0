defmodule PriceSearch.Application do
  # Starts the catalogue store, which loads in the background, then the HTTP
  # listener (503 until the store has loaded). Stopped in reverse order.
  @moduledoc false

  use Application

  @impl true
  def start(_type, _args) do
    children =
      replica() ++
        [
          {PriceSearch.Store, [name: PriceSearch.Store] ++ follow()},
          {PriceSearch.HTTP,
           name: PriceSearch.HTTP,
           port: port(),
           ip: Application.get_env(:price_search, :ip, {0, 0, 0, 0})}
        ]

    Supervisor.start_link(children, strategy: :one_for_one, name: PriceSearch.Supervisor)
  end

  # With a prices stream configured (the application's :prices_stream, or
  # PRICES_STREAM, as "host:port/stream"), a Larder.Replica keeps the table
  # PriceSearch.Prices equal to it, snapshotted every minute beside the
  # catalogue's snapshots, and the store searches that table.
  defp replica do
    case prices_stream() do
      nil ->
        []

      {redis, stream} ->
        snapshot = Path.join(PriceSearch.Snapshot.default_dir(), "prices-stream-#{stream}.snap")
        File.mkdir_p!(Path.dirname(snapshot))

        [
          {Larder.Replica,
           PriceSearch.PriceStream.replica_opts(
             PriceSearch.Replica,
             PriceSearch.Prices,
             redis,
             stream,
             snapshot: snapshot,
             snapshot_every: 60_000
           )}
        ]
    end
  end

  defp follow do
    if prices_stream(), do: [follow: {PriceSearch.Replica, PriceSearch.Prices}], else: []
  end

  defp prices_stream do
    case Application.get_env(:price_search, :prices_stream) || System.get_env("PRICES_STREAM") do
      nil ->
        nil

      spec ->
        case Regex.run(~r/\A([^:\/]+):(\d+)\/(.+)\z/, spec) do
          [_, host, port, stream] ->
            {[host: host, port: String.to_integer(port)], stream}

          _ ->
            raise ArgumentError, "PRICES_STREAM must be host:port/stream, got: #{inspect(spec)}"
        end
    end
  end

  # The application's :port when configured (the tests' 0), else PORT, else 8091.
  defp port do
    case {Application.fetch_env(:price_search, :port), System.get_env("PORT")} do
      {{:ok, port}, _} -> port
      {:error, nil} -> 8091
      {:error, port} -> parse_port!(port)
    end
  end

  defp parse_port!(string) do
    case Integer.parse(string) do
      {port, ""} when port in 0..65_535 -> port
      _ -> raise ArgumentError, "PORT must be an integer in 0..65535, got: #{inspect(string)}"
    end
  end
end
