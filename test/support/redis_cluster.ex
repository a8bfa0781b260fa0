# Starts a throwaway Redis Cluster: six redis-server nodes (three masters,
# three replicas) on free loopback ports, joined with `redis-cli --cluster
# create`, and drives failovers, reshards, kills and pauses for the tests
# and the benchmarks. Not part of the library.
defmodule Larder.Test.RedisCluster do
  @moduledoc false

  alias Larder.Test.RedisServer

  defstruct nodes: []

  @node_timeout_ms 2_000

  @doc """
  Starts six nodes and forms the cluster, then waits until every node says
  `cluster_state:ok` and agrees on the slots. Every node is killed when the
  caller exits, even if the VM dies (see `Larder.Test.RedisServer`).

  `:node_timeout` is `cluster-node-timeout` in ms (default #{@node_timeout_ms}).
  """
  def start(opts \\ []) do
    node_timeout = Keyword.get(opts, :node_timeout, @node_timeout_ms)
    ports = cluster_ports(6)

    nodes =
      Enum.map(ports, fn port ->
        dir = tmp_dir(port)
        File.mkdir_p!(dir)

        RedisServer.start(
          port: port,
          dir: dir,
          args:
            ~w(--cluster-enabled yes --cluster-config-file #{Path.join(dir, "nodes.conf")}) ++
              ~w(--cluster-node-timeout #{node_timeout})
        )
      end)

    addresses = Enum.map(ports, &"127.0.0.1:#{&1}")

    {out, status} =
      redis_cli(
        ["--cluster", "create" | addresses] ++ ~w(--cluster-replicas 1 --cluster-yes),
        60_000
      )

    if status != 0, do: raise("redis-cli --cluster create failed: #{out}")
    cluster = %__MODULE__{nodes: nodes}
    wait_ok(cluster)
    cluster
  end

  @doc "The seed addresses, `[{\"127.0.0.1\", port}, ...]`, as the L2 option takes them."
  def seeds(%__MODULE__{nodes: nodes}), do: Enum.map(nodes, &{"127.0.0.1", &1.port})

  @doc "The nodes that are masters now (asked with `ROLE`; unreachable nodes are left out)."
  def masters(%__MODULE__{nodes: nodes}), do: Enum.filter(nodes, &(role(&1) == "master"))

  @doc "The nodes that are replicas now (asked with `ROLE`)."
  def replicas(%__MODULE__{nodes: nodes}), do: Enum.filter(nodes, &(role(&1) == "slave"))

  @doc "The node's role: `\"master\"`, `\"slave\"` or nil when it does not answer."
  def role(%RedisServer{} = node) do
    case cli(node, ["ROLE"]) do
      {:ok, [role | _]} -> role
      _ -> nil
    end
  end

  @doc "The node's cluster id (`CLUSTER MYID`)."
  def node_id(%RedisServer{} = node) do
    {:ok, [id]} = cli(node, ~w(CLUSTER MYID))
    id
  end

  @doc "The master a replica follows (from its `ROLE`), as a node of the cluster."
  def master_of(%__MODULE__{nodes: nodes}, %RedisServer{} = replica) do
    {:ok, ["slave", _host, port | _]} = cli(replica, ["ROLE"])
    Enum.find(nodes, &(Integer.to_string(&1.port) == port))
  end

  @doc """
  `CLUSTER FAILOVER` on `replica` (a coordinated, lossless promotion), then
  waits until it is a master and the cluster is ok again. Returns the old
  master.
  """
  def failover(%__MODULE__{} = cluster, %RedisServer{} = replica, timeout \\ 20_000) do
    old = master_of(cluster, replica)

    # A replica still in its first sync (which its master starts only after
    # repl-diskless-sync-delay, 5 s) cannot reach the master's offset within
    # a manual failover's 5 s: each CLUSTER FAILOVER then aborts, and a
    # cluster just formed on a loaded machine used up `timeout` that way.
    # The timeout counts from the end of that sync.
    await_link_up(replica, System.monotonic_time(:millisecond) + 60_000)
    deadline = System.monotonic_time(:millisecond) + timeout

    # Redis aborts a manual failover whose replica has not reached the
    # master's offset within its own timeout (5 s), and says nothing: asked
    # again until the replica is a master or `timeout` has passed.
    RedisServer.wait_until(timeout, "#{replica.port} to become a master", fn ->
      role(replica) == "master" or promote(replica, deadline)
    end)

    wait_ok(cluster, timeout)
    old
  end

  # One CLUSTER FAILOVER, then up to 7 s (or the deadline) for it to end.
  # (An error answer, such as a replica promoted meanwhile: the caller
  # looks at its role again.)
  defp promote(replica, deadline) do
    with {:ok, ["OK"]} <- cli(replica, ~w(CLUSTER FAILOVER)) do
      wait = min(7_000, max(deadline - System.monotonic_time(:millisecond), 0))

      try do
        RedisServer.wait_until(wait, "a manual failover", fn -> role(replica) == "master" end)
      rescue
        RuntimeError -> false
      end
    else
      _ -> false
    end
  end

  @doc """
  Moves `slots` slots from master `from` to master `to` with `redis-cli
  --cluster reshard` (non-interactive), then waits until the cluster is ok
  and every node agrees. Returns `:ok`.
  """
  def reshard(%__MODULE__{} = cluster, %RedisServer{} = from, %RedisServer{} = to, slots) do
    args =
      ["--cluster", "reshard", "127.0.0.1:#{from.port}"] ++
        ~w(--cluster-from #{node_id(from)} --cluster-to #{node_id(to)}) ++
        ~w(--cluster-slots #{slots} --cluster-yes)

    {out, status} = redis_cli(args, 120_000)
    if status != 0, do: raise("redis-cli --cluster reshard failed: #{out}")
    wait_ok(cluster)
  end

  @doc """
  Starts moving `slot` from master `from` to master `to` by hand and stops
  halfway, as a reshard does between its steps: `to` is IMPORTING, `from`
  is MIGRATING, no key has moved yet. Keys that are no longer on `from`
  then get `ASK`. Go on with `migrate_keys/4` and `finish_migration/3`.
  """
  def begin_migration(%__MODULE__{}, slot, %RedisServer{} = from, %RedisServer{} = to) do
    s = Integer.to_string(slot)
    {:ok, ["OK"]} = cli(to, ~w(CLUSTER SETSLOT #{s} IMPORTING #{node_id(from)}))
    {:ok, ["OK"]} = cli(from, ~w(CLUSTER SETSLOT #{s} MIGRATING #{node_id(to)}))
    :ok
  end

  @doc """
  Moves every key of `slot` from `from` to `to` (`MIGRATE ... KEYS`);
  returns how many. Spoken in RESP, not through `redis-cli`: the tests
  write keys with any bytes (NUL, CR LF), which a command line or
  `redis-cli`'s line-per-key output would mangle into keys of other slots.
  """
  def migrate_keys(%__MODULE__{}, slot, %RedisServer{} = from, %RedisServer{} = to) do
    case RedisServer.request(from, ~w(CLUSTER GETKEYSINSLOT #{slot} 100000)) do
      {:ok, []} ->
        0

      {:ok, keys} ->
        port = Integer.to_string(to.port)
        migrate = ["MIGRATE", "127.0.0.1", port, "", "0", "5000", "KEYS" | keys]
        {:ok, "OK"} = RedisServer.request(from, migrate)
        length(keys)
    end
  end

  @doc """
  Gives `slot` to master `to` on every master (`CLUSTER SETSLOT ... NODE`),
  `to` first as the Redis Cluster spec orders it (so `to` bumps its config
  epoch before any other node hears of the move), which ends a migration,
  and waits until the cluster is ok.
  """
  def finish_migration(%__MODULE__{} = cluster, slot, %RedisServer{} = to) do
    id = node_id(to)

    for master <- [to | List.delete(masters(cluster), to)] do
      {:ok, ["OK"]} = cli(master, ~w(CLUSTER SETSLOT #{slot} NODE #{id}))
    end

    wait_ok(cluster)
  end

  @doc "How many slots `master` serves, in its own `CLUSTER NODES` view."
  def slot_count(%RedisServer{} = master) do
    {:ok, lines} = cli(master, ~w(CLUSTER NODES))

    lines
    |> Enum.find(&String.contains?(&1, "myself"))
    |> String.split(" ")
    |> Enum.drop(8)
    |> Enum.map(fn range ->
      case String.split(range, "-") do
        [a, b] -> String.to_integer(b) - String.to_integer(a) + 1
        ["[" <> _] -> 0
        [_] -> 1
      end
    end)
    |> Enum.sum()
  end

  # A node is killed, paused and resumed with RedisServer.kill/1, pause/1
  # and resume/1: it is a %RedisServer{}.

  @doc """
  Waits until the replica of `master` is in sync with it, then SIGKILLs
  `master`, as a crash would (no `CLUSTER FAILOVER`: the dead node
  answers nothing), calls `after_kill` (e.g. to start timing puts),
  then waits until its replica says it is a master (the cluster's own
  promotion) and every other node says `cluster_state:ok`, each polled
  every 10 ms. Returns the replica and the monotonic times, in
  microseconds, of the kill, the promotion and the ok.
  """
  def kill_master(
        %__MODULE__{nodes: nodes} = cluster,
        %RedisServer{} = master,
        after_kill \\ fn -> :ok end,
        timeout \\ 60_000
      ) do
    replica =
      Enum.find(replicas(cluster), &(master_of(cluster, &1).port == master.port)) ||
        raise "#{master.port} has no replica"

    deadline = System.monotonic_time(:millisecond) + timeout

    # A replica that has not finished its first sync is never promoted
    # ("Disconnected from master for longer than allowed"): on a loaded
    # machine that sync can take seconds after the cluster says ok.
    await_link_up(replica, deadline)

    killed_at = System.monotonic_time(:microsecond)
    :ok = RedisServer.kill(master)
    after_kill.()

    promoted_at =
      poll(deadline, "#{replica.port} to be promoted", fn ->
        String.starts_with?(RedisServer.command(replica, ["ROLE"]), "*3\r\n$6\r\nmaster")
      end)

    live = Enum.reject(nodes, &(&1.port == master.port))

    ok_at =
      poll(deadline, "cluster_state:ok on every live node", fn ->
        Enum.all?(live, &(RedisServer.command(&1, ~w(CLUSTER INFO)) =~ "cluster_state:ok"))
      end)

    %{replica: replica, killed_at: killed_at, promoted_at: promoted_at, ok_at: ok_at}
  end

  # Waits until the replica's link to its master is up (its first sync done).
  defp await_link_up(replica, deadline) do
    poll(deadline, "#{replica.port} to be in sync with its master", fn ->
      RedisServer.command(replica, ~w(INFO replication)) =~ "master_link_status:up"
    end)
  end

  # When `fun` first holds (monotonic us), polled every 10 ms.
  defp poll(deadline, what, fun) do
    cond do
      fun.() ->
        System.monotonic_time(:microsecond)

      System.monotonic_time(:millisecond) > deadline ->
        raise "timed out waiting for #{what}"

      true ->
        Process.sleep(10)
        poll(deadline, what, fun)
    end
  end

  @doc "Kills every node and removes their dirs."
  def stop(%__MODULE__{nodes: nodes}) do
    Enum.each(nodes, &RedisServer.stop/1)
  end

  @doc """
  Waits until every reachable node says `cluster_state:ok` and
  `redis-cli --cluster check` finds the slots covered and agreed on.
  """
  def wait_ok(%__MODULE__{nodes: nodes} = cluster, timeout \\ 30_000) do
    RedisServer.wait_until(timeout, "the cluster to be ok", fn ->
      live = Enum.filter(nodes, &alive?/1)

      Enum.all?(live, fn node ->
        match?({:ok, ["cluster_state:ok" | _]}, cli(node, ~w(CLUSTER INFO)))
      end) and check_ok?(cluster, live)
    end)

    :ok
  end

  @doc "Runs one command on `node` with redis-cli: `{:ok, lines}` or `{:error, output}`."
  def cli(%RedisServer{port: port}, args) do
    case redis_cli(["-p", Integer.to_string(port) | args], 2_000) do
      {out, 0} ->
        lines = out |> String.split(["\r\n", "\n"], trim: true)

        case lines do
          ["ERR" <> _ | _] -> {:error, out}
          _ -> {:ok, lines}
        end

      {out, _} ->
        {:error, out}
    end
  end

  # Six ports P, each with P + 10000 (its cluster bus) free too.
  defp cluster_ports(n), do: cluster_ports(n, MapSet.new(), [])

  defp cluster_ports(0, _taken, acc), do: Enum.reverse(acc)

  defp cluster_ports(n, taken, acc) do
    port = RedisServer.free_port()
    bus = port + 10_000

    if bus <= 65_535 and free?(bus) and not MapSet.member?(taken, port) and
         not MapSet.member?(taken, bus) do
      cluster_ports(n - 1, taken |> MapSet.put(port) |> MapSet.put(bus), [port | acc])
    else
      cluster_ports(n, taken, acc)
    end
  end

  defp free?(port) do
    case :gen_tcp.listen(port, ip: {127, 0, 0, 1}) do
      {:ok, socket} ->
        :gen_tcp.close(socket)
        true

      {:error, _} ->
        false
    end
  end

  defp alive?(%RedisServer{os_pid: pid}) do
    match?({_, 0}, System.cmd("kill", ["-0", Integer.to_string(pid)], stderr_to_stdout: true))
  end

  defp check_ok?(_cluster, []), do: false

  defp check_ok?(_cluster, [node | _]) do
    case redis_cli(["--cluster", "check", "127.0.0.1:#{node.port}"], 10_000) do
      {out, 0} -> not String.contains?(out, "[ERR]") and not String.contains?(out, "[WARNING]")
      _ -> false
    end
  end

  # redis-cli under coreutils' timeout: a paused node never answers.
  defp redis_cli(args, timeout_ms) do
    cli = System.find_executable("redis-cli") || raise "redis-cli is not installed"
    secs = Float.to_string(timeout_ms / 1_000)
    System.cmd("timeout", ["-s", "KILL", secs, cli | args], stderr_to_stdout: true)
  end

  defp tmp_dir(port) do
    Path.join(System.tmp_dir!(), "larder-cluster-#{port}-#{System.unique_integer([:positive])}")
  end
end
