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
      deps: [larder()],
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

  defp extra_applications(:test), do: [:proper]
  defp extra_applications(_), do: []

  # Of the core's test support, what these tests use (free ports, the
  # PropEr runner, polling, the Source conformance suite and the log it
  # runs on by default, the generated dependent project) is compiled here
  # too, with this package's own (the Postgres server): one support folder
  # per package, nothing loaded from one tree by another.
  @core_support ~w(free_port proper eventually source_conformance partitioned_source replica_log
                   dependent_app)

  defp elixirc_paths(:test),
    do: ["lib", "test/support"] ++ Enum.map(@core_support, &core("test/support/#{&1}.ex"))

  defp elixirc_paths(_), do: ["lib"]

  defp core(path), do: Path.expand(Path.join("..", path), __DIR__)
end
