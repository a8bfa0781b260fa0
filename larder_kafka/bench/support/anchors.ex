# The outside anchors of bench/replica_kafka_bench.exs: a topic drained by
# librdkafka alone (bench/support/librdkafka_drain.c) and by Java's
# KafkaConsumer (bench/support/KafkaDrain.java), each built on demand, under
# the NIF crate's target/ folder, and run as an OS process at the same fetch
# settings as the replica.
#
#   * The C program is compiled with the system's C compiler against the
#     librdkafka the NIF crate's build produced (rdkafka-sys's static
#     library and header under native/larder_kafka/target/release/build),
#     with the zstd that build made and the system's OpenSSL and zlib, as
#     the NIF links them: the very librdkafka the replica reads with, and
#     nothing of Larder's.
#   * The Java program is compiled with javac against the kafka-clients jar
#     of the jars scripts/setup fetched (Larder.Test.KafkaBroker.home/0),
#     and run with them on its class path.
#
# Each reports its own time, from the consumer's creation to its last
# record (its process's start, a JVM's included, is not counted; the
# consumer's close neither), and its CPU time over the same span. Both read
# at the settings `Larder.Bench.KafkaLoad.consumer_config/1` gives (the
# replica's own), Java's consumer under their Java names (`java_config/1`).
defmodule Larder.Bench.Anchors do
  @moduledoc false

  @crate Path.expand("../../native/larder_kafka", __DIR__)
  @c_source Path.expand("librdkafka_drain.c", __DIR__)
  @java_source Path.expand("KafkaDrain.java", __DIR__)
  # What rdkafka-sys's and zstd-sys's build scripts leave under the crate's
  # target/ (the NIF links these two static libraries).
  @rdkafka "target/release/build/rdkafka-sys-*/out/src/librdkafka.a"
  @zstd "target/release/build/zstd-sys-*/out/libzstd.a"
  @build_hint "build the NIF crate first: mix compile"

  @typedoc """
  What a drain reports: records read, what it kept (the C drain and Java's
  `"drain"`: the sum of every key's and value's bytes; Java's `"story"` and
  `"map"`: the map's size), its time and its CPU time in us.
  """
  @type report :: %{
          records: non_neg_integer(),
          kept: non_neg_integer(),
          wall_us: pos_integer(),
          cpu_us: non_neg_integer()
        }

  @typedoc "Java's drain: the java executable and the class path (`java_drain/0`)."
  @type java :: %{java: Path.t(), classpath: String.t()}

  @doc """
  The C drain's executable, compiled when missing or older than its source
  or the librdkafka it links: `{:ok, path}`, or `{:error, why}` (no C
  compiler, no librdkafka build under the crate's target/).
  """
  @spec c_drain() :: {:ok, Path.t()} | {:error, String.t()}
  def c_drain do
    out = Path.join([@crate, "target", "bench", "librdkafka_drain"])

    with {:ok, cc} <- executable("cc"),
         {:ok, rdkafka} <- newest(Path.join(@crate, @rdkafka), @build_hint),
         {:ok, zstd} <- newest(Path.join(@crate, @zstd), @build_hint) do
      if stale?(out, [@c_source, rdkafka, zstd]) do
        File.mkdir_p!(Path.dirname(out))
        # Built beside, then renamed: never a half-written executable.
        tmp = out <> ".#{System.unique_integer([:positive])}"

        args =
          ["-O2", "-Wall", "-o", tmp, @c_source, "-I", Path.dirname(rdkafka), rdkafka, zstd] ++
            ~w(-lssl -lcrypto -lz -lm -ldl -lpthread -lrt)

        case System.cmd(cc, args, stderr_to_stdout: true) do
          {_, 0} ->
            File.rename!(tmp, out)
            {:ok, out}

          {text, status} ->
            File.rm(tmp)
            {:error, "cc exited with #{status}: #{String.slice(text, 0, 500)}"}
        end
      else
        {:ok, out}
      end
    end
  end

  @doc """
  The Java drain: the java executable and its class path (its class and
  the Kafka jars), compiled when missing or older than its source:
  `{:ok, java}`, or `{:error, why}` (no javac or java, no Kafka jars).
  """
  @spec java_drain() :: {:ok, java()} | {:error, String.t()}
  def java_drain do
    classes = Path.join([@crate, "target", "bench", "java"])
    libs = Path.join(Larder.Test.KafkaBroker.home(), "libs")

    with {:ok, javac} <- executable("javac"),
         {:ok, java} <- executable("java"),
         {:ok, _jar} <- newest(Path.join(libs, "kafka-clients-*.jar"), "run scripts/setup") do
      drain = %{java: java, classpath: "#{classes}:#{libs}/*"}
      class = Path.join(classes, "KafkaDrain.class")

      if stale?(class, [@java_source]) do
        File.mkdir_p!(classes)
        args = ["-d", classes, "-cp", "#{libs}/*", @java_source]

        case System.cmd(javac, args, stderr_to_stdout: true) do
          {_, 0} -> {:ok, drain}
          {text, status} -> {:error, "javac exited with #{status}: #{String.slice(text, 0, 500)}"}
        end
      else
        {:ok, drain}
      end
    end
  end

  @doc """
  Runs the C drain on `topic` with `config` (librdkafka settings as
  `{key, value}`; `bootstrap.servers` is taken from it).
  """
  @spec run_c(Path.t(), String.t(), [{String.t(), String.t()}]) :: report()
  def run_c(exe, topic, config) do
    {bootstrap, settings} = bootstrap(config)
    args = [bootstrap, topic | for({k, v} <- settings, do: "#{k}=#{v}")]
    report!(System.cmd(exe, args, stderr_to_stdout: true), "librdkafka_drain")
  end

  @doc """
  Runs the Java drain on `topic`, in `mode` (`"drain"`, `"story"` or
  `"map"`, see KafkaDrain.java), with the Java settings of `config`
  (`java_config/1`).
  """
  @spec run_java(java(), String.t(), String.t(), [{String.t(), String.t()}]) :: report()
  def run_java(%{java: java, classpath: classpath}, mode, topic, config)
      when mode in ["drain", "story", "map"] do
    {bootstrap, settings} = bootstrap(config)

    args =
      ["-Xmx2g", "-Xlog:disable", "-cp", classpath, "KafkaDrain", mode, bootstrap, topic] ++
        for({k, v} <- java_config(settings), do: "#{k}=#{v}")

    report!(System.cmd(java, args, stderr_to_stdout: true), "KafkaDrain")
  end

  @doc """
  librdkafka's consumer settings under their Java names, where Java's
  consumer has them: fetch sizes, the fetch wait, the isolation level and
  the client id; `max.poll.records` 1,000 (the replica's `batch_size`).
  Two of Java's defaults differ from librdkafka's and are set to
  librdkafka's: `check.crcs` false (librdkafka checks no CRC by default,
  Java checks every batch's) and `receive.buffer.bytes` -1 (the system's
  socket buffer, as librdkafka's `socket.receive.buffer.bytes` 0; Java's
  64 KiB would throttle its fetches). librdkafka's prefetch queue settings
  (`queued.*`, `fetch.queue.backoff.ms`) have no Java counterpart: Java's
  consumer fetches again as soon as what it buffered is handed out.
  """
  @spec java_config([{String.t(), String.t()}]) :: [{String.t(), String.t()}]
  def java_config(settings) do
    names = %{
      "client.id" => "client.id",
      "isolation.level" => "isolation.level",
      "fetch.max.bytes" => "fetch.max.bytes",
      "max.partition.fetch.bytes" => "max.partition.fetch.bytes",
      "fetch.wait.max.ms" => "fetch.max.wait.ms"
    }

    for({k, v} <- settings, java = names[k], do: {java, v}) ++
      [{"max.poll.records", "1000"}, {"check.crcs", "false"}, {"receive.buffer.bytes", "-1"}]
  end

  defp bootstrap(config) do
    {[{_, bootstrap}], settings} = Enum.split_with(config, &(elem(&1, 0) == "bootstrap.servers"))
    {bootstrap, settings}
  end

  # The report line, "records=N kept=K wall_us=W cpu_us=C" (or bytes=B
  # for kept), the last of the output that starts with "records=": the
  # Java client's log lines may come before or after it.
  defp report!({out, 0}, what) do
    line =
      out
      |> String.split("\n", trim: true)
      |> Enum.filter(&String.starts_with?(&1, "records="))
      |> List.last()

    fields =
      for pair <- String.split(line || "", " "),
          [k, v] <- [String.split(pair, "=")],
          {n, ""} <- [Integer.parse(v)],
          into: %{},
          do: {k, n}

    case fields do
      %{"records" => n, "wall_us" => wall, "cpu_us" => cpu} ->
        kept = fields["kept"] || fields["bytes"] || 0
        %{records: n, kept: kept, wall_us: max(wall, 1), cpu_us: cpu}

      _ ->
        raise "#{what}: unexpected output: #{String.slice(out, 0, 500)}"
    end
  end

  defp report!({out, status}, what),
    do: raise("#{what} exited with #{status}: #{String.slice(out, 0, 1_000)}")

  defp executable(name) do
    case System.find_executable(name) do
      nil -> {:error, "no #{name} on the PATH"}
      path -> {:ok, path}
    end
  end

  defp newest(pattern, hint) do
    case Path.wildcard(pattern) do
      [] -> {:error, "nothing matches #{pattern} (#{hint})"}
      paths -> {:ok, Enum.max_by(paths, &File.stat!(&1, time: :posix).mtime)}
    end
  end

  defp stale?(out, inputs) do
    case File.stat(out, time: :posix) do
      {:ok, %{mtime: built}} -> Enum.any?(inputs, &(File.stat!(&1, time: :posix).mtime > built))
      {:error, _} -> true
    end
  end
end
