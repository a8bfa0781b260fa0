defmodule Larder.Cache.L2InputPropertyTest do
  # Bad-input properties for everything that crosses the L2 boundary:
  # Larder.Cache.Redis's public functions with arbitrary arguments and with
  # arbitrary bytes for replies, and the cache owner with arbitrary
  # invalidation payloads, generation-key contents and stray messages.
  use ExUnit.Case, async: true

  alias Larder.Cache
  alias Larder.Cache.{Codec, Runtime}
  alias Larder.Test.RedisServer
  alias Larder.Test.{GarbageServer, Hostile, MemoryL2, PropEr}

  import Larder.Test.Eventually

  ## Generators

  # Larder.Test.Hostile's terms (descriptors: build them before use, as
  # below), plus near-misses of what the cache expects.
  defp term_gen do
    Hostile.term([
      {1, :proper_types.binary()},
      {1, :proper_types.integer()},
      {1, exactly(deep())},
      {1, exactly([1, 2 | :improper])},
      {1, exactly(:binary.copy("x", 300_000))},
      {1, exactly(-1)},
      {1, exactly(1.5)}
    ])
  end

  # PropEr's ?LET
  defp let(type, fun), do: :proper_types.bind(type, fun, false)

  # literal terms are PropEr types of their own; these are values
  defp exactly(term), do: :proper_types.exactly(term)

  defp deep, do: Enum.reduce(1..5_000, :leaf, fn _, acc -> {acc} end)

  defp payload_gen do
    node =
      :proper_types.oneof([:crypto.strong_rand_bytes(16), :proper_types.binary(), term_gen()])

    generation =
      :proper_types.oneof([
        :proper_types.integer(),
        :proper_types.oneof(
          Enum.map([2 ** 62 - 1, 2 ** 62, 2 ** 70, 10 ** 100, -1, 0], &exactly/1)
        ),
        term_gen()
      ])

    message =
      :proper_types.oneof([
        {:all, generation},
        {:key, term_gen()},
        exactly({:key}),
        term_gen()
      ])

    :proper_types.oneof([
      :proper_types.binary(),
      let(term_gen(), &:erlang.term_to_binary(Hostile.build(&1))),
      let(
        {node, message, :proper_types.range(0, 9)},
        fn {n, m, level} ->
          :erlang.term_to_binary(Hostile.build({:larder_cache, n, m}), compressed: level)
        end
      ),
      let(:proper_types.binary(), &(<<131>> <> &1)),
      let(:proper_types.binary(), &(<<131, 80>> <> &1))
    ])
  end

  ## Codec

  test "decode_value/2 and decode_message/2: arbitrary bytes never raise; results are bounded" do
    property =
      :proper.forall(payload_gen(), fn bin ->
        value_ok =
          case Codec.decode_value(bin, 65_536) do
            {:ok, term} -> :erlang.external_size(term) <= 65_536 * 2
            {:error, reason} -> reason in [:corrupt, :too_large, :fun]
          end

        message_ok =
          case Codec.decode_message(bin, 65_536) do
            {:ok, <<_::binary-16>>, {:key, _}} -> true
            {:ok, <<_::binary-16>>, {:all, g}} -> g in 0..Codec.max_generation()
            :error -> true
          end

        value_ok and message_ok
      end)

    PropEr.check(property, numtests: 500)
  end

  test "decode_value/2 gives back every term without funs that fits the bound" do
    property =
      :proper.forall({:proper_types.any(), :proper_types.range(0, 9)}, fn {term, level} ->
        bin = :erlang.term_to_binary(term, compressed: level)
        Codec.decode_value(bin, 67_108_864) == {:ok, term}
      end)

    PropEr.check(property, numtests: 300)
  end

  test "decode_value/2 gives back pids, ports, references, bitstrings, big integers and maps" do
    terms = [
      self(),
      hd(Port.list()),
      make_ref(),
      <<1::3>>,
      2 ** 300,
      -(2 ** 300),
      1.5,
      %{},
      Map.new(1..100, &{&1, [&1]}),
      ~c"charlist",
      :ünïcode,
      [1, 2 | 3],
      deep(),
      :binary.copy("x", 100_000)
    ]

    for term <- terms, level <- [0, 1, 9] do
      assert Codec.decode_value(:erlang.term_to_binary(term, compressed: level), 67_108_864) ==
               {:ok, term}
    end
  end

  test "parse_generation/1 accepts only integers in 0..max_generation" do
    property =
      :proper.forall(:proper_types.oneof([term_gen(), :proper_types.binary()]), fn input ->
        case Codec.parse_generation(Hostile.build(input)) do
          {:ok, g} -> is_integer(g) and g in 0..Codec.max_generation()
          :error -> true
        end
      end)

    PropEr.check(property, numtests: 300)
    assert Codec.parse_generation(String.duplicate("9", 100)) == :error
    assert Codec.parse_generation("4611686018427387903") == {:ok, 2 ** 62 - 1}
    assert Codec.parse_generation("4611686018427387904") == :error
  end

  ## The owner

  test "the owner survives arbitrary invalidation payloads and stray messages", ctx do
    l2 = start_supervised!(MemoryL2)
    name = :"#{ctx.test}"
    start_supervised!({Cache, name: name, l2: {MemoryL2, server: l2}})
    owner = Process.whereis(name)
    sentinel = {:sentinel, make_ref()}

    # A message's {:all, g} is only a hint, checked against the L2, which
    # nobody changes here: the node stays on the L2's generation and keeps L1.
    property =
      :proper.forall({payload_gen(), term_gen()}, fn {payload, stray} ->
        stray = Hostile.build(stray)
        :ok = Cache.put(name, sentinel, :kept)
        generation = generation(name)
        send(owner, {:larder_cache_l2, :message, payload})
        send(owner, stray)
        send(owner, {:larder_cache_l2, stray})
        # twice: a check the payload asked for runs behind the first
        _ = :sys.get_state(owner)
        _ = :sys.get_state(owner)

        Process.whereis(name) == owner and generation(name) == generation and
          generation == l2_generation(l2, name) and Cache.get(name, sentinel) == :kept
      end)

    PropEr.check(property, numtests: 300)
    assert Cache.fetch(name, :after, fn -> {:ok, 1} end) == {:ok, 1}
  end

  test "a cache starts whatever bytes are in the generation key", ctx do
    l2 = start_supervised!(MemoryL2)

    # A generation is adopted; anything else is replaced by a fresh
    # generation, which the node then holds too.
    property =
      :proper.forall(:proper_types.oneof([:proper_types.binary(), gen_string()]), fn bin ->
        name = :"#{ctx.test}"
        cache = {Cache, name: name, l2: {MemoryL2, server: l2}}
        :ok = MemoryL2.raw_put(l2, "larder:1:gen", bin)
        {:ok, pid} = start_supervised(cache, id: name)
        g = generation(name)
        in_l2 = l2_generation(l2, name)
        :ok = stop_supervised(name)

        expected =
          case Codec.parse_generation(bin) do
            {:ok, parsed} -> g == parsed
            :error -> g > 0
          end

        is_pid(pid) and g in 0..Codec.max_generation() and g == in_l2 and expected
      end)

    PropEr.check(property, numtests: 100)
  end

  defp gen_string do
    let(
      :proper_types.oneof([:proper_types.integer(), 2 ** 70, 10 ** 100, -5]),
      &Integer.to_string/1
    )
  end

  ## Options

  test "numeric options of Larder.Cache.Redis have upper bounds; errors name the option" do
    for {key, bad} <- [
          port: 65_536,
          port: 0,
          database: 1_000_001,
          database: -1,
          timeout: 600_001,
          timeout: 0,
          reconnect_sleep: 60_001,
          pool_size: 65,
          pool_size: 0,
          max_reply_bytes: 2 ** 32 + 1,
          max_message_bytes: 100,
          host: "",
          port: 1.5,
          timeout: :infinity
        ] do
      message = ~r/Redis option #{inspect(key)} to be/

      assert_raise ArgumentError, message, fn -> Cache.Redis.validate_opts!([{key, bad}]) end

      assert_raise ArgumentError, message, fn ->
        Cache.start_link(name: :bounded_redis_opts, l2: {Cache.Redis, [{key, bad}]})
      end
    end

    assert Cache.Redis.validate_opts!(port: 65_535, pool_size: 64, timeout: 600_000)
  end

  test ":max_value_bytes is checked and bounded" do
    for bad <- [0, 1023, 2 ** 30 + 1, :infinity, "1"] do
      assert_raise ArgumentError, ~r/option :max_value_bytes to be/, fn ->
        Cache.start_link(name: :bounded_value_bytes, max_value_bytes: bad)
      end
    end
  end

  ## Larder.Cache.Redis

  @tag :redis
  test "Larder.Cache.Redis: arbitrary arguments raise ArgumentError or return an allowed value" do
    server = RedisServer.start()
    on_exit(fn -> RedisServer.stop(server) end)

    {:ok, state} =
      Larder.Test.L2Process.start(Cache.Redis, [port: server.port, timeout: 500], self(), "ch")

    states = [state, state, state, :not_a_state, %{}, %{state | table: :x}]

    property =
      PropEr.forall(
        {:proper_types.range(0, 6), :proper_types.oneof(states), term_gen(), term_gen(),
         term_gen(), term_gen()},
        fn {fun, st, a, b, c, d} ->
          {a, b, c, d} = Hostile.build({a, b, c, d})

          result =
            try do
              case fun do
                0 -> Cache.Redis.get(st, a)
                1 -> Cache.Redis.put(st, a, b, c, d)
                2 -> Cache.Redis.delete(st, a)
                3 -> Cache.Redis.incr(st, a)
                4 -> Cache.Redis.publish(st, a, b)
                5 -> Cache.Redis.validate_opts!(a)
                6 -> Cache.Redis.put(st, "k", "v", c, d)
              end
            rescue
              ArgumentError -> :argument_error
            end

          allowed?(result)
        end
      )

    PropEr.check(property, numtests: 300)
    # still works afterwards
    assert :ok = Cache.Redis.put(state, "after", "v", :infinity, :always)
    assert {:ok, "v"} = Cache.Redis.get(state, "after")
    Cache.Redis.stop(state)
  end

  @tag :redis
  @tag :capture_log
  test "Larder.Cache.Redis: arbitrary bytes as replies never crash the caller or the cache" do
    {:ok, agent} = Agent.start_link(fn -> "" end)
    garbage = GarbageServer.start(fn _request -> Agent.get(agent, & &1) end)
    on_exit(fn -> GarbageServer.stop(garbage) end)

    {:ok, state} =
      Larder.Test.L2Process.start(Cache.Redis, [port: garbage.port, timeout: 100], self(), "ch")

    name = :"#{__MODULE__}.garbage_replies"
    l2 = {Cache.Redis, port: garbage.port, timeout: 100}
    start_supervised!({Cache, name: name, l2: l2, namespace: "garbage"})
    owner = Process.whereis(name)

    reply_gen =
      :proper_types.oneof([
        :proper_types.binary(),
        :proper_types.oneof([
          "+OK\r\n",
          "$-1\r\n",
          ":99999999999999999999999999\r\n",
          ":-1\r\n",
          "*1\r\n$1\r\nx\r\n",
          "-ERR x\r\n",
          "$5\r\nab"
        ]),
        let(:proper_types.binary(), &("$#{byte_size(&1)}\r\n" <> &1 <> "\r\n"))
      ])

    property =
      :proper.forall({reply_gen, :proper_types.range(0, 4)}, fn {reply, fun} ->
        Agent.update(agent, fn _ -> reply end)

        result =
          case fun do
            0 -> Cache.Redis.get(state, "k")
            1 -> Cache.Redis.put(state, "k", "v", 10, :new)
            2 -> Cache.Redis.delete(state, "k")
            3 -> Cache.Redis.incr(state, "k")
            4 -> Cache.Redis.publish(state, "ch", "p")
          end

        cache_result = Cache.fetch(name, {:k, fun}, fn -> {:ok, fun} end)
        allowed?(result) and cache_result == {:ok, fun} and Process.whereis(name) == owner
      end)

    PropEr.check(property, numtests: 60)
    Cache.Redis.stop(state)
    eventually(fn -> Process.whereis(name) == owner end)
  end

  defp allowed?(:argument_error), do: true
  defp allowed?(:ok), do: true
  defp allowed?(:miss), do: true
  defp allowed?({:ok, _}), do: true
  defp allowed?({:error, %Larder.Error{}}), do: true
  defp allowed?(opts) when is_list(opts), do: true
  defp allowed?(_other), do: false

  defp generation(name),
    do: :atomics.get(Runtime.get(name).generation, 1)

  defp l2_generation(l2, name) do
    key = Larder.Cache.Remote.generation_key(Runtime.get(name))
    {:ok, bin} = MemoryL2.get(l2, key)
    {:ok, g} = Codec.parse_generation(bin)
    g
  end
end
