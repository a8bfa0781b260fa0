defmodule PriceSearch.MixProject do
  use Mix.Project

  def project do
    [
      app: :price_search,
      version: "0.1.0",
      elixir: "~> 1.14",
      start_permanent: Mix.env() == :prod,
      elixirc_paths: elixirc_paths(Mix.env()),
      # Larder and the price catalogue (examples/price_catalogue, shared
      # with Larder's benches and tests) by path; jiffy comes from Debian
      # (scripts/setup), never Hex.
      deps: [{:larder, path: "../.."}, {:price_catalogue, path: "../price_catalogue"}],
      # eredis (Debian's erlang-redis-client) is used only by the producer
      # side of PriceSearch.PriceStream (the producer script, the tests); the
      # service's replica reads the stream with Larder's own client.
      xref: [exclude: [:eredis]]
    ]
  end

  # The tests start a real redis-server with Larder's own starter
  # (test/support/redis_server.ex and the free port it takes), compiled here
  # by absolute path, as larder_kafka compiles it: test support, not part of
  # the service, which uses only Larder's public API.
  defp elixirc_paths(:test),
    do: ["lib" | Enum.map(~w(redis_server free_port), &larder("test/support/#{&1}.ex"))]

  defp elixirc_paths(_), do: ["lib"]

  defp larder(path), do: Path.expand(Path.join("../..", path), __DIR__)

  def application do
    [
      mod: {PriceSearch.Application, []},
      extra_applications: [:logger, :jiffy] ++ test_applications(Mix.env())
    ]
  end

  defp test_applications(:test), do: [:inets]
  defp test_applications(_), do: []
end
