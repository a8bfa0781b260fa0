defmodule PriceSearch.OptionsTest do
  use ExUnit.Case, async: true

  alias PriceSearch.Options

  doctest Options

  @defaults [:csv, port: 8091]
  defp checks, do: [port: Options.integer(0..65_535), csv: {"a string", &is_binary/1}]

  test "fills defaults, checks given values and defaults alike" do
    assert Options.validate!([], @defaults, checks(), "X") == [port: 8091]
    assert Options.validate!([csv: "a"], @defaults, checks(), "X") == [port: 8091, csv: "a"]

    assert_raise ArgumentError,
                 ~r/^expected X option :port to be an integer in 0..65535, got: -1$/,
                 fn ->
                   Options.validate!([port: -1], @defaults, checks(), "X")
                 end

    assert_raise ArgumentError, ~r/^expected X option :port/, fn ->
      Options.validate!([], [port: :bad], checks(), "X")
    end
  end

  test "anything but a keyword list of known keys, each once, is an ArgumentError" do
    for bad <- [nil, :x, "port", %{port: 1}, [1], [{"port", 1}], [{:port, 1} | :tail]] do
      assert_raise ArgumentError, ~r/^expected X options to be a keyword list/, fn ->
        Options.validate!(bad, @defaults, checks(), "X")
      end
    end

    assert_raise ArgumentError, ~r/unknown keys \[:bogus\]/, fn ->
      Options.validate!([bogus: 1], @defaults, checks(), "X")
    end

    assert_raise ArgumentError, ~r/duplicate keys \[:port\]/, fn ->
      Options.validate!([port: 1, port: 2], @defaults, checks(), "X")
    end
  end
end
