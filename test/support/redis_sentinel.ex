# Starts a throwaway Sentinel set: a master, a replica and three sentinels
# (`redis-server --sentinel`) on free loopback ports, with a 1 s
# down-after-milliseconds, and drives kills, pauses and failovers for the
# tests and the benchmarks. Not part of the library.
defmodule Larder.Test.RedisSentinel do
  @moduledoc false

  alias Larder.Test.RedisCluster
  alias Larder.Test.RedisServer

  defstruct [:name, :data, :sentinels]

  @name "mymaster"

  @doc """
  Starts the master, its replica and three sentinels (quorum 2), and waits
  until every sentinel knows the master, the replica and the two other
  sentinels. Every process is killed when the caller exits, even if the VM
  dies.

  Options: `:name` (default #{inspect(@name)}), `:down_after` (ms, default
  1000), `:failover_timeout` (ms, default 5000), `:data_args` (more
  command-line words for both data nodes, default none).
  """
  def start(opts \\ []) do
    name = Keyword.get(opts, :name, @name)
    down_after = Keyword.get(opts, :down_after, 1_000)
    failover_timeout = Keyword.get(opts, :failover_timeout, 5_000)
    data_args = Keyword.get(opts, :data_args, [])

    master = RedisServer.start(args: data_args)

    replica =
      RedisServer.start(
        args: ~w(--replicaof 127.0.0.1 #{master.port} --repl-ping-replica-period 1) ++ data_args
      )

    sentinels =
      for _ <- 1..3 do
        port = RedisServer.free_port()

        dir =
          Path.join(
            System.tmp_dir!(),
            "larder-sentinel-#{port}-#{System.unique_integer([:positive])}"
          )

        File.mkdir_p!(dir)
        config = Path.join(dir, "sentinel.conf")

        File.write!(config, """
        sentinel resolve-hostnames no
        sentinel monitor #{name} 127.0.0.1 #{master.port} 2
        sentinel down-after-milliseconds #{name} #{down_after}
        sentinel failover-timeout #{name} #{failover_timeout}
        sentinel parallel-syncs #{name} 1
        """)

        RedisServer.start(port: port, dir: dir, config: config, args: ["--sentinel"])
      end

    set = %__MODULE__{name: name, data: [master, replica], sentinels: sentinels}
    wait_agreed(set)
    set
  end

  @doc "The sentinels' addresses, `[{\"127.0.0.1\", port}, ...]`, as the L2 option takes them."
  def addresses(%__MODULE__{sentinels: sentinels}),
    do: Enum.map(sentinels, &{"127.0.0.1", &1.port})

  @doc """
  The master every answering sentinel names now (`SENTINEL
  get-master-addr-by-name`), as one of the data nodes; nil while they
  disagree or none answers.
  """
  def master(%__MODULE__{} = set) do
    case master_addrs(set) do
      [port | rest] -> if Enum.all?(rest, &(&1 == port)), do: data_node(set, port)
      [] -> nil
    end
  end

  @doc "The data node that is not the master (as the sentinels see it), or nil."
  def replica(%__MODULE__{data: data} = set) do
    case master(set) do
      nil -> nil
      master -> Enum.find(data, &(&1.port != master.port))
    end
  end

  @doc """
  Waits until every live sentinel names the same master, that node's
  `ROLE` says master, and each sentinel sees its replica and two other
  sentinels. Returns the master.
  """
  def wait_agreed(%__MODULE__{} = set, timeout \\ 30_000) do
    wait_master(set, timeout, "the sentinels to agree", fn master ->
      RedisCluster.role(master) == "master" and
        Enum.all?(live(set.sentinels), &settled?(&1, set.name))
    end)
  end

  @doc """
  Waits until the replica of the master the sentinels agree on is in sync:
  its link up, no sync under way, and its offset at least the master's
  offset read before it. (The sentinels list a replica as soon as it is
  connected, before a full sync has brought it the master's data.)
  Returns the master.
  """
  def wait_replicated(%__MODULE__{} = set, timeout \\ 30_000) do
    wait_master(set, timeout, "the replica to be in sync", fn master ->
      replica = Enum.find(set.data, &(&1.port != master.port))
      master_offset = replication(master)["master_repl_offset"]
      info = replication(replica)

      info["role"] == "slave" and info["master_port"] == Integer.to_string(master.port) and
        info["master_link_status"] == "up" and info["master_sync_in_progress"] == "0" and
        master_offset != nil and
        String.to_integer(info["slave_repl_offset"] || "-1") >= String.to_integer(master_offset)
    end)
  end

  defp replication(node) do
    node
    |> RedisServer.command(["INFO", "replication"])
    |> String.split("\r\n")
    |> Enum.flat_map(fn line ->
      case String.split(line, ":", parts: 2) do
        [k, v] -> [{k, v}]
        _ -> []
      end
    end)
    |> Map.new()
  end

  @doc """
  Kills the current master with SIGKILL. Returns it (its port stays taken
  by nothing; `RedisServer.restart/1` brings it back as a stale master).
  """
  def kill_master(%__MODULE__{} = set) do
    master = master(set) || raise "the sentinels do not agree on a master"
    RedisServer.kill(master)
    master
  end

  @doc """
  Waits until the sentinels agree on a master other than `old` (a data
  node) and that node says master. Returns the new master.
  """
  def wait_failover(%__MODULE__{} = set, %RedisServer{port: old_port}, timeout \\ 30_000) do
    wait_master(set, timeout, "a failover", fn %RedisServer{port: port} = master ->
      port != old_port and RedisCluster.role(master) == "master"
    end)
  end

  # Waits until the sentinels name a master and `fit?` holds for it (it is
  # checked with the sentinels' answer in hand, so it may query the node).
  # Returns the master.
  defp wait_master(set, timeout, what, fit?) do
    RedisServer.wait_until(timeout, what, fn ->
      case master(set) do
        %RedisServer{} = master -> if fit?.(master), do: master
        _none -> nil
      end
    end)
  end

  # A node, data or sentinel, is killed, paused and resumed with
  # RedisServer.kill/1, pause/1 and resume/1: it is a %RedisServer{}.

  @doc "Kills every process and removes their dirs."
  def stop(%__MODULE__{data: data, sentinels: sentinels}) do
    Enum.each(sentinels ++ data, &RedisServer.stop/1)
  end

  defp master_addrs(set) do
    set.sentinels
    |> live()
    |> Enum.flat_map(fn sentinel ->
      case RedisCluster.cli(sentinel, ~w(SENTINEL get-master-addr-by-name #{set.name})) do
        {:ok, [_host, port]} -> [port]
        _ -> []
      end
    end)
  end

  defp data_node(set, port), do: Enum.find(set.data, &(Integer.to_string(&1.port) == port))

  # A sentinel that sees one replica and two other sentinels of the master,
  # and no failover in progress.
  defp settled?(sentinel, name) do
    case RedisCluster.cli(sentinel, ~w(SENTINEL master #{name})) do
      {:ok, lines} ->
        info =
          lines
          |> Enum.chunk_every(2)
          |> Map.new(fn
            [k, v] -> {k, v}
            [k] -> {k, nil}
          end)

        info["num-slaves"] == "1" and info["num-other-sentinels"] == "2" and
          not String.contains?(info["flags"] || "", "failover") and
          not String.contains?(info["flags"] || "", "down")

      _ ->
        false
    end
  end

  defp live(nodes) do
    Enum.filter(nodes, fn %RedisServer{os_pid: pid} ->
      match?({_, 0}, System.cmd("kill", ["-0", Integer.to_string(pid)], stderr_to_stdout: true))
    end)
  end
end
