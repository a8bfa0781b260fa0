# Runs the L2's processes (the child spec its init/3 returned) under a
# supervisor of their own, and starts them again, after the one backoff
# (Larder.Backoff), when they stop: the piece of the cache's tree that
# makes an L2 in a crash loop cost L1 nothing.
defmodule Larder.Cache.L2Runner do
  @moduledoc false

  use GenServer

  require Logger

  alias Larder.Backoff
  alias Larder.Cache.{Owner, Remote, Runtime}

  # Why not a supervisor's own restarts: an L2's processes stop when they
  # hit a bug or are killed (a server that refuses or is down costs them
  # nothing: Larder.Cache.L2, "Lifecycle"), but one that keeps stopping at
  # once would spend any supervisor's intensity, and the cache with it. So
  # the supervisor below only runs the child spec (starting it, shutting
  # it down within its :shutdown), with no restart of its own; this
  # process tells the cache of each stop (Remote.process_died/1) and starts
  # the child again after the backoff: @min_ms, doubling up to @max_ms
  # while they keep stopping (or failing to start), back to @min_ms once
  # they stayed up for @max_ms.
  @min_ms 100
  @max_ms 5_000

  def start_link(name), do: GenServer.start_link(__MODULE__, name)

  @impl true
  def init(name) do
    rt = Runtime.get(name)

    case rt.l2_child do
      nil ->
        :ignore

      spec ->
        Process.flag(:trap_exit, true)

        case start_l2(spec) do
          {:ok, sup} ->
            :ok = Owner.l2_started(rt, false)
            backoff = Backoff.new(@min_ms, @max_ms)
            {:ok, %{name: name, spec: spec, sup: sup, backoff: backoff, started: now()}}

          # the L2's own error, as it is (Redis refusing tracking, say)
          {:error, {:shutdown, {:failed_to_start_child, _id, %Larder.Error{} = error}}} ->
            {:stop, error}

          {:error, reason} ->
            {:stop, Larder.Error.new(:l2_failed, "the L2 did not start", reason: reason)}
        end
    end
  end

  # One supervisor for the L2's processes, with no restart of its own: when
  # one of them stops, the others are stopped too (:one_for_all, in the
  # order of their shutdown) and this process starts them all again.
  defp start_l2(spec) do
    Supervisor.start_link(List.wrap(spec), strategy: :one_for_all, max_restarts: 0)
  catch
    kind, reason -> {:error, {kind, reason}}
  end

  @impl true
  def handle_info({:EXIT, sup, reason}, %{sup: sup} = state) do
    rt = Runtime.get(state.name)

    Logger.warning(
      "Larder.Cache #{inspect(state.name)}: the L2's processes stopped " <>
        "(#{inspect(reason, limit: 10, printable_limit: 200)}); starting them again"
    )

    Remote.process_died(rt)

    backoff =
      if now() - state.started >= @max_ms, do: Backoff.reset(state.backoff), else: state.backoff

    {:noreply, restart_later(%{state | sup: nil, backoff: backoff})}
  end

  def handle_info(:restart, %{sup: nil} = state) do
    case start_l2(state.spec) do
      {:ok, sup} ->
        :ok = Owner.l2_started(Runtime.get(state.name), true)
        {:noreply, %{state | sup: sup, started: now()}}

      {:error, reason} ->
        Logger.warning(
          "Larder.Cache #{inspect(state.name)}: the L2 did not start " <>
            "(#{inspect(reason, limit: 10, printable_limit: 200)}); trying again in " <>
            "#{Backoff.peek(state.backoff)} ms"
        )

        {:noreply, restart_later(state)}
    end
  end

  def handle_info(_other, state), do: {:noreply, state}

  defp restart_later(state) do
    {wait, backoff} = Backoff.wait(state.backoff)
    Process.send_after(self(), :restart, wait)
    %{state | backoff: backoff}
  end

  @impl true
  def terminate(_reason, %{sup: sup}) when is_pid(sup) do
    Supervisor.stop(sup, :shutdown)
  catch
    :exit, _ -> :ok
  end

  def terminate(_reason, _state), do: :ok

  defp now, do: System.monotonic_time(:millisecond)
end
