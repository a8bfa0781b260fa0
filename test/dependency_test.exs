defmodule Larder.DependencyTest do
  # Larder as a dependency of someone else's service: a fresh project made
  # by `mix new` in a temporary folder, depending on this checkout's core by
  # path, compiled (the core's NIF crate and nothing else: no librdkafka,
  # no OpenSSL), then running a program (test/dependency/dependent.ex) that
  # uses a Bag, a Register, a Table with an index, a Cache on Redis and a
  # Replica of a Redis Stream against a real redis-server. Tagged
  # :dependency (`mix test --exclude dependency` skips it); `make test`
  # runs it. larder_kafka/test/dependency_test.exs does the same with the
  # Kafka adapter.
  use ExUnit.Case, async: true

  alias Larder.Test.{DependentApp, RedisServer}

  @moduletag :dependency
  @moduletag :redis
  @moduletag timeout: 600_000

  @core Path.expand("..", __DIR__)
  @program Path.expand("dependency/dependent.ex", __DIR__)

  setup do
    dir = Path.join(System.tmp_dir!(), "larder_dep_#{System.unique_integer([:positive])}")
    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf!(dir) end)
    %{dir: dir}
  end

  test "a new Mix project depends on the core by path, builds no Kafka, and runs", %{dir: dir} do
    app = DependentApp.new!(dir, "dependent", "[{:larder, path: #{inspect(@core)}}]", @program)

    # A machine without OpenSSL's headers: an openssl-sys build would fail.
    env = [{"OPENSSL_DIR", "/nonexistent"}, {"OPENSSL_NO_PKG_CONFIG", "1"}]
    out = DependentApp.mix!(["compile"], app, env)
    refute out =~ "warning", out

    # The core and the app, nothing of Kafka.
    assert DependentApp.built(app) == ["dependent", "larder"]

    assert File.ls!(Path.join(app, "_build/dev/lib/larder/priv/native")) == [
             "liblarder_native.so"
           ]

    lock = File.read!(Path.join(@core, "native/larder_native/Cargo.lock"))
    refute lock =~ ~r/name = "(rdkafka|rdkafka-sys|openssl-sys|zstd-sys)"/

    server = RedisServer.start()
    on_exit(fn -> RedisServer.stop(server) end)
    "$" <> _ = RedisServer.command(server, ["XADD", "orders", "*", "id", "1", "status", "new"])
    "$" <> _ = RedisServer.command(server, ["XADD", "orders", "*", "id", "2", "status", "paid"])

    url = "redis://127.0.0.1:#{server.port}"
    out = DependentApp.mix!(["run", "-e", "Dependent.run(#{inspect(url)}, \"orders\")"], app)
    assert out =~ "dependent: ok"
  end
end
