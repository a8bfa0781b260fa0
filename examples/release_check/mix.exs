# A small application that depends on Larder by path and is shipped as a
# release: test/release_test.exs builds it with `MIX_ENV=prod mix release`
# and boots it: it uses a Bag, a Register, a Table and Larder.Cache.Redis,
# which needs nothing beyond OTP and Larder.
defmodule ReleaseCheck.MixProject do
  use Mix.Project

  # The test copies this app elsewhere and says where Larder is.
  @larder System.get_env("LARDER_PATH", Path.expand("../..", __DIR__))

  def project do
    [
      app: :release_check,
      version: "0.1.0",
      elixir: "~> 1.14",
      start_permanent: Mix.env() == :prod,
      deps: [{:larder, path: @larder}]
    ]
  end

  def application do
    [mod: {ReleaseCheck.Application, []}, extra_applications: [:logger]]
  end
end
