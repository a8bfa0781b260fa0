# price_catalogue: the price catalogue that the price search example serves
# and that Larder's benchmarks, demo and tests search. Plain Elixir and OTP,
# nothing of Larder: the example (examples/price_search) depends on it by
# path, and so do the core and larder_kafka, for :dev and :test only, so a
# service that depends on Larder never fetches it.
defmodule PriceCatalogue.MixProject do
  use Mix.Project

  def project do
    [
      app: :price_catalogue,
      version: "0.1.0",
      elixir: "~> 1.14",
      start_permanent: Mix.env() == :prod,
      elixirc_paths: elixirc_paths(Mix.env()),
      deps: []
    ]
  end

  # test/support holds the tests' generators of prices. The properties run
  # through the PropEr runner of Larder's test support (it uses ExUnit and
  # PropEr only), compiled here by absolute path, as larder_kafka compiles
  # Larder's support: one copy in the repository.
  defp elixirc_paths(:test),
    do: ["lib", "test/support", Path.expand("../../test/support/proper.ex", __DIR__)]

  defp elixirc_paths(_), do: ["lib"]

  # jiffy (Debian's erlang-jiffy, installed by scripts/setup) reads the
  # reference requests. PropEr (Debian's erlang-proper) drives the tests'
  # properties.
  def application do
    [extra_applications: [:jiffy] ++ extra_applications(Mix.env())]
  end

  defp extra_applications(:test), do: [:proper]
  defp extra_applications(_), do: []
end
