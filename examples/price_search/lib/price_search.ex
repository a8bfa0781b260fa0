defmodule PriceSearch do
  @moduledoc """
  A price search service on `Larder.Table`, compatible with the Go reference
  service: same routes, status codes and bodies (see `PriceSearch.HTTP`).

    * `PriceSearch.Store` loads the catalogue (`PriceCatalogue`) at
      start and holds the table and the map index.
    * `PriceSearch.Request` reads request bodies as the Go service does.
    * `PriceSearch.Search` is the reference's search semantics.
    * `PriceSearch.HTTP` serves them over `gen_tcp`, JSON by jiffy.

  `make serve` (in the Larder root) starts it on port 8091, or `PORT`.
  """

  @doc "The port the application's listener serves on."
  @spec port() :: :inet.port_number()
  def port, do: PriceSearch.HTTP.port(PriceSearch.HTTP)
end
