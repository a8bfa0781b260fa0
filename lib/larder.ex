defmodule Larder do
  @moduledoc """
  Fast in-memory state for read-heavy BEAM services, without ETS's sharp edges.

  Larder is for Elixir and Erlang services that sync state from Kafka, Redis
  or a database and serve it at microsecond latency. Each capability is one
  public module:

    * `Larder.Bag` - set-semantic multi-value tables: a `{key, value}` pair is
      stored at most once, at close to ETS `:duplicate_bag` speed, with disk
      snapshots for fast restarts.
    * `Larder.Table` - map records keyed by a primary key in ETS, with
      secondary indexes held as Roaring bitmaps by a Rust NIF
      (`Larder.Index`), searched by ANDing the bitmaps smallest first.

  Every performance claim in these docs comes from a benchmark under `bench/`
  that measures Larder side by side with the ETS (or Redis) baseline in the
  same run. `make bench` runs them all.

  Errors follow one convention across the library: bad arguments raise
  `ArgumentError` naming the argument; failures that come from the world
  (a corrupt file, a server that is down) are returned as
  `{:error, %Larder.Error{}}`.
  """
end
