# The L2 as the cache sees it: the only caller of the L2 module. It builds
# the L2 keys (namespace, version, generation, key) and the channel, encodes
# and checks what goes and comes back (through Codec), and counts every L2
# failure in one place (failed/2).
defmodule Larder.Cache.Remote do
  @moduledoc false

  alias Larder.Cache.{Codec, ExternalTerm, Stats}
  alias Larder.Telemetry

  ## Keys

  def prefix(namespace, version), do: "#{namespace}:#{version}"

  def generation_key(rt), do: rt.prefix <> ":gen"

  def channel(rt), do: rt.prefix <> ":invalidate"

  # What the L2 tracks with invalidation: :tracking: with codec :term every
  # key of this namespace and version, whatever its generation (the
  # generation key too); with codec :raw the keys under :key_prefix.
  def tracking_prefix(:raw, key_prefix, _namespace, _version), do: key_prefix

  def tracking_prefix(:term, _key_prefix, namespace, version),
    do: prefix(namespace, version) <> ":"

  # The L2's options, plus the prefix it tracks when the cache asks for
  # invalidation: :tracking (from start_link/1's validated options or a cache's handle).
  def l2_opts(%{invalidation: :tracking} = rt, l2_opts) do
    prefix = if rt.codec == :raw, do: rt.key_prefix, else: rt.prefix <> ":"
    [{:tracking_prefix, prefix} | l2_opts]
  end

  def l2_opts(%{invalidation: _}, l2_opts), do: l2_opts

  def l2_opts(opts, l2_opts) when is_list(opts) do
    if opts[:invalidation] == :tracking do
      prefix = tracking_prefix(opts[:codec], opts[:key_prefix], opts[:namespace], opts[:version])
      [{:tracking_prefix, prefix} | l2_opts]
    else
      l2_opts
    end
  end

  # A key Redis reported changed (invalidation: :tracking): {:ok, key} for a
  # key of the current generation, :other for the generation key or another
  # generation's key (nothing in L1 to drop), :bad for anything else.
  def tracked_key(%{codec: :raw, key_prefix: prefix}, l2_key) do
    size = byte_size(prefix)

    case l2_key do
      <<^prefix::binary-size(size), key::binary>> -> {:ok, key}
      _ -> :bad
    end
  end

  def tracked_key(rt, l2_key) do
    size = byte_size(rt.prefix)

    with <<prefix::binary-size(size), ?:, rest::binary>> when prefix == rt.prefix <- l2_key,
         [generation, encoded] <- :binary.split(rest, ":") do
      if generation == Integer.to_string(:atomics.get(rt.generation, 1)),
        do: decode_key(rt, encoded),
        else: if(digits?(generation), do: :other, else: :bad)
    else
      ["gen"] -> :other
      _ -> :bad
    end
  end

  defp decode_key(_cfg, "b:" <> key), do: {:ok, key}

  defp decode_key(rt, "t:" <> bin) do
    case Codec.decode_value(bin, rt.max_value_bytes) do
      {:ok, key} -> {:ok, key}
      {:error, _} -> :bad
    end
  end

  defp decode_key(_cfg, _other), do: :bad

  defp digits?(bin), do: bin != "" and bin =~ ~r/\A[0-9]{1,19}\z/

  # codec: :raw: exactly :key_prefix <> key, no generation (another
  # program's keys).
  def l2_key(%{codec: :raw} = rt, key), do: rt.key_prefix <> key

  def l2_key(rt, key) do
    generation = :atomics.get(rt.generation, 1)
    [rt.prefix, ?:, Integer.to_string(generation), ?: | encode_key(key)] |> IO.iodata_to_binary()
  end

  # A key of an L2-backed cache goes to the other nodes in its invalidation
  # message, which they check like an L2 value (no fun, at most
  # :max_value_bytes): a key they would refuse is refused here, with an
  # ArgumentError, before anything is written. Called on every put/4 and
  # delete/2 and on an L1 miss (such a key never gets into L1), never on a
  # hit. Keys that cannot hold a fun skip the encoding.
  def check_key!(%{codec: :raw} = rt, key) do
    unless is_binary(key) do
      raise ArgumentError,
            "expected key to be a binary (the cache's codec is :raw), got: #{inspect(key, limit: 10)}"
    end

    if byte_size(key) > rt.max_value_bytes do
      raise ArgumentError,
            "expected key to take at most :max_value_bytes (#{rt.max_value_bytes}), " <>
              "got #{byte_size(key)} bytes"
    end

    :ok
  end

  def check_key!(%{l2: nil}, _key), do: :ok

  def check_key!(_cfg, key)
      when is_binary(key) or is_atom(key) or is_integer(key) or is_float(key) or is_pid(key) or
             is_reference(key) or is_port(key),
      do: :ok

  def check_key!(rt, key) do
    case ExternalTerm.check(:erlang.term_to_binary(key, [:deterministic]), rt.max_value_bytes) do
      {:ok, _plain} ->
        :ok

      {:error, :fun} ->
        raise ArgumentError,
              "expected key to hold no fun in a cache with an L2 (other nodes refuse " <>
                "invalidations that carry one), got: #{inspect(key, limit: 10)}"

      {:error, _too_large} ->
        raise ArgumentError,
              "expected key to take at most :max_value_bytes (#{rt.max_value_bytes}) in a " <>
                "cache with an L2, got: #{inspect(key, limit: 10, printable_limit: 100)}"
    end
  end

  # Binary keys stay readable in redis-cli; other terms are encoded
  # deterministically so equal keys map to one L2 key.
  defp encode_key(key) when is_binary(key), do: ["b:", key]
  defp encode_key(key), do: ["t:", :erlang.term_to_binary(key, [:deterministic])]

  ## Lifecycle (the cache's process)

  # {:ok, rt with its l2 state (and the child spec of its processes, which
  # the cache's L2Runner starts)} or {:error, %Larder.Error{}}.
  def start(rt, nil), do: {:ok, %{rt | l2: nil}}

  def start(rt, {mod, l2_opts}) do
    case mod.init(l2_opts(rt, l2_opts), self(), channel(rt)) do
      {:ok, state} ->
        {:ok, %{rt | l2: {mod, state}}}

      {:ok, state, child_spec} ->
        {:ok, %{rt | l2: {mod, state}, l2_child: child_spec}}

      other ->
        {:error, Larder.Error.new(:l2_failed, "the L2 did not start", returned: other)}
    end
  catch
    kind, reason ->
      {:error, Larder.Error.new(:l2_failed, "the L2 did not start", kind: kind, reason: reason)}
  end

  def stop(%{l2: {mod, state}}) do
    mod.stop(state)
  catch
    _, _ -> :ok
  end

  def stop(_cfg), do: :ok

  ## A call's deadline
  #
  # One call of the cache (a fetch/3, put/4, delete/2, invalidate_all/1)
  # makes its L2 calls with the rt begin/1 returns: with an L2 that exports
  # deadline/2 (Larder.Cache.L2, "Deadlines"), its state carries the call's
  # deadline, which every L2 call of it meets; rt.deadline holds it. A
  # loader's time is not the L2's: pause/1 before it, resume/2 after.

  def begin(%{l2: {mod, state}} = rt) do
    if function_exported?(mod, :deadline, 2) do
      {state, deadline} = mod.deadline(state, nil)
      %{rt | l2: {mod, state}, deadline: deadline}
    else
      rt
    end
  end

  def begin(rt), do: rt

  # What is left of the call's deadline (ms), or nil without one.
  def pause(%{deadline: nil}), do: nil
  def pause(%{deadline: deadline}), do: deadline - System.monotonic_time(:millisecond)

  # The call's deadline, `left` ms from now (what pause/1 said was left).
  def resume(rt, nil), do: rt

  def resume(%{l2: {mod, state}} = rt, left) do
    {state, deadline} = mod.deadline(state, System.monotonic_time(:millisecond) + left)
    %{rt | l2: {mod, state}, deadline: deadline}
  end

  ## Calls

  # {:ok, value} | :miss | :corrupt | :error | :none (no L2). Whatever the
  # L2 returns is checked: a value that is corrupt, too large for
  # :max_value_bytes or holds a fun is a miss plus a decode error (and the
  # load replaces it); a reply of the wrong shape is an L2 error.
  def get(%{l2: nil}, _key), do: :none

  def get(%{l2: {mod, state}} = rt, key) do
    case mod.get(state, l2_key(rt, key)) do
      {:ok, bin} when is_binary(bin) ->
        case decode(rt, bin) do
          {:ok, value} ->
            Stats.count(rt, :l2_hits)
            {:ok, value}

          :error ->
            Stats.count(rt, :l2_misses)
            Stats.count(rt, :decode_errors)
            failed(rt, :bad_value)
            rejected(rt)
        end

      :miss ->
        Stats.count(rt, :l2_misses)
        :miss

      other ->
        failed(rt, other)
        :error
    end
  end

  # codec: :raw: the bytes as they are, within :max_value_bytes.
  defp decode(%{codec: :raw} = rt, bin),
    do: if(byte_size(bin) <= rt.max_value_bytes, do: {:ok, bin}, else: :error)

  defp decode(rt, bin) do
    case Codec.decode_value(bin, rt.max_value_bytes) do
      {:ok, value} -> {:ok, value}
      {:error, _why} -> :error
    end
  end

  # A rejected raw value is another program's: a miss, so that the load's
  # SET NX leaves it in place. A rejected term is corrupt: the load
  # replaces it.
  defp rejected(%{codec: :raw}), do: :miss
  defp rejected(_cfg), do: :corrupt

  # A value whose encoding is over :max_value_bytes would be rejected by
  # every reader: it is not written, and the key is deleted instead so no
  # older value stays behind.
  def put(%{l2: nil}, _key, _value, _ttl, _mode), do: :ok

  def put(%{l2: {mod, state}} = rt, key, value, ttl, mode) do
    bin = if rt.codec == :raw, do: value, else: Codec.encode_value(value, rt.compression_level)
    l2_key = l2_key(rt, key)

    if byte_size(bin) > rt.max_value_bytes,
      do: ok(rt, mod.delete(state, l2_key)),
      else: ok(rt, mod.put(state, l2_key, bin, ttl, mode))
  end

  def delete(%{l2: nil}, _key), do: :ok
  def delete(%{l2: {mod, state}} = rt, key), do: ok(rt, mod.delete(state, l2_key(rt, key)))

  # Publishes an invalidation ({:key, key} or {:all, generation}).
  def publish(%{l2: nil}, _message), do: :ok

  def publish(%{l2: {_mod, _state}} = rt, message) do
    case raw_publish(rt, message) do
      :ok -> sent(rt, message)
      other -> failed(rt, other)
    end
  end

  defp sent(rt, message) do
    Telemetry.execute(rt.telemetry, [:larder, :cache, :invalidation, :sent], %{count: 1}, %{
      cache: rt.name,
      message: message
    })
  end

  # Increments the namespace's generation: {:ok, generation} or an error.
  def incr_generation(%{l2: {mod, state}} = rt) do
    case generation(mod.incr(state, generation_key(rt))) do
      {:ok, generation} ->
        {:ok, generation}

      {:bad, reply} ->
        error =
          Larder.Error.new(:l2_bad_reply, "INCR of the generation key gave a bad reply",
            reply: reply
          )

        failed(rt, {:error, error})

      other ->
        failed(rt, other)
    end
  end

  # The generation stored in the L2: {:ok, generation}, :none (no key),
  # :bad (a key that holds no generation: counted as a decode error) or
  # {:error, %Larder.Error{}} (counted as an L2 error).
  def read_generation(%{l2: {mod, state}} = rt) do
    case generation(mod.get(state, generation_key(rt))) do
      {:ok, generation} ->
        {:ok, generation}

      {:bad, _reply} ->
        Stats.count(rt, :decode_errors)
        :bad

      :miss ->
        :none

      other ->
        failed(rt, other)
    end
  end

  # An L2 answer that holds a generation: {:ok, generation}, {:bad, reply}
  # when it holds something else, or the answer as it is (a miss, an error).
  defp generation({:ok, reply}) do
    case Codec.parse_generation(reply) do
      {:ok, generation} -> {:ok, generation}
      :error -> {:bad, reply}
    end
  end

  defp generation(other), do: other

  # Writes `generation` into the generation key, only if the key is absent
  # with mode :new: :ok or {:error, %Larder.Error{}} (counted).
  def write_generation(%{l2: {mod, state}} = rt, generation, mode) do
    ok(rt, mod.put(state, generation_key(rt), Integer.to_string(generation), :infinity, mode))
  end

  # The L2 refuses to report changes (invalidation: :tracking): an L2
  # error, counted and reported.
  def tracking_refused(rt, %Larder.Error{} = error), do: failed(rt, {:error, error})
  def tracking_refused(rt, _other), do: failed(rt, :tracking_refused)

  # A process the L2 linked to the cache's process died.
  def process_died(rt) do
    failed(rt, :process_died)

    Telemetry.execute(
      rt.telemetry,
      [:larder, :cache, :l2, :disconnected],
      %{system_time: System.system_time()},
      %{cache: rt.name, reason: :process_died}
    )
  end

  ## Repairs (a worker of the cache's process)
  #
  # A repair retries what already failed and was counted: its own failures
  # are not counted again.

  # Bumps and publishes the generation: {:done, g}, {:generation, g} (bumped,
  # not published) or {:failed, reason} (the reason of the L2's error, or
  # :l2_bad_reply for an INCR reply that is not a generation).
  def repair_all(%{l2: {mod, state}} = rt) do
    with {:ok, g} <- mod.incr(state, generation_key(rt)),
         {:ok, g} <- Codec.parse_generation(g) do
      if raw_publish(rt, {:all, g}) == :ok,
        do: sent_done(rt, g),
        else: {:generation, g}
    else
      {:error, %Larder.Error{reason: reason}} -> {:failed, reason}
      _bad_reply -> {:failed, :l2_bad_reply}
    end
  end

  # Deletes and publishes key: true when both went through.
  def repair_key(%{l2: {mod, state}} = rt, key) do
    mod.delete(state, l2_key(rt, key)) == :ok and raw_publish(rt, {:key, key}) == :ok and
      sent(rt, {:key, key}) == :ok
  end

  defp sent_done(rt, g) do
    sent(rt, {:all, g})
    {:done, g}
  end

  defp raw_publish(%{l2: {mod, state}} = rt, message),
    do: mod.publish(state, channel(rt), Codec.encode_message(rt.node_id, message))

  ## Failures

  defp ok(_cfg, :ok), do: :ok
  defp ok(rt, other), do: failed(rt, other)

  # The one place L2 failures are counted. Returns the error callers give
  # back: the L2's own {:error, %Larder.Error{}}, or :l2_bad_reply for a
  # return value outside the behaviour.
  defp failed(rt, result) do
    Stats.count(rt, :l2_errors)

    {reason, error} =
      case result do
        {:error, %Larder.Error{reason: reason}} = error ->
          {reason, error}

        why when why in [:bad_value, :process_died, :tracking_refused] ->
          {why, nil}

        other ->
          {:l2_bad_reply,
           {:error,
            Larder.Error.new(
              :l2_bad_reply,
              "the L2 returned a value its behaviour does not allow",
              returned: other
            )}}
      end

    Telemetry.execute(rt.telemetry, [:larder, :cache, :l2, :error], %{count: 1}, %{
      cache: rt.name,
      reason: reason
    })

    error
  end
end
