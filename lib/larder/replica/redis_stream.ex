defmodule Larder.Replica.RedisStream do
  @moduledoc """
  A `Larder.Replica.Source` that reads a Redis Stream (Redis 5 or later;
  reading from the beginning of a trimmed stream is detected from Redis 7 on).

      {Larder.Replica.RedisStream,
       redis: [host: "127.0.0.1", port: 6379], stream: "prices"}

  Options:

    * `:stream` (required) - the stream's key, 1 to 1,024 bytes.
    * `:redis` - the server: a keyword list of the connection options
      `Larder.Cache.Redis` takes too (one schema):
      * `:url` - `"redis://[[username]:password@]host[:port][/database]"`,
        instead of the five keys it names (see `Larder.Cache.Redis`);
      * `:host` - a string of 1 to 255 bytes (or a charlist), default
        `"127.0.0.1"`;
      * `:port` - `1..65_535`, default `6379`;
      * `:username` - a Redis 6 ACL user (1 to 255 bytes), or `nil`
        (default);
      * `:password` - a string sent with `AUTH` (with `:username` when
        given), or `nil` (default);
      * `:database` - `0..1_000_000`, default `0` (`SELECT`);
      * `:sentinel` - read from the master a Sentinel set names, as
        `Larder.Cache.Redis`'s `:sentinel` (`sentinels:`, `master:`, and
        the sentinels' own `username:`/`password:`), used instead of
        `:host` and `:port`. The master is asked for (and checked with
        `ROLE`) on every connect, so after a failover the replica
        reconnects to the promoted replica;
      * `:cluster` - `{host, port}` seeds of a Redis Cluster: the stream
        (one key, one slot) is read from its slot's master, found with
        `CLUSTER SLOTS` on every connect (and again after a `MOVED`);
        excludes `:host`, `:port` and `:sentinel`, and needs `:database` 0;
      * `:timeout` - ms, `1..600_000`, default `5_000`: connecting, and
        waiting for a reply beyond the read's own block time;
      * `:max_reply_bytes` - the largest reply accepted, `1_024..2^32`,
        default `67_108_864` (64 MiB); a larger reply to a read closes the
        connection and is `:batch_too_large`, so the replica reads half as
        many entries per batch from then on (down to one), and a log of
        large entries is still read.

  Entry ids are the stream's ids as Redis writes them (`"1700000000000-0"`).
  The replica's position (`Larder.Replica.Source`) is the id of the last
  entry it applied; `origin/1` is `"0-0"`, and `Larder.Replica.await/3`
  takes an id.

  ## Reading

  Each read is one round trip of `MULTI`, `XINFO STREAM`, `XRANGE key
  after after` (the replica's own entry, for the trim check), `XREAD COUNT
  n STREAMS key after`, `EXEC`: the trim check and the read are one atomic
  step on the server, so no trim can fall between them. When that read
  returns nothing, the source waits with `XREAD COUNT 1 BLOCK ms STREAMS key
  after` and, when an entry arrives, does the atomic read again. A read
  that follows a batch shorter than `n` (the end of the stream was
  reached) starts with that wait, not with an atomic read that would find
  nothing: a wake-up costs two round trips, a batch of a catch-up one. A
  wait that times out leaves the next read to start with the atomic read,
  so a trim is seen within one block time even when no entry comes. After
  a full batch, the atomic read of the next one is sent at once, before
  the batch is returned: Redis prepares it while the replica applies.

  ## Trimming

  The read reports `{:trimmed, resume_after, conn}` when `XINFO STREAM`
  shows that entries after the replica's id may have been removed
  (`XTRIM`, `XADD ... MAXLEN`/`MINID`):

    * the stream's first entry is above the replica's id and is not the id
      right after it (`"<ms>-<seq + 1>"`): entries between the two may have
      existed. The check is conservative: when the replica's own entry and
      those before it were trimmed and the next entry's id is in a later
      millisecond, a trim that lost nothing is reported too (never the
      reverse). `resume_after` is the id just before the first entry;
    * the stream is empty and its last generated id is above the replica's;
    * reading from the beginning (`"0-0"`), the stream has added more
      entries than it holds (`entries-added`, Redis 7);
    * the stream went backwards: its last generated id is below the
      replica's (deleted and written again with lower ids, or a failover
      that lost entries the replica had read). `resume_after` is then where
      a read from the beginning starts: `"0-0"`, or the id before the
      first entry if the stream also lost its first entries. Since a wait
      (`XREAD ... BLOCK`) is not woken by entries below its id, this is
      seen by the atomic read that follows a wait that timed out, within
      one block time;
    * the stream went backwards and new entries have passed the replica's
      id since (Redis 7): the stream holds entries below the replica's id
      but not the replica's own entry, and its `max-deleted-entry-id` is
      below it, so that entry was never deleted from this stream: it is
      an entry the replica read that this stream never had. `resume_after`
      as above.

  A stream that does not exist is empty; if the replica's id is above
  `"0-0"` it was deleted, which is reported as trimmed after `"0-0"`. An
  entry removed with `XDEL` after the replica's id, with entries before
  and after it still there, is not detected: it is no longer in the log.
  Before Redis 7, a stream that lost entries the replica read and then
  got new ones past its id is not detected either (nothing tells a lost
  entry from one removed with `XDEL`).

  ## Failures

  The source reads through Larder's Redis socket layer and RESP parser,
  the ones of the cache's connections (incremental: a large `XREAD` reply split
  over many packets is read once; bounded: a length above
  `:max_reply_bytes` is refused at its header, before its bytes are
  buffered); it needs no eredis. Every reply is checked: bytes that are
  not RESP, a reply of the wrong shape, an id that does not parse or does
  not increase, fields that are not pairs of strings: each is `{:error,
  %Larder.Error{reason: :source_bad_reply}}`; the replies of one read
  larger than `:max_reply_bytes` in all are `{:error, %Larder.Error{reason:
  :batch_too_large}}` (see the option). An error reply (`NOAUTH`, `WRONGTYPE`) is
  `:source_failed`; a refused connection, a closed one, a timeout, no
  master from the sentinels or the cluster's seeds, or an error reply that
  says the stream is served elsewhere now (`MOVED`, `ASK`, `TRYAGAIN`,
  `CLUSTERDOWN`, `READONLY`, `MASTERDOWN`) is `:source_unavailable`. None
  raises.

  With `:sentinel` or `:cluster`, the server is found through the Redis
  client's topology layer, the one `Larder.Cache.Redis` uses: a failover,
  or a slot that moved, is a failed read followed by a connect to the new
  master. A promoted replica may lack entries the
  replica read from the old master: that is a stream that went
  backwards (see "Trimming"), and the replica rebuilds from what the new
  master holds.
  """

  @behaviour Larder.Replica.Source

  alias Larder.Redis.{RESP, Socket, Topology}
  alias Larder.Redis.Options, as: RedisOptions

  @what "Larder.Replica.RedisStream"
  @max_u64 18_446_744_073_709_551_615

  @impl true
  def validate!(opts) do
    opts =
      Larder.Options.validate!(
        opts,
        [
          stream: {{:string, 1, 1_024}, :required},
          redis: {{:custom, "a keyword list", &Keyword.keyword?/1}, []}
        ],
        @what
      )

    # (a charlist host, which this source took before the options were
    # shared, is still taken)
    redis =
      opts[:redis]
      |> charlist_host()
      |> RedisOptions.validate!("#{@what} :redis", [],
        timeout: 5_000,
        max_reply_bytes: 67_108_864
      )

    Keyword.put(opts, :redis, redis)
  end

  defp charlist_host(redis) do
    case redis[:host] do
      [_ | _] = host ->
        if List.ascii_printable?(host),
          do: Keyword.put(redis, :host, List.to_string(host)),
          else: redis

      _ ->
        redis
    end
  end

  @impl true
  def identity(opts), do: opts[:stream]

  @impl true
  def origin(_opts), do: "0-0"

  @impl true
  def cast_position(id), do: cast_id(id)

  @impl true
  def advance(_position, id), do: id

  @impl true
  def reached?(position, target), do: compare(position, target) != :lt

  defp cast_id(id) when is_binary(id) and byte_size(id) <= 41 do
    case parse_id(id) do
      {:ok, _} -> {:ok, id}
      :error -> :error
    end
  end

  defp cast_id(_id), do: :error

  defp compare(a, b) do
    {:ok, a} = parse_id(a)
    {:ok, b} = parse_id(b)

    cond do
      a < b -> :lt
      a > b -> :gt
      true -> :eq
    end
  end

  defp parse_id(id) when is_binary(id) do
    with [ms, seq] <- :binary.split(id, "-"),
         {:ok, ms} <- u64(ms),
         {:ok, seq} <- u64(seq) do
      {:ok, {ms, seq}}
    else
      _ -> :error
    end
  end

  defp parse_id(_), do: :error

  # 1 to 20 digits (binary_to_integer/1 would also take a sign: the first
  # byte is a digit, and it refuses a sign anywhere else).
  defp u64(<<d, _::binary>> = digits) when d in ?0..?9 and byte_size(digits) <= 20 do
    case :erlang.binary_to_integer(digits) do
      n when n <= @max_u64 -> {:ok, n}
      _ -> :error
    end
  rescue
    ArgumentError -> :error
  end

  defp u64(_), do: :error

  ## Connection

  @impl true
  def connect(opts) do
    redis = opts[:redis]
    # Large buffers: a catch-up's replies are megabytes, read in few packets.
    socket_opts = [
      timeout: redis[:timeout],
      tcp: [nodelay: true, recbuf: 1_048_576, buffer: 1_048_576],
      handshake: Socket.handshake(redis)
    ]

    with {:ok, {host, port}} <- address(redis, opts[:stream]) do
      case Socket.connect(host, port, socket_opts) do
        {:ok, socket} ->
          {:ok,
           %{
             socket: socket,
             caught_up: false,
             ahead: nil,
             stream: opts[:stream],
             timeout: redis[:timeout],
             max: redis[:max_reply_bytes]
           }}

        {:error, {:handshake, message}} ->
          {:error, Larder.Error.new(:source_failed, "AUTH/SELECT: #{truncate(message)}")}

        {:error, reason} ->
          {:error, unavailable(reason)}
      end
    end
  end

  # The server to read: the one named, the master the sentinels name
  # (asked on every connect, so a replica follows a failover: a read that
  # fails reconnects), or the master of the stream's slot on a cluster (a
  # stream is one key; MOVED fails the read, and the reconnect locates it
  # again). Larder.Redis.Topology resolves both, as it does for the cache.
  defp address(redis, stream) do
    case Topology.locate(redis, stream, redis[:timeout]) do
      {:ok, address} -> {:ok, address}
      {:error, {:cluster, :no_seed}} -> {:error, unavailable(:no_seed)}
      {:error, reason} -> {:error, unavailable(reason)}
    end
  end

  @impl true
  def close(%{socket: socket}), do: Socket.close(socket)

  def close(_conn), do: :ok

  ## Reading

  @impl true
  def read(%{ahead: {after_id, count}} = conn, after_id, count, _block_ms) do
    # This read was sent ahead, when the last batch came.
    conn = %{conn | ahead: nil}
    result(atomic_reply(replies(conn, 5, 0), conn, after_id), conn, count, after_id)
  end

  def read(%{ahead: {_, _}} = conn, after_id, count, block_ms) do
    # A read sent ahead for another position (after a trim): its replies go.
    case replies(conn, 5, 0) do
      {:ok, _replies} -> read(%{conn | ahead: nil}, after_id, count, block_ms)
      {:error, error} -> {:error, error, conn}
    end
  end

  def read(%{caught_up: true} = conn, after_id, count, block_ms) when block_ms > 0 do
    # The last read had reached the end: wait for an entry first.
    block(conn, after_id, count, block_ms)
  end

  def read(conn, after_id, count, block_ms) do
    case atomic_read(conn, after_id, count) do
      {:ok, [], _info} when block_ms > 0 -> block(conn, after_id, count, block_ms)
      other -> result(other, conn, count, after_id)
    end
  end

  # Waits for one entry, then reads atomically again. A wait that times out
  # leaves the next read to start with the atomic read (and its trim check).
  defp block(conn, after_id, count, block_ms) do
    case request(conn, [xread(conn, after_id, 1, block_ms)], block_ms) do
      {:ok, [{:ok, :undefined}]} -> {:ok, [], after_id, %{conn | caught_up: false}}
      {:ok, [{:ok, reply}]} when is_list(reply) -> wake(conn, after_id, count)
      {:ok, [reply]} -> {:error, reply_error(reply, "XREAD"), conn}
      {:error, error} -> {:error, error, conn}
    end
  end

  defp wake(conn, after_id, count),
    do: result(atomic_read(conn, after_id, count), conn, count, after_id)

  # A batch short of `count` reached the end of the stream; after a full
  # one, the next read is sent now, so that Redis prepares it while the
  # replica applies this one. The position after a batch is its last id.
  defp result({:ok, [], _info}, conn, _count, after_id),
    do: {:ok, [], after_id, %{conn | caught_up: true}}

  defp result({:ok, entries, _info}, conn, count, _after_id) when length(entries) < count do
    {last, _fields} = List.last(entries)
    {:ok, entries, last, %{conn | caught_up: true}}
  end

  defp result({:ok, entries, _info}, conn, count, _after_id) do
    {last, _fields} = List.last(entries)

    case Socket.send(conn.socket, atomic_commands(conn, last, count)) do
      :ok -> {:ok, entries, last, %{conn | caught_up: false, ahead: {last, count}}}
      {:error, _reason} -> {:ok, entries, last, %{conn | caught_up: false}}
    end
  end

  defp result({:trimmed, resume}, conn, _count, _after_id), do: {:trimmed, resume, conn}
  defp result({:error, error}, conn, _count, _after_id), do: {:error, error, conn}

  defp xread(conn, after_id, count, block_ms) do
    block = if block_ms > 0, do: ["BLOCK", Integer.to_string(block_ms)], else: []
    ["XREAD", "COUNT", Integer.to_string(count)] ++ block ++ ["STREAMS", conn.stream, after_id]
  end

  # XRANGE of the replica's own entry: whether the stream still holds it
  # (see "Trimming").
  defp atomic_commands(conn, after_id, count) do
    [
      ["MULTI"],
      ["XINFO", "STREAM", conn.stream],
      ["XRANGE", conn.stream, after_id, after_id],
      xread(conn, after_id, count, 0),
      ["EXEC"]
    ]
  end

  defp atomic_read(conn, after_id, count) do
    atomic_reply(request(conn, atomic_commands(conn, after_id, count), 0), conn, after_id)
  end

  defp atomic_reply(replies, conn, after_id) do
    case replies do
      {:ok,
       [{:ok, "OK"}, {:ok, "QUEUED"}, {:ok, "QUEUED"}, {:ok, "QUEUED"}, {:ok, [info, own, read]}]} ->
        with {:ok, info} <- info(info),
             {:ok, info} <- own_entry(info, own, after_id),
             :ok <- trim_check(info, after_id),
             {:ok, entries} <- entries(read, conn.stream, after_id) do
          {:ok, entries, info}
        end

      {:ok, replies} ->
        case Enum.find(replies, &match?({:error, _}, &1)) do
          nil -> {:error, bad_reply("MULTI/EXEC", replies)}
          error -> {:error, reply_error(error, "MULTI/EXEC")}
        end

      {:error, error} ->
        {:error, error}
    end
  end

  # XINFO STREAM: a flat list of names and values (RESP2). A missing
  # stream is an error reply inside EXEC, which the parser gives as a string.
  defp info({:error, "ERR no such key" <> _}), do: {:ok, :missing}

  defp info(info) when is_list(info) do
    with {:ok, pairs} <- pairs(info, []),
         {:ok, last} <- cast_id(Map.get(pairs, "last-generated-id")),
         {:ok, first} <- first_entry(Map.get(pairs, "first-entry")),
         {:ok, added} <- count(Map.get(pairs, "entries-added")),
         {:ok, length} <- count(Map.get(pairs, "length")),
         {:ok, deleted} <- max_deleted(Map.get(pairs, "max-deleted-entry-id")) do
      {:ok, %{first: first, last: last, added: added, length: length, deleted: deleted}}
    else
      _ -> {:error, bad_reply("XINFO", info)}
    end
  end

  defp info({:error, message}) when is_binary(message),
    do: {:error, Larder.Error.new(:source_failed, "XINFO STREAM: #{truncate(message)}")}

  defp info(info), do: {:error, bad_reply("XINFO", info)}

  defp first_entry([id, _fields]), do: cast_id(id)
  defp first_entry(:undefined), do: {:ok, nil}
  defp first_entry(nil), do: {:ok, nil}
  defp first_entry(_other), do: :error

  # max-deleted-entry-id exists from Redis 7 on.
  defp max_deleted(nil), do: {:ok, nil}
  defp max_deleted(id), do: cast_id(id)

  # Whether the stream holds the entry `after_id` (XRANGE of that one id).
  defp own_entry(:missing, _own, _after_id), do: {:ok, :missing}
  defp own_entry(info, [], _after_id), do: {:ok, Map.put(info, :own, false)}
  defp own_entry(info, [[id, _fields]], id), do: {:ok, Map.put(info, :own, true)}
  defp own_entry(_info, own, _after_id), do: {:error, bad_reply("XRANGE", own)}

  # entries-added exists from Redis 7 on.
  defp count(nil), do: {:ok, nil}
  defp count(n) when is_integer(n) and n >= 0, do: {:ok, n}

  defp count(n) when is_binary(n) do
    case u64(n) do
      {:ok, n} -> {:ok, n}
      :error -> :error
    end
  end

  defp count(_n), do: :error

  defp pairs([name, value | rest], acc) when is_binary(name),
    do: pairs(rest, [{name, value} | acc])

  defp pairs([], acc), do: {:ok, Map.new(acc)}
  defp pairs(_other, _acc), do: :error

  # Whether entries after `after_id` were removed (see "Trimming").
  defp trim_check(:missing, "0-0"), do: :ok
  defp trim_check(:missing, _after_id), do: {:trimmed, "0-0"}

  # From the beginning: anything ever removed is lost (Redis 7's count).
  defp trim_check(%{first: first, last: last, added: added, length: length}, "0-0") do
    cond do
      added == nil or added <= length -> :ok
      first == nil -> {:trimmed, last}
      true -> {:trimmed, predecessor(first)}
    end
  end

  # A stream whose last generated id is below ours went backwards (deleted
  # and written again, or a failover that lost entries we read): what we
  # applied is not the log any more, so it is a trim, to be rebuilt from
  # what the stream holds, as a read from the beginning would.
  defp trim_check(%{last: last} = info, after_id) do
    if compare(last, after_id) == :lt or lost?(info, after_id),
      do: {:trimmed, from_origin(info)},
      else: trim_check_forward(info, after_id)
  end

  # The same when new entries have passed our id since (Redis 7): the
  # stream holds entries below our id but not ours, and deleted nothing at
  # or above it (an XDEL or a trim would have raised max-deleted-entry-id).
  # Our id is then an entry we read that this stream never had. (An id we
  # resumed after, which is no entry, is below the first entry.)
  defp lost?(%{first: first, deleted: deleted, own: false}, after_id)
       when first != nil and deleted != nil,
       do: compare(first, after_id) == :lt and compare(deleted, after_id) == :lt

  defp lost?(_info, _after_id), do: false

  # An empty stream whose last id is above ours: its entries after ours went.
  defp trim_check_forward(%{first: nil, last: last}, after_id) do
    if compare(last, after_id) == :gt, do: {:trimmed, last}, else: :ok
  end

  defp trim_check_forward(%{first: first}, after_id) do
    if compare(first, after_id) == :gt and first != successor(after_id),
      do: {:trimmed, predecessor(first)},
      else: :ok
  end

  # Where a rebuild reads from: the beginning, or after what was trimmed.
  defp from_origin(info) do
    case trim_check(info, "0-0") do
      :ok -> "0-0"
      {:trimmed, resume_after} -> resume_after
    end
  end

  defp successor(id) do
    {:ok, {ms, seq}} = parse_id(id)
    if seq < @max_u64, do: "#{ms}-#{seq + 1}", else: "#{ms + 1}-0"
  end

  defp predecessor(id) do
    case parse_id(id) do
      {:ok, {ms, 0}} when ms > 0 -> "#{ms - 1}-#{@max_u64}"
      {:ok, {ms, seq}} when seq > 0 -> "#{ms}-#{seq - 1}"
      _ -> "0-0"
    end
  end

  defp entries(:undefined, _stream, _after_id), do: {:ok, []}

  defp entries([[stream, entries]], stream, after_id) do
    {:ok, last} = parse_id(after_id)
    check_entries(entries, last, [])
  end

  defp entries(other, _stream, _after_id), do: {:error, bad_reply("XREAD", other)}

  # Ids that parse and increase, fields that are pairs of strings.
  defp check_entries([[id, fields] | rest], last, acc) when is_list(fields) do
    with {:ok, parsed} when parsed > last <- parse_id(id),
         {:ok, map} <- fields(fields, []) do
      check_entries(rest, parsed, [{id, map} | acc])
    else
      _ -> {:error, bad_reply("XREAD", [id, fields])}
    end
  end

  defp check_entries([], _last, acc), do: {:ok, Enum.reverse(acc)}
  defp check_entries(other, _last, _acc), do: {:error, bad_reply("XREAD", other)}

  defp fields([name, value | rest], acc) when is_binary(name) and is_binary(value),
    do: fields(rest, [{name, value} | acc])

  defp fields([], acc), do: {:ok, :maps.from_list(acc)}
  defp fields(_other, _acc), do: :error

  @impl true
  def latest(opts, timeout) do
    opts = put_in(opts, [:redis, :timeout], max(1, min(timeout, 60_000)))

    with {:ok, conn} <- connect(opts) do
      try do
        case request(conn, [["XINFO", "STREAM", conn.stream]], 0) do
          {:ok, [{:error, "ERR no such key" <> _}]} ->
            {:ok, "0-0"}

          {:ok, [{:ok, info}]} ->
            last_generated(info)

          {:ok, [reply]} ->
            {:error, reply_error(reply, "XINFO")}

          # (its first and last entries, not a batch: no read makes it smaller)
          {:error, %{reason: :batch_too_large} = error} ->
            {:error, %{error | reason: :source_bad_reply}}

          {:error, error} ->
            {:error, error}
        end
      after
        close(conn)
      end
    end
  end

  defp last_generated(info) when is_list(info) do
    with {:ok, pairs} <- pairs(info, []),
         id when is_binary(id) <- Map.get(pairs, "last-generated-id"),
         {:ok, id} <- cast_id(id) do
      {:ok, id}
    else
      _ -> {:error, bad_reply("XINFO", info)}
    end
  end

  defp last_generated(info), do: {:error, bad_reply("XINFO", info)}

  ## One request: the commands pipelined, their replies read whole, the
  ## bytes of the reply being read bounded by :max_reply_bytes, all within
  ## :timeout (plus `extra_ms`, a blocking read's own wait).

  defp request(conn, commands, extra_ms) do
    case Socket.send(conn.socket, commands) do
      :ok -> replies(conn, length(commands), extra_ms)
      {:error, reason} -> {:error, unavailable(reason)}
    end
  end

  # The bound is checked before the bytes are buffered (and the parser
  # refuses a declared length above it as soon as it reads the header).
  defp replies(conn, n, extra_ms) do
    deadline = System.monotonic_time(:millisecond) + conn.timeout + extra_ms

    case Socket.recv(conn.socket, RESP.new(conn.max), n, deadline, conn.max) do
      {:ok, replies, _parser} ->
        {:ok, replies}

      # The read's batch is too large: the replica reads fewer entries
      # (Larder.Replica.Source, :batch_too_large).
      {:error, :reply_too_large} ->
        {:error,
         Larder.Error.new(:batch_too_large, "a reply above :max_reply_bytes",
           max_reply_bytes: conn.max
         )}

      {:error, :bad_reply} ->
        {:error,
         Larder.Error.new(
           :source_bad_reply,
           "bytes that are not RESP, or more replies than commands"
         )}

      {:error, reason} ->
        {:error, unavailable(reason)}
    end
  end

  defp unavailable(reason) do
    Larder.Error.new(:source_unavailable, "Redis did not answer: #{inspect(reason)}",
      reason: reason
    )
  end

  defp reply_error({:error, message}, command) when is_binary(message) do
    # (MOVED, READONLY...: the stream is served elsewhere now; the
    # reconnect locates it again)
    if Topology.relocate?(message),
      do: unavailable({:relocated, truncate(message)}),
      else: Larder.Error.new(:source_failed, "#{command}: #{truncate(message)}")
  end

  defp reply_error(reply, command), do: bad_reply(command, reply)

  defp bad_reply(command, reply) do
    Larder.Error.new(:source_bad_reply, "an unexpected reply to #{command}",
      reply: inspect(reply, limit: 5, printable_limit: 100)
    )
  end

  defp truncate(message) when byte_size(message) > 200, do: binary_part(message, 0, 200)
  defp truncate(message), do: message
end
