# The contract every Larder.Cache.L2 implementation must meet. A test module
# `use`s it and provides, in its setup, `l2_opts` (init options for a fresh,
# empty backend) and `l2_module`.
defmodule Larder.Test.L2Conformance do
  @moduledoc false

  defmacro __using__(_opts) do
    quote do
      alias Larder.Test.L2Conformance, as: C

      describe "Larder.Cache.L2 conformance" do
        test "get of an absent key is a miss", ctx do
          {mod, state} = C.init(ctx)
          assert mod.get(state, C.key(ctx, "absent")) == :miss
        end

        test "put then get returns the same bytes, binary-safe", ctx do
          {mod, state} = C.init(ctx)
          key = C.key(ctx, <<0, 255, "k", 13, 10>>)
          value = :erlang.term_to_binary(%{a: [1, 2, 3], b: <<0, 13, 10, 255>>})
          assert :ok = mod.put(state, key, value, :infinity, :always)
          assert mod.get(state, key) == {:ok, value}
        end

        test "put :always overwrites, put :new does not", ctx do
          {mod, state} = C.init(ctx)
          key = C.key(ctx, "k")
          assert :ok = mod.put(state, key, "one", :infinity, :new)
          assert :ok = mod.put(state, key, "two", :infinity, :new)
          assert mod.get(state, key) == {:ok, "one"}
          assert :ok = mod.put(state, key, "three", :infinity, :always)
          assert mod.get(state, key) == {:ok, "three"}
        end

        test "delete removes a key, and deleting an absent key is :ok", ctx do
          {mod, state} = C.init(ctx)
          key = C.key(ctx, "k")
          :ok = mod.put(state, key, "v", :infinity, :always)
          assert :ok = mod.delete(state, key)
          assert mod.get(state, key) == :miss
          assert :ok = mod.delete(state, key)
        end

        test "a ttl expires the key", ctx do
          {mod, state} = C.init(ctx)
          key = C.key(ctx, "k")
          :ok = mod.put(state, key, "v", 50, :always)
          assert mod.get(state, key) == {:ok, "v"}
          Larder.Test.Eventually.eventually(fn -> mod.get(state, key) == :miss end)
        end

        test "incr counts from 1", ctx do
          {mod, state} = C.init(ctx)
          key = C.key(ctx, "counter")
          assert mod.incr(state, key) == {:ok, 1}
          assert mod.incr(state, key) == {:ok, 2}
        end

        test "publish reaches every subscriber of the channel, including the publisher", ctx do
          channel = C.key(ctx, "channel")
          {mod, a} = C.init(ctx, channel)
          b_pid = C.subscriber(ctx, channel, self())
          assert_receive {:larder_cache_l2, :connected}, 2_000
          assert_receive {:sub, ^b_pid, {:larder_cache_l2, :connected}}, 2_000
          :ok = mod.publish(a, channel, "hello")
          assert_receive {:larder_cache_l2, :message, "hello"}, 1_000
          assert_receive {:sub, ^b_pid, {:larder_cache_l2, :message, "hello"}}, 1_000
          :ok = mod.publish(a, C.key(ctx, "other"), "not for us")
          refute_receive {:larder_cache_l2, :message, "not for us"}, 100
        end
      end
    end
  end

  def init(ctx, channel \\ nil) do
    mod = ctx.l2_module

    {:ok, state} =
      Larder.Test.L2Process.start(mod, ctx.l2_opts, self(), channel || key(ctx, "channel"))

    ExUnit.Callbacks.on_exit(fn -> mod.stop(state) end)
    {mod, state}
  end

  # A second instance, in its own process, forwarding what it receives.
  def subscriber(ctx, channel, parent) do
    pid =
      spawn_link(fn ->
        {:ok, _state} = Larder.Test.L2Process.start(ctx.l2_module, ctx.l2_opts, self(), channel)
        forward(parent)
      end)

    pid
  end

  defp forward(parent) do
    receive do
      message ->
        send(parent, {:sub, self(), message})
        forward(parent)
    end
  end

  def key(ctx, suffix), do: "#{inspect(ctx.module)}:#{ctx.test}:" <> suffix
end
