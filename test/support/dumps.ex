# Holds a structure's dump in the middle, for the tests of what goes on
# during one: finds the process writing a Table's or Bag's dump file among
# given processes and the processes linked to them, and suspends it there.
defmodule Larder.Test.Dumps do
  @moduledoc false

  @dump_modules [Larder.Table.Snapshot, Larder.Bag.Snapshot]

  @doc """
  Starts `dump` (a function that makes a dump and returns its result) in a
  task, and suspends the process that writes the dump file, found among
  `owners.()` and the processes linked to them, once it is inside it.
  Returns `{dumper, task}`; a dump that ends before it is caught is made
  again (after `again.()`), up to 50 times.
  """
  def suspend_dump(owners, dump, again \\ fn -> :ok end, tries \\ 50) do
    task = Task.async(dump)

    case find(owners, task) do
      nil when tries > 1 ->
        Task.await(task, 60_000)
        again.()
        suspend_dump(owners, dump, again, tries - 1)

      nil ->
        raise "no dump was caught in the middle"

      pid ->
        {pid, task}
    end
  end

  @doc "Lets the suspended dumper go on."
  def resume(pid) do
    :erlang.resume_process(pid)
  rescue
    ArgumentError -> :ok
  end

  defp find(owners, task) do
    candidates =
      for owner <- owners.(),
          pid <- [owner | links(owner)],
          pid != self() and pid != task.pid,
          uniq: true,
          do: pid

    case Enum.find(candidates, &dumping?/1) do
      nil ->
        if Process.alive?(task.pid) do
          Process.sleep(1)
          find(owners, task)
        end

      pid ->
        # Suspended, then checked again: it may have left the dump between.
        if suspend(pid) and dumping?(pid) do
          pid
        else
          resume(pid)
          find(owners, task)
        end
    end
  end

  # False for a process that is gone, or that runs a dirty NIF just now
  # (suspend_process/1 raises :internal_error then): it is tried again.
  defp suspend(pid) do
    :erlang.suspend_process(pid)
  rescue
    _ -> false
  end

  defp links(pid) do
    case Process.info(pid, :links) do
      {:links, links} -> Enum.filter(links, &is_pid/1)
      nil -> []
    end
  end

  defp dumping?(pid) do
    case Process.info(pid, :current_stacktrace) do
      {:current_stacktrace, frames} -> Enum.any?(frames, &(elem(&1, 0) in @dump_modules))
      nil -> false
    end
  end
end
