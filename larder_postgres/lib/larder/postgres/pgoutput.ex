# pgoutput, the logical decoding output plugin's protocol (version 1):
# decodes its messages (the data of XLogData) and turns a transaction's
# changes into the entries a replica applies, with the relations it has
# described so far.
defmodule Larder.Postgres.Pgoutput do
  @moduledoc false

  alias Larder.Postgres.Protocol

  # Contract (internal).
  #
  # decode/1 parses one message, never raising: {:ok, message} or
  # {:error, reason}. The messages:
  #
  #   {:begin, final_lsn, commit_time, xid}
  #   {:commit, flags, commit_lsn, end_lsn, commit_time}
  #   {:origin, lsn, name}
  #   {:relation, id, namespace, name, replica_identity, [column]}, a
  #       column {key?, name, type_oid, type_modifier}
  #   {:type, oid, namespace, name}
  #   {:insert, relation_id, tuple}
  #   {:update, relation_id, old, tuple}, old nil, {:key, tuple} or
  #       {:old, tuple}
  #   {:delete, relation_id, {:key | :old, tuple}}
  #   {:truncate, [relation_id], cascade?, restart_identity?}
  #   {:message, transactional?, lsn, prefix, content}
  #
  # A tuple is a list of values: a binary (the text form), nil (NULL), or
  # :unchanged_toast (a TOASTed value the change did not carry: the
  # column keeps the value it had). Binary values ('b') are refused: they
  # are sent only to a client that asks for them.
  #
  # handle/2 folds a decoded message into the state (the relations
  # described so far, the transaction open) and returns what it means:
  #
  #   {:begin, final_lsn}            a transaction starts; its changes
  #                                  follow, then its commit
  #   {:changes, [entry]}            an insert, update or delete (one
  #                                  entry) or a truncate (one per table)
  #   {:commit, commit_lsn, end_lsn} the transaction ends
  #   :none                          a relation, a type, an origin
  #   :ignored                       a logical decoding message
  #
  # or {:error, reason} for a message that cannot follow what came before
  # (a change outside a transaction, a nested Begin, a Commit whose LSN
  # is not its Begin's, a relation never described, a tuple with the
  # wrong number of columns, more than @max_relations relations).
  #
  # An entry, in the shape a replica applies:
  #
  #   %{"op" => "insert", "table" => "schema.table", "new" => row}
  #   %{"op" => "update", "table" => ..., "new" => row, "old" => key}
  #   %{"op" => "delete", "table" => ..., "old" => key}
  #   %{"op" => "truncate", "table" => ...}
  #
  # `row` maps every column name to its value (text, nil or
  # :unchanged_toast); `key` maps the replica identity's columns (the
  # primary key by default, every column with REPLICA IDENTITY FULL) to
  # their values before the change: from the old tuple when the server
  # sent one (the key changed, or FULL), else from the new row (the key
  # did not change). "schema.table" joins the names as they are, without
  # quoting.

  import Bitwise

  @max_relations 100_000
  # MaxTupleAttributeNumber
  @max_columns 1_664

  @type value :: binary() | nil | :unchanged_toast
  @type entry :: %{required(String.t()) => term()}
  @type relation :: %{
          table: String.t(),
          identity: byte(),
          columns: [String.t()],
          key: [boolean()]
        }
  @type t :: %__MODULE__{
          relations: %{non_neg_integer() => relation()},
          tx: non_neg_integer() | nil
        }

  defstruct relations: %{}, tx: nil

  @doc "A fresh state: no relation, no transaction."
  @spec new() :: t()
  def new, do: %__MODULE__{}

  @doc "The largest number of relations kept."
  def max_relations, do: @max_relations

  ## Decoding

  @doc "Decodes one pgoutput message (see the contract above)."
  @spec decode(binary()) :: {:ok, tuple()} | {:error, term()}
  def decode(<<?B, final_lsn::64, time::64-signed, xid::32>>),
    do: {:ok, {:begin, final_lsn, time, xid}}

  def decode(<<?C, flags, commit_lsn::64, end_lsn::64, time::64-signed>>),
    do: {:ok, {:commit, flags, commit_lsn, end_lsn, time}}

  def decode(<<?O, lsn::64, rest::binary>>) do
    case cstring(rest) do
      {:ok, name, ""} -> {:ok, {:origin, lsn, name}}
      _ -> malformed(?O)
    end
  end

  def decode(<<?R, id::32, rest::binary>>) do
    with {:ok, namespace, rest} <- cstring(rest),
         {:ok, name, <<identity, count::16, rest::binary>>}
         when identity in ~c"dnfi" and count <= @max_columns <- cstring(rest),
         {:ok, columns} <- columns(rest, count, []) do
      {:ok, {:relation, id, namespace, name, identity, columns}}
    else
      _ -> malformed(?R)
    end
  end

  def decode(<<?Y, oid::32, rest::binary>>) do
    with {:ok, namespace, rest} <- cstring(rest),
         {:ok, name, ""} <- cstring(rest) do
      {:ok, {:type, oid, namespace, name}}
    else
      _ -> malformed(?Y)
    end
  end

  def decode(<<?I, id::32, ?N, rest::binary>>) do
    case tuple(rest) do
      {:ok, tuple, ""} -> {:ok, {:insert, id, tuple}}
      _ -> malformed(?I)
    end
  end

  def decode(<<?U, id::32, kind, rest::binary>>) when kind in [?K, ?O] do
    with {:ok, old, <<?N, rest::binary>>} <- tuple(rest),
         {:ok, new, ""} <- tuple(rest) do
      {:ok, {:update, id, {old_kind(kind), old}, new}}
    else
      _ -> malformed(?U)
    end
  end

  def decode(<<?U, id::32, ?N, rest::binary>>) do
    case tuple(rest) do
      {:ok, new, ""} -> {:ok, {:update, id, nil, new}}
      _ -> malformed(?U)
    end
  end

  def decode(<<?D, id::32, kind, rest::binary>>) when kind in [?K, ?O] do
    case tuple(rest) do
      {:ok, old, ""} -> {:ok, {:delete, id, {old_kind(kind), old}}}
      _ -> malformed(?D)
    end
  end

  def decode(<<?T, count::32, options, rest::binary>>)
      when count > 0 and byte_size(rest) == 4 * count and options <= 3 do
    ids = for <<id::32 <- rest>>, do: id
    {:ok, {:truncate, ids, (options &&& 1) != 0, (options &&& 2) != 0}}
  end

  def decode(<<?M, flags, lsn::64, rest::binary>>) when flags in [0, 1] do
    with {:ok, prefix, <<length::32, content::binary>>} <- cstring(rest),
         true <- byte_size(content) == length do
      {:ok, {:message, flags == 1, lsn, prefix, content}}
    else
      _ -> malformed(?M)
    end
  end

  def decode(<<type, _::binary>>) when type in ~c"BCORYIUDTM", do: malformed(type)
  def decode(<<type, _::binary>>), do: {:error, {:unknown_pgoutput_message, type}}
  def decode(<<>>), do: {:error, :empty_pgoutput_message}

  defp malformed(type), do: {:error, {:malformed_pgoutput, type}}

  defp old_kind(?K), do: :key
  defp old_kind(?O), do: :old

  defp cstring(binary) do
    case :binary.match(binary, <<0>>) do
      {at, 1} ->
        <<string::binary-size(at), 0, rest::binary>> = binary
        {:ok, string, rest}

      :nomatch ->
        :error
    end
  end

  defp columns("", 0, acc), do: {:ok, Enum.reverse(acc)}
  defp columns(_rest, 0, _acc), do: :error

  defp columns(<<flags, rest::binary>>, n, acc) when flags in [0, 1] do
    with {:ok, name, <<type_oid::32, modifier::32-signed, rest::binary>>} <- cstring(rest) do
      columns(rest, n - 1, [{flags == 1, name, type_oid, modifier} | acc])
    end
  end

  defp columns(_rest, _n, _acc), do: :error

  # TupleData: a count, then per column 'n', 'u' or 't' + length + text.
  defp tuple(<<count::16, rest::binary>>) when count <= @max_columns,
    do: tuple_values(rest, count, [])

  defp tuple(_), do: :error

  defp tuple_values(rest, 0, acc), do: {:ok, Enum.reverse(acc), rest}
  defp tuple_values(<<?n, rest::binary>>, n, acc), do: tuple_values(rest, n - 1, [nil | acc])

  defp tuple_values(<<?u, rest::binary>>, n, acc),
    do: tuple_values(rest, n - 1, [:unchanged_toast | acc])

  defp tuple_values(<<?t, length::32, rest::binary>>, n, acc) when byte_size(rest) >= length do
    <<value::binary-size(length), rest::binary>> = rest
    tuple_values(rest, n - 1, [Protocol.detach(value) | acc])
  end

  defp tuple_values(_rest, _n, _acc), do: :error

  ## Folding into entries

  @doc "Folds one decoded message into `state` (see the contract above)."
  @spec handle(t(), tuple()) :: {:ok, term(), t()} | {:error, term()}
  def handle(%__MODULE__{tx: nil} = state, {:begin, final_lsn, _time, _xid}),
    do: {:ok, {:begin, final_lsn}, %{state | tx: final_lsn}}

  def handle(%__MODULE__{}, {:begin, _, _, _}), do: {:error, :begin_inside_transaction}

  def handle(%__MODULE__{tx: final_lsn} = state, {:commit, _flags, final_lsn, end_lsn, _time})
      when end_lsn >= final_lsn,
      do: {:ok, {:commit, final_lsn, end_lsn}, %{state | tx: nil}}

  def handle(%__MODULE__{tx: nil}, {:commit, _, _, _, _}),
    do: {:error, :commit_outside_transaction}

  def handle(%__MODULE__{}, {:commit, _, _, _, _}), do: {:error, :commit_lsn_mismatch}

  def handle(
        %__MODULE__{relations: relations} = state,
        {:relation, id, namespace, name, identity, columns}
      ) do
    if map_size(relations) >= @max_relations and not Map.has_key?(relations, id) do
      {:error, :too_many_relations}
    else
      relation = %{
        table: table_name(namespace, name),
        identity: identity,
        columns: Enum.map(columns, fn {_key?, column, _oid, _mod} -> column end),
        key: Enum.map(columns, fn {key?, _column, _oid, _mod} -> key? end)
      }

      {:ok, :none, %{state | relations: Map.put(relations, id, relation)}}
    end
  end

  def handle(state, {:type, _, _, _}), do: {:ok, :none, state}
  def handle(state, {:origin, _, _}), do: {:ok, :none, state}
  def handle(state, {:message, _, _, _, _}), do: {:ok, :ignored, state}

  def handle(%__MODULE__{tx: nil}, change)
      when elem(change, 0) in [:insert, :update, :delete, :truncate],
      do: {:error, {:change_outside_transaction, elem(change, 0)}}

  def handle(state, {:insert, id, tuple}) do
    with {:ok, relation} <- relation(state, id),
         {:ok, new} <- row(relation, tuple) do
      {:ok, {:changes, [%{"op" => "insert", "table" => relation.table, "new" => new}]}, state}
    end
  end

  def handle(state, {:update, id, old, tuple}) do
    with {:ok, relation} <- relation(state, id),
         {:ok, new} <- row(relation, tuple),
         {:ok, old} <- key(relation, old || {:new, tuple}) do
      entry = %{"op" => "update", "table" => relation.table, "new" => new, "old" => old}
      {:ok, {:changes, [entry]}, state}
    end
  end

  def handle(state, {:delete, id, old}) do
    with {:ok, relation} <- relation(state, id),
         {:ok, old} <- key(relation, old) do
      {:ok, {:changes, [%{"op" => "delete", "table" => relation.table, "old" => old}]}, state}
    end
  end

  def handle(state, {:truncate, ids, _cascade?, _restart?}) do
    Enum.reduce_while(ids, {:ok, []}, fn id, {:ok, acc} ->
      case relation(state, id) do
        {:ok, relation} ->
          {:cont, {:ok, [%{"op" => "truncate", "table" => relation.table} | acc]}}

        error ->
          {:halt, error}
      end
    end)
    |> case do
      {:ok, entries} -> {:ok, {:changes, Enum.reverse(entries)}, state}
      error -> error
    end
  end

  defp relation(state, id) do
    case Map.fetch(state.relations, id) do
      {:ok, relation} -> {:ok, relation}
      :error -> {:error, {:unknown_relation, id}}
    end
  end

  defp row(%{columns: columns}, tuple) do
    if length(tuple) == length(columns),
      do: {:ok, zip_map(columns, tuple, %{})},
      else: {:error, :tuple_column_count}
  end

  defp key(%{columns: columns, key: key}, {_kind, tuple}) do
    if length(tuple) == length(columns),
      do: {:ok, key_map(columns, key, tuple, %{})},
      else: {:error, :tuple_column_count}
  end

  defp zip_map([c | cs], [v | vs], acc), do: zip_map(cs, vs, Map.put(acc, c, v))
  defp zip_map([], [], acc), do: acc

  defp key_map([c | cs], [true | ks], [v | vs], acc), do: key_map(cs, ks, vs, Map.put(acc, c, v))
  defp key_map([_ | cs], [false | ks], [_ | vs], acc), do: key_map(cs, ks, vs, acc)
  defp key_map([], [], [], acc), do: acc

  # The protocol sends "" for pg_catalog.
  defp table_name("", name), do: "pg_catalog." <> name
  defp table_name(namespace, name), do: namespace <> "." <> name
end
