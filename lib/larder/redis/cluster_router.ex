# Cluster slot routing of the Redis client, the callers' side: a command
# goes to the pool of the master that serves its key's slot (the
# topology's table), and follows MOVED, ASK, TRYAGAIN and CLUSTERDOWN within the
# caller's :timeout.
defmodule Larder.Redis.ClusterRouter do
  @moduledoc false

  # Contract (internal).
  #
  # query/2 takes a map with :table (the topology's table), :pool_size
  # and :timeout (ms), and optionally :deadline (a monotonic time in ms,
  # shared by every query of one call of its user: each query then ends
  # by it instead of :timeout from its start). The table (written by the
  # cluster's manager and the masters' pools, but for the hint row) holds
  # `{slot, {host, port}}` for every slot a master serves and
  # `{{host, port, i}, pid | :none}` for the i-th client of each master's
  # pool, and `{:refresh_hinted, true}` while a caller's hint to refresh
  # the map is on its way (a caller sends one only when it inserts that
  # row; the manager deletes it as it takes the hint). A command costs one
  # CRC16 of its key and two ETS lookups.
  #
  # Redirects: MOVED hints the manager to refresh its map (it does so at most
  # once per :reconnect_sleep) and sends the command to the named node; ASK
  # sends `ASKING` then the command, pipelined on one connection of the named
  # node; TRYAGAIN, CLUSTERDOWN, a slot no master serves yet and a named node
  # the manager has no pool for yet are retried after a wait (5 ms, doubling
  # to 100 ms) while the caller's deadline allows. At most @max_hops MOVED
  # or ASK are followed. Every wait and every call is bounded by what is
  # left of the caller's :timeout (or :deadline), so no caller waits longer
  # than :timeout (or past :deadline).
  #
  # Results, in the client's vocabulary (the user of the client turns them
  # into its own errors): {:ok, reply}; {:error, {:error_reply, text}} for
  # an error reply that is not a redirect (as Connection.q/3's
  # {:error, text} on one server); {:error, {:unavailable, reason}} for a
  # lost connection, a call past the deadline, a redirect loop
  # ({:too_many_redirects, text}), no table (:no_client) or a cluster
  # still down when the deadline comes (the last TRYAGAIN/CLUSTERDOWN
  # text, :no_master or :unknown_node); {:error, {:bad_reply, reply}} for
  # a reply to ASKING then the command that is not what Redis sends.

  alias Larder.Redis.Connection
  alias Larder.Redis.Cluster

  @max_hops 5
  @first_wait_ms 5
  @max_wait_ms 100

  @doc """
  Runs `command` (its second word is the key or channel that routes it) on
  the cluster: `{:ok, reply}` or `{:error, reason}` (see the contract
  above). `PUBLISH` is sent as `SPUBLISH` (sharded pub/sub).
  """
  @spec query(map(), [binary()]) ::
          {:ok, term()}
          | {:error, {:error_reply, binary()} | {:unavailable, term()} | {:bad_reply, term()}}
  def query(%{timeout: timeout} = state, [name, key | args]) do
    command = if name == "PUBLISH", do: ["SPUBLISH", key | args], else: [name, key | args]

    deadline =
      case state do
        %{deadline: deadline} -> deadline
        _ -> System.monotonic_time(:millisecond) + timeout
      end

    route(state, command, Cluster.slot(key), deadline, 0, 0)
  end

  # By the slot map.
  defp route(%{table: table} = state, command, slot, deadline, hops, waits) do
    case :ets.lookup(table, slot) do
      [{_, node}] -> send_to(state, command, slot, node, false, deadline, hops, waits)
      [] -> wait(state, command, slot, deadline, hops, waits, :no_master)
    end
  catch
    # the table is gone (its owner stopped)
    :error, _ -> {:error, {:unavailable, :no_client}}
  end

  defp send_to(state, command, slot, {host, port} = node, asking?, deadline, hops, waits) do
    i = rem(:erlang.system_info(:scheduler_id), state.pool_size)

    case :ets.lookup(state.table, {host, port, i}) do
      [{_, client}] when is_pid(client) ->
        left = deadline - System.monotonic_time(:millisecond)

        if left > 0 do
          reply = call(client, command, asking?, left)
          handle(reply, state, command, slot, node, deadline, hops, waits)
        else
          {:error, {:unavailable, :timeout}}
        end

      [{_, :none}] ->
        # the pool is replacing that connection
        {:error, {:unavailable, :no_connection}}

      [] ->
        # a node the manager does not know yet (a new master): it learns it
        # from its next CLUSTER SLOTS
        hint(state)
        wait(state, command, slot, deadline, hops, waits, :unknown_node)
    end
  end

  defp call(client, command, true, timeout) do
    case Connection.qp(client, [["ASKING"], command], timeout) do
      [{:ok, "OK"}, reply] -> reply
      [{:error, _} = error, _] -> error
      {:error, _} = error -> error
      other -> {:bad, other}
    end
  end

  defp call(client, command, false, timeout), do: Connection.q(client, command, timeout)

  defp handle({:ok, value}, _state, _command, _slot, _node, _deadline, _hops, _waits),
    do: {:ok, value}

  defp handle({:error, reason}, state, command, slot, {host, _}, deadline, hops, waits)
       when is_binary(reason) do
    case Cluster.redirect(reason, host) do
      {:moved, _slot, to} ->
        hint(state)
        hop(state, command, slot, to, false, deadline, hops, waits, reason)

      {:ask, _slot, to} ->
        hop(state, command, slot, to, true, deadline, hops, waits, reason)

      :tryagain ->
        wait(state, command, slot, deadline, hops, waits, reason)

      :clusterdown ->
        wait(state, command, slot, deadline, hops, waits, reason)

      :other ->
        {:error, {:error_reply, reason}}
    end
  end

  defp handle({:error, reason}, state, _command, _slot, _node, _deadline, _hops, _waits) do
    # a lost connection: the master may have failed over
    hint(state)
    {:error, {:unavailable, reason}}
  end

  defp handle({:bad, other}, _state, _command, _slot, _node, _deadline, _hops, _waits),
    do: {:error, {:bad_reply, other}}

  defp hop(_state, _command, _slot, _to, _asking?, _deadline, hops, _waits, reason)
       when hops >= @max_hops,
       do: {:error, {:unavailable, {:too_many_redirects, reason}}}

  defp hop(state, command, slot, to, asking?, deadline, hops, waits, _reason),
    do: send_to(state, command, slot, to, asking?, deadline, hops + 1, waits)

  # A short wait, then the slot map again, while the deadline allows.
  defp wait(state, command, slot, deadline, hops, waits, reason) do
    pause = min(@first_wait_ms * Integer.pow(2, min(waits, 10)), @max_wait_ms)

    if System.monotonic_time(:millisecond) + pause < deadline do
      Process.sleep(pause)
      route(state, command, slot, deadline, hops, waits + 1)
    else
      {:error, {:unavailable, reason}}
    end
  end

  # The manager refreshes its slot map, at most once per :reconnect_sleep
  # however many callers hint it; one hint is on its way at a time (a row
  # the manager deletes as it takes it), so callers failing in a loop add
  # nothing to its mailbox.
  defp hint(%{table: table}) do
    case :ets.lookup(table, :manager) do
      [{:manager, manager}] ->
        if :ets.insert_new(table, {:refresh_hinted, true}), do: send(manager, :refresh)

      [] ->
        :ok
    end
  catch
    :error, _ -> :ok
  end
end
