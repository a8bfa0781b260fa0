# The table of a Redis topology (Larder.Redis.Topology.new/1): the rows its
# processes write and its callers read, and its counters. The table belongs
# to the process that made the topology (its user: a cache's owner), so it
# outlives the topology's processes; every write here tolerates a table
# that is gone (its user stopped first).
defmodule Larder.Redis.Table do
  @moduledoc false

  # Rows (each written by one process):
  #
  #   {:manager, pid}                 the topology's manager (callers' hints)
  #   {key, pid | :none}              a command connection of a pool (key:
  #                                   a slot 0..pool_size-1 on one server,
  #                                   {host, port, i} on a cluster)
  #   {slot, {host, port}}            a cluster's slot map (0..16_383)
  #   {:check_hinted, true}           a caller's hint to the manager on its way
  #   {:refresh_hinted, true}         (the one of a cluster)
  #   {:started, true}                the topology started once (see
  #                                   Larder.Redis.Topology.start_link/3)
  #   {:ended_connections, n}         counters
  #   {:bad_replies, n}

  @counters [:ended_connections, :bad_replies]

  @doc "Inserts `rows`, if the table still exists."
  @spec put(:ets.tid(), tuple() | [tuple()]) :: true
  def put(table, rows), do: unless_gone(fn -> :ets.insert(table, rows) end, true)

  @doc "Inserts `row` unless its key is there: whether it did (false once the table is gone)."
  @spec put_new(:ets.tid(), tuple()) :: boolean()
  def put_new(table, row), do: unless_gone(fn -> :ets.insert_new(table, row) end, false)

  @doc "Deletes `key`, if the table still exists."
  @spec delete(:ets.tid(), term()) :: true
  def delete(table, key), do: unless_gone(fn -> :ets.delete(table, key) end, true)

  @doc "Deletes the row `{key, value}` only, if the table still exists."
  @spec delete_object(:ets.tid(), tuple()) :: true
  def delete_object(table, row), do: unless_gone(fn -> :ets.delete_object(table, row) end, true)

  @doc "The value of `key`, or `default`."
  @spec get(:ets.tid(), term(), term()) :: term()
  def get(table, key, default \\ nil) do
    case unless_gone(fn -> :ets.lookup(table, key) end, []) do
      [{_, value}] -> value
      [] -> default
    end
  end

  @doc """
  Deletes every row but the counters and `{:started, true}`: a manager that
  starts again starts from nothing, and callers wait for it meanwhile.
  """
  @spec delete_all_but_counters(:ets.tid()) :: non_neg_integer()
  def delete_all_but_counters(table) do
    keep = Enum.reduce(@counters, {:==, :"$1", :started}, &{:orelse, {:==, :"$1", &1}, &2})

    unless_gone(
      fn -> :ets.select_delete(table, [{{:"$1", :_}, [{:not, keep}], [true]}]) end,
      0
    )
  end

  @doc "Adds `n` to the counter `name`."
  @spec count(:ets.tid(), atom(), pos_integer()) :: integer()
  def count(table, name, n) when name in @counters,
    do: unless_gone(fn -> :ets.update_counter(table, name, n, {name, 0}) end, 0)

  @doc "The counter `name` (0 before its first count)."
  @spec counter(:ets.tid(), atom()) :: non_neg_integer()
  def counter(table, name) when name in @counters, do: get(table, name, 0)

  defp unless_gone(fun, gone) do
    fun.()
  catch
    :error, :badarg -> gone
  end
end
