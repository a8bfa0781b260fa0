# The cache's configuration: its options, checked once (validate!/1, in the
# caller of start_link/1) with Larder.Options, and the struct the cache's
# process builds from them once (new/2), which every caller reads from
# :persistent_term.
defmodule Larder.Cache.Config do
  @moduledoc false

  alias Larder.Cache.{Expiry, Remote, Stats, Store}
  alias Larder.Options

  @enforce_keys [
    :name,
    :owner,
    :data,
    :index,
    :large,
    :waiters,
    :meta,
    :lock,
    :stats,
    :seq,
    :generation,
    :clock,
    :node_id,
    :prefix,
    :ttl,
    :max_entries,
    :max_bytes,
    :compression_level,
    :local_copy_min_bytes,
    :local_copy_max_bytes,
    :max_value_bytes,
    :telemetry
  ]
  defstruct [l2: nil, l2_child: nil, invalidation: :pubsub, codec: :term, key_prefix: ""] ++
              @enforce_keys

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
          invalidation: :pubsub | :tracking,
          codec: :term | :raw,
          key_prefix: binary(),
          l2: {module(), term()} | nil,
          l2_child: Supervisor.child_spec() | nil
        }

  # Upper bounds of the numeric options (documented in Larder.Cache.start_link/1).
  @max_ttl 3_153_600_000_000
  @max_bytes 1_125_899_906_842_624
  @max_entries 1_099_511_627_776
  @max_copy_bytes 1_099_511_627_776
  @max_version 9_223_372_036_854_775_807
  @max_string_bytes 1_024
  # A compressed term declares its size in 32 bits; a value above 1 GB is
  # not a cache value.
  @max_max_value_bytes 1_073_741_824

  @doc "The persistent_term key of a cache's config."
  def key(name), do: {Larder.Cache, name}

  @doc "Builds the config in the cache's process, from validate!/1's options."
  @spec new(keyword()) :: t()
  def new(opts) do
    tables = Store.new_tables(opts[:compressed])

    %__MODULE__{
      name: opts[:name],
      owner: self(),
      data: tables.data,
      index: tables.index,
      large: tables.large,
      waiters: tables.waiters,
      meta: tables.meta,
      lock: tables.lock,
      seq: tables.seq,
      stats: Stats.new(),
      generation: :atomics.new(1, signed: true),
      clock: Expiry.new_clock(),
      node_id: :crypto.strong_rand_bytes(16),
      prefix: Remote.prefix(opts[:namespace], opts[:version]),
      ttl: opts[:ttl],
      max_entries: opts[:max_entries],
      max_bytes: opts[:max_bytes],
      compression_level: opts[:compression_level],
      local_copy_min_bytes: opts[:local_copy_min_bytes],
      local_copy_max_bytes: opts[:local_copy_max_bytes],
      max_value_bytes: opts[:max_value_bytes],
      invalidation: opts[:invalidation],
      codec: opts[:codec],
      key_prefix: opts[:key_prefix],
      telemetry: Larder.Instance.telemetry?(opts[:telemetry])
    }
  end

  @doc "`put/4`'s ttl: its `ttl:` option, or the cache's."
  @spec put_ttl!(t(), keyword()) :: ttl()
  def put_ttl!(cfg, opts) do
    case opts do
      [] ->
        cfg.ttl

      [ttl: ttl] when ttl == :infinity or (is_integer(ttl) and ttl > 0 and ttl <= @max_ttl) ->
        ttl

      # Anything else takes the one option check: it raises for what it
      # refuses, and gives the first of a ttl given twice.
      _ ->
        opts
        |> Options.validate!(
          [ttl: {{:or_infinity, {:integer, 1, @max_ttl}}, cfg.ttl}],
          "Larder.Cache.put/4"
        )
        |> Keyword.fetch!(:ttl)
    end
  end

  @doc """
  Checks `start_link/1`'s options and returns them over the defaults;
  raises `ArgumentError` naming a bad one.
  """
  @spec validate!(keyword()) :: keyword()
  def validate!(opts) do
    opts = Options.validate!(opts, schema(), "Larder.Cache")

    if opts[:key_prefix] != "" and opts[:codec] != :raw do
      raise ArgumentError,
            "expected Larder.Cache option :key_prefix only with codec: :raw, got: " <>
              inspect(opts[:key_prefix], limit: 10, printable_limit: 100)
    end

    case opts[:l2] do
      {mod, l2_opts} ->
        Code.ensure_loaded(mod)

        unless function_exported?(mod, :init, 3) and function_exported?(mod, :get, 2) do
          raise ArgumentError, "expected :l2 module #{inspect(mod)} to implement Larder.Cache.L2"
        end

        if function_exported?(mod, :validate_opts!, 1),
          do: mod.validate_opts!(Remote.l2_opts(opts, l2_opts))

      nil ->
        if opts[:invalidation] == :tracking do
          raise ArgumentError, "expected an :l2 with invalidation: :tracking, got: l2: nil"
        end
    end

    opts
  end

  defp schema do
    [
      name: {:atom, :required},
      l2:
        {{:custom, "nil or {module, opts}",
          &(is_nil(&1) or match?({m, o} when is_atom(m) and is_list(o), &1))}, nil},
      ttl: {{:or_infinity, {:integer, 1, @max_ttl}}, :infinity},
      max_bytes: {{:or_infinity, {:integer, 1, @max_bytes}}, :infinity},
      max_entries: {{:or_infinity, {:integer, 1, @max_entries}}, :infinity},
      compressed: {:boolean, false},
      compression_level: {{:integer, 0, 9}, 1},
      # L2 value bounds (kept together; see the :max_value_bytes docs)
      max_value_bytes: {{:integer, 1024, @max_max_value_bytes}, 67_108_864},
      namespace: {{:string, 1, @max_string_bytes}, "larder"},
      version:
        {{:custom,
          "an integer of at most #{@max_version} in absolute value " <>
            "or a string of at most #{@max_string_bytes} bytes",
          &((is_integer(&1) and abs(&1) <= @max_version) or
              (is_binary(&1) and byte_size(&1) <= @max_string_bytes))}, 1},
      local_copy_min_bytes: {{:or_infinity, {:integer, 0, @max_copy_bytes}}, 65_536},
      local_copy_max_bytes: {{:integer, 0, @max_copy_bytes}, 67_108_864},
      telemetry: {:boolean, true},
      invalidation: {{:in, [:pubsub, :tracking]}, :pubsub},
      codec: {{:in, [:term, :raw]}, :term},
      key_prefix: {{:string, 0, @max_string_bytes}, ""}
    ]
  end
end
