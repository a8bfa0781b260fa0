# The Kafka NIF (native/larder_kafka, librdkafka through the rdkafka crate):
# argument checks, then the NIF stubs. The library is loaded lazily by
# load!/0, the first time a Kafka function is called, so a VM that never
# uses Kafka never maps librdkafka (there is no @on_load).
defmodule Larder.Kafka.Native do
  @moduledoc false

  # cargo builds native/larder_kafka (librdkafka included) when this module
  # is compiled; the library is loaded only by load!/0.
  use Larder.Native.Cargo, crate: "native/larder_kafka", lib: "larder_kafka"

  @max_poll 100_000
  @max_timeout 600_000
  @max_partitions 100_000
  @max_headers 10_000

  @doc """
  Loads the NIF library once. Safe to call from many processes at once:
  a load that finds the library already loaded (by a concurrent caller)
  counts as loaded. Raises if the library cannot be loaded.
  """
  def load! do
    if loaded?() do
      :ok
    else
      path = :filename.join(:code.priv_dir(:larder_kafka), ~c"native/liblarder_kafka")

      case :erlang.load_nif(path, 0) do
        :ok ->
          :ok

        {:error, {:reload, _}} ->
          :ok

        {:error, {:upgrade, _}} ->
          :ok

        {:error, {reason, text}} ->
          if loaded?(),
            do: :ok,
            else: raise("cannot load the Kafka NIF (#{reason}): #{text}")
      end
    end
  end

  @doc "True once the NIF library is loaded."
  def loaded? do
    nif_loaded()
  catch
    :error, :not_loaded -> false
  end

  ## consumer

  def consumer_open(config) do
    check_config!(config)
    load!()
    nif_consumer_open(config)
  end

  def consumer_close(consumer) do
    check_handle!(consumer, :consumer)
    with_handle(consumer, :consumer, fn -> nif_consumer_close(consumer) end)
  end

  @doc """
  `{:ok, [{level, facility, message}], dropped}`: librdkafka's log lines
  since the last call (syslog levels 0..7), at most 100, and how many more
  there were. librdkafka never writes them to stderr.
  """
  def consumer_logs(consumer) do
    check_handle!(consumer, :consumer)
    with_handle(consumer, :consumer, fn -> nif_consumer_logs(consumer) end)
  end

  @doc """
  `{:ok, text | nil}`: librdkafka's last broker connection failure (its
  log line, such as "ssl://h:9092/bootstrap: SSL handshake failed: ...")
  since the last metadata or watermark request that succeeded: the cause
  behind a request's "Broker transport failure".
  """
  def consumer_failure(consumer) do
    check_handle!(consumer, :consumer)
    with_handle(consumer, :consumer, fn -> nif_consumer_failure(consumer) end)
  end

  def consumer_metadata(consumer, topic, timeout_ms) do
    check_handle!(consumer, :consumer)
    check_binary!(topic, :topic)
    check_int!(timeout_ms, :timeout_ms, 0, @max_timeout)
    with_handle(consumer, :consumer, fn -> nif_consumer_metadata(consumer, topic, timeout_ms) end)
  end

  def consumer_watermarks(consumer, topic, partition, timeout_ms) do
    check_handle!(consumer, :consumer)
    check_binary!(topic, :topic)
    check_int!(partition, :partition, 0, 2_147_483_647)
    check_int!(timeout_ms, :timeout_ms, 0, @max_timeout)

    with_handle(consumer, :consumer, fn ->
      nif_consumer_watermarks(consumer, topic, partition, timeout_ms)
    end)
  end

  def consumer_assign(consumer, topic, offsets) do
    check_handle!(consumer, :consumer)
    check_binary!(topic, :topic)

    unless list_of?(offsets, @max_partitions, fn
             {p, o} -> int?(p, 0, 2_147_483_647) and int?(o, -1, 9_223_372_036_854_775_807)
             _ -> false
           end) do
      raise ArgumentError,
            "offsets must be a list of {partition, offset} (offset -1 = from the start), got: " <>
              inspect(offsets, limit: 5)
    end

    with_handle(consumer, :consumer, fn -> nif_consumer_assign(consumer, topic, offsets) end)
  end

  def consumer_notify(consumer, pid) do
    check_handle!(consumer, :consumer)

    unless is_pid(pid) and node(pid) == node(),
      do: raise(ArgumentError, "pid must be a local pid, got: #{inspect(pid)}")

    with_handle(consumer, :consumer, fn -> nif_consumer_notify(consumer, pid) end)
  end

  def consumer_poll(consumer, max, block_ms, max_record_bytes) do
    check_handle!(consumer, :consumer)
    check_int!(max, :max, 1, @max_poll)
    check_int!(block_ms, :block_ms, 0, @max_timeout)
    check_int!(max_record_bytes, :max_record_bytes, 0, 1_073_741_824)

    with_handle(consumer, :consumer, fn ->
      nif_consumer_poll(consumer, max, block_ms, max_record_bytes)
    end)
  end

  ## producer

  def producer_open(config) do
    check_config!(config)
    load!()
    nif_producer_open(config)
  end

  def producer_close(producer) do
    check_handle!(producer, :producer)
    with_handle(producer, :producer, fn -> nif_producer_close(producer) end)
  end

  def produce(producer, topic, partition, key, value, headers) do
    check_handle!(producer, :producer)
    check_binary!(topic, :topic)
    check_record!({partition, key, value, headers})

    with_handle(producer, :producer, fn ->
      nif_produce(producer, topic, partition, key, value, headers)
    end)
  end

  def produce_batch(producer, topic, records) do
    check_handle!(producer, :producer)
    check_binary!(topic, :topic)

    unless list_of?(records, @max_poll, fn _ -> true end),
      do: raise(ArgumentError, "records must be a list of at most 100000 records")

    Enum.each(records, &check_record!/1)
    with_handle(producer, :producer, fn -> nif_produce_batch(producer, topic, records) end)
  end

  def producer_flush(producer, timeout_ms) do
    check_handle!(producer, :producer)
    check_int!(timeout_ms, :timeout_ms, 0, @max_timeout)
    with_handle(producer, :producer, fn -> nif_producer_flush(producer, timeout_ms) end)
  end

  @doc """
  One step of a transaction on a producer opened with a
  `"transactional.id"`: `:init` (once, first), `:begin`, `:commit` or
  `:abort`, waiting up to `timeout_ms`. A producer closed inside a
  transaction sends neither a commit nor an abort, as one that died: the
  broker aborts the transaction after its `transaction.timeout.ms`.
  """
  def producer_transaction(producer, step, timeout_ms) do
    check_handle!(producer, :producer)

    unless step in [:init, :begin, :commit, :abort],
      do:
        raise(
          ArgumentError,
          "step must be :init, :begin, :commit or :abort, got: #{inspect(step, limit: 5)}"
        )

    check_int!(timeout_ms, :timeout_ms, 0, @max_timeout)

    with_handle(producer, :producer, fn ->
      nif_producer_transaction(producer, step, timeout_ms)
    end)
  end

  ## admin

  def admin_open(config) do
    check_config!(config)
    load!()
    nif_admin_open(config)
  end

  def admin_close(admin) do
    check_handle!(admin, :admin)
    with_handle(admin, :admin, fn -> nif_admin_close(admin) end)
  end

  def create_topic(admin, topic, partitions, configs, timeout_ms) do
    check_handle!(admin, :admin)
    check_binary!(topic, :topic)
    check_int!(partitions, :partitions, 1, 10_000)
    check_config!(configs)
    check_int!(timeout_ms, :timeout_ms, 0, @max_timeout)

    with_handle(admin, :admin, fn ->
      nif_create_topic(admin, topic, partitions, configs, timeout_ms)
    end)
  end

  def delete_topic(admin, topic, timeout_ms) do
    check_handle!(admin, :admin)
    check_binary!(topic, :topic)
    check_int!(timeout_ms, :timeout_ms, 0, @max_timeout)
    with_handle(admin, :admin, fn -> nif_delete_topic(admin, topic, timeout_ms) end)
  end

  def create_partitions(admin, topic, count, timeout_ms) do
    check_handle!(admin, :admin)
    check_binary!(topic, :topic)
    check_int!(count, :count, 1, 10_000)
    check_int!(timeout_ms, :timeout_ms, 0, @max_timeout)
    with_handle(admin, :admin, fn -> nif_create_partitions(admin, topic, count, timeout_ms) end)
  end

  def delete_records(admin, topic, offsets, timeout_ms) do
    check_handle!(admin, :admin)
    check_binary!(topic, :topic)

    unless list_of?(offsets, @max_partitions, fn
             {p, o} -> int?(p, 0, 2_147_483_647) and int?(o, 0, 9_223_372_036_854_775_807)
             _ -> false
           end),
           do: raise(ArgumentError, "offsets must be a list of {partition, offset}")

    check_int!(timeout_ms, :timeout_ms, 0, @max_timeout)
    with_handle(admin, :admin, fn -> nif_delete_records(admin, topic, offsets, timeout_ms) end)
  end

  ## checks

  defp check_config!(config) do
    unless list_of?(config, 256, &match?({k, v} when is_binary(k) and is_binary(v), &1)) do
      raise ArgumentError,
            "config must be a list of at most 256 {binary, binary}, got: " <>
              inspect(config, limit: 5)
    end
  end

  defp check_handle!(handle, what) do
    unless is_reference(handle),
      do: raise(ArgumentError, "#{what} must be a Kafka #{what} handle, got: #{inspect(handle)}")

    load!()
  end

  defp check_binary!(value, what) do
    unless is_binary(value),
      do: raise(ArgumentError, "#{what} must be a binary, got: #{inspect(value, limit: 5)}")
  end

  defp check_int!(value, what, min, max) do
    unless int?(value, min, max),
      do:
        raise(
          ArgumentError,
          "#{what} must be an integer in #{min}..#{max}, got: #{inspect(value)}"
        )
  end

  # The arguments are checked above but for the handle's resource type,
  # which only the NIF can tell: its bare badarg names the handle here.
  defp with_handle(handle, what, fun) do
    fun.()
  rescue
    ArgumentError ->
      reraise ArgumentError,
              [message: "#{what} must be a Kafka #{what} handle, got: #{inspect(handle)}"],
              __STACKTRACE__
  end

  defp int?(value, min, max), do: is_integer(value) and value >= min and value <= max

  # A proper list of at most `max` elements, each passing `ok?`: walked
  # once, never past `max` cells, so an improper or huge list is refused
  # without a bare badarg (length/1) or a FunctionClauseError (Enum).
  defp list_of?(list, max, ok?), do: list_of?(list, max, ok?, 0)

  defp list_of?([], _max, _ok?, _n), do: true

  defp list_of?([x | rest], max, ok?, n) when n < max,
    do: ok?.(x) and list_of?(rest, max, ok?, n + 1)

  defp list_of?(_other, _max, _ok?, _n), do: false

  defp check_record!({partition, key, value, headers} = record) do
    ok =
      int?(partition, -1, 2_147_483_647) and (is_nil(key) or is_binary(key)) and
        (is_nil(value) or is_binary(value)) and
        list_of?(
          headers,
          @max_headers,
          &match?({k, v} when is_binary(k) and (is_binary(v) or is_nil(v)), &1)
        )

    unless ok,
      do:
        raise(
          ArgumentError,
          "a record must be {partition | -1, key | nil, value | nil, [{name, value | nil}]}, got: " <>
            inspect(record, limit: 5)
        )
  end

  defp check_record!(other),
    do: raise(ArgumentError, "a record must be a 4-tuple, got: #{inspect(other, limit: 5)}")

  ## NIF stubs (replaced by load!/0)

  # Each stub raises through :erlang.nif_error/1, which the compiler takes
  # as returning any term (a stub returning false would let it fold
  # loaded?/0 to false).
  defp nif_loaded, do: :erlang.nif_error(:not_loaded)

  defp nif_consumer_open(_config), do: :erlang.nif_error(:not_loaded)
  defp nif_consumer_close(_c), do: :erlang.nif_error(:not_loaded)
  defp nif_consumer_logs(_c), do: :erlang.nif_error(:not_loaded)
  defp nif_consumer_failure(_c), do: :erlang.nif_error(:not_loaded)
  defp nif_consumer_metadata(_c, _topic, _timeout), do: :erlang.nif_error(:not_loaded)
  defp nif_consumer_watermarks(_c, _topic, _p, _timeout), do: :erlang.nif_error(:not_loaded)
  defp nif_consumer_assign(_c, _topic, _offsets), do: :erlang.nif_error(:not_loaded)
  defp nif_consumer_poll(_c, _max, _block, _cap), do: :erlang.nif_error(:not_loaded)
  defp nif_consumer_notify(_c, _pid), do: :erlang.nif_error(:not_loaded)
  defp nif_producer_open(_config), do: :erlang.nif_error(:not_loaded)
  defp nif_producer_close(_p), do: :erlang.nif_error(:not_loaded)
  defp nif_produce(_p, _topic, _part, _key, _value, _headers), do: :erlang.nif_error(:not_loaded)
  defp nif_produce_batch(_p, _topic, _records), do: :erlang.nif_error(:not_loaded)
  defp nif_producer_flush(_p, _timeout), do: :erlang.nif_error(:not_loaded)
  defp nif_producer_transaction(_p, _step, _timeout), do: :erlang.nif_error(:not_loaded)
  defp nif_admin_open(_config), do: :erlang.nif_error(:not_loaded)
  defp nif_admin_close(_a), do: :erlang.nif_error(:not_loaded)
  defp nif_create_topic(_a, _topic, _n, _configs, _timeout), do: :erlang.nif_error(:not_loaded)
  defp nif_delete_topic(_a, _topic, _timeout), do: :erlang.nif_error(:not_loaded)
  defp nif_create_partitions(_a, _topic, _n, _timeout), do: :erlang.nif_error(:not_loaded)
  defp nif_delete_records(_a, _topic, _offsets, _timeout), do: :erlang.nif_error(:not_loaded)
end
