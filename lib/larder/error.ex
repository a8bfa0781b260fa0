defmodule Larder.Error do
  @moduledoc """
  An error that comes from the world rather than from the caller: a corrupt
  snapshot, a Redis server that is down, a loader that failed.

  Functions that can fail this way return `{:error, %Larder.Error{}}`; their
  bang variants raise it. Bad arguments are not `Larder.Error`s: they raise
  `ArgumentError`.

  ## Fields

    * `:reason` - an atom that classifies the error, for matching; one of
      the reasons below.
    * `:message` - a human-readable explanation, or `nil` to derive one.
    * `:details` - a map of context (a path, a key, the underlying error).

  ## Reasons

    * `:corrupt_snapshot` - `Larder.Bag.load/2`: the file is not a whole,
      well-formed snapshot (bad magic, checksum, framing, count, or an
      object of the wrong shape). No table is left behind.
    * `:file_error` - `Larder.Bag.dump/2` and `load/2`: the operating
      system refused a read, write, fsync or rename; `details.posix` says why.
      `Larder.Replica.start_link/1` also returns it, with `details.option`
      `:snapshot`, for a snapshot path that cannot hold snapshots: a
      directory that does not exist or is not writable (`details.dir`), a
      lock file that cannot be opened, is a symbolic link (`:eloop`) or is
      not a lock file (`details.lock_file`).
    * `:loader_failed` - `Larder.Cache.fetch/3`: the loader returned an
      error or something other than `{:ok, value}`, raised, threw or exited.
    * `:cache_stopped` - `Larder.Cache`: the cache stopped (or was killed)
      while the call was loading or waiting for another process's load.
    * `:load_cycle` - `Larder.Cache.fetch/3` called by a loader: waiting
      for that key's load would close a ring of loads waiting for each
      other (in one cache or across caches), which would never end.
    * `:l2_unavailable` - `Larder.Cache` and `Larder.Cache.Redis`: the L2
      could not be reached or did not answer within its timeout.
    * `:l2_failed` - the L2 answered with an error, or did not start.
    * `:l2_bad_reply` - the L2 answered with something its protocol does
      not allow (a server on the port that is not Redis, a reply of the
      wrong type or size).
    * `:definition_mismatch` - `Larder.Table.load/2` (and a
      `Larder.Replica` starting from its snapshot): the file's table
      definition differs from the options.
    * `:snapshot_mismatch` - `Larder.Replica.start_link/1`: the snapshot
      was written by a replica of another log or another structure.
    * `:snapshot_in_use` - `Larder.Replica.start_link/1`: another replica,
      in this VM or another OS process, holds the snapshot path;
      `details.path`, and `details.holder` (a pid) or
      `details.holder_os_pid` name them.
    * `:offset_trimmed` - `Larder.Replica`: the log lost entries after the
      replica's position, or the log went backwards below it (with
      `on_trimmed: :stop`).
    * `:apply_failed` - `Larder.Replica`: the apply function rejected an
      entry (with `on_error: :stop`); `details.id` is the entry's id.
    * `:source_unavailable`, `:source_failed`, `:source_bad_reply` - a
      `Larder.Replica.Source` could not be reached, answered with an error,
      or answered with something its protocol does not allow.
    * `:batch_too_large` - a `Larder.Replica.Source`'s read would return
      more than the source takes in one reply (for
      `Larder.Replica.RedisStream`, above `:max_reply_bytes`); the replica
      reads half as many entries per batch from then on.
    * `:timeout` - `Larder.Replica.await/3`: the position was not reached in time.
    * `:replica_stopped` - `Larder.Replica.await/3`: the replica stopped.
    * `:no_snapshot_path` - `Larder.Replica.dump/1` on a replica
      without `:snapshot`.
    * `:in_apply` - `Larder.Replica.dump/1` called from the replica's own
      `:apply` function (the snapshot would wait for that apply).
    * `:unknown_call` - a `Larder.Replica` process was sent a
      `GenServer.call/3` that is not one of `Larder.Replica`'s.
    * `:internal` - `Larder.Index`: the NIF could not rebuild a stored
      term; a bug in Larder, not in the caller's input.

  Larder itself returns only these. A third-party `Larder.Cache.L2` module
  may return reasons of its own, which the cache passes through.
  """

  @type reason ::
          :corrupt_snapshot
          | :file_error
          | :loader_failed
          | :cache_stopped
          | :load_cycle
          | :l2_unavailable
          | :l2_failed
          | :l2_bad_reply
          | :definition_mismatch
          | :snapshot_mismatch
          | :snapshot_in_use
          | :offset_trimmed
          | :apply_failed
          | :source_unavailable
          | :source_failed
          | :source_bad_reply
          | :batch_too_large
          | :timeout
          | :replica_stopped
          | :no_snapshot_path
          | :in_apply
          | :unknown_call
          | :internal
          | atom()
  @type t :: %__MODULE__{reason: reason(), message: String.t() | nil, details: map()}

  defexception reason: :unknown, message: nil, details: %{}

  @doc """
  Builds an error.

  `reason` must be an atom, `message` a string or `nil`, and `details` a
  map (not a struct) or a list of `{key, value}` pairs (a keyword list);
  anything else
  raises `ArgumentError` naming the argument.

      iex> Larder.Error.new(:corrupt_snapshot, "bad checksum", path: "x.snap").details
      %{path: "x.snap"}
  """
  @spec new(reason(), String.t() | nil, map() | [{term(), term()}]) :: t()
  def new(reason, message \\ nil, details \\ %{})

  def new(reason, message, details)
      when is_atom(reason) and (is_binary(message) or is_nil(message)) do
    %__MODULE__{reason: reason, message: message, details: details!(details, details)}
  end

  def new(reason, _message, _details) when not is_atom(reason),
    do: raise(ArgumentError, "expected reason to be an atom, got: #{inspect(reason, limit: 10)}")

  def new(_reason, message, _details) do
    raise ArgumentError,
          "expected message to be a string or nil, got: #{inspect(message, limit: 10)}"
  end

  # A map as it is; a list only when it is a proper list of pairs (walked
  # once, so an improper or huge one costs no more than its length).
  defp details!(details, _all) when is_map(details) and not is_struct(details), do: details

  defp details!(details, all) when is_list(details) do
    if pairs?(details), do: Map.new(details), else: bad_details!(all)
  end

  defp details!(_details, all), do: bad_details!(all)

  defp pairs?([{_, _} | rest]), do: pairs?(rest)
  defp pairs?([]), do: true
  defp pairs?(_other), do: false

  defp bad_details!(details) do
    raise ArgumentError,
          "expected details to be a map or a list of {key, value} pairs, got: " <>
            inspect(details, limit: 10)
  end

  @impl true
  def message(%__MODULE__{reason: reason, message: nil, details: details}) do
    "#{reason}" <> format_details(details)
  end

  def message(%__MODULE__{reason: reason, message: message, details: details}) do
    "#{reason}: #{message}" <> format_details(details)
  end

  defp format_details(details) when map_size(details) == 0, do: ""
  defp format_details(details), do: " " <> inspect(details)
end
