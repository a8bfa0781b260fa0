# Runs crash-class test cases (VM aborts, segfaults, allocator failures) in a
# separate OS process: a peer VM with the suite's code paths, so that a
# regression fails the test instead of killing the whole suite.
defmodule Larder.Test.Isolated do
  @moduledoc false

  @doc """
  Evaluates `quoted` (from `quote do ... end` in the test, so aliases
  resolve as they do there) in a fresh peer VM and returns `{:ok, result}`,
  `{:raised, exception}` when it raised, or `{:vm_died, reason}` when the
  peer VM went away (crashed, aborted, or ran past `timeout` ms). Code
  compiled only in the test process (the test module itself) is not there.

  `memory_mb: n` caps the peer's address space (`ulimit -v`), so that a
  regression that allocates without bound aborts the peer quickly instead
  of taking the machine's memory from everything else running on it. The
  peer then writes no crash dump and no core.
  """
  @spec run(Macro.t(), timeout(), memory_mb: pos_integer()) ::
          {:ok, term()} | {:raised, Exception.t()} | {:vm_died, term()}
  def run(quoted, timeout \\ 30_000, opts \\ []) do
    peer = start_peer(opts)

    try do
      case :peer.call(peer, __MODULE__, :__run__, [quoted], timeout) do
        {:ok, _} = ok -> ok
        {:raised, _} = raised -> raised
      end
    catch
      # The call's own arguments are in the reason; keep only why it ended.
      :exit, {reason, {:gen_server, :call, _}} -> {:vm_died, reason}
      :exit, reason -> {:vm_died, reason}
    after
      try do
        :peer.stop(peer)
      catch
        :exit, _ -> :ok
      end
    end
  end

  @doc """
  Starts a peer VM (another OS process) with the suite's code paths, not
  linked to the caller (its death must reach the test as a value); stop it
  with `:peer.stop/1`, or kill its OS process (`os_pid/1`). Takes
  `memory_mb:` as `run/3` does.
  """
  @spec start_peer(memory_mb: pos_integer()) :: pid()
  def start_peer(opts \\ []) do
    paths = Enum.flat_map(:code.get_path(), &["-pa", &1])
    start = %{connection: :standard_io, args: Enum.map(paths, &to_charlist/1)}

    start =
      case Keyword.fetch(opts, :memory_mb) do
        {:ok, mb} when is_integer(mb) and mb > 0 ->
          # peer runs `sh -c <script> sh <erl's own arguments>`.
          script = ~c"ulimit -c 0 && ulimit -v #{mb * 1024} && exec erl \"$@\""

          Map.merge(start, %{
            exec: {~c"/bin/sh", [~c"-c", script, ~c"sh"]},
            env: [{~c"ERL_CRASH_DUMP_SECONDS", ~c"0"}]
          })

        :error ->
          start
      end

    # Not linked: the peer's death must reach the test as a value.
    {:ok, peer, _node} = :peer.start(start)
    peer
  end

  @doc "Evaluates `quoted` in the peer VM `peer` (its :larder started), as run/2 does."
  @spec eval(pid(), Macro.t(), timeout()) :: {:ok, term()} | {:raised, Exception.t()}
  def eval(peer, quoted, timeout \\ 30_000),
    do: :peer.call(peer, __MODULE__, :__run__, [quoted], timeout)

  @doc "The OS pid of the peer VM `peer`."
  @spec os_pid(pid()) :: String.t()
  def os_pid(peer), do: :peer.call(peer, System, :pid, [])

  @doc """
  In a fresh peer VM: builds 20 structures with `build` (a quoted function
  of 1..20 that returns a handle), then drops each with `drop` (a quoted
  function of a handle), while the handles are still alive. Returns
  `{:ok, {held, left, 20}}`: the NIF bytes (`index_live_bytes`) the 20
  held, and those still held after the drops.
  """
  @spec native_bytes_dropped(Macro.t(), Macro.t()) ::
          {:ok, tuple()} | {:raised, Exception.t()} | {:vm_died, term()}
  def native_bytes_dropped(build, drop) do
    run(
      quote do
        before = Larder.Native.index_live_bytes()
        handles = Enum.map(1..20, unquote(build))
        held = Larder.Native.index_live_bytes() - before
        Enum.each(handles, unquote(drop))
        # The handles are alive here, in `handles`.
        {held, Larder.Native.index_live_bytes() - before, length(handles)}
      end
    )
  end

  @doc false
  def __run__(quoted) do
    {:ok, _} = Application.ensure_all_started(:larder)
    {result, _binding} = Code.eval_quoted(quoted)
    {:ok, result}
  rescue
    exception -> {:raised, exception}
  end
end
