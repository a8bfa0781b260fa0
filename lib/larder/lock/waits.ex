# The wait-for graph of Larder's blocking waits on another process's work
# (a cache loader's waiters): one VM-wide table, so that the wait that
# would close a cycle is refused instead of hanging for ever.
defmodule Larder.Lock.Waits do
  @moduledoc false

  alias Larder.Lock.Holders

  # Rows {waiter, awaited, tab, ref}: `waiter` blocks until `awaited`
  # answers, and the wait is still on while `tab` (a :bag or
  # :duplicate_bag the awaited process takes its waiters from, at once,
  # before it answers) holds {ref, waiter}. A waiter writes its row only
  # once it knows its {ref, waiter} went in before that take.
  #
  # A waiter writes its row, then follows the chain of rows from the
  # process it awaits, at most @max_steps steps; reaching itself is a
  # cycle. Of the waits that close a cycle at the same time, the one whose
  # row went in last sees every other row of the cycle, so at least one of
  # them sees it. A step only follows a row that is still a wait (its
  # waiter alive, its awaited process not done answering), so a wait that
  # has just ended cannot make a false cycle. A waiter deletes its row when
  # its wait ends; the holder registry deletes the row of a waiter that
  # exits first (a waiter registers with it before it writes).
  #
  # The table belongs to the process that runs Larder.Application.start/2,
  # like the holders' table.
  @table __MODULE__
  @max_steps 1_000

  @doc "Creates the table; called once by Larder.Application.start/2."
  @spec create_table() :: :ok
  def create_table do
    _ =
      :ets.new(@table, [
        :named_table,
        :public,
        :set,
        read_concurrency: true,
        write_concurrency: true
      ])

    :ok
  end

  @doc "The longest chain of waits a cycle is looked for along."
  @spec max_steps() :: pos_integer()
  def max_steps, do: @max_steps

  @doc """
  Records that the caller waits for `awaited` while `tab` holds
  `{ref, caller}`, then looks for a cycle: `:cycle` (the row is gone again)
  when the chain of waits from `awaited` leads back to the caller, `:ok`
  otherwise. Each step of the chain costs an ETS lookup and a look at the
  waiters of one `ref`.
  """
  @spec wait_for(pid(), :ets.tid(), reference()) :: :ok | :cycle
  def wait_for(awaited, tab, ref) do
    _ = Holders.id()
    me = self()
    :ets.insert(@table, {me, awaited, tab, ref})

    if reaches?(awaited, me, @max_steps) do
      done()
      :cycle
    else
      :ok
    end
  end

  @doc "The caller's wait ended."
  @spec done() :: :ok
  def done do
    :ets.delete(@table, self())
    :ok
  end

  @doc "Deletes the row of `pid`, which exited (the holder registry calls it)."
  @spec forget(pid()) :: :ok
  def forget(pid) do
    :ets.delete(@table, pid)
    :ok
  end

  defp reaches?(me, me, _steps), do: true
  defp reaches?(_pid, _me, 0), do: false

  defp reaches?(pid, me, steps) do
    case :ets.lookup(@table, pid) do
      [{_, next, tab, ref}] -> waiting?(pid, tab, ref) and reaches?(next, me, steps - 1)
      [] -> false
    end
  end

  defp waiting?(pid, tab, ref) do
    Process.alive?(pid) and :ets.select_count(tab, [{{ref, pid}, [], [true]}]) > 0
  rescue
    # the table went with its cache: that wait is over
    ArgumentError -> false
  end
end
