# A replica's Larder.Table (`into: {Larder.Table, opts}`). Ops:
# `{:insert, record}` (a map holding the key field) and `{:delete, key}`.
# A run of inserts is one write of the table's writer, through
# Larder.Table.Requests.insert!/3: check/2 already checked each record
# (in the reader, beside the writes), so they are not checked again. The
# writer takes a consistent cut in constant time (Larder.Table.Dump), so a
# snapshot always dumps the table while the replica writes on, whatever
# the apply function.
defmodule Larder.Replica.Target.Table do
  @moduledoc false

  @behaviour Larder.Replica.Target

  alias Larder.Replica.Target
  alias Larder.Table
  alias Larder.Table.Requests

  @impl true
  def structure, do: Table

  @impl true
  def validate!(opts) do
    unless is_list(opts) and Keyword.keyword?(opts) and Keyword.has_key?(opts, :key) do
      raise ArgumentError,
            "expected Larder.Replica option :into to be {Larder.Table, opts} with the " <>
              "options of Larder.Table.new/1 (:key required), got: " <>
              inspect({Table, opts}, limit: 10)
    end

    opts
  end

  @impl true
  def identity(opts, replica), do: {:table, opts[:name] || replica}

  @impl true
  def new(opts), do: Table.new(opts)

  @impl true
  def load(opts, path), do: Table.load(path, opts)

  @impl true
  def drop(table), do: Table.drop(table)

  @impl true
  def check(opts, ops), do: check_ops(ops, opts[:key])

  defp check_ops([{:insert, record} | rest], key) when is_map_key(record, key),
    do: check_ops(rest, key)

  defp check_ops([{:delete, _key} | rest], key), do: check_ops(rest, key)
  defp check_ops([], _key), do: true
  defp check_ops(_other, _key), do: false

  @impl true
  def write(table, ops) do
    Target.each_run(ops, fn
      :insert, run ->
        records = for {:insert, record} <- run, do: record

        Requests.span(table, :insert_many, %{}, fn table ->
          Requests.insert!(table, records, "insert_many/2")
        end)

      :delete, run ->
        Enum.each(run, fn {:delete, key} -> Table.delete(table, key) end)
    end)
  end

  @impl true
  def dump_mode(_opts, _arity), do: :concurrent

  @impl true
  def dump(table, path), do: Table.dump(table, path)

  # The writer takes the cut now, before the replica writes the next batch;
  # the dump's process then waits for the writer's dump of it.
  @impl true
  def start_dump(table, path, dumper) do
    case Table.Dump.request(table, path, dumper) do
      {:ok, ref} -> {:ok, {table.writer, ref}}
      :gone -> :gone
    end
  end

  @impl true
  def finish_dump(_table, _path, {writer, ref}), do: Table.Dump.await(writer, ref)
end
