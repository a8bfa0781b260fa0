# The producer of the `prices` stream a price search service can follow
# (PRICES_STREAM=host:port/stream, see PriceSearch.Application): fills the
# stream with the catalogue, then XADDs price changes at a steady rate.
#
#   mix run --no-start producer.exs [--host 127.0.0.1] [--port 6379]
#     [--stream prices] [--fill] [--limit N] [--rate 1000] [--seconds 10]
#
# --fill XADDs the catalogue (the shared CSV, or the generated one; --limit
# takes its first N prices); --rate/--seconds then add changes of random
# prices (a new value each) at that rate, for that long (0: none).
alias PriceSearch.PriceStream

{opts, _, _} =
  OptionParser.parse(System.argv(),
    strict: [
      host: :string,
      port: :integer,
      stream: :string,
      fill: :boolean,
      limit: :integer,
      rate: :integer,
      seconds: :integer
    ]
  )

stream = Keyword.get(opts, :stream, "prices")

client =
  PriceStream.connect(
    host: Keyword.get(opts, :host, "127.0.0.1"),
    port: Keyword.get(opts, :port, 6379)
  )

{source, prices, _requests} = PriceCatalogue.reference_or_generated()
prices = if opts[:limit], do: Enum.take(prices, opts[:limit]), else: prices

if opts[:fill] do
  {us, last} = :timer.tc(fn -> PriceStream.fill(client, stream, prices) end)

  IO.puts(
    "#{length(prices)} prices of #{source} added to #{stream} in #{div(us, 1_000)} ms (last id #{last})"
  )
end

rate = Keyword.get(opts, :rate, 1_000)
seconds = Keyword.get(opts, :seconds, 10)

if rate > 0 and seconds > 0 do
  sent = PriceStream.produce(client, stream, List.to_tuple(prices), rate, seconds * 1_000)
  IO.puts("#{sent} price changes added to #{stream} in #{seconds} s")
end

:eredis.stop(client)
