# The cache's options, checked once (validate!/1, in the caller of
# start_link/1) with Larder.Options, and put/4's ttl. The handle a running
# cache is called through is Larder.Cache.Runtime.
defmodule Larder.Cache.Config do
  @moduledoc false

  alias Larder.Cache.Remote
  alias Larder.Options

  @type ttl :: pos_integer() | :infinity

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

  @doc "`put/4`'s ttl: its `ttl:` option, or the cache's."
  @spec put_ttl!(Larder.Cache.Runtime.t(), keyword()) :: ttl()
  def put_ttl!(rt, opts) do
    case opts do
      [] ->
        rt.ttl

      [ttl: ttl] when ttl == :infinity or (is_integer(ttl) and ttl > 0 and ttl <= @max_ttl) ->
        ttl

      # Anything else takes the one option check: it raises for what it
      # refuses, and gives the first of a ttl given twice.
      _ ->
        opts
        |> Options.validate!(
          [ttl: {{:or_infinity, {:integer, 1, @max_ttl}}, rt.ttl}],
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
