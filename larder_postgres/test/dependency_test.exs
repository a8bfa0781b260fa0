defmodule LarderPostgres.DependencyTest do
  # larder_postgres as a dependency of someone else's service: a fresh
  # project made by `mix new` in a temporary folder, depending on this
  # checkout's core and Postgres adapter by path, compiled, then running a
  # program (test/dependency/dependent_postgres.ex) that keeps a Table
  # equal to a table of a real server. Tagged :dependency and :postgres.
  use ExUnit.Case, async: false

  alias Larder.Test.{DependentApp, PostgresServer, PostgresSetup}

  @moduletag :dependency
  @moduletag :postgres
  @moduletag timeout: 900_000

  @adapter Path.expand("..", __DIR__)
  @core Path.expand("../..", __DIR__)
  @program Path.expand("dependency/dependent_postgres.ex", __DIR__)

  setup do
    dir = Path.join(System.tmp_dir!(), "larder_pg_dep_#{System.unique_integer([:positive])}")
    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf!(dir) end)
    %{dir: dir}
  end

  test "a new Mix project depends on larder and larder_postgres by path and follows a table",
       %{dir: dir} do
    deps = "[{:larder, path: #{inspect(@core)}}, {:larder_postgres, path: #{inspect(@adapter)}}]"
    app = DependentApp.new!(dir, "dependent_postgres", deps, @program)

    out = DependentApp.mix!(["compile"], app)
    refute out =~ "warning", out
    assert DependentApp.built(app) == ["dependent_postgres", "larder", "larder_postgres"]

    server = PostgresSetup.start()
    {user, password} = PostgresServer.superuser()

    PostgresServer.sql!(server, """
    CREATE TABLE prices (id int PRIMARY KEY, kind text NOT NULL, cents int NOT NULL);
    INSERT INTO prices VALUES (1, 'food', 100), (2, 'book', 250), (3, 'food', 5);
    DELETE FROM prices WHERE id = 3;
    CREATE PUBLICATION larder_pub FOR TABLE prices;
    """)

    url = "postgres://#{user}:#{password}@127.0.0.1:#{server.port}/postgres"
    snapshots = Path.join(dir, "snapshots")
    File.mkdir_p!(snapshots)

    out =
      DependentApp.mix!(
        ["run", "-e", "DependentPostgres.run(#{inspect(url)}, #{inspect(snapshots)})"],
        app
      )

    assert out =~ "dependent_postgres: ok"
  end
end
