defmodule Larder.TelemetryTest do
  # Larder.Telemetry: whether an instance emits (checked once, false when
  # turned off), and span/4 and execute/4, which emit through :telemetry
  # (the test stand-in, test/support/telemetry.ex) only when enabled.
  use ExUnit.Case, async: true

  alias Larder.Telemetry

  @span [:larder, :telemetry_test, :span]
  @event [:larder, :telemetry_test, :event]

  setup ctx do
    events = [@event | for(kind <- [:start, :stop, :exception], do: @span ++ [kind])]
    :ok = Larder.Test.TelemetryEvents.forward({__MODULE__, ctx.test}, events)
    # Events of other tests of this module are told apart by a tag of their own.
    %{tag: make_ref()}
  end

  test "enabled?/1: false when turned off, true when :telemetry is loaded (the tests' stand-in)" do
    refute Telemetry.enabled?(false)
    assert Telemetry.enabled?(true)
  end

  test "execute/4 emits only when enabled", %{tag: tag} do
    assert Telemetry.execute(false, @event, %{count: 1}, %{tag: tag}) == :ok
    refute_received {:event, @event, _, %{tag: ^tag}}
    assert Telemetry.execute(true, @event, %{count: 1}, %{tag: tag}) == :ok
    assert_received {:event, @event, %{count: 1}, %{tag: ^tag}}
  end

  test "span/4 returns the function's result, with start and stop events when enabled",
       %{tag: tag} do
    assert Telemetry.span(false, @span, %{tag: tag}, fn -> {:result, %{tag: tag, ok: 1}} end) ==
             :result

    refute_received {:event, [:larder, :telemetry_test, :span, _], _, %{tag: ^tag}}

    assert Telemetry.span(true, @span, %{tag: tag}, fn -> {:result, %{tag: tag, ok: 1}} end) ==
             :result

    assert_received {:event, [:larder, :telemetry_test, :span, :start], %{system_time: _},
                     %{tag: ^tag}}

    assert_received {:event, [:larder, :telemetry_test, :span, :stop], %{duration: d},
                     %{tag: ^tag, ok: 1}}

    assert is_integer(d) and d >= 0
  end

  test "a span whose function raises emits an exception event and raises on", %{tag: tag} do
    assert_raise RuntimeError, "boom", fn ->
      Telemetry.span(true, @span, %{tag: tag}, fn -> raise "boom" end)
    end

    assert_received {:event, [:larder, :telemetry_test, :span, :exception], _,
                     %{tag: ^tag, kind: :error}}

    # Off: the raise goes through untouched, with no event.
    assert_raise RuntimeError, fn ->
      Telemetry.span(false, @span, %{tag: tag}, fn -> raise "x" end)
    end

    refute_received {:event, _, _, %{tag: ^tag, reason: %RuntimeError{message: "x"}}}
  end
end
