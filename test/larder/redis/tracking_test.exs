defmodule Larder.Redis.TrackingTest do
  # The client's reading of what arrives on the tracking channel and of
  # CLIENT ID: untrusted (anyone may PUBLISH there), so anything but what
  # Redis sends is :bad or :error, never a crash and never keys.
  use ExUnit.Case, async: true

  alias Larder.Redis.Tracking
  alias Larder.Test.PropEr

  test "keys/1: Redis's array of keys, its nil after a flush, anything else :bad" do
    assert Tracking.keys(["a", "b"]) == ["a", "b"]
    assert Tracking.keys([]) == []
    assert Tracking.keys(:undefined) == :all
    assert Tracking.keys("a published payload") == :bad
    assert Tracking.keys(["a", 1]) == :bad
    assert Tracking.keys(["a", ["nested"]]) == :bad
    assert Tracking.keys(42) == :bad
  end

  test "keys/1 returns the keys of a list of binaries, and :bad for any other term" do
    gen = :proper_types.oneof([:proper_types.any(), :proper_types.list(:proper_types.binary())])

    PropEr.check(
      PropEr.forall(gen, fn term ->
        case Tracking.keys(term) do
          :all -> term == :undefined
          :bad -> not (is_list(term) and Enum.all?(term, &is_binary/1))
          keys -> keys == term and Enum.all?(keys, &is_binary/1)
        end
      end)
    )
  end

  test "parse_id/1: decimal digits of a positive 64-bit id, anything else :error" do
    assert Tracking.parse_id("7") == {:ok, "7"}
    assert Tracking.parse_id("18446744073709551615") == {:ok, "18446744073709551615"}
    assert Tracking.parse_id("0") == :error
    assert Tracking.parse_id("-1") == :error
    assert Tracking.parse_id("12x") == :error
    assert Tracking.parse_id("") == :error
    assert Tracking.parse_id(String.duplicate("9", 21)) == :error
    assert Tracking.parse_id(7) == :error
    assert Tracking.parse_id(:undefined) == :error
  end
end
