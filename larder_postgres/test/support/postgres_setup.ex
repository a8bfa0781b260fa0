# What the tests of Larder.Replica.Postgres share: a real server started
# from a setup (stopped, its directory removed, when the test or the test
# module is done), names unique to a test, a source's options, and a
# table of the source's own shape (a key and a value) with its
# publication.
defmodule Larder.Test.PostgresSetup do
  @moduledoc false

  import ExUnit.Callbacks, only: [on_exit: 1]

  alias Larder.Test.PostgresServer

  @doc """
  Starts a server (`opts` of `Larder.Test.PostgresServer.start/1`) and
  stops it when the test, or from `setup_all` the module, is done.
  """
  def start(opts \\ []) do
    server = PostgresServer.start(opts)
    on_exit(fn -> PostgresServer.stop(server) end)
    server
  end

  @doc """
  A name unique to the test (a table's, a publication's and a slot's): a
  lower-case letter and 15 hex digits.
  """
  def name(ctx) do
    hash = :crypto.hash(:md5, inspect({ctx.module, ctx.test, System.unique_integer()}))
    "t" <> (hash |> Base.encode16(case: :lower) |> binary_part(0, 15))
  end

  @doc "A Larder.Replica.Postgres's options on `server` (its superuser), then `extra`."
  def source_opts(server, name, extra \\ []) do
    PostgresServer.options(server, Keyword.merge([publication: name, slot: name], extra))
  end

  @doc """
  Creates the table `name` (`k int PRIMARY KEY, v text`) and the
  publication `name` of it.
  """
  def kv_table!(server, name) do
    PostgresServer.sql!(server, """
    CREATE TABLE #{name} (k int PRIMARY KEY, v text);
    CREATE PUBLICATION #{name} FOR TABLE #{name};
    """)

    :ok
  end

  @doc """
  Waits until no connection uses the slot `name` (the server sees a
  closed connection a moment after it closed).
  """
  def await_slot_free(server, name) do
    PostgresServer.wait_until(30_000, "slot #{name} free", fn ->
      PostgresServer.sql!(
        server,
        "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '#{name}' AND active"
      ) == "0"
    end)
  end
end
