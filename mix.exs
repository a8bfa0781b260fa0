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
      # The session registry example's test lives beside it (it has no Mix
      # project of its own); `mix test` runs it with the library's.
      test_paths: ["test", "examples/session_registry"],
      deps: deps(),
      # The price catalogue's producer (test/support/prices.ex), which the
      # benches and the demo use, XADDs prices with eredis (Debian's
      # erlang-redis-client); the library does not call it.
      xref: [exclude: [:eredis]],
      name: "Larder",
      description: "Fast in-memory state for BEAM services: ETS without the sharp edges.",
      docs: [main: "Larder"]
    ]
  end

  # The price catalogue (examples/price_catalogue: plain Elixir, nothing of
  # Larder) for the benches, the demo and the tests, which search it. Only
  # in :dev and :test: a project that depends on Larder never fetches it
  # (test/dependency_test.exs checks what such a project builds).
  defp deps do
    [{:price_catalogue, path: "examples/price_catalogue", only: [:dev, :test]}]
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

  # test/support is the one support folder, compiled here rather than loaded
  # from one tree by another. The tests get all of it, and the benchmark
  # harness and report they test. The benchmarks and the demo (`mix run`, in
  # :dev) get the harness and, of test/support, the servers they start, the
  # free port and the price catalogue's table, replica and producer: not
  # ExUnit's case templates, nor the :telemetry stand-in, which would turn
  # telemetry events on in every benchmark. A dependency's build (:prod) is
  # the library alone.
  @shared_support ~w(free_port redis_server redis_cluster redis_sentinel prices)

  defp elixirc_paths(:test), do: ["lib", "test/support", "bench/support", "bench/report"]

  defp elixirc_paths(:dev),
    do: ["lib", "bench/support"] ++ Enum.map(@shared_support, &"test/support/#{&1}.ex")

  defp elixirc_paths(_), do: ["lib"]
end
