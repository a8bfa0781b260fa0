defmodule Larder.Replica.Kafka.BadInputTest do
  # PropEr throws arbitrary terms at every option of Larder.Replica.Kafka,
  # passed through Larder.Replica's start_link/1 and child_spec/1 (one option
  # at a time in otherwise valid options, and whole option lists): only an
  # ArgumentError naming the option may come back. Values at the ends of
  # every option's bounds are accepted, and librdkafka takes the
  # configuration they make. Then arbitrary terms at every function of
  # Larder.Kafka.Native: a result or an ArgumentError of ours, never another
  # exception or a crash. No broker is needed: a refused option raises
  # before anything connects, and the NIF's calls are made with handles to
  # a broker that does not exist.
  use ExUnit.Case, async: true

  alias Larder.Kafka.Native
  alias Larder.Replica
  alias Larder.Replica.Kafka
  alias Larder.Test.{BadCall, Hostile, PropEr}

  import :proper_types,
    only: [oneof: 1, frequency: 1, list: 1, tuple: 1, integer: 2, binary: 0, bind: 3]

  @moduletag :capture_log

  @options [
    :brokers,
    :topic,
    :client_id,
    :tls,
    :sasl,
    :isolation_level,
    :fetch_max_bytes,
    :max_partition_fetch_bytes,
    :queued_max_kbytes,
    :max_record_bytes,
    :timeout
  ]

  @bounds %{
    fetch_max_bytes: {1_048_576, 268_435_456},
    max_partition_fetch_bytes: {1_024, 268_435_456},
    queued_max_kbytes: {64, 1_048_576},
    max_record_bytes: {1_024, 1_073_741_824},
    timeout: {100, 600_000}
  }

  # A broker nobody listens on: consumer_open does not connect.
  @good [brokers: ["127.0.0.1:1"], topic: "t"]

  ## Hostile values

  defp near_bounds do
    @bounds
    |> Map.values()
    |> Enum.flat_map(fn {min, max} -> [min - 1, max + 1, -min, min * 1.0, 2 ** 64 + min] end)
    |> oneof()
  end

  defp nasty do
    Hostile.term([
      {3, near_bounds()},
      {2,
       oneof([
         nil,
         true,
         false,
         :read_committed,
         "read_committed",
         "",
         "t\0",
         "a b",
         "127.0.0.1:9092,evil:1",
         ~c"127.0.0.1:9092",
         ["127.0.0.1:0"],
         ["127.0.0.1:65536"],
         [{"h", 0}],
         [{~c"h" ++ [256], 1}],
         [{[?h | :x], 1}],
         [{"h", 1} | :tail],
         ["h:1" | "h:2"],
         ["[::1:9092"],
         ["[zz]:1"],
         [cacertfile: [?a | ?b]],
         [cacertfile: [0]],
         [verify: :maybe],
         [keyfile: "a\0"],
         [cacertfile: "/nope/ca.pem"],
         {:plain, "u", "p", "x"},
         {:plain, "", "p"},
         {:plain, "u\0", "p"},
         {:scram_sha_1, "u", "p"},
         {"plain", "u", "p"},
         {:plain, <<255>>, "p"}
       ])},
      {1, bind(binary(), &[&1], false)},
      {1, list(tuple([oneof(@options ++ [:bogus, :group_id]), :proper_types.any()]))}
    ])
  end

  ## Values every option must take

  defp edge(key) when is_map_key(@bounds, key) do
    {min, max} = @bounds[key]
    oneof([min, max, integer(min, max)])
  end

  defp edge(:brokers) do
    broker =
      oneof([
        "h:1",
        "h:65535",
        "[::1]:9092",
        {"127.0.0.1", 1},
        {~c"localhost", 65_535},
        {"::1", 9092},
        String.duplicate("h", 253) <> ":9092"
      ])

    oneof([bind(list(broker), &[{"h", 1} | Enum.take(&1, 99)], false), List.duplicate("h:1", 100)])
  end

  defp edge(:topic),
    do: oneof(["t", "a.b_c-D9", String.duplicate("t", 249)])

  defp edge(:client_id), do: oneof(["c", String.duplicate("c", 255), "client id ü"])

  defp edge(:tls),
    do:
      oneof([
        false,
        true,
        [],
        [verify: false],
        [verify: true, cacertfile: "/etc/ssl/certs/ca-certificates.crt"]
      ])

  defp edge(:sasl) do
    oneof([
      nil,
      {:plain, "u", "p"},
      {:scram_sha_256, String.duplicate("u", 1_024), String.duplicate("p", 1_024)},
      {:scram_sha_512, "ü", "p"}
    ])
  end

  defp edge(:isolation_level), do: oneof([:read_committed, :read_uncommitted])

  ## Calls

  defp call do
    frequency([
      {6, tuple([oneof([:start_link, :child_spec]), tuple([:option, oneof(@options), nasty()])])},
      {2, tuple([oneof([:start_link, :child_spec]), tuple([:options, nasty()])])},
      {1, tuple([oneof([:start_link, :child_spec]), tuple([:unknown, nasty()])])},
      {3, bind(oneof(@options), &{:edge, &1, edge(&1)}, false)}
    ])
  end

  defp replica_opts(ctx, source_opts) do
    [
      name: :"#{ctx.test}-replica",
      into: {Larder.Table, name: :"#{ctx.test}-table", key: :id},
      source: {Kafka, source_opts},
      apply: fn _ -> :skip end
    ]
  end

  # The failures of one call, a list.
  defp check(_ctx, {:edge, key, value}) do
    opts = Kafka.validate!(Keyword.put(@good, key, value))

    case Native.consumer_open(Kafka.librdkafka_config(opts)) do
      {:ok, consumer} ->
        :ok = Native.consumer_close(consumer)
        []

      {:error, reason} ->
        [{:librdkafka_refused, key, value, reason}]
    end
  rescue
    e -> [{:edge_refused, key, value, e}]
  end

  defp check(ctx, {fun, {:option, key, value}}) do
    value = Hostile.build(value)
    source_opts = Keyword.put(@good, key, value)

    case BadCall.run(Kafka, :validate!, [source_opts]) do
      :argument_error ->
        refused(ctx, fun, source_opts, inspect(key))

      {:raised, e, stack} ->
        [{:validate!, key, e, stack}]

      validated ->
        # the value happened to be valid: librdkafka must take it
        case Native.consumer_open(Kafka.librdkafka_config(validated)) do
          {:ok, consumer} ->
            :ok = Native.consumer_close(consumer)
            []

          {:error, reason} ->
            [{:accepted_then_refused, key, value, reason}]
        end
    end
  end

  defp check(ctx, {fun, {:options, value}}) do
    value = Hostile.build(value)

    case BadCall.run(Kafka, :validate!, [value]) do
      :argument_error -> refused(ctx, fun, value, "Larder.Replica.Kafka")
      {:raised, e, stack} -> [{:validate!, e, stack}]
      _valid -> []
    end
  end

  defp check(ctx, {fun, {:unknown, value}}) do
    source_opts = [{:bogus, Hostile.build(value)} | @good]
    refused(ctx, fun, source_opts, ":bogus")
  end

  # Both Kafka.validate!/1 and the replica's start_link/child_spec refuse
  # `source_opts` with an ArgumentError whose message holds `name`.
  defp refused(ctx, fun, source_opts, name) do
    opts = replica_opts(ctx, source_opts)

    try do
      apply(Replica, fun, [opts])
      [{fun, :accepted, summary(source_opts)}]
    rescue
      e in ArgumentError ->
        message = Exception.message(e)

        if String.contains?(message, name),
          do: [],
          else: [{fun, :message_without, name, message}]

      e ->
        [{fun, summary(source_opts), e, __STACKTRACE__}]
    catch
      kind, reason -> [{fun, summary(source_opts), kind, reason}]
    end
  end

  defp summary(term), do: inspect(term, limit: 5, printable_limit: 50)

  test "every Kafka option refuses hostile values by name and takes its edge values", ctx do
    property =
      PropEr.forall(list(call()), fn calls ->
        failures = Enum.flat_map(calls, &check(ctx, &1))
        failures == [] or (IO.puts(inspect(failures, limit: 20)) && false)
      end)

    PropEr.check(property, numtests: 100)
  end

  ## Larder.Kafka.Native

  defp handle do
    frequency([
      {4, oneof([:consumer, :producer, :admin])},
      {1, oneof([:closed_consumer, :closed_producer, :closed_admin])},
      {2, nasty()}
    ])
  end

  defp native_call do
    arg = frequency([{2, nasty()}, {1, oneof(["t", 0, -1, 10, [], [{0, 0}]])}])
    config = frequency([{1, [{"bootstrap.servers", "127.0.0.1:1"}]}, {3, nasty()}])

    oneof([
      tuple([:consumer_open, tuple([config])]),
      tuple([:producer_open, tuple([config])]),
      tuple([:admin_open, tuple([config])]),
      tuple([:consumer_close, tuple([handle()])]),
      tuple([:consumer_logs, tuple([handle()])]),
      tuple([:consumer_failure, tuple([handle()])]),
      tuple([:producer_close, tuple([handle()])]),
      tuple([:admin_close, tuple([handle()])]),
      tuple([:consumer_metadata, tuple([handle(), arg, oneof([0, 10, arg])])]),
      tuple([:consumer_watermarks, tuple([handle(), arg, arg, oneof([0, 10, arg])])]),
      tuple([:consumer_assign, tuple([handle(), arg, arg])]),
      tuple([:consumer_poll, tuple([handle(), arg, oneof([0, arg]), arg])]),
      tuple([:produce, tuple([handle(), arg, arg, arg, arg, arg])]),
      tuple([:produce_batch, tuple([handle(), arg, arg])]),
      tuple([:producer_flush, tuple([handle(), oneof([0, arg])])]),
      tuple([
        :producer_transaction,
        tuple([handle(), oneof([:init, :begin, :commit, :abort, arg]), oneof([0, 10, arg])])
      ]),
      tuple([:create_topic, tuple([handle(), arg, arg, arg, oneof([0, 10, arg])])]),
      tuple([:delete_topic, tuple([handle(), arg, oneof([0, 10, arg])])]),
      tuple([:create_partitions, tuple([handle(), arg, arg, oneof([0, 10, arg])])]),
      tuple([:delete_records, tuple([handle(), arg, arg, oneof([0, 10, arg])])])
    ])
  end

  # Timeouts over 100 ms would wait for a broker that is not there.
  defp short_timeouts(fun, args) when fun in [:consumer_poll] do
    List.update_at(args, 2, &if(is_integer(&1) and &1 > 100, do: 0, else: &1))
  end

  defp short_timeouts(fun, args)
       when fun in [:consumer_metadata, :consumer_watermarks, :producer_flush] or
              fun in [:producer_transaction] or
              fun in [:create_topic, :delete_topic, :create_partitions, :delete_records] do
    List.update_at(args, -1, &if(is_integer(&1) and &1 > 100, do: 0, else: &1))
  end

  defp short_timeouts(_fun, args), do: args

  test "Larder.Kafka.Native gives a result or an ArgumentError for arbitrary arguments" do
    config = [{"bootstrap.servers", "127.0.0.1:1"}]
    {:ok, consumer} = Native.consumer_open(config)
    {:ok, producer} = Native.producer_open(config)
    {:ok, admin} = Native.admin_open(config)
    {:ok, closed_consumer} = Native.consumer_open(config)
    :ok = Native.consumer_close(closed_consumer)
    {:ok, closed_producer} = Native.producer_open(config)
    :ok = Native.producer_close(closed_producer)
    {:ok, closed_admin} = Native.admin_open(config)
    :ok = Native.admin_close(closed_admin)

    handles = %{
      consumer: consumer,
      producer: producer,
      admin: admin,
      closed_consumer: closed_consumer,
      closed_producer: closed_producer,
      closed_admin: closed_admin
    }

    # Live handles stay open: a close through the property closes a copy.
    placeholder = fn
      name when name in [:consumer, :producer, :admin] -> {:ok, handles[name]}
      name when is_map_key(handles, name) -> {:ok, handles[name]}
      _ -> :error
    end

    property =
      PropEr.forall(list(native_call()), fn calls ->
        failures =
          Enum.flat_map(calls, fn {fun, args} ->
            args =
              args
              |> Tuple.to_list()
              |> Enum.map(fn arg ->
                case placeholder.(arg) do
                  {:ok, handle} -> handle
                  :error -> Hostile.build(arg)
                end
              end)
              |> then(&short_timeouts(fun, &1))

            # closing the shared live handles would make the rest moot
            args =
              if fun in [:consumer_close, :producer_close, :admin_close] and
                   hd(args) in [consumer, producer, admin],
                 do: [closed_consumer],
                 else: args

            BadCall.failures(fun, args, fn ->
              case apply(Native, fun, args) do
                {:ok, handle} when fun in [:consumer_open, :producer_open, :admin_open] ->
                  close = String.replace(Atom.to_string(fun), "_open", "_close")
                  :ok = apply(Native, String.to_existing_atom(close), [handle])
                  []

                :ok ->
                  []

                {:ok, _} ->
                  []

                {:ok, _, _, _} ->
                  []

                {:ok, lines, dropped} when is_list(lines) and is_integer(dropped) ->
                  []

                {:error, {code, message}} when is_atom(code) and is_binary(message) ->
                  []

                {:error, {code, _p, message}} when is_atom(code) and is_binary(message) ->
                  []

                other ->
                  [{fun, :returned, other}]
              end
            end)
          end)

        failures == [] or (IO.puts(inspect(failures, limit: 20)) && false)
      end)

    PropEr.check(property, numtests: 100)

    :ok = Native.consumer_close(consumer)
    :ok = Native.producer_close(producer)
    :ok = Native.admin_close(admin)
  end
end
