# The write actions (put/4, delete/2, invalidate_all/1), beside the read
# action (Loader): L1 first (Store, then Eviction), then the L2 and the
# other nodes (Remote); an L2 write whose outcome is unknown is handed to
# the owner's repairs (Repairs), and invalidate_all/1's clear and
# generation move to the owner.
defmodule Larder.Cache.Writes do
  @moduledoc false

  alias Larder.Cache.{Config, Eviction, Expiry, Owner, Remote, Repairs, Store}
  alias Larder.Telemetry

  def put(rt, key, value, opts) do
    ttl = Config.put_ttl!(rt, opts)
    Remote.check_key!(rt, key)

    if rt.codec == :raw and not is_binary(value) do
      raise ArgumentError,
            "expected value to be a binary (the cache's codec is :raw), got: " <>
              inspect(value, limit: 10)
    end

    span(rt, :put, key, fn ->
      Store.write(rt, key, value, Expiry.expires_at(ttl))
      Eviction.evict(rt)
      tell_others(rt, key, Remote.put(rt, key, value, ttl, :always))
    end)
  end

  def delete(rt, key) do
    Remote.check_key!(rt, key)

    span(rt, :delete, key, fn ->
      Store.delete(rt, key)
      tell_others(rt, key, Remote.delete(rt, key))
    end)
  end

  # After the L2 write of key: the invalidation for the other nodes.
  defp tell_others(rt, key, l2_result) do
    with :ok <- l2_result,
         :ok <- Remote.publish(rt, {:key, key}) do
      :ok
    else
      error -> unknown_outcome(rt, {:key, key}, error)
    end
  end

  def invalidate_all(%{l2: nil} = rt) do
    {:ok, _generation, _published?} = Owner.invalidate_all(rt, :local)
    :ok
  end

  def invalidate_all(rt) do
    case Remote.incr_generation(rt) do
      {:ok, _incremented} ->
        # the owner moves to the L2's generation (checked, as every
        # hint is) and clears L1 before it answers
        case Owner.invalidate_all(rt, :incremented) do
          {:ok, _generation, true} -> :ok
          {:ok, generation, false} -> publish_all(rt, generation)
          error -> unknown_outcome(rt, :all, error)
        end

      {:error, %Larder.Error{reason: reason}} = error ->
        # L1 is cleared either way; an INCR that Redis refused (a key
        # that holds no generation) makes the owner write a fresh one,
        # which moves every node like a successful call would
        case Owner.invalidate_all(rt, {:failed, reason}) do
          {:ok, _generation, true} -> :ok
          _not_renewed -> unknown_outcome(rt, :all, error)
        end
    end
  end

  defp publish_all(rt, generation) do
    case Remote.publish(rt, {:all, generation}) do
      :ok -> :ok
      error -> unknown_outcome(rt, :all, error)
    end
  end

  # An L2 write that failed may still land (a timeout) or may have left the
  # old value (a dropped connection): the owner deletes and publishes the
  # key (or bumps and publishes the generation) once the L2 answers again.
  defp unknown_outcome(rt, item, {:error, %Larder.Error{}} = error) do
    Repairs.record(rt, item)
    error
  end

  defp span(%{telemetry: false}, _op, _key, fun), do: fun.()

  defp span(rt, op, key, fun) do
    meta = %{cache: rt.name, key: key}

    Telemetry.span(true, [:larder, :cache, op], meta, fn ->
      case fun.() do
        :ok = ok -> {ok, Map.put(meta, :result, :ok)}
        {:error, error} = result -> {result, Map.merge(meta, %{result: :error, error: error})}
      end
    end)
  end
end
