defmodule PriceSearch.SearchTest do
  use ExUnit.Case, async: true

  alias PriceSearch.Search

  test "conditions/1 of a valid request, with and without charValues" do
    request = %{
      "offeringId" => "o",
      "groupId" => "group1",
      "priceSpecId" => "MRC",
      "charValues" => [%{"char" => "Term", "value" => "12"}, %{"char" => "VPN", "value" => "v"}],
      "ignored" => 1
    }

    assert Search.conditions(request) ==
             {:ok,
              [
                offering_id: "o",
                group_id: "group1",
                spec: "MRC",
                char: {"Term", "12"},
                char: {"VPN", "v"}
              ]}

    assert {:ok, [offering_id: "o", group_id: "group1", spec: "MRC"]} =
             Search.conditions(Map.put(request, "charValues", nil))

    too_many = for i <- 1..65, do: %{"char" => "c#{i}", "value" => "v"}

    assert {:error, "field charValues has more than 64 entries"} =
             Search.conditions(Map.put(request, "charValues", too_many))
  end

  # Seeded random terms of every JSON-decoded shape (and some that jiffy
  # never makes): conditions/1 answers {:ok, _} or {:error, message}, never raises.
  test "conditions/1 never raises, on any term" do
    rand = :rand.seed_s(:exsss, 9)

    Enum.reduce(1..3_000, rand, fn _, rand ->
      {term, rand} = term(rand, 3)

      case Search.conditions(term) do
        {:ok, conditions} -> assert Keyword.keyword?(conditions)
        {:error, message} -> assert is_binary(message)
      end

      rand
    end)
  end

  @fields ~w(offeringId groupId priceSpecId charValues char value)

  defp term(rand, depth) do
    {kind, rand} = :rand.uniform_s(if(depth > 0, do: 9, else: 6), rand)

    case kind do
      1 -> {nil, rand}
      2 -> {:rand.uniform_s(3, rand) |> elem(0) > 1, rand}
      3 -> :rand.uniform_s(1000, rand)
      4 -> {"s", rand}
      5 -> {{:not, :json}, rand}
      6 -> {1.5, rand}
      7 -> list(rand, depth - 1)
      8 -> map(rand, depth - 1)
      9 -> map(rand, depth - 1)
    end
  end

  defp list(rand, depth) do
    {n, rand} = :rand.uniform_s(4, rand)
    Enum.map_reduce(1..n, rand, fn _, rand -> term(rand, depth) end)
  end

  defp map(rand, depth) do
    {n, rand} = :rand.uniform_s(6, rand)

    Enum.reduce(1..n, {%{}, rand}, fn _, {map, rand} ->
      {i, rand} = :rand.uniform_s(length(@fields), rand)
      {value, rand} = term(rand, depth)
      {Map.put(map, Enum.at(@fields, i - 1), value), rand}
    end)
  end

  test "the store and the listener refuse bad options with an ArgumentError naming them" do
    assert_raise ArgumentError, ~r/unknown options \[:bogus\]/, fn ->
      PriceSearch.Store.start_link(bogus: 1)
    end

    assert_raise ArgumentError, ~r/:load must be a function/, fn ->
      PriceSearch.Store.start_link(name: :x, load: :nope)
    end

    assert_raise ArgumentError, ~r/:port must be an integer/, fn ->
      PriceSearch.HTTP.start_link(port: 70_000)
    end

    assert_raise ArgumentError, ~r/unknown options \[:bogus\]/, fn ->
      PriceSearch.HTTP.start_link(bogus: 1)
    end
  end

  test "a store loads the records its :load gives, and fetch/1 answers :loading before" do
    name = :"#{__MODULE__}.store"
    assert PriceSearch.Store.fetch(name) == :loading
    prices = PriceSearch.Catalogue.generate(offerings: 1)
    start_supervised!({PriceSearch.Store, name: name, load: fn -> {"test", prices} end})
    assert {:ok, store} = await(name)
    assert store.size == length(prices)
    assert store.source == "test"
  end

  defp await(name) do
    case PriceSearch.Store.fetch(name) do
      {:ok, store} ->
        {:ok, store}

      :loading ->
        Process.sleep(50)
        await(name)
    end
  end
end
