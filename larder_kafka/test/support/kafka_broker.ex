# Starts a throwaway single-node Kafka 4 broker (KRaft, broker and controller
# in one JVM) on free loopback ports from the jars scripts/setup fetched, and
# shuts it down, kills it or restarts it on the same data on demand; runs the
# Kafka CLI tools of the same jars against it (topics, records). One home for
# the tests (compiled with test/support), the benchmarks and the demo
# (compiled for them too: see mix.exs); not part of the library.
defmodule Larder.Test.KafkaBroker do
  @moduledoc false

  alias Larder.Test.FreePort

  defstruct [:port, :controller_port, :root, :os_pid, :erl_port, config: []]

  @version "4.4.0"

  # Heap and GC for a test broker on a loaded 2-core machine: a small heap,
  # the serial collector (no GC threads), the client compiler only (starts
  # faster), no perf-data file in /tmp, no JVM log lines on stdout (CDS
  # warnings would mix with a tool's output).
  @jvm_opts ~w(-Xms64m -Xmx512m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:-UsePerfData
               -XX:+ExitOnOutOfMemoryError -Xlog:disable -Djava.awt.headless=true)

  # The CLI tools: smaller still.
  @tool_jvm_opts ~w(-Xms16m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:-UsePerfData
                    -Xlog:disable -Djava.awt.headless=true)

  # Class-data sharing: each main class (the broker, each tool) gets a
  # dynamic CDS archive of the classes it loaded, written by its first run
  # that exits cleanly (-XX:ArchiveClassesAtExit) into <home>/cds, and
  # mapped by the later runs (-XX:SharedArchiveFile): a broker then starts
  # in ~6 s instead of ~24 s, a tool in ~3 s instead of ~5 s on the loaded
  # 2-core machine. A JVM that cannot use an archive (another JDK) runs
  # without it. An archive is written under a temporary name and renamed.

  # A broker's start on a loaded 2-core machine took up to ~10 s here; the
  # restart after a SIGKILL also recovers its logs.
  @start_timeout_ms 180_000
  @tool_timeout_ms 120_000

  # What a test broker sets besides its listeners: replication factor 1
  # for the internal topics, no group rebalance delay, no auto-created
  # topics, fewer threads, and a log cleaner that wakes up every 100 ms
  # with a small dedupe buffer. A topic compacts quickly with
  # `segment.ms`/`segment.bytes` small and `min.cleanable.dirty.ratio`
  # near 0 in its own config (the active segment is never cleaned: a
  # record written after `segment.ms` rolls it).
  @defaults [
    {"offsets.topic.replication.factor", "1"},
    {"offsets.topic.num.partitions", "4"},
    {"transaction.state.log.replication.factor", "1"},
    {"transaction.state.log.min.isr", "1"},
    {"transaction.state.log.num.partitions", "4"},
    {"share.coordinator.state.topic.replication.factor", "1"},
    {"share.coordinator.state.topic.min.isr", "1"},
    {"group.initial.rebalance.delay.ms", "0"},
    {"auto.create.topics.enable", "false"},
    {"num.partitions", "1"},
    {"num.network.threads", "2"},
    {"num.io.threads", "2"},
    {"background.threads", "2"},
    {"num.recovery.threads.per.data.dir", "1"},
    {"log.cleaner.threads", "1"},
    {"log.cleaner.backoff.ms", "100"},
    {"log.cleaner.dedupe.buffer.size", "16777216"},
    {"log.segment.delete.delay.ms", "1000"},
    {"log.retention.check.interval.ms", "1000"}
  ]

  @doc "The directory holding `libs/`: $LARDER_KAFKA_HOME, else ~/.cache/larder/kafka-#{@version}."
  def home do
    System.get_env("LARDER_KAFKA_HOME") ||
      Path.join([System.user_home!(), ".cache", "larder", "kafka-#{@version}"])
  end

  @doc "True when java is on the PATH and scripts/setup completed the jars."
  def available? do
    System.find_executable("java") != nil and
      File.exists?(Path.join([home(), "libs", ".larder-complete"]))
  end

  @doc "`\"127.0.0.1:port\"`, the broker's bootstrap address."
  def bootstrap(%__MODULE__{port: port}), do: "127.0.0.1:#{port}"

  @doc """
  Formats a fresh data directory and starts the broker on it. The broker
  is killed when the handle's owner exits, even if the VM dies (its
  wrapper shell watches its stdin). Waits until the broker answers a
  metadata request listing itself (so topics can be created).

  Options: `:port` and `:controller_port` (default: free ones), `:root` (a
  fresh directory by default), `:config` (more `{key, value}` broker
  settings, after the defaults, which they override).
  """
  def start(opts \\ []) do
    ensure_available!()
    port = Keyword.get_lazy(opts, :port, &FreePort.get/0)
    controller_port = Keyword.get_lazy(opts, :controller_port, &FreePort.get/0)
    root = Keyword.get_lazy(opts, :root, fn -> tmp_dir(port) end)
    config = Keyword.get(opts, :config, [])
    File.mkdir_p!(Path.join(root, "data"))

    broker = %__MODULE__{
      port: port,
      controller_port: controller_port,
      root: root,
      config: config
    }

    write_config!(broker)
    format!(broker)
    launch(broker)
  end

  @doc """
  Starts the broker again on the same data, ports and settings, after
  `kill/1` or `shutdown/1`; returns the new handle.
  """
  def restart(%__MODULE__{} = broker) do
    kill(broker)
    launch(%{broker | os_pid: nil, erl_port: nil})
  end

  @doc "Kills the broker at once (SIGKILL), as a crash would; its data stays."
  def kill(%__MODULE__{} = broker), do: signal_and_wait(broker, "-KILL", 30_000)

  @doc """
  Stops the broker with SIGTERM (a controlled shutdown: logs flushed and
  closed) and waits for it to exit; its data stays.
  """
  def shutdown(%__MODULE__{} = broker) do
    signal_and_wait(broker, "-TERM", 120_000)
    kill(broker)
    commit_archive(broker_archive_tmp(broker), cds_archive("kafka.Kafka"), true)
  end

  @doc """
  Kills the broker and removes its directory. While no broker class-data
  archive exists yet, it shuts the broker down with SIGTERM instead, so
  that the JVM writes one.
  """
  def stop(%__MODULE__{} = broker) do
    if os_pid(broker) && not File.exists?(cds_archive("kafka.Kafka")),
      do: shutdown(broker),
      else: kill(broker)

    rm_rf(broker.root, 20)
    :ok
  end

  defp broker_archive_tmp(broker), do: Path.join(broker.root, "kafka.Kafka.jsa.tmp")

  @doc "The OS pid of the running broker JVM, or nil."
  def os_pid(%__MODULE__{} = broker) do
    with {:ok, text} <- File.read(pid_file(broker)),
         {pid, _} <- Integer.parse(String.trim(text)),
         {:ok, cmdline} <- File.read("/proc/#{pid}/cmdline"),
         true <- String.contains?(cmdline, config_file(broker)) do
      pid
    else
      _ -> nil
    end
  end

  @doc "The broker's log (log4j), for a failing test's message."
  def log_tail(%__MODULE__{} = broker, lines \\ 40) do
    [log_file(broker), Path.join(broker.root, "broker.out")]
    |> Enum.map(fn path ->
      case File.read(path) do
        {:ok, text} -> text |> String.split("\n") |> Enum.take(-lines) |> Enum.join("\n")
        _ -> ""
      end
    end)
    |> Enum.join("\n")
  end

  ## Admin, through the Kafka CLI tools of the same jars (each runs a JVM:
  ## a few seconds each on a loaded machine).

  @doc """
  Creates `topic` with `partitions` partitions (replication factor 1) and
  `configs` (`[{"cleanup.policy", "compact"}, ...]`). Raises on failure.
  """
  def create_topic(broker, topic, partitions, configs \\ []) do
    config_args = Enum.flat_map(configs, fn {k, v} -> ["--config", "#{k}=#{v}"] end)

    tool!(
      broker,
      "org.apache.kafka.tools.TopicCommand",
      ~w(--create --topic #{topic} --partitions #{partitions} --replication-factor 1) ++
        config_args
    )

    :ok
  end

  @doc "Adds partitions to `topic`, up to `partitions` in all."
  def add_partitions(broker, topic, partitions) do
    tool!(
      broker,
      "org.apache.kafka.tools.TopicCommand",
      ~w(--alter --topic #{topic} --partitions #{partitions})
    )

    :ok
  end

  @doc "Deletes `topic` (the broker removes its data in the background)."
  def delete_topic(broker, topic) do
    tool!(broker, "org.apache.kafka.tools.TopicCommand", ~w(--delete --topic #{topic}))
    :ok
  end

  @doc """
  `%{topic_id: id, partitions: n, configs: text}` from `kafka-topics
  --describe`, or `:error` when the topic does not exist.
  """
  def describe_topic(broker, topic) do
    case tool(broker, "org.apache.kafka.tools.TopicCommand", ~w(--describe --topic #{topic})) do
      {out, 0} ->
        case Regex.run(~r/TopicId:\s*(\S+)\s+PartitionCount:\s*(\d+).*Configs:\s*(\S*)/, out) do
          [_, id, n, configs] ->
            %{topic_id: id, partitions: String.to_integer(n), configs: configs}

          nil ->
            :error
        end

      {_out, _} ->
        :error
    end
  end

  @doc """
  Deletes the records of `topic` before the given offsets
  (`kafka-delete-records`): `[{partition, offset}]`; the partitions' log
  start offsets move there.
  """
  def delete_records(broker, topic, partition_offsets) do
    json =
      "{\"version\":1,\"partitions\":[" <>
        Enum.map_join(partition_offsets, ",", fn {p, o} ->
          "{\"topic\":\"#{topic}\",\"partition\":#{p},\"offset\":#{o}}"
        end) <> "]}"

    file = Path.join(broker.root, "delete-records-#{System.unique_integer([:positive])}.json")
    File.write!(file, json)

    try do
      tool!(
        broker,
        "org.apache.kafka.tools.DeleteRecordsCommand",
        ["--offset-json-file", file]
      )
    after
      File.rm(file)
    end

    :ok
  end

  @doc """
  `%{partition => offset}` of `topic`: `:latest` (the high watermarks) or
  `:earliest` (the log start offsets).
  """
  def offsets(broker, topic, which \\ :latest) do
    time = if which == :earliest, do: "-2", else: "-1"

    out =
      tool!(broker, "org.apache.kafka.tools.GetOffsetShell", ~w(--topic #{topic} --time #{time}))

    for line <- String.split(out, "\n"),
        [_, p, o] <- [Regex.run(~r/^#{Regex.escape(topic)}:(\d+):(\d+)$/, String.trim(line))],
        into: %{},
        do: {String.to_integer(p), String.to_integer(o)}
  end

  # The console tools' null marker (`null.marker`, `null.literal`) and
  # their key separator (a tab, their default, is trimmed away when given
  # as a property value; the consumer also puts it between its fields).
  @null "<larder-null>"
  @sep "<larder-sep>"

  @doc """
  Produces `records` to `topic` with the console producer, in order:
  `{key, value}` pairs, `nil` for a null key or a tombstone. Keys and
  values are UTF-8 text without newlines; the partition is the Java
  client's (murmur2 of the key). Use the NIF's producer for anything else.
  """
  def produce(broker, topic, records) do
    lines =
      Enum.map(records, fn {k, v} ->
        for x <- [k, v], x != nil, String.contains?(x, ["\n", "\r", @sep]) or x == @null do
          raise ArgumentError, "console records cannot hold newlines, #{@sep} or #{@null}"
        end

        [k || @null, @sep, v || @null, "\n"]
      end)

    input = Path.join(broker.root, "produce-#{System.unique_integer([:positive])}.txt")
    File.write!(input, lines)

    try do
      tool!(
        broker,
        "org.apache.kafka.tools.ConsoleProducer",
        ~w(--topic #{topic} --producer-property acks=all --producer-property linger.ms=0) ++
          ~w(--reader-property parse.key=true) ++
          [
            "--reader-property",
            "key.separator=#{@sep}",
            "--reader-property",
            "null.marker=#{@null}"
          ],
        stdin: input
      )
    after
      File.rm(input)
    end

    :ok
  end

  @doc """
  Reads `count` records of `topic` from the beginning with the console
  consumer: `[%{partition: p, offset: o, key: k, value: v}]` (`nil` for a
  null key or value), in the order received. Raises if fewer arrive in
  `timeout` ms.
  """
  def consume(broker, topic, count, timeout \\ 60_000) do
    out =
      tool!(
        broker,
        "org.apache.kafka.tools.consumer.ConsoleConsumer",
        ~w(--topic #{topic} --from-beginning --max-messages #{count} --timeout-ms #{timeout}) ++
          Enum.flat_map(
            ~w(print.partition=true print.offset=true print.key=true) ++
              ["key.separator=#{@sep}", "null.literal=#{@null}"],
            &["--formatter-property", &1]
          )
      )

    records =
      for line <- String.split(out, "\n"),
          ["Partition:" <> p, "Offset:" <> o, k, v] <- [String.split(line, @sep)] do
        %{
          partition: String.to_integer(p),
          offset: String.to_integer(o),
          key: unnull(k),
          value: unnull(v)
        }
      end

    if length(records) < count do
      raise "expected #{count} records of #{topic}, the console consumer printed:\n#{out}"
    end

    records
  end

  defp unnull(@null), do: nil
  defp unnull(x), do: x

  @doc """
  Runs a Kafka CLI tool (a main class of the jars) against the broker,
  with `--bootstrap-server` added; returns its output, raising when it
  exits with a non-zero status.
  """
  def tool!(broker, class, args, opts \\ []) do
    case tool(broker, class, args, opts) do
      {out, 0} -> out
      {out, status} -> raise "#{class} #{Enum.join(args, " ")} exited with #{status}:\n#{out}"
    end
  end

  @doc "As `tool!/4`, returning `{output, exit_status}`."
  def tool(broker, class, args, opts \\ []) do
    java(
      class,
      @tool_jvm_opts ++ ["-Dlog4j2.configurationFile=#{tools_log_config(broker)}"],
      ["--bootstrap-server", bootstrap(broker) | args],
      Keyword.get(opts, :stdin, "/dev/null"),
      Keyword.get(opts, :timeout, @tool_timeout_ms)
    )
  end

  ## Starting

  defp ensure_available! do
    cond do
      System.find_executable("java") == nil ->
        raise "java is not installed: run scripts/setup (it installs Java 17 and the Kafka jars)"

      not available?() ->
        raise "the Kafka #{@version} jars are not in #{home()}/libs: run scripts/setup"

      true ->
        :ok
    end
  end

  defp classpath, do: Path.join([home(), "libs", "*"])
  defp config_file(broker), do: Path.join(broker.root, "server.properties")
  defp pid_file(broker), do: Path.join(broker.root, "broker.pid")
  defp log_file(broker), do: Path.join(broker.root, "broker.log")

  defp write_config!(broker) do
    settings =
      [
        {"process.roles", "broker,controller"},
        {"node.id", "1"},
        {"controller.quorum.bootstrap.servers", "127.0.0.1:#{broker.controller_port}"},
        {"listeners",
         "PLAINTEXT://127.0.0.1:#{broker.port},CONTROLLER://127.0.0.1:#{broker.controller_port}"},
        {"advertised.listeners", "PLAINTEXT://127.0.0.1:#{broker.port}"},
        {"controller.listener.names", "CONTROLLER"},
        {"inter.broker.listener.name", "PLAINTEXT"},
        {"listener.security.protocol.map", "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"},
        {"log.dirs", Path.join(broker.root, "data")}
      ] ++ @defaults ++ broker.config

    # Later settings override earlier ones, as in a properties file.
    File.write!(config_file(broker), Enum.map(settings, fn {k, v} -> "#{k}=#{v}\n" end))

    File.write!(Path.join(broker.root, "log4j2.properties"), """
    status = warn
    appender.file.type = File
    appender.file.name = file
    appender.file.fileName = #{log_file(broker)}
    appender.file.layout.type = PatternLayout
    appender.file.layout.pattern = [%d] %p %m (%c)%n
    rootLogger.level = INFO
    rootLogger.appenderRef.file.ref = file
    logger.cleaner.name = kafka.log.LogCleaner
    logger.cleaner.level = INFO
    """)

    File.write!(tools_log_config(broker), """
    status = warn
    appender.err.type = Console
    appender.err.name = err
    appender.err.target = SYSTEM_ERR
    appender.err.layout.type = PatternLayout
    appender.err.layout.pattern = %p %m%n
    rootLogger.level = ERROR
    rootLogger.appenderRef.err.ref = err
    """)
  end

  defp tools_log_config(broker), do: Path.join(broker.root, "log4j2-tools.properties")

  defp format!(broker) do
    jvm = @tool_jvm_opts ++ ["-Dlog4j2.configurationFile=#{tools_log_config(broker)}"]

    args = [
      "format",
      "--cluster-id",
      cluster_id(),
      "--config",
      config_file(broker),
      "--standalone"
    ]

    case java("kafka.tools.StorageTool", jvm, args, "/dev/null", @tool_timeout_ms) do
      {_out, 0} -> :ok
      {out, status} -> raise "formatting the Kafka data dir exited with #{status}:\n#{out}"
    end
  end

  # A random cluster id: 16 bytes, base64url (a leading "-" would read as
  # an option, so it is avoided).
  defp cluster_id do
    id = Base.url_encode64(:crypto.strong_rand_bytes(16), padding: false)
    if String.starts_with?(id, "-"), do: cluster_id(), else: id
  end

  # The wrapper shell: starts the command in the background, prints its
  # pid, and kills it (SIGKILL) as soon as its own stdin (the Erlang port)
  # closes: when the port's owner exits or the VM dies. It exits with the
  # command's status.
  @wrapper """
  exec 3<&0
  out="$1"; input="$2"; shift 2
  if [ -n "$out" ]; then "$@" <"$input" >>"$out" 2>&1 & else "$@" <"$input" 2>&1 & fi
  j=$!
  echo "pid $j"
  ( read _ <&3; kill -9 $j 2>/dev/null ) &
  w=$!
  wait $j 2>/dev/null
  rc=$?
  kill $w 2>/dev/null
  exit $rc
  """

  defp open_wrapped(out, input, args) do
    java = System.find_executable("java")

    Port.open(
      {:spawn_executable, "/bin/sh"},
      [:binary, :exit_status, args: ["-c", @wrapper, "sh", out, input, java | args]]
    )
  end

  # Runs the main class `class` to its end (a CLI tool), killed after
  # `timeout` ms, with its class-data archive, or writing it.
  defp java(class, jvm_opts, args, input, timeout) do
    {cds_opts, done} = cds(class)
    port = open_wrapped("", input, jvm_opts ++ cds_opts ++ ["-cp", classpath(), class | args])
    deadline = System.monotonic_time(:millisecond) + timeout
    {out, status} = collect(port, [], deadline)
    done.(status == 0)
    [_pid_line | rest] = String.split(out, "\n", parts: 2)
    {Enum.join(rest), status}
  end

  # The JVM options that use `class`'s archive, or write it at exit to a
  # temporary file, and a function to call after the JVM exited (with
  # whether it exited cleanly) that renames that file into place.
  defp cds(class) do
    archive = cds_archive(class)

    if File.exists?(archive) do
      {["-XX:SharedArchiveFile=#{archive}"], fn _ -> :ok end}
    else
      File.mkdir_p!(Path.dirname(archive))
      tmp = "#{archive}.#{System.unique_integer([:positive])}.tmp"
      {["-XX:ArchiveClassesAtExit=#{tmp}"], fn ok? -> commit_archive(tmp, archive, ok?) end}
    end
  end

  defp commit_archive(tmp, archive, ok?) do
    if ok? and File.exists?(tmp) and not File.exists?(archive),
      do: File.rename(tmp, archive),
      else: File.rm(tmp)

    :ok
  end

  # One archive per main class and JDK (the java binary's real path).
  defp cds_archive(class) do
    java = resolve(System.find_executable("java"), 20)
    Path.join([home(), "cds", "#{class}-#{:erlang.phash2(java)}.jsa"])
  end

  defp resolve(path, 0), do: path

  defp resolve(path, hops) do
    case :file.read_link_all(path) do
      {:ok, target} -> resolve(Path.expand(to_string(target), Path.dirname(path)), hops - 1)
      _ -> path
    end
  end

  defp collect(port, acc, deadline) do
    left = max(deadline - System.monotonic_time(:millisecond), 0)

    receive do
      {^port, {:data, data}} ->
        collect(port, [acc | data], deadline)

      {^port, {:exit_status, status}} ->
        {IO.iodata_to_binary(acc), status}
    after
      left ->
        Port.close(port)
        {IO.iodata_to_binary(acc) <> "\n(timed out after #{div(left, 1)} ms)", :timeout}
    end
  end

  defp launch(broker) do
    archive = cds_archive("kafka.Kafka")

    # Without an archive, this broker writes one when it exits cleanly
    # (`stop/1` and `shutdown/1` then rename it into place).
    cds_opts =
      if File.exists?(archive),
        do: ["-XX:SharedArchiveFile=#{archive}"],
        else: ["-XX:ArchiveClassesAtExit=#{broker_archive_tmp(broker)}"]

    args =
      @jvm_opts ++
        cds_opts ++
        ["-Dlog4j2.configurationFile=#{Path.join(broker.root, "log4j2.properties")}"] ++
        ["-cp", classpath(), "kafka.Kafka", config_file(broker)]

    erl_port = open_wrapped(Path.join(broker.root, "broker.out"), "/dev/null", args)

    os_pid =
      receive do
        {^erl_port, {:data, "pid " <> rest}} ->
          rest |> String.split("\n") |> hd() |> String.trim() |> String.to_integer()
      after
        10_000 -> raise "the Kafka broker's wrapper did not start"
      end

    File.write!(pid_file(broker), Integer.to_string(os_pid))
    broker = %{broker | os_pid: os_pid, erl_port: erl_port}
    wait_ready(broker, System.monotonic_time(:millisecond) + @start_timeout_ms)
    broker
  end

  defp wait_ready(broker, deadline) do
    cond do
      metadata_brokers(broker.port) > 0 ->
        :ok

      not alive?(broker.os_pid) ->
        raise "the Kafka broker exited while starting:\n#{log_tail(broker)}"

      System.monotonic_time(:millisecond) > deadline ->
        stop_quietly(broker)

        raise "the Kafka broker did not answer within #{@start_timeout_ms} ms:\n#{log_tail(broker)}"

      true ->
        Process.sleep(100)
        wait_ready(broker, deadline)
    end
  end

  defp stop_quietly(broker) do
    kill(broker)
  catch
    _, _ -> :ok
  end

  # The number of brokers a Metadata v1 request (all topics) lists: 0 until
  # the broker serves requests and has registered itself (unfenced).
  defp metadata_brokers(port) do
    with {:ok, socket} <-
           :gen_tcp.connect(~c"127.0.0.1", port, [:binary, active: false, packet: 4], 500) do
      try do
        request = <<3::16, 1::16, 1::32, 12::16, "larder-ready", -1::32-signed>>

        with :ok <- :gen_tcp.send(socket, request),
             {:ok, <<1::32, count::32, _::binary>>} <- :gen_tcp.recv(socket, 0, 2_000) do
          count
        else
          _ -> 0
        end
      after
        :gen_tcp.close(socket)
      end
    else
      _ -> 0
    end
  end

  ## Stopping

  defp signal_and_wait(broker, signal, timeout) do
    case os_pid(broker) do
      nil ->
        :ok

      pid ->
        System.cmd("kill", [signal, Integer.to_string(pid)], stderr_to_stdout: true)
        wait_dead(pid, System.monotonic_time(:millisecond) + timeout)
    end

    close_port(broker.erl_port)
    :ok
  end

  defp close_port(nil), do: :ok

  defp close_port(port) do
    if Port.info(port), do: Port.close(port)
    :ok
  catch
    _, _ -> :ok
  end

  defp wait_dead(pid, deadline) do
    cond do
      not alive?(pid) -> :ok
      System.monotonic_time(:millisecond) > deadline -> :timeout
      true -> wait_dead_again(pid, deadline)
    end
  end

  defp wait_dead_again(pid, deadline) do
    Process.sleep(50)
    wait_dead(pid, deadline)
  end

  # A zombie (exited, not yet reaped by its shell) counts as dead.
  defp alive?(pid) do
    case File.read("/proc/#{pid}/stat") do
      {:ok, stat} -> not Regex.match?(~r/^\d+ \(.*\) Z/s, stat)
      _ -> false
    end
  end

  defp rm_rf(_dir, 0), do: :ok

  defp rm_rf(dir, tries) do
    case File.rm_rf(dir) do
      {:ok, _} ->
        :ok

      {:error, _, _} ->
        Process.sleep(100)
        rm_rf(dir, tries - 1)
    end
  end

  defp tmp_dir(port) do
    # Random: unique_integer/1 is unique in this VM only, and other VMs on
    # the machine start brokers too.
    token = Base.encode16(:rand.bytes(8), case: :lower)
    Path.join(System.tmp_dir!(), "larder-kafka-#{port}-#{token}")
  end
end
