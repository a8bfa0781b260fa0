# The write actions (put/4, delete/2, invalidate_all/1), beside the read
# action (Loader): L1 first (Store, then Eviction), then the L2 and the
# other nodes (Remote); an L2 write whose outcome is unknown is handed to
# the owner's repairs (Repairs), and invalidate_all/1's clear and
# generation move to the owner (after its L2 calls, made here).
defmodule Larder.Cache.Writes do
  @moduledoc false

  alias Larder.Cache.{Config, Eviction, Expiry, Generation, Owner, Remote, Repairs, Store}
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
      # one deadline for the call's L2 write and its publish
      rt = Remote.begin(rt)
      Store.write(rt, key, value, Expiry.expires_at(ttl))
      Eviction.evict(rt)
      tell_others(rt, key, Remote.put(rt, key, value, ttl, :always))
    end)
  end

  def delete(rt, key) do
    Remote.check_key!(rt, key)

    span(rt, :delete, key, fn ->
      rt = Remote.begin(rt)
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

  def invalidate_all(%{l2: nil} = rt), do: Owner.invalidate_all(rt, :local)

  # INCR, then the owner moves to that generation and clears L1 (no L2
  # call in the owner), then PUBLISH: every L2 call of it within one
  # deadline.
  def invalidate_all(rt) do
    rt = Remote.begin(rt)

    case Remote.incr_generation(rt) do
      {:ok, g} ->
        if g >= Generation.local(rt) do
          :ok = Owner.invalidate_all(rt, g)
          publish_all(rt, g)
        else
          # the key was lost and INCR made it anew, below the generations
          # this node used: a fresh one, above them
          renew_all(rt, nil)
        end

      {:error, %Larder.Error{reason: :l2_unavailable}} = error ->
        # L1 is cleared either way; nothing to read: the pending repair
        # bumps and publishes the generation once the L2 answers
        :ok = Owner.invalidate_all(rt, nil)
        unknown_outcome(rt, :all, error)

      {:error, %Larder.Error{}} = error ->
        # Redis answered, but not with a generation (a key that holds
        # none): a fresh one, published, moves every node as a successful
        # call would
        renew_all(rt, error)
    end
  end

  # Generation.read/1 renews a lost generation key (and publishes it).
  defp renew_all(rt, incr_error) do
    case Generation.read(rt) do
      {:ok, g, true} ->
        :ok = Owner.invalidate_all(rt, g)
        :ok

      {:ok, g, false} ->
        :ok = Owner.invalidate_all(rt, g)
        if incr_error, do: unknown_outcome(rt, :all, incr_error), else: publish_all(rt, g)

      {:error, %Larder.Error{}} = read_error ->
        :ok = Owner.invalidate_all(rt, nil)
        unknown_outcome(rt, :all, incr_error || read_error)
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
