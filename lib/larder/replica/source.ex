defmodule Larder.Replica.Source do
  @moduledoc """
  The behaviour of a log that a `Larder.Replica` follows: a sequence of
  entries, each an id and a map of fields, read in id order from a given
  id on. `Larder.Replica.RedisStream` (a Redis Stream) is the first; a
  Kafka partition, a file of records or a database's change feed fit the
  same callbacks.

  A source is given to the replica as `{module, options}`. The replica
  calls `validate!/1` when it is configured (so bad options raise
  `ArgumentError` in the caller of `Larder.Replica.start_link/1`), then,
  in its reader process, `connect/1`, `read/4` in a loop and `close/1`.
  `last_id/2` runs in the caller of `Larder.Replica.await/3`.

  ## The contract

    * Ids are terms ordered by `compare/2`; `origin/1` is an id below every
      entry's (reading after it reads the log from its beginning).
    * `read(conn, after_id, count, block_ms)` returns up to `count`
      entries whose ids are all above `after_id`, in increasing order,
      with no entry of the log skipped between `after_id` and the last one
      returned. It may wait up to `block_ms` for entries when there are
      none, and returns `{:ok, [], conn}` when none came.
    * When the log has lost entries after `after_id` (trimmed, expired,
      compacted), `read/4` returns `{:trimmed, resume_after, conn}`
      instead: `resume_after` is an id at or above the last one lost, so
      that reading after it skips nothing that is still there. A source
      must never skip entries silently.
    * Everything read from the outside is untrusted: a reply of the wrong
      shape or size is `{:error, %Larder.Error{reason: :source_bad_reply}}`,
      a server that cannot be reached or does not answer in time
      `{:error, %Larder.Error{reason: :source_unavailable}}`. Neither may
      raise. After an error the replica calls `close/1` and, after a
      pause, `connect/1` again and reads on from where it was.
    * `identity/1` names the log (a stream's name, a topic and partition):
      it is stored in the replica's snapshots, and a snapshot of another
      log is refused.
  """

  @typedoc "A position in the log, ordered by `c:compare/2`."
  @type id :: term()

  @typedoc "One entry of the log: its id and its fields."
  @type entry :: {id(), %{optional(binary()) => binary()}}

  @typedoc "The source's connection state, private to it."
  @type conn :: term()

  @doc """
  Checks the source's options and returns them with their defaults.
  Raises `ArgumentError` naming a bad option.
  """
  @callback validate!(opts :: term()) :: keyword()

  @doc "The name of the log these (validated) options read, stored in snapshots."
  @callback identity(opts :: keyword()) :: binary()

  @doc "The id below every entry: reading after it reads the whole log."
  @callback origin(opts :: keyword()) :: id()

  @doc "`{:ok, id}` when `term` is an id of this source, `:error` otherwise."
  @callback cast_id(term :: term()) :: {:ok, id()} | :error

  @doc "Orders two ids."
  @callback compare(id(), id()) :: :lt | :eq | :gt

  @doc "Opens a connection. Must not raise."
  @callback connect(opts :: keyword()) :: {:ok, conn()} | {:error, Larder.Error.t()}

  @doc "Reads the next entries after `after_id` (see \"The contract\"). Must not raise."
  @callback read(conn(), after_id :: id(), count :: pos_integer(), block_ms :: non_neg_integer()) ::
              {:ok, [entry()], conn()}
              | {:trimmed, resume_after :: id(), conn()}
              | {:error, Larder.Error.t(), conn()}

  @doc """
  The id of the log's last entry now (`origin/1`'s when it is empty),
  over a connection of its own, within `timeout` ms. Must not raise.
  """
  @callback last_id(opts :: keyword(), timeout :: non_neg_integer()) ::
              {:ok, id()} | {:error, Larder.Error.t()}

  @doc "Closes a connection. Must not raise."
  @callback close(conn()) :: :ok
end
