defmodule PriceSearch.Search do
  @many_chars 64

  @moduledoc """
  The reference service's search semantics over a loaded `PriceSearch.Store`:
  the bitmap search (`Larder.Table`), the map-index search, the choice among
  several matches, and the Go service's messages when nothing is found.

  A search is a `t:PriceSearch.Request.t/0`. Each given characteristic must
  match exactly, an omitted one is not checked. One match is the answer;
  among several, the default price (lowest row first), or an error when none
  is a default.

  ## Failures

  The searches answer `{:error, message}` with the Go service's message when
  nothing (or no default) matches. The bitmap search names the first value
  that is unknown, in Go's order: the offering, each characteristic in the
  request's order (its name, then its value), the price spec, the group:
  `unable find offeringId in index`, `unable to find charId in index`,
  `unable to find charValue in index`, `unable find specId in index`,
  `unable find groupId in index`; then `unable find price` (no match) or
  `unable find price, no default and >1 found`. The map search says only
  the last two, as Go's does. Nothing here raises on any request.

  ## Performance

  A search is one `Larder.Table.search/2` (or one `Larder.Table.search_many/2`
  for each piece of a bulk body, see `PriceSearch.HTTP`); finding which value is unknown costs map lookups, and
  only when nothing matched. A request with more than #{@many_chars}
  characteristics has them checked first and repeats dropped, so the table
  search never gets more conditions than the catalogue has values.
  """

  alias Larder.Table
  alias PriceCatalogue.MapIndex
  alias PriceSearch.{Request, Store}

  @typedoc "An answer: the price's stored fields, or a message saying why none."
  @type answer :: {:ok, map()} | {:error, String.t()}

  @no_price "unable find price"
  @no_default "unable find price, no default and >1 found"

  @doc """
  The `Larder.Table` conditions of a request: offering, group, spec, then
  its characteristics.
  """
  @spec conditions(Request.t()) :: keyword()
  def conditions(%{offering: offering, group: group, spec: spec, chars: chars}) do
    [
      {:offering_id, offering},
      {:group_id, group},
      {:spec, spec} | for({c, v} <- chars, do: {:char, {c, v}})
    ]
  end

  @doc "Searches the bitmap indexes (`Larder.Table.search/2`)."
  @spec bitmap(Store.t(), Request.t()) :: answer()
  def bitmap(store, request) do
    case prepare(store, request) do
      {:ok, conditions} -> choose(Table.search(store.table, conditions), store, request)
      error -> error
    end
  end

  @doc "Answers many searches with one `Larder.Table.search_many/2`, in order."
  @spec bitmap_many(Store.t(), [Request.t()]) :: [answer()]
  def bitmap_many(_store, []), do: []

  def bitmap_many(store, requests) do
    prepared = Enum.map(requests, &prepare(store, &1))
    found = Table.search_many(store.table, for({:ok, conditions} <- prepared, do: conditions))
    answer_many(prepared, requests, found, store, [])
  end

  defp answer_many([], [], [], _store, acc), do: :lists.reverse(acc)

  defp answer_many([{:ok, _} | prepared], [request | requests], [prices | found], store, acc),
    do: answer_many(prepared, requests, found, store, [choose(prices, store, request) | acc])

  defp answer_many([error | prepared], [_ | requests], found, store, acc),
    do: answer_many(prepared, requests, found, store, [error | acc])

  @doc "Searches the Go-style map index (`PriceCatalogue.MapIndex.find/5`)."
  @spec map(Store.t(), Request.t()) :: answer()
  def map(store, %{offering: offering, group: group, spec: spec, chars: chars}) do
    case MapIndex.find(store.map_index, offering, group, spec, chars) do
      {:ok, price} -> {:ok, price}
      {:error, :no_price} -> {:error, @no_price}
      {:error, :no_default} -> {:error, @no_default}
    end
  end

  # A request with many characteristics is checked before it is searched, and
  # its repeats dropped: what reaches the table is bounded by the catalogue.
  defp prepare(store, %{chars: chars} = request) when length(chars) > @many_chars do
    case unknown(store, request) do
      nil -> {:ok, conditions(%{request | chars: Enum.uniq(chars)})}
      message -> {:error, message}
    end
  end

  defp prepare(_store, request), do: {:ok, conditions(request)}

  defp choose([price], _store, _request), do: {:ok, price}
  defp choose([], store, request), do: {:error, unknown(store, request) || @no_price}
  defp choose(prices, _store, _request), do: default(prices)

  defp default(prices) do
    case Enum.find(prices, & &1.is_default) do
      nil -> {:error, @no_default}
      price -> {:ok, price}
    end
  end

  # The first unknown value in the Go service's order, or nil.
  defp unknown(store, %{offering: o, group: g, spec: s, chars: chars}) do
    cond do
      not Map.has_key?(store.offerings, o) -> "unable find offeringId in index"
      message = unknown_char(store.chars, chars) -> message
      not Map.has_key?(store.specs, s) -> "unable find specId in index"
      not Map.has_key?(store.groups, g) -> "unable find groupId in index"
      true -> nil
    end
  end

  defp unknown_char(_known, []), do: nil

  defp unknown_char(known, [{c, v} | rest]) do
    case known do
      %{^c => %{^v => _}} -> unknown_char(known, rest)
      %{^c => _} -> "unable to find charValue in index"
      _ -> "unable to find charId in index"
    end
  end
end
