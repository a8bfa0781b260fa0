# The Redis topologies of Larder's Redis client behind one interface: a
# single server, the master a Sentinel set names, or a Redis Cluster. Where
# a command goes (query/2), where a key lives now (locate/3, for one
# connection of its own), and the processes that keep the connections and
# the subscription (start_link/3), which speak their own messages to their
# subscriber.
defmodule Larder.Redis.Topology do
  @moduledoc false

  # Contract (internal).
  #
  # new/1 takes the client's connection options (Larder.Redis.Options,
  # already checked) with :pool_size, :reconnect_sleep and
  # :max_message_bytes, and makes the handle every call takes: a map with
  # :table (an ETS table owned by the caller, which outlives the
  # topology's processes: Larder.Redis.Table), :ref (the topology's id in
  # its messages), :kind (:server, :sentinel or :cluster), :pool_size,
  # :timeout and :opts. Its user may add keys (query/2 reads :deadline).
  #
  # start_link/3 starts the topology's manager, linked to the caller:
  # Topology.Server (one server, or the master a Sentinel set names) or
  # Topology.Cluster. The manager starts, linked to it, a Larder.Redis.Pool
  # of command connections per master and a Larder.Redis.PubSub per
  # subscription (the channel; with tracking, its report channel; with
  # Sentinel, one per sentinel), each of which reconnects on its own with
  # the one backoff (Larder.Backoff: :reconnect_sleep doubling up to
  # max(2 s, :reconnect_sleep)) and never exits because of a server. So
  # the topology's processes exit only when killed or on a bug: any of them
  # that exits takes the manager with it (exit reason {:shutdown, {role,
  # reason}}), and whoever supervises the manager starts it again. What
  # the subscriber gets then is a new first :subscribed. The manager's first
  # start for a handle (a row of its table) with a subscription checks on a
  # connection of its own that the server allows it (with tracking,
  # CLIENT ID and CLIENT TRACKING too); a refusal (see :refused below) is
  # `{:error, {:refused, props}}` from start_link/3, nothing left running.
  #
  # Messages to the subscriber, each `{:larder_redis, manager, ref, kind,
  # props}` (the shape of Redix.PubSub's):
  #
  #   :subscribed    %{}  the subscription is up (again), and with tracking
  #                  every command connection reports to it; also when
  #                  tracking is back after a time when no connection had
  #                  it. Whatever was published meanwhile was not heard.
  #   :disconnected  %{reason}  the subscription was lost, or the topology
  #                  moved to another master (reason :moved)
  #   :message       %{channel, payload}  a binary published on the channel
  #   :invalidated   %{keys}  tracking's report: a list of keys, :all (a
  #                  flush) or :bad (not what Redis sends)
  #   :failover      %{master}  a Sentinel failover of the master in use
  #                  has begun (what is read from it may be lost)
  #   :bad_event     %{from}  a sentinel's event that names no master
  #   :moved         %{from, to}  the topology moved to another master (a
  #                  promoted replica: it may hold older values); sent once
  #                  the command connections reach it
  #   :refused       %{server, user, command, reply, tracking}  the server
  #                  answers but refuses what the subscription needs: with
  #                  tracking, an error reply to its AUTH, CLIENT ID,
  #                  SUBSCRIBE or CLIENT TRACKING; without, a NOPERM reply
  #                  to SUBSCRIBE or SSUBSCRIBE (an ACL without the channel
  #                  or the command). Sent once, until the next :subscribed.
  #
  # query/2 runs one command on the connection its key's node (slot on a
  # cluster) and the caller's scheduler pick, within the handle's :timeout
  # (or by its :deadline): {:ok, reply}, or {:error, {:error_reply, text}}
  # (an error reply), {:error, {:unavailable, reason}} (no connection, a
  # lost one, a timeout, a cluster still down; reason in
  # Larder.Redis.Socket's vocabulary or ClusterRouter's), {:error,
  # {:bad_reply, reply}}. With Sentinel a READONLY reply or a lost
  # connection hints the manager to ask the sentinels again (one hint on
  # its way at a time); on a cluster, ClusterRouter follows redirects.

  alias Larder.Redis.{ClusterRouter, Connection, Sentinel, Socket, Table}
  alias Larder.Redis.Topology.{Cluster, Server}

  # Longest wait for a manager to start, beyond its connections' timeouts.
  @init_timeout 5_000
  # How long stop_linked/1 waits for each process before it kills it.
  @stop_ms 5_000

  @type t :: %{
          required(:table) => :ets.tid(),
          required(:ref) => reference(),
          required(:kind) => :server | :sentinel | :cluster,
          required(:pool_size) => pos_integer(),
          required(:timeout) => pos_integer(),
          required(:opts) => keyword(),
          optional(atom()) => term()
        }

  @doc "The handle of the topology `opts` name (see the contract). Starts no process."
  @spec new(keyword()) :: t()
  def new(opts) do
    kind =
      cond do
        opts[:cluster] -> :cluster
        opts[:sentinel] -> :sentinel
        true -> :server
      end

    table = :ets.new(:larder_redis_topology, [:set, :public, read_concurrency: true])

    unless kind == :cluster,
      do: for(slot <- 0..(opts[:pool_size] - 1), do: :ets.insert(table, {slot, :none}))

    %{
      table: table,
      ref: make_ref(),
      kind: kind,
      pool_size: opts[:pool_size],
      timeout: opts[:timeout],
      opts: opts
    }
  end

  @doc """
  Starts the manager of `topology`, linked to the caller, which gets its
  messages as `subscriber`. Options: `:channel` (the channel to subscribe
  to, or nil: no subscription), `:tracking` (a key prefix whose changes
  Redis reports, or nil). `{:ok, pid}`, `{:error, {:refused, props}}` (see
  the contract) or `{:error, reason}`.
  """
  @spec start_link(t(), pid(), keyword()) :: {:ok, pid()} | {:error, term()}
  def start_link(topology, subscriber, opts) do
    manager = if topology.kind == :cluster, do: Cluster, else: Server
    args = %{handle: topology, subscriber: subscriber, channel: opts[:channel]}
    args = Map.put(args, :tracking, opts[:tracking])
    timeout = @init_timeout + (topology.pool_size + 1) * topology.timeout
    GenServer.start_link(manager, args, timeout: timeout)
  end

  @doc "Runs `command` (see the contract)."
  @spec query(t(), [binary()]) ::
          {:ok, term()}
          | {:error, {:error_reply, binary()} | {:unavailable, term()} | {:bad_reply, term()}}
  def query(%{kind: :cluster} = topology, command), do: ClusterRouter.query(topology, command)

  def query(%{table: table, pool_size: size} = topology, command) do
    case time_left(topology) do
      left when left > 0 ->
        slot = rem(:erlang.system_info(:scheduler_id), size)
        [{_, client}] = :ets.lookup(table, slot)
        reply(topology, Connection.q(client, command, left))

      _passed ->
        {:error, {:unavailable, :timeout}}
    end
  catch
    # the table is gone (its owner stopped)
    :error, _ -> {:error, {:unavailable, :no_client}}
  end

  defp time_left(%{deadline: deadline}), do: deadline - System.monotonic_time(:millisecond)
  defp time_left(%{timeout: timeout}), do: timeout

  defp reply(_topology, {:ok, value}), do: {:ok, value}

  defp reply(topology, {:error, text}) when is_binary(text) do
    if match?("READONLY" <> _, text), do: hint(topology)
    {:error, {:error_reply, text}}
  end

  defp reply(topology, {:error, reason}) do
    hint(topology)
    {:error, {:unavailable, reason}}
  end

  # A READONLY reply or a lost connection: with Sentinel the master may
  # have moved; the manager asks the sentinels (at most once per
  # :reconnect_sleep). One hint on its way at a time (a row the manager
  # deletes as it takes it), so callers failing in a loop add nothing to
  # its mailbox.
  defp hint(%{kind: :sentinel, table: table}) do
    case :ets.lookup(table, :manager) do
      [{:manager, manager}] ->
        if :ets.insert_new(table, {:check_hinted, true}), do: send(manager, :check_master)

      [] ->
        :ok
    end
  end

  defp hint(_topology), do: :ok

  @doc """
  Where `key` lives now, for a connection of its own (a stream's reader):
  the server `opts` name, the master its Sentinel set names (checked with
  `ROLE`), or the master of the key's slot in a `CLUSTER SLOTS` of the
  first seed that answers, each asked within `timeout` ms. `{:ok, {host,
  port}}` or `{:error, reason}`: `{:sentinel, error}` (see
  Larder.Redis.Sentinel.describe/1) or `{:cluster, reason}`.
  """
  @spec locate(keyword(), binary(), pos_integer()) ::
          {:ok, {String.t(), 1..65_535}} | {:error, term()}
  def locate(opts, key, timeout) do
    auth = Socket.handshake(Keyword.take(opts, [:username, :password]))

    cond do
      opts[:sentinel] ->
        case Sentinel.master(opts[:sentinel], auth, timeout) do
          {:ok, address} -> {:ok, address}
          {:error, reason} -> {:error, {:sentinel, reason}}
        end

      opts[:cluster] ->
        case Cluster.locate(opts[:cluster], key, auth, timeout) do
          {:ok, address} -> {:ok, address}
          {:error, reason} -> {:error, {:cluster, reason}}
        end

      true ->
        {:ok, {opts[:host], opts[:port]}}
    end
  end

  @doc """
  Whether an error reply says the key is served by another node now, so
  that a connection of its own should locate it again: `MOVED` and `ASK`
  (a cluster's slot moved), `TRYAGAIN` and `CLUSTERDOWN` (a cluster
  changing), `READONLY` (the master is a replica now), `MASTERDOWN` (a
  replica that lost its master).
  """
  @spec relocate?(term()) :: boolean()
  def relocate?(text) when is_binary(text) do
    Enum.any?(~w(MOVED ASK TRYAGAIN CLUSTERDOWN READONLY MASTERDOWN), fn word ->
      String.starts_with?(text, word <> " ")
    end)
  end

  def relocate?(_other), do: false

  @doc """
  Stops processes a topology's manager started (linked) and returns once
  they are gone: each is unlinked and sent a `:shutdown` exit (a pool
  stops its connections first, a pub/sub connection at once), and killed
  if it is still alive 5 s (`@stop_ms`) later.
  """
  @spec stop_linked([pid()]) :: :ok
  def stop_linked(pids) do
    refs =
      for pid <- pids do
        Process.unlink(pid)
        ref = Process.monitor(pid)
        Process.exit(pid, :shutdown)
        {pid, ref}
      end

    for {pid, ref} <- refs do
      receive do
        {:DOWN, ^ref, :process, _, _} -> :ok
      after
        @stop_ms ->
          Process.exit(pid, :kill)
          receive do: ({:DOWN, ^ref, :process, _, _} -> :ok)
      end
    end

    :ok
  end

  @doc "How many command connections of the topology have ended."
  @spec ended_connections(t()) :: non_neg_integer()
  def ended_connections(%{table: table}), do: Table.counter(table, :ended_connections)

  @doc "How many CLUSTER SLOTS answers (or their entries) were not usable."
  @spec bad_replies(t()) :: non_neg_integer()
  def bad_replies(%{table: table}), do: Table.counter(table, :bad_replies)
end
