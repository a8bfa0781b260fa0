# The build claim of a Larder.Table: a caller that writes a chunk of fresh
# rows inserts them into ETS itself (sparing their copy to the writer) while
# the writer holds every other write back, then the writer indexes them.
defmodule Larder.Table.Claim do
  @moduledoc false

  # The protocol, in three messages, all ordinary gen_server calls:
  #
  #   1. caller -> writer: {:claim, {low, high}, ops, ids}. The writer answers
  #      {:claimed, ref} (ref monitors the caller) and from then on holds
  #      every other write back, or :stale when a row at or above `low` may
  #      exist (the caller then sends the chunk as an ordinary insert).
  #   2. The caller inserts the rows into the public ETS table, in one
  #      atomic :ets.insert/2.
  #   3. caller -> writer: {:release, ref}. Its reply is the chunk's outcome.
  #
  # The claim ends on the release or on the caller's death. Either way the
  # writer settles it by whether the rows are in ETS, checked by the lowest
  # id: in, it applies the index ops (and takes the rows out again if the
  # index refuses them); not in, the chunk was never written. So a chunk is
  # whole even when its caller is killed holding the claim.

  alias Larder.Index

  # Below this many rows a claim's second round trip costs more than the
  # copy it saves.
  @min_rows 256

  @enforce_keys [:ref, :low, :high, :ops, :ids]
  defstruct @enforce_keys

  @type t :: %__MODULE__{
          ref: reference(),
          low: non_neg_integer(),
          high: non_neg_integer(),
          ops: [Index.op()],
          ids: [non_neg_integer()]
        }

  ## The caller's side

  @doc """
  The claim request for a chunk (`Larder.Table.Records.write/2`'s
  `{rows, ops, keyed, span}`), or `nil` when the chunk is written as an
  ordinary insert: it has keys that are not row ids, fewer than 256 rows,
  or rows it replaces (`{:set_terms, ...}` ops come first), which the
  writer would refuse to claim.
  """
  @spec request({list(), list(), list(), {non_neg_integer(), non_neg_integer()} | nil}) ::
          tuple() | nil
  def request({_rows, [{:set_terms, _, _} | _], _keyed, _span}), do: nil

  def request({rows, ops, [], {_low, _high} = span}) when length(rows) >= @min_rows,
    do: {:claim, span, ops, Enum.map(rows, &elem(&1, 0))}

  def request(_write), do: nil

  @doc """
  Steps 2 and 3 of a granted claim: inserts `rows` into the table's ETS rows
  and releases the claim. Returns how the insert went and the release's
  request id, whose reply is the chunk's outcome. An insert fails only when
  the table is gone; the writer, if still there, then drops the chunk.
  """
  @spec fill(Larder.Table.t(), list(), reference()) ::
          {:ok | {:raise, atom(), term(), list()}, :gen_server.request_id()}
  def fill(table, rows, ref) do
    inserted =
      try do
        :ets.insert(table.rows, rows)
        :ok
      catch
        kind, reason -> {:raise, kind, reason, __STACKTRACE__}
      end

    {inserted, :gen_server.send_request(table.writer, {:release, ref})}
  end

  ## The writer's side

  @doc """
  Grants the claim `{low, high}` to `caller` when every id of the span is at
  or above `top` (no row there can exist), monitoring the caller; `:stale`
  otherwise.
  """
  @spec grant(
          {non_neg_integer(), non_neg_integer()},
          list(),
          [non_neg_integer()],
          pid(),
          non_neg_integer()
        ) ::
          {:ok, t()} | :stale
  def grant({low, high}, ops, ids, caller, top) when low >= top do
    ref = Process.monitor(caller)
    {:ok, %__MODULE__{ref: ref, low: low, high: high, ops: ops, ids: ids}}
  end

  def grant(_span, _ops, _ids, _caller, _top), do: :stale

  @doc """
  Ends `claim` (released, or its caller is down): indexes its rows when they
  are in ETS. Returns the outcome for the caller and the new `top`
  (unchanged when nothing was written); an index that refuses the ops gives
  `{:raise, kind, reason, stack}`, and the rows are taken out again.
  """
  @spec settle(t(), Larder.Table.t(), non_neg_integer()) :: {:ok | tuple(), non_neg_integer()}
  def settle(%__MODULE__{} = claim, table, top) do
    Process.demonitor(claim.ref, [:flush])

    if :ets.member(table.rows, claim.low) do
      try do
        Index.batch(table.index, claim.ops)
        {:ok, claim.high + 1}
      catch
        kind, reason ->
          for id <- claim.ids, do: :ets.delete(table.rows, id)
          {{:raise, kind, reason, __STACKTRACE__}, top}
      end
    else
      {:ok, top}
    end
  end
end
