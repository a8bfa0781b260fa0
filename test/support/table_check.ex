# What the Table's writer and claim tests check after writes that may have
# been killed midway: the test table's every search equal to a filter.
defmodule Larder.Test.TableCheck do
  @moduledoc false

  import ExUnit.Assertions

  alias Larder.Table

  @doc """
  A table of the tests' shape: keyed by `:id`, indexed by `:a` and by each
  of the record's `:tags` (as `:m`), plus `opts`.
  """
  def table(opts \\ []),
    do: Table.new([key: :id, index: [:a, {:m, &Map.get(&1, :tags, [])}]] ++ opts)

  @doc """
  Runs `writes` in a process killed after a varying amount of work (by
  `round`), often mid-write. The kill is a signal: this waits until it has
  landed, so that nothing the process sends can arrive after a barrier the
  test writes next.
  """
  def killed_midway(round, writes) do
    {pid, ref} = spawn_monitor(writes)
    for _ <- 1..rem(round * 7, 40), do: :erlang.yield()
    Process.exit(pid, :kill)
    assert_receive {:DOWN, ^ref, :process, ^pid, _}
  end

  @doc "Whether every search of `table` by `:a` and `:m` for `values` agrees with a plain filter."
  def consistent?(table, values) do
    records = table |> Table.stream() |> Enum.to_list()

    Enum.all?(values, fn v ->
      expect_a = records |> Enum.filter(&(&1.a === v)) |> Enum.map(& &1.id) |> Enum.sort()
      expect_m = records |> Enum.filter(&(v in &1.tags)) |> Enum.map(& &1.id) |> Enum.sort()

      Enum.sort(Enum.map(Table.search(table, a: v), & &1.id)) == expect_a and
        Enum.sort(Table.search_keys(table, m: v)) == expect_m and
        Table.count(table, a: v) == length(expect_a)
    end)
  end
end
