# A small application that depends on Larder by path and is shipped as a
# release: test/release_test.exs builds it with `MIX_ENV=prod mix release`
# and boots it, once as an app that uses no Redis and once as one that uses
# Larder.Cache.Redis (RELEASE_CHECK_REDIS=1), which lists :eredis itself.
defmodule ReleaseCheck.MixProject do
  use Mix.Project

  # The test copies this app elsewhere and says where Larder is.
  @larder System.get_env("LARDER_PATH", Path.expand("../..", __DIR__))
  @redis? System.get_env("RELEASE_CHECK_REDIS") == "1"

  def project do
    [
      app: :release_check,
      version: "0.1.0",
      elixir: "~> 1.14",
      start_permanent: Mix.env() == :prod,
      deps: [{:larder, path: @larder}]
    ]
  end

  # An application that uses Larder.Cache.Redis lists eredis (Debian's
  # erlang-redis-client) here, so that it is started and put in the release.
  def application do
    [
      mod: {ReleaseCheck.Application, []},
      extra_applications: [:logger] ++ if(@redis?, do: [:eredis], else: [])
    ]
  end
end
