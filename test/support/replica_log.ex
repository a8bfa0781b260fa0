# A log of key/value ops in a Redis Stream for the Larder.Replica tests: a
# small client (pipelined commands, whole replies), the entries' encoding,
# the pure apply function, the plain model (a map folded over XRANGE), and
# a Table's contents in the model's shape.
defmodule Larder.Test.ReplicaLog do
  @moduledoc false

  import Bitwise

  alias Larder.Redis.{RESP, Socket}

  @doc "A connection to the redis-server on `port` (through Larder's socket layer)."
  def connect(port) do
    {:ok, socket} = Socket.connect("127.0.0.1", port, timeout: 5_000, tcp: [nodelay: true])
    socket
  end

  @doc "Sends `commands` pipelined and returns their replies."
  def pipeline(socket, commands) do
    :ok = Socket.send(socket, commands)
    deadline = System.monotonic_time(:millisecond) + 30_000
    {:ok, replies, _parser} = Socket.recv(socket, RESP.new(1 <<< 30), length(commands), deadline)
    replies
  end

  def command(socket, command), do: hd(pipeline(socket, [command]))

  @doc "The fields of an op."
  def fields({:put, key, value}), do: ["op", "put", "k", to_string(key), "v", to_string(value)]
  def fields({:del, key}), do: ["op", "del", "k", to_string(key)]
  def fields({:delp, key, value}), do: ["op", "delp", "k", to_string(key), "v", to_string(value)]
  def fields({:incr, key, n}), do: ["op", "incr", "k", to_string(key), "n", to_string(n)]
  def fields(:poison), do: ["op", "poison"]

  @doc "XADDs `ops` (pipelined); returns their ids."
  def add(socket, stream, ops) do
    socket
    |> pipeline(Enum.map(ops, &["XADD", stream, "*" | fields(&1)]))
    |> Enum.map(fn {:ok, id} -> id end)
  end

  @doc "XADDs `{id, op}` pairs with their explicit ids."
  def add_at(socket, stream, pairs) do
    socket
    |> pipeline(Enum.map(pairs, fn {id, op} -> ["XADD", stream, id | fields(op)] end))
    |> Enum.map(fn {:ok, id} -> id end)
  end

  @doc "The pure apply function: an entry's fields to a Table op."
  def apply_entry(%{"op" => "put", "k" => k, "v" => v}),
    do: {:insert, %{id: String.to_integer(k), v: String.to_integer(v)}}

  def apply_entry(%{"op" => "del", "k" => k}), do: {:delete, String.to_integer(k)}
  def apply_entry(%{"op" => "poison"}), do: raise("poisoned entry")

  @doc """
  An arity-2 apply function: puts and deletes as ops, an increment as a
  read-modify-write of the table (so an entry applied twice shows).
  """
  def apply_entry(%{"op" => "incr", "k" => k, "n" => n}, table) do
    key = String.to_integer(k)
    n = String.to_integer(n)

    Larder.Table.update(table, key, %{id: key, v: n}, &%{&1 | v: &1.v + n})
  end

  def apply_entry(fields, _table), do: apply_entry(fields)

  @doc "The model: the ops of the whole stream folded into a map."
  def model(socket, stream) do
    {:ok, entries} = command(socket, ["XRANGE", stream, "-", "+"])

    Enum.reduce(entries, %{}, fn [_id, fields], acc ->
      case Map.new(Enum.chunk_every(fields, 2), fn [k, v] -> {k, v} end) do
        %{"op" => "put", "k" => k, "v" => v} ->
          Map.put(acc, String.to_integer(k), String.to_integer(v))

        %{"op" => "del", "k" => k} ->
          Map.delete(acc, String.to_integer(k))

        %{"op" => "incr", "k" => k, "n" => n} ->
          Map.update(
            acc,
            String.to_integer(k),
            String.to_integer(n),
            &(&1 + String.to_integer(n))
          )

        _ ->
          acc
      end
    end)
  end

  @doc "A random op on keys 1..`keys`."
  def random_op(keys) do
    case :rand.uniform(10) do
      n when n <= 5 -> {:put, :rand.uniform(keys), :rand.uniform(1_000)}
      n when n <= 7 -> {:del, :rand.uniform(keys)}
      _ -> {:incr, :rand.uniform(keys), :rand.uniform(10)}
    end
  end

  @doc "A Table's records as the model's map."
  def contents(table), do: table |> Larder.Table.stream() |> Map.new(&{&1.id, &1.v})

  @doc "The options of a replica of `stream` on `port` into a Table named `table`."
  def opts(name, table, port, stream, extra \\ []) do
    Keyword.merge(
      [
        name: name,
        into: {Larder.Table, name: table, key: :id, index: [:v]},
        source: {Larder.Replica.RedisStream, redis: [port: port, timeout: 1_000], stream: stream},
        apply: &__MODULE__.apply_entry/1,
        batch_size: 100,
        block_ms: 100
      ],
      extra
    )
  end
end
