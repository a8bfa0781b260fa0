# The program of larder_postgres's test/dependency_test.exs: the lib/ of a
# fresh Mix project that depends on larder and larder_postgres, keeping a
# Table equal to a Postgres table as a service of someone else's would.
# Each step raises (a MatchError) when Larder answers otherwise.
defmodule DependentPostgres do
  @moduledoc false

  def run(url, dir) do
    children = [
      {Larder.Replica,
       name: :pg_prices,
       into: {Larder.Table, name: :prices, key: :id, index: [:kind]},
       source: {Larder.Replica.Postgres, url: url, publication: "larder_pub", slot: "larder_slot"},
       apply: fn
         %{"op" => op, "table" => "public.prices", "new" => row}
         when op in ["insert", "update"] ->
           {:insert, decode(row)}

         %{"op" => "delete", "table" => "public.prices", "old" => old} ->
           {:delete, String.to_integer(old["id"])}
       end,
       snapshot: Path.join(dir, "pg")}
    ]

    {:ok, sup} = Supervisor.start_link(children, strategy: :one_for_one)

    :ok = Larder.Replica.await(:pg_prices, :latest, 60_000)
    [%{id: 2, cents: 250}] = Larder.Table.search(:prices, kind: "book")
    2 = Larder.Table.size(:prices)
    {:ok, {lsn, _}} = Larder.Replica.dump(:pg_prices)
    true = lsn > 0
    :ok = Supervisor.stop(sup)

    IO.puts("dependent_postgres: ok")
  end

  defp decode(%{"id" => id, "kind" => kind, "cents" => cents}),
    do: %{id: String.to_integer(id), kind: kind, cents: String.to_integer(cents)}
end
