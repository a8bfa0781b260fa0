defmodule Larder.Replica.Kafka do
  @moduledoc """
  A `Larder.Replica.Source` that reads every partition of a Kafka topic,
  through librdkafka (the `rdkafka` crate's bundled build, in a NIF library
  of its own that is loaded the first time a Kafka source is used).

      import Larder.Replica.Kafka, only: [kafka_record: 1]

      {Larder.Replica,
       name: :prices_replica,
       into: {Larder.Table, name: :prices, key: :k, index: [:product]},
       source: {Larder.Replica.Kafka, brokers: ["127.0.0.1:9092"], topic: "prices"},
       apply: fn kafka_record(key: k, value: v) ->
         if v, do: {:insert, decode(k, v)}, else: {:delete, k}
       end,
       snapshot: "/var/lib/app/prices.snap"}

  No consumer group is joined and no offset is committed: the source
  assigns every partition of the topic to itself and seeks to the
  replica's offsets, which live in the replica's snapshot, next to the
  state they produced. There is no group id option either: a replica's
  lag is `Larder.Replica.offset/1` against the topic's end
  (`await(r, :latest, t)`), not a group's committed offsets.

  ## Options

    * `:brokers` (required) - the bootstrap brokers, a list of 1 to 100
      `"host:port"` strings or `{host, port}` tuples (host a string or
      charlist, port `1..65_535`).
    * `:topic` (required) - the topic, 1 to 249 bytes of letters, digits,
      `.`, `_` and `-`.
    * `:client_id` - the client id the brokers see, 1 to 255 bytes of
      UTF-8 without null bytes, default `"larder"`.
    * `:tls` - `false` (default), `true` (TLS, the system's CA
      certificates), or a keyword list: `:cacertfile`, `:certfile`,
      `:keyfile` (paths of files that exist when the options are checked;
      a file librdkafka cannot read is `:source_failed` at each
      connection) and `:verify` (`true` by default: the broker's
      certificate and host name are checked).
    * `:sasl` - `nil` (default) or `{mechanism, user, password}` with
      mechanism `:plain`, `:scram_sha_256` or `:scram_sha_512` (user and
      password strings of 1 to 1,024 bytes). Over TLS when `:tls` is set.
    * `:isolation_level` - `:read_committed` (default) or
      `:read_uncommitted`. Read committed hands over the records of
      committed transactions only, and records of non-transactional
      producers as they come; a partition is then read up to its last
      stable offset, the first offset of its oldest open transaction, and
      no further (not even the non-transactional records after it) until
      that transaction ends. So `await(r, :latest, t)` waits for every
      transaction open when it is called to end (see "Positions").
    * `:fetch_max_bytes` - the most bytes one fetch asks a broker for,
      `1_048_576..268_435_456`, default `52_428_800` (librdkafka wants it
      at least its `message.max.bytes`, 1,000,000).
    * `:max_partition_fetch_bytes` - the most bytes of one partition in a
      fetch, `1_024..268_435_456`, default `4_194_304`.
    * `:queued_max_kbytes` - librdkafka's prefetch buffer per partition,
      in KiB, `64..1_048_576`, default `16_384`: what the source holds in
      memory ahead of the replica is at most about this times the number
      of partitions.
    * `:queued_min_messages` - `1..10_000_000`, default `100_000`, and
      `:fetch_queue_backoff_ms` - `1..1_000`, default `10`: librdkafka
      fetches a partition again only while its prefetch queue holds fewer
      than `:queued_min_messages` records (and less than
      `:queued_max_kbytes`); otherwise it waits `:fetch_queue_backoff_ms`
      before it looks again. librdkafka's own default wait is 1,000 ms,
      which idles a catch-up for most of a second each time a partition's
      queue fills; 10 ms keeps fetching as soon as the replica has taken
      records, and costs a little CPU when idle.
    * `:max_record_bytes` - the largest record (key, value and headers)
      handed to the replica, `1_024..1_073_741_824`, default `16_777_216`.
      A larger record is not copied: it is skipped and reported by a
      `[:larder, :replica, :kafka, :oversize]` event (measurement `count`,
      metadata `topic` and `records`, a list of `{partition, offset,
      bytes}`) and a warning in the log.
    * `:timeout` - ms, `100..600_000`, default `10_000`: how long a
      metadata or watermark request may take.

  Bad options raise `ArgumentError` naming the option.

  ## Entries

  Each record is an entry `{{partition, offset}, record}`, and `:apply`
  gets the `record`, a `kafka_record` (an Erlang record, a tagged tuple):

      {:kafka_record, key, value, headers, timestamp, partition, offset}

    * `key` - `binary | nil`;
    * `value` - `binary | nil` (`nil`: a tombstone);
    * `headers` - `[{name :: binary, binary | nil}]`, `[]` when none;
    * `timestamp` - `integer | nil`, ms since the epoch;
    * `partition`, `offset` - non-negative integers.

  Match it with the `kafka_record/1` macro (`import Larder.Replica.Kafka,
  only: [kafka_record: 1]`), which names the fields you want and leaves
  out the others, or as the tuple:

      fn kafka_record(key: k, value: nil) -> {:delete, k}
         kafka_record(key: k, value: v) -> {:insert, decode(k, v)}
      end

      fn {:kafka_record, k, v, _headers, _timestamp, _partition, _offset} -> ... end

  A tuple rather than a map: the NIF builds one per record, and a map
  (its keys sorted and checked on every record) cost a catch-up more than
  reading the record did. A key or value of up to 64 bytes is copied into
  the reading process's heap, a larger one is a binary of its own: never a
  part of a larger binary that a value kept in the structure would keep
  alive.

  Records of one partition come in offset order; records of different
  partitions are interleaved as the brokers send them (Kafka orders
  nothing across partitions).

  ## Positions

  The replica's position is a map `%{partition => next_offset}`: the
  offset of the next record to read in each partition. A partition absent
  from the map is read from its start. On its first read the source puts
  every partition of the topic in the map (those absent at their log start
  offset), and adds `:topic_id` (the topic's id, when the broker has
  topic ids), so a snapshot names the topic's incarnation as well as its
  offsets. The position moves past offsets that hold no record (compacted
  away, transaction markers, aborted records): gaps in offsets are not a
  trim.

  `await(r, :latest, t)` is for every record acknowledged before the call:
  it reads each partition's high watermark when it is called (the offset
  after its last acknowledged record, committed or not, under either
  isolation level), and returns `:ok` once every partition's position is
  at or past it, with the records before it applied. Under
  `:read_committed` the position cannot pass a partition's last stable
  offset, so a transaction open at the call holds the wait until it ends:
  committed, its records are applied and the position moves past its
  commit marker; aborted (by its producer, or by the broker
  `transaction.timeout.ms` after it began when its producer died), its
  records are skipped and the position moves past them. A caller whose
  `t` runs out first gets `{:error, %Larder.Error{reason: :timeout}}`, as
  for a transaction that never ends within `t`.

  ## Trims and changes of the topic

  These are reported to the replica as a trim, which it handles by its
  `:on_trimmed` option (`:rebuild` empties the structure and reads every
  partition from its start):

    * a partition's log start offset is past the replica's offset
      (retention, `kafka-delete-records`), found when the source assigns
      the partitions, or librdkafka's `OFFSET_OUT_OF_RANGE` while reading;
    * a partition's end below the replica's offset, or a topic id other
      than the one in the position: the topic was deleted and created again.

  A number of partitions other than the position's (partitions were added,
  or, on a broker without topic ids, the topic was created again with
  another count) is not a trim: the replica stops with `{:shutdown,
  %Larder.Error{reason: :partitions_changed}}` whatever its `:on_trimmed`,
  and its `await/3` callers get that error. Kafka maps a key to a
  partition by the partition count, so after the change a key's new
  records may go to another partition than its earlier ones, and the log
  keeps no order between two partitions: no read, and no rebuild from the
  topic's start, can apply a key's records in the order they were written.
  The replica reads no record of the new partitions; records written after
  the change to the partitions it already reads are applied until it finds
  the change, at its next look at the topic's metadata (below). No
  snapshot is written on the stop, and the last one holds the old
  partitions, so a replica started from it stops again. To go on, write
  the records into a new topic (with the partitions wanted from its
  start), or start the replica without its snapshot: it then reads the
  topic as it is, each partition in offset order and a key's records in
  two partitions in the order they happen to be read, which no check here
  can tell from a topic that always had its partitions.

  The topic's metadata is read on every assignment (each connection, each
  trim) and again every 30 s while reading, so a change during a run is
  found within 30 s.

  ## Failures

  A broker restart, a leader change or an unreachable broker pauses the
  replica: librdkafka reconnects and fetches from the leader by itself, the
  reads return no records meanwhile, and reading goes on from the
  replica's offsets. A topic that does not exist, a broker that does not
  answer a metadata or watermark request within `:timeout` are
  `{:error, %Larder.Error{reason: :source_unavailable}}`; a failed
  authentication, a refused TLS or SASL handshake or a configuration
  librdkafka rejects are `:source_failed`. After an error the replica
  closes the connection, waits and connects again.

  A request that fails on the connection gets from librdkafka only
  "Broker transport failure", for a dead host as for a listener that
  speaks another protocol. Its error leads with the cause librdkafka
  logged for the connection since the last request that succeeded, and the
  option to check, and keeps librdkafka's texts (the message, and
  `details.librdkafka`). `details.cause` is one of:

    * `:connection_refused`, `:unresolved` (`:source_unavailable`): check
      `:brokers`, and that the broker is up;
    * `:tls_to_plaintext`: TLS (`:tls` set) to a listener without it, which
      closed the connection during the TLS handshake;
      `:tls_certificate`: the broker's certificate was not verified;
      `:tls_handshake`: another TLS failure (`:source_failed`, check `:tls`);
    * `:sasl_to_plaintext`: SASL (`:sasl` set) to a listener without it,
      which offers no mechanism; `:sasl_mechanism`: a listener that takes
      other mechanisms (`:source_failed`, check `:sasl`);
    * `:plaintext_to_secured`: neither TLS nor SASL, to a listener that
      closed the connection at the first request, as a TLS listener does
      (`:source_failed`, check `:tls` and `:sasl`);
    * `:connection`: another failure, in librdkafka's words.

  Everything a broker sends is untrusted: librdkafka checks the protocol
  (CRCs, sizes), the NIF bounds what it copies (at most `batch_size`
  records per read, each at most `:max_record_bytes`), and no reply can
  raise in the replica or crash the VM.

  librdkafka's own log (a refused connection, "brokers are down") never
  reaches the VM's stderr: the NIF takes it at each read, metadata and
  watermark request, keeps up to 100 lines between two reads and counts
  the rest, and the source hands them to `Logger` (librdkafka's levels
  mapped to Logger's), at most 5 lines and a count of the others every
  10 s.

  ## Performance

  The replica's reader reads this source with no wait (the source
  implements `c:Larder.Replica.Source.notify/2`): a read is one call into
  the NIF on a dirty I/O scheduler that takes, with no wait, up to
  `batch_size` records from librdkafka's prefetch queue and builds the
  entries there; librdkafka fetches from every broker in its own threads
  meanwhile. The reader connects, reads, and runs an arity-1 `:apply`
  over each batch while the replica's process writes the batch before, so
  the reads, the decoding and the writes of a catch-up overlap. Once a
  read comes back empty, librdkafka's queue callback wakes the reader (the
  message `:larder_source_ready`, sent by a thread of the NIF's) when the
  next record, end of partition or error arrives: the lag from a record's
  arrival is one message, one read and one batch's apply, with no polling
  while idle. `mix run bench/replica_kafka_bench.exs` measures the
  catch-up from zero of the 487,200-price catalogue from 8 partitions
  against `Larder.Table.insert_many/2` of the same records.
  """

  @behaviour Larder.Replica.Source

  require Record

  alias Larder.Kafka.Native

  @doc """
  The record `:apply` gets (see "Entries"): `kafka_record(key: k, value:
  v)` in a pattern matches `{:kafka_record, k, v, _, _, _, _}`. The fields
  and their defaults (for building one, in a test): `key: nil, value: nil,
  headers: [], timestamp: nil, partition: 0, offset: 0`.
  """
  Record.defrecord(:kafka_record,
    key: nil,
    value: nil,
    headers: [],
    timestamp: nil,
    partition: 0,
    offset: 0
  )

  @typedoc "A record of the topic, as `:apply` gets it (see \"Entries\")."
  @type kafka_record ::
          record(:kafka_record,
            key: binary() | nil,
            value: binary() | nil,
            headers: [{binary(), binary() | nil}],
            timestamp: integer() | nil,
            partition: non_neg_integer(),
            offset: non_neg_integer()
          )

  @what "Larder.Replica.Kafka"
  @recheck_ms 30_000
  @log_every_ms 10_000
  @log_lines 5
  @max_offset 9_223_372_036_854_775_807
  @max_partition 2_147_483_647

  @impl true
  def validate!(opts) do
    opts =
      Larder.Options.validate!(
        opts,
        [
          brokers:
            {{:custom, "a list of 1 to 100 \"host:port\" or {host, port}", &brokers?/1},
             :required},
          topic:
            {{:custom, "a topic name (1 to 249 bytes of [a-zA-Z0-9._-])", &topic?/1}, :required},
          client_id:
            {{:custom, "a string of 1 to 255 bytes of UTF-8 without null bytes", &client_id?/1},
             "larder"},
          tls: {{:custom, "false, true or a keyword list of TLS options", &tls?/1}, false},
          sasl:
            {{:custom, "nil or {:plain | :scram_sha_256 | :scram_sha_512, user, password}",
              &sasl?/1}, nil},
          isolation_level: {{:in, [:read_committed, :read_uncommitted]}, :read_committed},
          fetch_max_bytes: {{:integer, 1_048_576, 268_435_456}, 52_428_800},
          max_partition_fetch_bytes: {{:integer, 1_024, 268_435_456}, 4_194_304},
          queued_max_kbytes: {{:integer, 64, 1_048_576}, 16_384},
          queued_min_messages: {{:integer, 1, 10_000_000}, 100_000},
          fetch_queue_backoff_ms: {{:integer, 1, 1_000}, 10},
          max_record_bytes: {{:integer, 1_024, 1_073_741_824}, 16_777_216},
          timeout: {{:integer, 100, 600_000}, 10_000}
        ],
        @what
      )

    opts
    |> Keyword.update!(:brokers, fn brokers -> Enum.map(brokers, &broker_string/1) end)
    |> Keyword.update!(:tls, &tls!/1)
  end

  # 1 to 100 brokers, walked by hand: an improper list is refused here, not
  # by a bare badarg from length/1.
  defp brokers?([_ | _] = brokers), do: brokers?(brokers, 0)
  defp brokers?(_), do: false

  defp brokers?([], _n), do: true
  defp brokers?([b | rest], n) when n < 100, do: broker?(b) and brokers?(rest, n + 1)
  defp brokers?(_, _n), do: false

  defp broker?({host, port}), do: host?(host) and is_integer(port) and port in 1..65_535

  defp broker?(string) when is_binary(string) and byte_size(string) <= 300 do
    case :binary.split(string, ":", [:global]) do
      [host, port] -> host?(host) and port?(port)
      _ -> bracketed?(string)
    end
  end

  defp broker?(_), do: false

  # "[::1]:9092"
  defp bracketed?(string) do
    case Regex.run(~r/^\[([0-9a-fA-F:.]+)\]:(\d{1,5})$/, string) do
      [_, _host, port] -> port?(port)
      _ -> false
    end
  end

  defp port?(port) do
    case Integer.parse(port) do
      {n, ""} -> n in 1..65_535
      _ -> false
    end
  end

  defp host?(host) when is_list(host),
    do: host != [] and List.ascii_printable?(host) and host?(List.to_string(host))

  defp host?(host) when is_binary(host),
    do: byte_size(host) in 1..253 and host =~ ~r/^[A-Za-z0-9._:\-\[\]]+$/

  defp host?(_), do: false

  defp broker_string({host, port}) do
    host = to_string(host)

    if String.contains?(host, ":") and not String.starts_with?(host, "["),
      do: "[#{host}]:#{port}",
      else: "#{host}:#{port}"
  end

  defp broker_string(string), do: string

  # librdkafka refuses a setting that is not UTF-8 or holds a null byte.
  defp client_id?(id),
    do:
      is_binary(id) and byte_size(id) in 1..255 and String.valid?(id) and
        not String.contains?(id, <<0>>)

  defp topic?(topic),
    do: is_binary(topic) and byte_size(topic) in 1..249 and topic =~ ~r/^[A-Za-z0-9._\-]+$/

  defp tls?(tls) when is_boolean(tls), do: true

  defp tls?(tls) when is_list(tls) do
    Keyword.keyword?(tls) and
      Enum.all?(tls, fn
        # librdkafka refuses to create a client whose files are missing:
        # refused here rather than by every connection attempt.
        {key, path} when key in [:cacertfile, :certfile, :keyfile] ->
          path?(path) and File.regular?(to_string(path))

        {:verify, verify} ->
          is_boolean(verify)

        _ ->
          false
      end)
  end

  defp tls?(_), do: false

  defp path?(path) when is_list(path),
    do: List.ascii_printable?(path) and path?(List.to_string(path))

  defp path?(path),
    do:
      is_binary(path) and byte_size(path) in 1..4_096 and String.valid?(path) and
        not String.contains?(path, <<0>>)

  defp tls!(false), do: false
  defp tls!(true), do: [verify: true]

  defp tls!(tls) do
    Keyword.merge(
      [verify: true],
      Enum.map(tls, fn
        {:verify, v} -> {:verify, v}
        {k, path} -> {k, to_string(path)}
      end)
    )
  end

  defp sasl?(nil), do: true

  defp sasl?({mechanism, user, password}) do
    mechanism in [:plain, :scram_sha_256, :scram_sha_512] and secret?(user) and secret?(password)
  end

  defp sasl?(_), do: false

  defp secret?(s),
    do:
      is_binary(s) and byte_size(s) in 1..1_024 and String.valid?(s) and
        not String.contains?(s, <<0>>)

  @doc false
  # librdkafka's configuration for these (validated) options.
  def librdkafka_config(opts) do
    fetch_max = opts[:fetch_max_bytes]

    base = [
      {"bootstrap.servers", Enum.join(opts[:brokers], ",")},
      {"client.id", opts[:client_id]},
      {"isolation.level", Atom.to_string(opts[:isolation_level])},
      {"fetch.max.bytes", Integer.to_string(fetch_max)},
      {"receive.message.max.bytes", Integer.to_string(fetch_max + 1_048_576)},
      {"max.partition.fetch.bytes", Integer.to_string(opts[:max_partition_fetch_bytes])},
      {"queued.max.messages.kbytes", Integer.to_string(opts[:queued_max_kbytes])},
      {"queued.min.messages", Integer.to_string(opts[:queued_min_messages])},
      {"fetch.queue.backoff.ms", Integer.to_string(opts[:fetch_queue_backoff_ms])},
      {"fetch.wait.max.ms", "100"},
      {"fetch.error.backoff.ms", "100"},
      {"reconnect.backoff.ms", "50"},
      {"reconnect.backoff.max.ms", "1000"},
      {"socket.keepalive.enable", "true"},
      {"log_level", "3"}
    ]

    base ++ security(opts[:tls], opts[:sasl])
  end

  defp security(tls, sasl) do
    protocol =
      case {tls, sasl} do
        {false, nil} -> "plaintext"
        {false, _} -> "sasl_plaintext"
        {_, nil} -> "ssl"
        {_, _} -> "sasl_ssl"
      end

    tls_config =
      case tls do
        false ->
          []

        tls ->
          [
            {"enable.ssl.certificate.verification", to_string(tls[:verify])},
            {"ssl.endpoint.identification.algorithm", if(tls[:verify], do: "https", else: "none")}
          ] ++
            for {key, name} <- [
                  cacertfile: "ssl.ca.location",
                  certfile: "ssl.certificate.location",
                  keyfile: "ssl.key.location"
                ],
                path = tls[key],
                do: {name, path}
      end

    sasl_config =
      case sasl do
        nil ->
          []

        {mechanism, user, password} ->
          name =
            case mechanism do
              :plain -> "PLAIN"
              :scram_sha_256 -> "SCRAM-SHA-256"
              :scram_sha_512 -> "SCRAM-SHA-512"
            end

          [{"sasl.mechanism", name}, {"sasl.username", user}, {"sasl.password", password}]
      end

    [{"security.protocol", protocol} | tls_config ++ sasl_config]
  end

  @impl true
  def identity(opts), do: opts[:topic]

  @impl true
  def origin(_opts), do: %{}

  @impl true
  def cast_position(position) when is_map(position) and map_size(position) <= 100_001 do
    valid =
      Enum.all?(position, fn
        {p, o} when is_integer(p) and p >= 0 and p <= @max_partition ->
          is_integer(o) and o >= 0 and o <= @max_offset

        {:topic_id, id} ->
          is_binary(id) and byte_size(id) in 1..64

        _ ->
          false
      end)

    if valid, do: {:ok, position}, else: :error
  end

  def cast_position(_position), do: :error

  @impl true
  def advance(position, {partition, offset}), do: Map.put(position, partition, offset + 1)

  @impl true
  def reached?(position, target) do
    Enum.all?(target, fn
      {p, end_offset} when is_integer(p) -> Map.get(position, p, 0) >= end_offset
      _ -> true
    end)
  end

  @impl true
  def connect(opts) do
    case Native.consumer_open(librdkafka_config(opts)) do
      {:ok, consumer} ->
        {:ok,
         %{
           consumer: consumer,
           topic: opts[:topic],
           timeout: opts[:timeout],
           max_record_bytes: opts[:max_record_bytes],
           expected: nil,
           partitions: nil,
           checked_at: nil,
           logged_at: now() - @log_every_ms,
           telemetry: Code.ensure_loaded?(:telemetry)
         }}

      {:error, reason} ->
        {:error, error(reason, "opening the consumer")}
    end
  end

  @impl true
  def close(%{consumer: consumer}) do
    Native.consumer_close(consumer)
    :ok
  end

  # librdkafka prefetches in its own threads: the replica's reader reads
  # with no wait, and is told when the consumer queue gets something (a
  # record, an end of partition, an error) after a read found it empty.
  @impl true
  def notify(conn, pid) do
    case Native.consumer_notify(conn.consumer, pid) do
      :armed -> {:armed, conn}
      :ready -> {:ready, conn}
      {:error, reason} -> {:error, error(reason, "asking for a notice"), %{conn | expected: nil}}
    end
  end

  @impl true
  def read(conn, position, count, block_ms) do
    result =
      case prepare(conn, position) do
        {:ok, conn, position} -> poll(conn, position, count, block_ms)
        other -> other
      end

    # (every result carries the conn last)
    put_elem(result, tuple_size(result) - 1, log_librdkafka(elem(result, tuple_size(result) - 1)))
  end

  # librdkafka's log lines (connection failures, brokers down) never reach
  # the VM's stderr: the NIF keeps them (at most 100 between two calls, the
  # rest counted) and they go to Logger from here, at most a few lines
  # every @log_every_ms.
  defp log_librdkafka(conn) do
    now = now()

    if now - conn.logged_at < @log_every_ms do
      conn
    else
      case Native.consumer_logs(conn.consumer) do
        {:ok, [], 0} ->
          conn

        {:ok, lines, dropped} ->
          require Logger

          {shown, rest} = Enum.split(lines, @log_lines)

          for {level, facility, message} <- shown do
            Logger.log(
              logger_level(level),
              "Larder.Replica.Kafka (#{conn.topic}): librdkafka #{facility}: #{message}"
            )
          end

          more = length(rest) + dropped

          if more > 0 do
            Logger.warning(
              "Larder.Replica.Kafka (#{conn.topic}): #{more} more librdkafka log line(s) " <>
                "in the last #{div(@log_every_ms, 1_000)} s not shown"
            )
          end

          %{conn | logged_at: now}

        {:error, _} ->
          conn
      end
    end
  end

  defp logger_level(level) when level <= 3, do: :error
  defp logger_level(4), do: :warning
  defp logger_level(level) when level in 5..6, do: :info
  defp logger_level(_), do: :debug

  # Assigns the partitions at `position` unless the consumer is already
  # there (the position the last read returned), checking the topic first;
  # and rechecks the topic's metadata every @recheck_ms.
  defp prepare(%{expected: position} = conn, position) do
    if now() - conn.checked_at < @recheck_ms do
      {:ok, conn, position}
    else
      with {:ok, meta} <- metadata(conn),
           :ok <- same_topic(conn, meta, position) do
        {:ok, %{conn | checked_at: now()}, position}
      else
        {:trimmed, _why} -> trimmed(conn)
        {:stop, error} -> {:stop, error, %{conn | expected: nil}}
        {:error, error} -> {:error, error, conn}
      end
    end
  end

  defp prepare(conn, position) do
    with {:ok, meta} <- metadata(conn),
         :ok <- same_topic(conn, meta, position),
         {:ok, position} <- fill(conn, meta, position) do
      offsets = Enum.map(meta.partitions, &{&1, Map.fetch!(position, &1)})

      case Native.consumer_assign(conn.consumer, conn.topic, offsets) do
        :ok ->
          {:ok, %{conn | expected: position, partitions: meta.partitions, checked_at: now()},
           position}

        {:error, reason} ->
          {:error, error(reason, "assigning the partitions"), conn}
      end
    else
      {:trimmed, _why} -> trimmed(conn)
      {:stop, error} -> {:stop, error, conn}
      {:error, error} -> {:error, error, conn}
    end
  end

  # Every trim resumes from the start of every partition (the empty
  # position): the replica rebuilds from what the topic holds now, and
  # the next assignment fills in the partitions and the topic id.
  defp trimmed(conn), do: {:trimmed, %{}, %{conn | expected: nil}}

  defp metadata(conn) do
    case Native.consumer_metadata(conn.consumer, conn.topic, conn.timeout) do
      {:ok, %{partitions: partitions, topic_id: id} = meta}
      when is_list(partitions) and partitions != [] ->
        conn_id = if is_binary(id) and byte_size(id) in 1..64, do: id
        {:ok, %{meta | topic_id: conn_id}}

      {:ok, _meta} ->
        {:error,
         Larder.Error.new(:source_unavailable, "the topic has no partitions", topic: conn.topic)}

      {:error, reason} ->
        {:error, request_error(conn, reason, "reading the topic's metadata")}
    end
  end

  # A position of another incarnation of the topic is a trim: the replica
  # may rebuild from what the new topic holds. A position of the same topic
  # with other partitions is not: Kafka maps a key to a partition by the
  # partition count, so once partitions are added the records a key gets
  # go to another partition than its earlier ones, and the log keeps no
  # order between the two; no read from any position gives the order they
  # were written in. The replica stops (whatever its :on_trimmed).
  defp same_topic(conn, meta, position) do
    stored = Enum.sort(for {p, _} <- position, is_integer(p), do: p)

    cond do
      is_binary(position[:topic_id]) and is_binary(meta.topic_id) and
          position[:topic_id] != meta.topic_id ->
        {:trimmed, :topic_id}

      stored != [] and stored != meta.partitions ->
        {:stop, partitions_changed(conn, stored, meta)}

      true ->
        :ok
    end
  end

  defp partitions_changed(conn, stored, meta) do
    Larder.Error.new(
      :partitions_changed,
      "the topic #{inspect(conn.topic)} has #{length(meta.partitions)} partitions, " <>
        "the replica's position #{length(stored)}: partitions were added (or the topic " <>
        "created again with another count). Kafka puts a key in a partition by the count, " <>
        "so a key's records written since may be in another partition than its earlier " <>
        "ones, in an order the topic does not keep: the replica stops rather than apply " <>
        "them out of order, whatever :on_trimmed. To go on, write the records into a new " <>
        "topic, or remove the snapshot to read the topic as it is (a key's records in two " <>
        "partitions are then applied in the order they are read)",
      topic: conn.topic,
      partitions: length(meta.partitions),
      position_partitions: length(stored)
    )
  end

  # Checks each stored offset against its partition's watermarks and puts
  # every partition (at its log start when absent) and the topic id into
  # the position.
  defp fill(conn, meta, position) do
    Enum.reduce_while(meta.partitions, {:ok, position}, fn p, {:ok, acc} ->
      case Native.consumer_watermarks(conn.consumer, conn.topic, p, conn.timeout) do
        {:ok, {low, high}}
        when is_integer(low) and is_integer(high) and low >= 0 and high >= low ->
          case Map.fetch(acc, p) do
            :error -> {:cont, {:ok, Map.put(acc, p, low)}}
            {:ok, o} when o < low or o > high -> {:halt, {:trimmed, {:offset, p, o, low, high}}}
            {:ok, _o} -> {:cont, {:ok, acc}}
          end

        {:ok, other} ->
          {:halt,
           {:error,
            Larder.Error.new(:source_bad_reply, "watermarks out of range",
              partition: p,
              watermarks: other
            )}}

        {:error, reason} ->
          {:halt, {:error, request_error(conn, reason, "reading partition #{p}'s watermarks")}}
      end
    end)
    |> case do
      {:ok, position} ->
        {:ok, if(meta.topic_id, do: Map.put(position, :topic_id, meta.topic_id), else: position)}

      other ->
        other
    end
  end

  defp poll(conn, position, count, block_ms) do
    case Native.consumer_poll(conn.consumer, min(count, 100_000), block_ms, conn.max_record_bytes) do
      {:ok, entries, positions, oversize} ->
        if oversize != [], do: oversize(conn, oversize)
        after_read = Enum.reduce(positions, position, fn {p, o}, acc -> Map.put(acc, p, o) end)
        {:ok, entries, after_read, %{conn | expected: after_read}}

      {:error, {:offset_out_of_range, _partition, _message}} ->
        trimmed(conn)

      {:error, reason} ->
        {:error, error(reason, "reading"), %{conn | expected: nil}}
    end
  end

  defp oversize(conn, records) do
    require Logger

    Logger.warning(
      "Larder.Replica.Kafka: #{length(records)} record(s) of #{conn.topic} over " <>
        ":max_record_bytes (#{conn.max_record_bytes}) skipped: " <>
        inspect(Enum.take(records, 10))
    )

    Larder.Telemetry.execute(
      conn.telemetry,
      [:larder, :replica, :kafka, :oversize],
      %{count: length(records)},
      %{topic: conn.topic, records: records}
    )
  end

  # Each partition's high watermark: the offset after the last record
  # acknowledged, committed or not. The watermark request carries the
  # client's isolation level, and under read_committed the broker answers
  # with the last stable offset instead (the first offset of the oldest
  # open transaction), which a replica reaches without the records
  # acknowledged after it: so this connection asks as read_uncommitted,
  # whatever the replica reads with. The replica's position, held at the
  # last stable offset while a transaction is open, reaches the watermark
  # once every transaction open now has ended.
  @impl true
  def latest(opts, timeout) do
    deadline = now() + timeout

    config =
      List.keystore(
        librdkafka_config(opts),
        "isolation.level",
        0,
        {"isolation.level", "read_uncommitted"}
      )

    case Native.consumer_open(config) do
      {:ok, consumer} ->
        try do
          conn = %{consumer: consumer, topic: opts[:topic], timeout: max(timeout, 1)}

          with {:ok, meta} <- metadata(conn) do
            Enum.reduce_while(meta.partitions, {:ok, %{}}, fn p, {:ok, acc} ->
              left = max(deadline - now(), 1)

              case Native.consumer_watermarks(consumer, opts[:topic], p, min(left, 600_000)) do
                {:ok, {_low, high}} when is_integer(high) and high >= 0 ->
                  {:cont, {:ok, Map.put(acc, p, high)}}

                {:ok, other} ->
                  {:halt,
                   {:error,
                    Larder.Error.new(:source_bad_reply, "a watermark out of range",
                      watermarks: other
                    )}}

                {:error, reason} ->
                  {:halt, {:error, request_error(conn, reason, "reading partition #{p}'s end")}}
              end
            end)
          end
        after
          Native.consumer_close(consumer)
        end

      {:error, reason} ->
        {:error, error(reason, "opening the consumer")}
    end
  end

  @failed [
    :config,
    :bad_arg,
    :authentication,
    :sasl_authentication_failed,
    :topic_authorization_failed,
    :cluster_authorization_failed,
    :ssl,
    :unsupported_sasl_mechanism,
    :fatal,
    :panic
  ]

  defp error({code, partition, message}, doing) when is_integer(partition),
    do: error({code, message}, doing) |> put_detail(:partition, partition)

  defp error({code, message}, doing) when is_atom(code) and is_binary(message) do
    reason = if code in @failed, do: :source_failed, else: :source_unavailable
    Larder.Error.new(reason, "#{doing}: #{message}", code: code)
  end

  defp error(other, doing),
    do:
      Larder.Error.new(:source_bad_reply, "#{doing}: an unexpected reply",
        reply: inspect(other, limit: 10)
      )

  # librdkafka's codes for a request that got no answer: its connection
  # failed, or nothing came in time (not a broker's answer, such as an
  # unknown topic).
  @connection_codes [
    :broker_transport_failure,
    :all_brokers_down,
    :operation_timed_out,
    :request_timed_out,
    :authentication,
    :ssl,
    :resolve,
    :fail
  ]

  # The causes of a failed connection that are a configuration the
  # listener does not take.
  @misconfigured [
    :tls_to_plaintext,
    :tls_certificate,
    :tls_handshake,
    :sasl_to_plaintext,
    :sasl_mechanism,
    :plaintext_to_secured
  ]

  # A metadata or watermark request that failed on the connection says
  # only "Broker transport failure", for a dead host as for a protocol the
  # listener does not speak. librdkafka's last connection failure (from its
  # log, since the last request that succeeded) says why: the error leads
  # with that cause and the option to check, and keeps both texts. A
  # handshake the listener refuses is a configuration that will not work
  # (:source_failed); a refused connection may be a broker down for a while.
  defp request_error(conn, reason, doing) do
    error = error(reason, doing)

    with true <- error.details[:code] in @connection_codes,
         {:ok, text} when is_binary(text) and text != "" <- Native.consumer_failure(conn.consumer) do
      explain(error, doing, text)
    else
      _ -> error
    end
  end

  defp explain(error, doing, text) do
    {cause, hint} = cause(text)
    broker = broker_of(text)
    hint = if broker, do: "#{broker}: #{hint}", else: hint
    reason = if cause in @misconfigured, do: :source_failed, else: error.reason
    said = String.replace_prefix(error.message, "#{doing}: ", "")

    %{
      error
      | reason: reason,
        message: "#{doing}: #{hint} (librdkafka: #{said}; #{text})",
        details: Map.merge(error.details, %{cause: cause, librdkafka: text})
    }
  end

  # librdkafka's wording (rdkafka_ssl.c, rdkafka_broker.c, its transport).
  defp cause(text) do
    cond do
      text =~ "SSL handshake failed" and text =~ "certificate" ->
        {:tls_certificate,
         "the broker's TLS certificate could not be verified: check :tls (:cacertfile, :verify)"}

      text =~ "connecting to a PLAINTEXT broker listener" or
          (text =~ "in state SSL_HANDSHAKE" and text =~ "Disconnected") ->
        {:tls_to_plaintext,
         "the broker closed the connection during the TLS handshake: is it a PLAINTEXT " <>
           "listener, without TLS? check :tls"}

      text =~ "SSL handshake failed" ->
        {:tls_handshake, "the TLS handshake failed: check :tls"}

      text =~ ~r/SASL .*handshake failed.*supported mechanisms:\s*(\(|$)/ ->
        {:sasl_to_plaintext,
         "the broker refused the SASL handshake and offers no SASL mechanism: is it a " <>
           "listener without SASL (PLAINTEXT or SSL)? check :sasl"}

      text =~ ~r/SASL .*handshake failed/ ->
        {:sasl_mechanism,
         "the broker does not take the SASL mechanism of :sasl (librdkafka's text names " <>
           "those it takes): check :sasl"}

      text =~ "connecting to a SSL listener" ->
        {:plaintext_to_secured,
         "the broker closed the connection at the first request: is it a TLS or SASL " <>
           "listener? check :tls and :sasl"}

      text =~ "Connection refused" ->
        {:connection_refused,
         "nothing listens there (connection refused): is the broker up, and :brokers right?"}

      text =~ "Failed to resolve" ->
        {:unresolved, "the host name does not resolve: check :brokers"}

      true ->
        {:connection, "the connection to the broker failed"}
    end
  end

  # "ssl://127.0.0.1:9092/bootstrap: ..." -> "127.0.0.1:9092"
  defp broker_of(text) do
    case Regex.run(~r{^(?:[a-z_]+://)?([^\s/]+)/[^\s:]*:}, text) do
      [_, broker] -> broker
      _ -> nil
    end
  end

  defp put_detail(%Larder.Error{details: details} = error, key, value),
    do: %{error | details: Map.put(details, key, value)}

  defp now, do: System.monotonic_time(:millisecond)
end
