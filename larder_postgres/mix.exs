# larder_postgres: the Postgres client under a Larder.Replica.Postgres (a
# Larder.Replica.Source over logical replication, pgoutput): the wire
# protocol, connections and authentication, COPY, the replication stream
# and the pgoutput decoder, in plain Elixir over OTP's :gen_tcp, :ssl and
# :crypto (no NIF, no Hex). A package of its own, so that only the
# services that read Postgres carry it; it depends on the core (`larder`,
# the folder above) by path.
defmodule LarderPostgres.MixProject do
  use Mix.Project

  @version "0.1.0"

  def project do
    [
      app: :larder_postgres,
      version: @version,
      elixir: "~> 1.14",
      start_permanent: Mix.env() == :prod,
      elixirc_paths: elixirc_paths(Mix.env()),
      deps: [larder() | price_catalogue()],
      # The core's test support (compiled here for the bench and the demo)
      # XADDs prices with eredis (Debian's erlang-redis-client); the library
      # does not.
      xref: [exclude: [:eredis]],
      name: "LarderPostgres",
      description:
        "The Postgres logical replication client under a Larder replica of Postgres tables."
    ]
  end

  def application do
    [extra_applications: [:logger, :crypto, :ssl, :public_key] ++ extra_applications(Mix.env())]
  end

  # In this repository, the core is the folder above. Fetched alone, as a
  # git dependency with `sparse: "larder_postgres"` (deps/larder_postgres
  # holds the repository with only this folder), the dependent declares
  # :larder itself with `override: true`, and this declaration, which it
  # overrides, points where Mix puts that one.
  defp larder do
    if File.regular?(Path.expand("../mix.exs", __DIR__)),
      do: {:larder, path: ".."},
      else: {:larder, path: "../../larder"}
  end

  # The price catalogue (examples/price_catalogue) for the benchmark and
  # the Postgres demo: only in :dev and :test, so a service that depends on
  # larder_postgres never fetches it (test/dependency_test.exs checks what
  # such a project builds), and not declared where it is absent (this
  # folder fetched alone, sparse).
  defp price_catalogue do
    path = Path.expand("../examples/price_catalogue", __DIR__)
    if File.dir?(path), do: [{:price_catalogue, path: path, only: [:dev, :test]}], else: []
  end

  defp extra_applications(:test), do: [:proper]
  defp extra_applications(_), do: []

  # Of the core's test support, what these tests use (free ports, the
  # PropEr runner, polling, the Source conformance suite and the log it
  # runs on by default, the generated dependent project) is compiled here
  # too, with this package's own (the Postgres server): one support folder
  # per package, nothing loaded from one tree by another.
  @core_support ~w(free_port proper eventually source_conformance partitioned_source replica_log
                   dependent_app prices)

  # The bench and the demo (:dev) run on the Postgres server of the test
  # support, the core's bench harness and price catalogue table, and their
  # own load (bench/support); :test compiles them too, so that they build.
  defp elixirc_paths(:test),
    do:
      ["lib", "test/support", "bench/support", core("bench/support/bench.ex")] ++
        Enum.map(@core_support, &core("test/support/#{&1}.ex"))

  defp elixirc_paths(:dev),
    do:
      ["lib", "test/support/postgres_server.ex", "bench/support", core("bench/support/bench.ex")] ++
        Enum.map(~w(free_port prices), &core("test/support/#{&1}.ex"))

  defp elixirc_paths(_), do: ["lib"]

  defp core(path), do: Path.expand(Path.join("..", path), __DIR__)
end
