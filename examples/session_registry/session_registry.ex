# A session registry after MongooseIM's session manager (ejabberd_sm), built
# on Larder.Table: sessions keyed by session id, an index on the user, and an
# info map merged on every create_session. The info representation is an
# option so the benchmark can compare maps with the proplists MongooseIM
# moved away from. Load it with Code.require_file/1; see README.md here.
defmodule SessionRegistry do
  @moduledoc """
  Sessions keyed by session id (`sid`), each `%{sid, user, resource,
  priority, info}`, in a `Larder.Table` indexed by `:user`.

      reg = SessionRegistry.new()
      :ok = SessionRegistry.create_session(reg, 1, "alice@host", "phone", 5, %{ip: {10, 0, 0, 1}})
      :ok = SessionRegistry.create_session(reg, 1, "alice@host", "phone", 5, %{auth: :sasl})
      SessionRegistry.get_info(reg, 1, :auth)
      #=> :sasl
      [%{info: %{auth: :sasl, ip: {10, 0, 0, 1}}}] = SessionRegistry.get_sessions(reg, "alice@host")
  """

  alias Larder.Table

  @enforce_keys [:table, :info]
  defstruct @enforce_keys

  @type t :: %__MODULE__{table: Table.t(), info: :map | :proplist}
  @type info :: map() | [{term(), term()}]

  @doc """
  A registry owned by the caller. Options: `:info` - `:map` (default) or
  `:proplist`, how each session's info is kept.
  """
  @spec new(keyword()) :: t()
  def new(opts \\ []) do
    unless is_list(opts) and Keyword.keyword?(opts),
      do: raise(ArgumentError, "expected options to be a keyword list, got: #{inspect(opts)}")

    # Unknown or repeated keys: Keyword.validate!/2 raises ArgumentError.
    info = Keyword.validate!(opts, info: :map)[:info]

    unless info in [:map, :proplist] do
      raise ArgumentError, "expected option :info to be :map or :proplist, got: #{inspect(info)}"
    end

    %__MODULE__{table: Table.new(key: :sid, index: [:user]), info: info}
  end

  @doc """
  Opens or refreshes a session. When `sid` exists, `info` is merged into its
  info (new values win), as MongooseIM's `merge_info` does. The read, the
  merge and the write are one `Larder.Table.update/4` step, so concurrent
  calls for one `sid` each keep their info keys.
  """
  @spec create_session(t(), term(), term(), term(), integer(), info()) :: :ok
  def create_session(%__MODULE__{} = reg, sid, user, resource, priority, info) do
    kind = reg.info

    new = session(sid, user, resource, priority, normalize(kind, info))

    Table.update(reg.table, sid, new, fn %{info: old} ->
      session(sid, user, resource, priority, merge_info(kind, old, info))
    end)
  end

  defp session(sid, user, resource, priority, info),
    do: %{sid: sid, user: user, resource: resource, priority: priority, info: info}

  @doc "Every session of `user`, through the index."
  @spec get_sessions(t(), term()) :: [map()]
  def get_sessions(%__MODULE__{} = reg, user), do: Table.search(reg.table, user: user)

  @doc "One value of a session's info, or `nil`."
  @spec get_info(t(), term(), term()) :: term()
  def get_info(%__MODULE__{} = reg, sid, key) do
    case Table.get(reg.table, sid) do
      %{info: info} -> lookup(reg.info, info, key)
      nil -> nil
    end
  end

  @doc "Closes a session."
  @spec close_session(t(), term()) :: :ok
  def close_session(%__MODULE__{} = reg, sid), do: Table.delete(reg.table, sid)

  @doc "Bytes held by the registry's table and index."
  @spec memory(t()) :: non_neg_integer()
  def memory(%__MODULE__{} = reg), do: Table.memory(reg.table)

  ## The two info representations

  @doc "Looks `key` up in an info map or proplist."
  @spec lookup(:map | :proplist, info(), term()) :: term()
  def lookup(:map, info, key), do: Map.get(info, key)

  def lookup(:proplist, info, key) do
    case List.keyfind(info, key, 0) do
      {_, value} -> value
      nil -> nil
    end
  end

  @doc "Merges `new` into `old`; `new` wins (MongooseIM's merge_info)."
  @spec merge_info(:map | :proplist, info(), info()) :: info()
  def merge_info(:map, old, new), do: Map.merge(old, Map.new(new))
  # What MongooseIM did with proplists: sort both by key, merge keeping New's.
  def merge_info(:proplist, old, new),
    do: :lists.ukeymerge(1, List.keysort(normalize(:proplist, new), 0), List.keysort(old, 0))

  defp normalize(:map, info), do: Map.new(info)

  defp normalize(:proplist, info),
    do: info |> Enum.to_list() |> List.keysort(0) |> Enum.uniq_by(&elem(&1, 0))
end
