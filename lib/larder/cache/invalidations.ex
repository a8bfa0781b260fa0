# What the owner hears from the L2, applied to L1: the invalidations other
# nodes publish, Redis's own reports of changed keys (invalidation:
# :tracking), and the connection events. All of it is untrusted: checked,
# counted, never fatal.
defmodule Larder.Cache.Invalidations do
  @moduledoc false

  alias Larder.Cache.{Codec, Remote, Stats, Store}
  alias Larder.Telemetry

  # A message on the cache's channel: :ok, or {:all, generation} for a
  # peer's invalidate_all/1, a hint the owner checks against the L2.
  def message(rt, payload) do
    node_id = rt.node_id

    case Codec.decode_message(payload, rt.max_value_bytes) do
      {:ok, ^node_id, _message} ->
        :ok

      {:ok, _other_node, {:key, key} = message} ->
        Stats.count(rt, :invalidations)
        Store.delete(rt, key)
        received(rt, message)

      {:ok, _other_node, {:all, _generation} = message} ->
        Stats.count(rt, :invalidations)
        received(rt, message)
        message

      :error ->
        Stats.count(rt, :bad_messages)
    end
  end

  # Redis's own report of changed keys, from any writer, this node
  # included. :all is FLUSHDB or FLUSHALL: nothing L1 holds is in Redis any
  # more.
  def tracked(rt, :all) do
    Stats.count(rt, :invalidations)
    Store.clear(rt)
    received(rt, :flush)
  end

  def tracked(rt, keys) when is_list(keys) do
    bad? =
      Enum.reduce(keys, false, fn l2_key, bad? ->
        case is_binary(l2_key) && Remote.tracked_key(rt, l2_key) do
          {:ok, key} ->
            Stats.count(rt, :invalidations)
            Store.delete(rt, key)
            received(rt, {:key, key})
            bad?

          :other ->
            bad?

          _bad ->
            true
        end
      end)

    if bad?, do: Stats.count(rt, :bad_messages)
    :ok
  end

  def tracked(rt, _bad), do: Stats.count(rt, :bad_messages)

  # The L2's connection went down or came back.
  def connection(rt, event, meta) do
    Telemetry.execute(
      rt.telemetry,
      [:larder, :cache, :l2, event],
      %{system_time: System.system_time()},
      Map.put(meta, :cache, rt.name)
    )
  end

  defp received(rt, message) do
    Telemetry.execute(rt.telemetry, [:larder, :cache, :invalidation, :received], %{count: 1}, %{
      cache: rt.name,
      message: message
    })
  end
end
