# A replica's Larder.Bag (`into: {Larder.Bag, opts}`). Ops: `{:insert,
# key, value}`, `{:delete, key}` and `{:delete, key, value}`; a run of
# inserts is one Larder.Bag.insert_many/2. A bag has no consistent cut:
# a deduplicating one fed by a pure (arity-1) apply function is dumped
# while the replica writes on, since applying an entry's ops again onto a
# dump that holds them changes nothing; any other is dumped by the
# replica's process, which writes nothing meanwhile (see "Snapshots" in
# Larder.Replica).
defmodule Larder.Replica.Target.Bag do
  @moduledoc false

  @behaviour Larder.Replica.Target

  alias Larder.Bag
  alias Larder.Replica.Target

  @impl true
  def structure, do: Bag

  @impl true
  def validate!(opts) do
    unless is_list(opts) and Keyword.keyword?(opts) do
      raise ArgumentError,
            "expected Larder.Replica option :into to be {Larder.Bag, opts} with the " <>
              "options of Larder.Bag.new/1, got: #{inspect({Bag, opts}, limit: 10)}"
    end

    opts
  end

  @impl true
  def identity(opts, replica), do: {:bag, opts[:name] || replica}

  @impl true
  def new(opts), do: Bag.new(opts)

  # The file holds the bag's mode (load/2 takes no :dedup): a file of the
  # other mode is refused.
  @impl true
  def load(opts, path) do
    {dedup, opts} = Keyword.pop(opts, :dedup, true)

    with {:ok, bag} <- Bag.load(path, opts) do
      if match?(%Bag{dedup: ^dedup}, bag) do
        {:ok, bag}
      else
        Bag.drop(bag)

        {:error,
         Larder.Error.new(
           :definition_mismatch,
           "the snapshot's bag has dedup: #{not dedup}, the replica's :into dedup: #{dedup}",
           path: path
         )}
      end
    end
  end

  @impl true
  def drop(bag), do: Bag.drop(bag)

  @impl true
  def check(_opts, [{:insert, _key, _value} | rest]), do: check(nil, rest)
  def check(_opts, [{:delete, _key} | rest]), do: check(nil, rest)
  def check(_opts, [{:delete, _key, _value} | rest]), do: check(nil, rest)
  def check(_opts, []), do: true
  def check(_opts, _other), do: false

  @impl true
  def write(bag, ops) do
    Target.each_run(ops, fn
      :insert, run ->
        Bag.insert_many(bag, for({:insert, k, v} <- run, do: {k, v}))

      :delete, run ->
        Enum.each(run, fn
          {:delete, k} -> Bag.delete(bag, k)
          {:delete, k, v} -> Bag.delete(bag, k, v)
        end)
    end)
  end

  @impl true
  def dump_mode(opts, arity) do
    if arity == 1 and Keyword.get(opts, :dedup, true), do: :concurrent, else: :exclusive
  end

  @impl true
  def dump(bag, path), do: Bag.dump(bag, path)

  # No cut to take: the dump's process reads the bag as it goes.
  @impl true
  def start_dump(_bag, _path, _dumper), do: {:ok, :read}

  @impl true
  def finish_dump(bag, path, :read), do: Bag.dump(bag, path)
end
