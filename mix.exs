Code.require_file("mix/compile.larder_native.exs", __DIR__)

defmodule Larder.MixProject do
  use Mix.Project

  @version "0.1.0"

  def project do
    [
      app: :larder,
      version: @version,
      elixir: "~> 1.14",
      start_permanent: Mix.env() == :prod,
      elixirc_paths: elixirc_paths(Mix.env()),
      # The Rust NIF is built first, so Larder.Native can load it.
      compilers: [:larder_native | Mix.compilers()],
      deps: [],
      name: "Larder",
      description: "Fast in-memory state for BEAM services: ETS without the sharp edges.",
      docs: [main: "Larder"]
    ]
  end

  # Libraries come from OTP and Debian's erlang-* packages, never from Hex.
  # Larder.Cache.Redis speaks RESP itself: no Redis client library.
  def application do
    [
      mod: {Larder.Application, []},
      extra_applications: [:logger, :crypto] ++ extra_applications(Mix.env())
    ]
  end

  # PropEr (Debian's erlang-proper) drives the model tests.
  defp extra_applications(:test), do: [:proper]
  defp extra_applications(_), do: []

  defp elixirc_paths(:test), do: ["lib", "test/support"]
  defp elixirc_paths(_), do: ["lib"]
end
