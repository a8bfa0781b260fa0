defmodule PriceSearch.Search do
  @moduledoc """
  The reference service's search semantics over a loaded `PriceSearch.Store`:
  request validation, the bitmap search (`Larder.Table`), the map-index
  search, and the choice among several matches.

  A request is the decoded JSON object
  `{"offeringId","groupId","priceSpecId","charValues":[{"char","value"}...]}`.
  `offeringId`, `groupId` and `priceSpecId` are required strings; an
  unknown value is an error. `charValues` may be absent or null; each given
  characteristic must match exactly, an omitted one is not checked. Unknown
  fields are ignored. One match is the answer; among several, the default
  price (lowest row first), or an error when none is a default.

  ## Failures

  `conditions/1` answers `{:error, message}` naming the field at fault; the
  searches answer `{:error, message}` when nothing (or no default) matches.
  Nothing here raises on any decoded JSON.

  ## Performance

  A search is one `Larder.Table.search/2` (or one `Larder.Table.search_many/2`
  for a bulk body); finding which value is unknown costs map lookups, and
  only when nothing matched.
  """

  alias Larder.Table
  alias PriceSearch.{Catalogue, Store}

  @max_chars 64

  @typedoc "An answer: the price's stored fields, or a message saying why none."
  @type answer :: {:ok, map()} | {:error, String.t()}

  @doc """
  The `Larder.Table` conditions of a decoded request, or `{:error, message}`
  naming the field that is missing or of the wrong type. At most
  #{@max_chars} `charValues`.
  """
  @spec conditions(term()) :: {:ok, keyword()} | {:error, String.t()}
  def conditions(%{} = request) do
    with {:ok, offering} <- required(request, "offeringId"),
         {:ok, group} <- required(request, "groupId"),
         {:ok, spec} <- required(request, "priceSpecId"),
         {:ok, chars} <- chars(Map.get(request, "charValues")) do
      {:ok, [{:offering_id, offering}, {:group_id, group}, {:spec, spec} | chars]}
    end
  end

  def conditions(_other), do: {:error, "the request must be a JSON object"}

  defp required(request, field) do
    case request do
      %{^field => value} when is_binary(value) -> {:ok, value}
      %{^field => nil} -> {:error, "missing field #{field}"}
      %{^field => _} -> {:error, "field #{field} must be a string"}
      _ -> {:error, "missing field #{field}"}
    end
  end

  defp chars(nil), do: {:ok, []}
  defp chars(list) when is_list(list), do: chars(list, 0, [])
  defp chars(_), do: {:error, "field charValues must be an array"}

  defp chars([], _i, acc), do: {:ok, :lists.reverse(acc)}

  defp chars(_list, @max_chars, _acc),
    do: {:error, "field charValues has more than #{@max_chars} entries"}

  defp chars([%{"char" => c, "value" => v} | rest], i, acc) when is_binary(c) and is_binary(v),
    do: chars(rest, i + 1, [{:char, {c, v}} | acc])

  defp chars([%{} = cv | _], i, _acc) do
    field = if is_binary(Map.get(cv, "char")), do: "value", else: "char"
    {:error, "field charValues[#{i}].#{field} must be a string"}
  end

  defp chars([_ | _], i, _acc), do: {:error, "field charValues[#{i}] must be an object"}

  @doc "Searches the bitmap indexes (`Larder.Table.search/2`)."
  @spec bitmap(Store.t(), keyword()) :: answer()
  def bitmap(store, conditions),
    do: choose(Table.search(store.table, conditions), store, conditions)

  @doc "Answers many searches with one `Larder.Table.search_many/2`, in order."
  @spec bitmap_many(Store.t(), [keyword()]) :: [answer()]
  def bitmap_many(_store, []), do: []

  def bitmap_many(store, many) do
    store.table
    |> Table.search_many(many)
    |> Enum.zip_with(many, &choose(&1, store, &2))
  end

  @doc "Searches the Go-style map index: the offering's prices, scanned."
  @spec map(Store.t(), keyword()) :: answer()
  def map(store, conditions),
    do: choose(Catalogue.map_search(store.map_index, conditions), store, conditions)

  defp choose([price], _store, _conditions), do: {:ok, price}
  defp choose([], store, conditions), do: {:error, no_match(store, conditions)}

  defp choose(prices, _store, _conditions) do
    case Enum.find(prices, & &1.is_default) do
      nil -> {:error, "#{length(prices)} prices match and none is the default"}
      price -> {:ok, price}
    end
  end

  defp no_match(store, [{:offering_id, o}, {:group_id, g}, {:spec, s} | _]) do
    cond do
      not Map.has_key?(store.offerings, o) -> "unknown offeringId: #{o}"
      not Map.has_key?(store.groups, g) -> "unknown groupId: #{g}"
      not Map.has_key?(store.specs, s) -> "unknown priceSpecId: #{s}"
      true -> "no price matches the request"
    end
  end
end
