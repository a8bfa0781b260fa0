defmodule Larder.Postgres.OptionsTest do
  use ExUnit.Case, async: true

  alias Larder.Postgres.Options

  @what "Larder.Replica.Postgres"

  defp validate!(opts), do: Options.validate!(opts, @what)

  test "keys with their defaults; the database defaults to the user name" do
    opts = validate!(username: "app")
    assert opts[:host] == "127.0.0.1"
    assert opts[:port] == 5432
    assert opts[:database] == "app"
    assert opts[:password] == nil
    assert opts[:sslmode] == :disable
    assert opts[:timeout] == 15_000
    assert opts[:max_message_bytes] == 64 * 1024 * 1024
    refute Keyword.has_key?(opts, :url)
  end

  test "a url stands for host, port, user, password, database and sslmode" do
    opts = validate!(url: "postgres://app:p%40ss%3Aw@db.example:6543/my%20db?sslmode=require")
    assert opts[:host] == "db.example"
    assert opts[:port] == 6543
    assert opts[:username] == "app"
    assert opts[:password] == "p@ss:w"
    assert opts[:database] == "my db"
    assert opts[:sslmode] == :require

    opts = validate!(url: "postgresql://app@[::1]/db?sslmode=verify-full")
    assert opts[:host] == "::1"
    assert opts[:port] == 5432
    assert opts[:sslmode] == :verify_full
    assert opts[:password] == nil

    assert validate!(url: "postgres://app@h")[:database] == "app"
    assert validate!(url: "postgres://h", username: "u")[:username] == "u"
    assert validate!(url: "postgres://u@h", password: "p")[:password] == "p"
  end

  test "a url excludes the keys it stands for" do
    error = assert_raise ArgumentError, fn -> validate!(url: "postgres://a@h/db", port: 1) end
    assert error.message =~ "option :url excludes :port"

    error = assert_raise ArgumentError, fn -> validate!(url: "postgres://a@h", username: "b") end
    assert error.message =~ "option :url excludes :username"
  end

  test "bad urls name the option and hide the password" do
    for url <- [
          "redis://a:secret@h/db",
          "postgres://a:secret@/db",
          "postgres://a:secret@h/db#frag",
          "postgres://a:secret@h:99999/db",
          "not a url",
          5
        ] do
      error = assert_raise ArgumentError, fn -> validate!(url: url) end
      assert error.message =~ "#{@what} option :url" or error.message =~ "option :port"
      refute error.message =~ "secret"
    end

    error =
      assert_raise ArgumentError, fn -> validate!(url: "postgres://a@h/db?sslmode=allow") end

    assert error.message =~ "sslmode"

    error =
      assert_raise ArgumentError, fn -> validate!(url: "postgres://a@h/db?connect_timeout=1") end

    assert error.message =~ ~s(parameter "connect_timeout")
  end

  test "each key is checked, and named when it is wrong" do
    for {key, value} <- [
          host: "",
          port: 0,
          port: 65_536,
          username: "",
          username: String.duplicate("u", 64),
          username: "a\0b",
          database: "",
          password: "a\0b",
          sslmode: :prefer,
          ssl_options: :nope,
          timeout: 0,
          timeout: 600_001,
          max_message_bytes: 1023,
          max_message_bytes: 1_073_741_825,
          application_name: String.duplicate("a", 64)
        ] do
      error = assert_raise ArgumentError, fn -> validate!([username: "u"] ++ [{key, value}]) end
      assert error.message =~ "#{@what} option #{inspect(key)}"
    end

    error = assert_raise ArgumentError, fn -> validate!(host: "h") end
    assert error.message =~ "option :username"
    assert error.message =~ "required"

    error = assert_raise ArgumentError, fn -> validate!(username: "u", bogus: 1) end
    assert error.message =~ "unknown #{@what} options [:bogus]"

    assert_raise ArgumentError, fn -> validate!(:nope) end
  end

  test "the caller's own keys are checked with the connection's" do
    opts =
      Options.validate!([username: "u", slot: "s"], @what, slot: {{:string, 1, 63}, :required})

    assert opts[:slot] == "s"
  end
end
