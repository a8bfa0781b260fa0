# larder_kafka: Larder.Replica.Kafka, a Larder.Replica.Source over a Kafka
# topic through librdkafka (its NIF crate, native/larder_kafka, holds the
# rdkafka crate's bundled build). A package of its own, so that only the
# services that read Kafka build librdkafka; it depends on the core
# (`larder`, the folder above) by path.
defmodule LarderKafka.MixProject do
  use Mix.Project

  @version "0.1.0"

  def project do
    [
      app: :larder_kafka,
      version: @version,
      elixir: "~> 1.14",
      start_permanent: Mix.env() == :prod,
      elixirc_paths: elixirc_paths(Mix.env()),
      deps: [larder() | price_catalogue()],
      # The core's test support (compiled here for the bench and the tests)
      # XADDs prices with eredis (Debian's erlang-redis-client); the library
      # does not.
      xref: [exclude: [:eredis]],
      name: "LarderKafka",
      description: "Larder.Replica.Kafka: a Larder replica of a Kafka topic, over librdkafka.",
      docs: [main: "Larder.Replica.Kafka"]
    ]
  end

  def application do
    [extra_applications: [:logger] ++ extra_applications(Mix.env())]
  end

  # In this repository, the core is the folder above. Fetched alone, as a
  # git dependency with `sparse: "larder_kafka"` (deps/larder_kafka holds
  # the repository with only this folder), the dependent declares :larder
  # itself with `override: true` (see the README's installation), and this
  # declaration, which it overrides, points where Mix puts that one.
  defp larder do
    if File.regular?(Path.expand("../mix.exs", __DIR__)),
      do: {:larder, path: ".."},
      else: {:larder, path: "../../larder"}
  end

  # The price catalogue (examples/price_catalogue) for the benchmark, the
  # Kafka demo and the core's test support: only in :dev and :test, so a
  # service that depends on larder_kafka never fetches it
  # (test/dependency_test.exs checks what such a project builds), and not
  # declared where it is absent (this folder fetched alone, sparse).
  defp price_catalogue do
    path = Path.expand("../examples/price_catalogue", __DIR__)
    if File.dir?(path), do: [{:price_catalogue, path: path, only: [:dev, :test]}], else: []
  end

  defp extra_applications(:test), do: [:proper]
  defp extra_applications(_), do: []

  # The core's test support (its servers, free ports, the price catalogue's
  # table, replica and producer) and bench harness are compiled here too,
  # with this package's own (the Kafka broker, the Kafka load): one support
  # folder per package, nothing loaded from one tree by another.
  defp elixirc_paths(:test),
    do: [
      "lib",
      "test/support",
      "bench/support",
      core("test/support"),
      core("bench/support/bench.ex")
    ]

  defp elixirc_paths(:dev) do
    core = Enum.map(~w(free_port redis_server prices), &core("test/support/#{&1}.ex"))

    ["lib", "test/support/kafka_broker.ex", "bench/support", core("bench/support/bench.ex")] ++
      core
  end

  defp elixirc_paths(_), do: ["lib"]

  defp core(path), do: Path.expand(Path.join("..", path), __DIR__)
end
