# The owner's pending invalidations: L2 writes whose outcome is unknown,
# recorded by the writers in an inbox the owner drains, and repaired by a
# worker process once the L2 answers again.
defmodule Larder.Cache.Repairs do
  @moduledoc false

  alias Larder.Cache.{Generation, Remote}

  # A put/4, delete/2 or invalidate_all/1 whose L2 write failed (a timeout
  # or a dropped connection: it may still land) leaves other nodes serving
  # what they hold. The caller records the key (or :all) here, and a worker
  # process repairs it once the L2 answers: for a key, DEL then PUBLISH; for
  # :all, INCR the generation then PUBLISH it. Each item carries the sequence
  # number of its latest failure, so a failure recorded while a repair is
  # running is not lost when that repair reports.
  #
  # Bounded work per failure, whatever the rate: a writer inserts its item
  # into the inbox, an ETS set of at most about @max_keys rows (one per
  # key, however often it fails; a new key beyond that is recorded as
  # :all), and wakes the owner only if no wake-up is on its way (an atomic
  # flag): the owner's mailbox holds at most one such message, and the
  # owner's work per wake-up is the inbox's rows. The owner clears the flag
  # before it drains, so an item inserted after a drain always wakes it.
  #
  # Retried after 100 ms, doubling while the L2 stays away up to 400 ms (so
  # a recovered L2 is noticed within that); items recorded while a retry
  # is scheduled wait for it (or for the subscription's return). More keys
  # than @max_keys degrade to one invalidate-all.
  @min_ms 100
  @max_ms 400
  @max_keys 1_000

  # The owner's state of them.
  def new, do: %{keys: %{}, all: nil, seq: 0, worker: nil, timer: nil, wait: @min_ms}

  @doc """
  The inbox writers record into and the owner drains, and the wake-up flag
  (fields of the cache's handle), made by the owner at its start.
  """
  def new_inbox do
    %{
      inbox: :ets.new(:larder_cache_repairs, [:set, :public, write_concurrency: true]),
      wake: :atomics.new(1, signed: false)
    }
  end

  @doc """
  Records that an L2 write of `item` (`{:key, key}` or `:all`) may or may
  not have happened, so that the owner deletes and publishes it once the
  L2 answers again. Any process; O(1) (an ETS insert and an atomic);
  never fails, never blocks. A cache that stopped meanwhile records
  nothing.
  """
  def record(rt, item) do
    :ets.insert(rt.inbox, {inbox_item(rt.inbox, item)})

    # one wake-up on its way at a time
    if :atomics.compare_exchange(rt.wake, 1, 0, 1) == :ok,
      do: send(rt.owner, :larder_cache_pending)

    :ok
  catch
    # the inbox went with the owner
    :error, :badarg -> :ok
  end

  defp inbox_item(_inbox, :all), do: :all

  defp inbox_item(inbox, {:key, _key} = item) do
    if :ets.info(inbox, :size) < @max_keys or :ets.member(inbox, item), do: item, else: :all
  end

  @doc """
  The owner was woken: clears the flag, then takes every item of the inbox
  (each row deleted as it was read, so an item written again meanwhile
  stays for the next wake-up) and adds it.
  """
  def drain(p, rt) do
    :atomics.put(rt.wake, 1, 0)

    rt.inbox
    |> :ets.tab2list()
    |> Enum.reduce(p, fn {item} = row, p ->
      :ets.delete_object(rt.inbox, row)
      add(p, rt, item)
    end)
  end

  # An item recorded (drained from the inbox, or the owner's own): adds it,
  # and repairs if it can.
  def add(p, rt, item) do
    seq = p.seq + 1

    p =
      case item do
        :all ->
          %{p | all: seq, keys: %{}, seq: seq}

        {:key, _key} when p.all != nil ->
          # an invalidate-all is pending: it covers every key
          %{p | seq: seq}

        {:key, key} when map_size(p.keys) >= @max_keys ->
          if Map.has_key?(p.keys, key),
            do: %{p | keys: Map.put(p.keys, key, seq), seq: seq},
            else: %{p | all: seq, keys: %{}, seq: seq}

        {:key, key} ->
          %{p | keys: Map.put(p.keys, key, seq), seq: seq}

        _other ->
          p
      end

    run(p, rt)
  end

  # Starts a worker on what is pending, unless one runs, a retry is
  # scheduled (the L2 did not answer the last one) or there is no L2.
  def run(%{worker: nil, timer: nil, keys: keys, all: all} = p, %{l2: {_, _}} = rt)
      when all != nil or map_size(keys) > 0 do
    snapshot = %{all: all, keys: Map.to_list(keys)}
    owner = self()
    {pid, ref} = spawn_monitor(fn -> send(owner, work(rt, snapshot)) end)
    %{p | worker: {pid, ref}}
  end

  def run(p, _rt), do: p

  # The retry timer fired.
  def retry(p, rt), do: run(%{p | timer: nil}, rt)

  # The subscription is back (the L2 answers): repair now, whatever the
  # backoff.
  def now(%{timer: timer} = p, rt) do
    if timer, do: Process.cancel_timer(timer)
    run(%{p | timer: nil, wait: @min_ms}, rt)
  end

  # The worker died before reporting: try again later.
  def worker_down(p), do: schedule(%{p | worker: nil})

  defp schedule(%{timer: nil} = p) do
    if p.all != nil or map_size(p.keys) > 0 do
      timer = Process.send_after(self(), :repair, p.wait)
      %{p | timer: timer, wait: min(p.wait * 2, @max_ms)}
    else
      p
    end
  end

  defp schedule(p), do: p

  # Runs in the worker: stops at the first failure (the L2 is still away).
  defp work(rt, %{all: all, keys: keys}) do
    all_result =
      case all do
        nil ->
          :none

        seq ->
          case repair_all(rt) do
            {:done, g} -> {:done, seq, g}
            {:generation, g} -> {:generation, g}
            {:failed, reason} -> {:failed, seq, reason}
          end
      end

    done =
      if all_result in [:none] or match?({:done, _, _}, all_result) do
        Enum.reduce_while(keys, [], fn {key, seq}, done ->
          if Remote.repair_key(rt, key),
            do: {:cont, [{key, seq} | done]},
            else: {:halt, done}
        end)
      else
        []
      end

    {:larder_cache_repaired, self(), %{all: all_result, keys: done}}
  end

  # INCR and PUBLISH of the generation ({:done, g}; {:generation, g} when
  # only the INCR went through), unless the L2 lost the generation key (an
  # INCR that Redis refused, a key that holds no generation, or one below
  # this node's generation): then a renewed generation, published, does
  # what the repair was for (Generation.read/1).
  defp repair_all(rt) do
    case Remote.repair_all(rt) do
      {tag, g} when tag in [:done, :generation] ->
        if g >= Generation.local(rt), do: {tag, g}, else: renewed(rt)

      {:failed, :l2_unavailable} = failed ->
        failed

      {:failed, _refused} ->
        renewed(rt)
    end
  end

  defp renewed(rt) do
    case Generation.read(rt) do
      {:ok, g, true} -> {:done, g}
      {:ok, g, false} -> {:generation, g}
      {:error, %Larder.Error{reason: reason}} -> {:failed, reason}
    end
  end

  # The worker reported what it repaired.
  def reported(p, rt, %{all: all_result, keys: done}) do
    {_pid, ref} = p.worker
    Process.demonitor(ref, [:flush])

    # the node moves to the generation the worker wrote (or read)
    all =
      case all_result do
        {:done, seq, g} ->
          Generation.adopt(rt, g)
          if p.all == seq, do: nil, else: p.all

        {:generation, g} ->
          Generation.adopt(rt, g)
          p.all

        _none_or_failed ->
          p.all
      end

    keys =
      Enum.reduce(done, p.keys, fn {key, seq}, keys ->
        if Map.get(keys, key) == seq, do: Map.delete(keys, key), else: keys
      end)

    # a generation that moved clears L1 here; L1 was cleared at the call too
    # progress (or nothing left) resets the backoff
    wait = if done != [] or match?({:done, _, _}, all_result), do: @min_ms, else: p.wait

    schedule(%{p | all: all, keys: keys, worker: nil, wait: wait})
  end
end
