# The cache's generation: the local copy every L2 key is built from, which
# only the owner changes (adopt/2), moving forward to what the L2's
# generation key holds and clearing L1 at every move; and the L2 side of
# it (read/1, the key checked and renewed if lost), which runs in the
# process that needs it, never in the owner.
defmodule Larder.Cache.Generation do
  @moduledoc false

  alias Larder.Cache.{Codec, Remote, Repairs, Store}

  # The L2's generation key is the truth, and the owner is the only writer
  # of the local copy (the atomic every L2 key is built from). A hint that
  # the generation may have changed (a peer's {:all, g}, a
  # (re)subscription, the start, a repaired invalidate-all) makes a
  # process of the owner's (sync/1, a worker; one at a time) GET the key,
  # and the owner adopts what the L2 holds; this node's invalidate_all/1
  # adopts its own INCR's reply. Adopting only ever moves forward: a GET
  # returns a value at least as new as any INCR already published, so a
  # delayed older message, or an older read reported after a newer one,
  # cannot pull a node back. A key that is missing, not a generation, or
  # below the local value means the L2 lost it (FLUSHALL, a restart with no
  # data, another program): the reader writes a fresh generation above
  # every one the node has used, max(local + 1, the system time in ms),
  # with SET NX if the key was missing (so nodes that find it missing
  # together agree), reads it back, and publishes it so that the other
  # nodes check too; the owner adopts it. Going back to a lower value
  # instead would reach generations whose L2 keys were written before the
  # loss. Every move clears L1, whose rows belong to the old generation.
  # An L2 error leaves the local value (counted) and the owner reads again
  # after a backoff (or at the next hint, whichever comes first).
  #
  # The owner makes no L2 call: it adopts what readers report, so that a
  # slow or stopped Redis never holds up the owner's other work (the
  # clear invalidate_all/1 waits for, invalidations, repairs).

  # The generation every L2 key is built from now.
  def local(rt), do: :atomics.get(rt.generation, 1)

  # Reads the L2's generation, renewing it if the L2 lost it: {:ok,
  # generation, published?} (published? when it wrote a fresh one and
  # published it) or {:error, %Larder.Error{}}. Any process; the owner
  # then adopts it. Every L2 call meets rt's deadline (Remote.begin/1).
  def read(%{l2: nil} = rt), do: {:ok, local(rt), false}

  def read(rt) do
    local = local(rt)

    case Remote.read_generation(rt) do
      {:ok, g} when g >= local -> {:ok, g, false}
      {:ok, _lower} -> renew(rt, local, :always, 2)
      :none -> renew(rt, local, :new, 2)
      :bad -> renew(rt, local, :always, 2)
      error -> l2_error(error)
    end
  end

  # The owner only: moves the local generation to `g` if that is newer,
  # clearing L1. :moved, or :same (g is the local one, or older: a newer
  # one was adopted since g was read).
  def adopt(%{owner: owner} = rt, g) when owner == self() and is_integer(g) do
    if g > local(rt) do
      :atomics.put(rt.generation, 1, g)
      Store.clear(rt)
      :moved
    else
      :same
    end
  end

  # The owner only, for a cache without an L2: the next generation.
  def next_local(rt), do: adopt(rt, min(local(rt) + 1, Codec.max_generation()))

  # The L2 is now another server, which may hold older values than were
  # acknowledged under this generation's keys (a replica promoted by a
  # failover, which had not received the last writes): the generation
  # moves past every one that server holds (INCR there, then the usual
  # read, which renews a key the server lost), and the other nodes hear of
  # it. {:ok, g} for the owner to adopt, or :pending when the L2 did not
  # answer (the owner then records a pending invalidate-all: an INCR and a
  # publish, once the L2 answers). Any process.
  def advance(rt) do
    with {:ok, _incremented} <- Remote.incr_generation(rt),
         {:ok, g, published?} <- read(rt),
         true <- published? or Remote.publish(rt, {:all, g}) == :ok do
      {:ok, g}
    else
      _failed -> :pending
    end
  end

  ## The owner's reader: a process that reads (or advances) the
  ## generation for the owner, one at a time; hints that come while it
  ## runs make it run once more after. Its state, in the owner's:
  ## %{worker: {pid, ref} | nil, again?, advance? (the next run is an
  ## advance/1), waiting (callers the running read answers), queued
  ## (callers the next one answers)}.

  def new_reader, do: %{worker: nil, again: false, advance: false, waiting: [], queued: []}

  # A hint. With `from`, a caller (GenServer.call) waits until a read that
  # began after the hint is done and adopted (the L2 started); with
  # :advance, the next run is advance/1 (the L2 moved to another server).
  def sync(reader, rt, from \\ nil, how \\ :read) do
    reader = %{
      reader
      | queued: if(from, do: [from | reader.queued], else: reader.queued),
        advance: reader.advance or how == :advance
    }

    case reader do
      %{worker: nil} -> start(reader, rt)
      _running -> %{reader | again: true}
    end
  end

  defp start(reader, rt) do
    owner = self()
    how = if reader.advance, do: :advance, else: :read

    {pid, ref} =
      spawn_monitor(fn ->
        result = if how == :advance, do: advance(rt), else: read(rt)
        send(owner, {:larder_cache_generation, self(), how, result})
      end)

    %{
      reader
      | worker: {pid, ref},
        again: false,
        advance: false,
        waiting: reader.queued,
        queued: []
    }
  end

  # The reader reported `result` (or died: :died). Adopts what it read and
  # answers the callers that waited for it. {reader, outcome}: :ok, :failed
  # (the owner reads again after a backoff) or :pending (an advance the L2
  # did not answer: the owner records a pending invalidate-all).
  def reported(reader, rt, how, result) do
    {_pid, ref} = reader.worker
    Process.demonitor(ref, [:flush])

    outcome =
      case {how, result} do
        {:read, {:ok, g, _published?}} -> adopted(rt, g)
        {:advance, {:ok, g}} -> adopted(rt, g)
        {:advance, _pending_or_died} -> :pending
        {:read, _error_or_died} -> :failed
      end

    for from <- reader.waiting, do: GenServer.reply(from, :ok)
    reader = %{reader | worker: nil, waiting: []}
    reader = if reader.again or reader.advance, do: start(reader, rt), else: reader
    {reader, outcome}
  end

  defp adopted(rt, g) do
    adopt(rt, g)
    :ok
  end

  ## Renewal

  defp renew(rt, local, mode, attempts) do
    fresh = min(max(local + 1, System.os_time(:millisecond)), Codec.max_generation())

    with :ok <- Remote.write_generation(rt, fresh, mode),
         {:ok, g} when g >= local <- Remote.read_generation(rt) do
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
end
