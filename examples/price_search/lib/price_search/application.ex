defmodule PriceSearch.Application do
  # Starts the catalogue store, which loads in the background, then the HTTP
  # listener (503 until the store has loaded). Stopped in reverse order.
  @moduledoc false

  use Application

  @impl true
  def start(_type, _args) do
    children = [
      {PriceSearch.Store, name: PriceSearch.Store},
      {PriceSearch.HTTP,
       name: PriceSearch.HTTP,
       port: port(),
       ip: Application.get_env(:price_search, :ip, {0, 0, 0, 0})}
    ]

    Supervisor.start_link(children, strategy: :one_for_one, name: PriceSearch.Supervisor)
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
