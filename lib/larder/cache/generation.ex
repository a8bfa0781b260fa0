# The cache's generation, run by the owner (its only writer): the local
# copy every L2 key is built from, checked against the L2's generation key
# and moved to it, clearing L1 at every move.
defmodule Larder.Cache.Generation do
  @moduledoc false

  alias Larder.Cache.{Codec, Remote, Repairs, Store}

  # The L2's generation key is the truth, and the owner is the only writer
  # of the local copy (the atomic every L2 key is built from), so checks
  # and moves never interleave. A hint that the generation may have
  # changed (a peer's {:all, g}, this node's INCR, a (re)subscription, the
  # start, a repaired invalidate-all) makes it GET the key and adopt what
  # the L2 holds; a GET returns a value at least as new as any INCR already
  # published, so a delayed older message cannot pull a node back. A key
  # that is missing, not a generation, or below the local value means the
  # L2 lost it (FLUSHALL, a restart with no data, another program): the
  # node writes a fresh generation above every one it has used, max(local
  # + 1, the system time in ms), with SET NX if the key was missing (so
  # nodes that find it missing together agree), reads it back, adopts it and
  # publishes it so that the other nodes check too. Going back to a lower
  # value instead would reach generations whose L2 keys were written before
  # the loss. Every move clears L1, whose rows belong to the old generation.
  # An L2 error leaves the local value (counted) and the owner reads again
  # after a backoff (or at the next hint, whichever comes first).
  #
  # Every function here runs in the owner: the messages it sends itself
  # (:generation_failed, a pending :all) go to the owner.

  # The generation every L2 key is built from now.
  def local(rt), do: :atomics.get(rt.generation, 1)

  # Reads the L2's generation and moves to it: {:ok, generation,
  # published?} or {:error, %Larder.Error{}} (and :generation_failed is on
  # its way to the owner, which reads again later).
  def sync(%{l2: nil} = rt), do: {:ok, local(rt), false}

  def sync(rt) do
    local = local(rt)

    case Remote.read_generation(rt) do
      {:ok, g} when g >= local -> {:ok, adopt(rt, g), false}
      {:ok, _lower} -> renew(rt, local, :always, 2)
      :none -> renew(rt, local, :new, 2)
      :bad -> renew(rt, local, :always, 2)
      error -> l2_error(error)
    end
    |> retry_on_error()
  end

  # Owner.invalidate_all/2: moves to the next generation (a cache without
  # an L2) or to the L2's, and clears L1 either way.
  def invalidate_all(rt, how) do
    before = local(rt)

    reply =
      case how do
        :local -> {:ok, adopt(rt, min(before + 1, Codec.max_generation())), false}
        :incremented -> sync(rt)
        # Redis away: nothing to read, the pending repair will do it
        {:failed, :l2_unavailable} -> {:ok, before, false}
        # Redis answered, but not with a generation: check the key
        {:failed, _reason} -> sync(rt)
      end

    # a move cleared L1 already; a generation we had moved to still clears it
    if local(rt) == before, do: Store.clear(rt)
    reply
  end

  # The L2 is now another server, which may hold older values than were
  # acknowledged under this generation's keys (a replica promoted by a
  # failover, which had not received the last writes): the generation
  # moves past every one that server holds (INCR there, then the usual
  # check, which renews a key the server lost), so none of those keys is
  # read again, and the other nodes hear of it. :ok, or :pending when the
  # L2 did not answer (the owner repairs it as a pending invalidate-all:
  # an INCR and a publish, once the L2 answers). L1 is cleared first.
  def advance(rt) do
    Store.clear(rt)

    with {:ok, _incremented} <- Remote.incr_generation(rt),
         {:ok, g, published?} <- sync(rt),
         true <- published? or Remote.publish(rt, {:all, g}) == :ok do
      :ok
    else
      _failed -> :pending
    end
  end

  defp retry_on_error({:ok, _g, _published?} = ok), do: ok

  defp retry_on_error(error) do
    send(self(), :generation_failed)
    error
  end

  defp renew(rt, local, mode, attempts) do
    fresh = min(max(local + 1, System.os_time(:millisecond)), Codec.max_generation())

    with :ok <- Remote.write_generation(rt, fresh, mode),
         {:ok, g} when g >= local <- Remote.read_generation(rt) do
      adopt(rt, g)

      # the other nodes check too; if they cannot hear it now, the pending
      # invalidate-all makes them (an INCR and a publish, once the L2 answers)
      if Remote.publish(rt, {:all, g}) != :ok, do: Repairs.record(rt, :all)
      {:ok, g, true}
    else
      # another node wrote a lower value, or removed it again, meanwhile
      {:ok, _lower} when attempts > 1 -> renew(rt, local, :always, attempts - 1)
      :none when attempts > 1 -> renew(rt, local, :new, attempts - 1)
      :bad when attempts > 1 -> renew(rt, local, :always, attempts - 1)
      {:error, %Larder.Error{}} = error -> error
      other -> l2_error(other)
    end
  end

  defp l2_error({:error, %Larder.Error{}} = error), do: error

  defp l2_error(other) do
    {:error,
     Larder.Error.new(:l2_failed, "the L2 generation could not be read or renewed", got: other)}
  end

  defp adopt(rt, generation) do
    if generation != local(rt) do
      :atomics.put(rt.generation, 1, generation)
      Store.clear(rt)
    end

    generation
  end
end
