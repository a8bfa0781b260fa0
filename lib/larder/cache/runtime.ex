# The handle of a running cache: its tables, lock, counters and atomics, its
# L2's state and the validated options every call needs, built once by the
# cache's process (the owner) at start and published in :persistent_term,
# where every call looks it up by the cache's name.
defmodule Larder.Cache.Runtime do
  @moduledoc false

  alias Larder.Instance

  require Larder.Instance

  # Taken from the validated options as they are.
  @options [
    :name,
    :ttl,
    :max_entries,
    :max_bytes,
    :compression_level,
    :local_copy_min_bytes,
    :local_copy_max_bytes,
    :max_value_bytes
  ]
  @defaulted_options [invalidation: :pubsub, codec: :term, key_prefix: ""]

  @enforce_keys @options ++
                  [:owner, :data, :index, :large, :waiters, :meta, :lock, :stats, :seq] ++
                  [:generation, :clock, :deaths, :node_id, :prefix, :telemetry] ++
                  [:inbox, :wake, :l1_off]
  defstruct [l2: nil, l2_child: nil, hit: nil, deadline: nil] ++
              @defaulted_options ++ @enforce_keys

  @type ttl :: pos_integer() | :infinity

  @type t :: %__MODULE__{
          name: atom(),
          owner: pid(),
          data: :ets.tid(),
          index: :ets.tid(),
          large: :ets.tid(),
          waiters: :ets.tid(),
          meta: :ets.tid(),
          lock: Larder.Lock.t(),
          stats: :counters.counters_ref(),
          seq: :atomics.atomics_ref(),
          generation: :atomics.atomics_ref(),
          clock: :atomics.atomics_ref(),
          deaths: :atomics.atomics_ref(),
          node_id: <<_::128>>,
          prefix: binary(),
          ttl: ttl(),
          max_entries: pos_integer() | :infinity,
          max_bytes: pos_integer() | :infinity,
          compression_level: 0..9,
          local_copy_min_bytes: non_neg_integer() | :infinity,
          local_copy_max_bytes: non_neg_integer(),
          max_value_bytes: pos_integer(),
          telemetry: boolean(),
          inbox: :ets.tid(),
          wake: :atomics.atomics_ref(),
          l1_off: :atomics.atomics_ref(),
          invalidation: :pubsub | :tracking,
          codec: :term | :raw,
          key_prefix: binary(),
          l2: {module(), term()} | nil,
          l2_child: Supervisor.child_spec() | nil,
          deadline: integer() | nil,
          hit: {:ets.tid(), :atomics.atomics_ref(), :counters.counters_ref()} | nil
        }

  @doc """
  The handle, in the cache's process, from `Larder.Cache.Config.validate!/1`'s
  options and the parts that process built (the Store's tables and lock,
  the counters, the clock, the L2 key prefix, the repairs' inbox). The
  L2's state is added by
  `Larder.Cache.Remote.start/2`.
  """
  @spec new(keyword(), map()) :: t()
  def new(opts, parts) do
    opts
    |> new_struct(parts)
    |> with_hit()
  end

  defp new_struct(opts, parts) do
    struct!(
      __MODULE__,
      opts
      |> Keyword.take(@options ++ Keyword.keys(@defaulted_options))
      |> Map.new()
      |> Map.merge(parts)
      |> Map.merge(%{
        owner: self(),
        generation: :atomics.new(1, signed: true),
        # the VM-wide count of structure deaths (Larder.LocalCopies)
        deaths: Larder.LocalCopies.deaths(),
        node_id: :crypto.strong_rand_bytes(16),
        # :telemetry is looked for once, here, at start (never at compile time).
        telemetry: Instance.telemetry?(opts[:telemetry])
      })
    )
  end

  # `hit` is what an L1 hit reads (Larder.Cache.Loader.read/3), the data
  # table, the clock and the counters, in one small tuple: matching one key
  # of this 30-key map instead of four scans fewer of its keys and touches
  # fewer cache lines. nil when the cache emits telemetry, whose hits take
  # the traced way.
  defp with_hit(%__MODULE__{telemetry: false} = rt),
    do: %{rt | hit: {rt.data, rt.clock, rt.stats}}

  defp with_hit(rt), do: rt

  @doc """
  Whether the cache of handle `rt` has stopped: its tables went with its
  owner. A read that ETS refused on them is then the unknown-cache error.
  """
  @spec stopped?(t()) :: boolean()
  def stopped?(%__MODULE__{data: data}), do: :ets.info(data, :id) == :undefined

  @doc "Publishes the handle through `Larder.Instance` (the owner, once it is complete)."
  @spec publish(t()) :: :ok
  def publish(%__MODULE__{name: name} = rt), do: Instance.publish(Larder.Cache, name, rt)

  @doc "Withdraws the handle `rt` (the owner, as it stops); a newer one stays."
  @spec withdraw(t()) :: :ok
  def withdraw(%__MODULE__{name: name} = rt), do: Instance.release(Larder.Cache, name, rt, self())

  @doc "The handle of the running cache `name`, or nil."
  @spec get(atom()) :: t() | nil
  def get(name), do: Instance.lookup(Larder.Cache, name)
end
