defmodule PriceSearch.MixProject do
  use Mix.Project

  def project do
    [
      app: :price_search,
      version: "0.1.0",
      elixir: "~> 1.14",
      start_permanent: Mix.env() == :prod,
      # Larder by path; jiffy comes from Debian (scripts/setup), never Hex.
      deps: [{:larder, path: "../.."}],
      # eredis (Debian's erlang-redis-client) is used only by the producer
      # side of PriceSearch.PriceStream (the producer script, the demo, the
      # bench); the service's replica reads the stream with Larder's own client.
      xref: [exclude: [:eredis]]
    ]
  end

  def application do
    [
      mod: {PriceSearch.Application, []},
      extra_applications: [:logger, :jiffy] ++ test_applications(Mix.env())
    ]
  end

  defp test_applications(:test), do: [:inets]
  defp test_applications(_), do: []
end
