defmodule Larder.Replica.LatestTest do
  # The log's end for await(replica, :latest, timeout), on a source whose
  # latest/2 the test scripts (a queue of answers in an Agent): asked again
  # after errors until it answers, a :timeout naming the last error once
  # the deadline passes, an ask that hangs abandoned at the deadline and
  # its process killed, and a raise taken as the source's failure.
  use ExUnit.Case, async: true

  alias Larder.Replica.Handle
  alias Larder.Replica.Latest

  defmodule Source do
    @moduledoc false
    # Only latest/2 is asked: each call takes the next answer (a term, or
    # a function called in the asking process), the last one repeated.

    def latest(opts, _timeout) do
      answer =
        Agent.get_and_update(opts[:answers], fn [a | rest] ->
          {a, if(rest == [], do: [a], else: rest)}
        end)

      send(opts[:test], {:asked, self()})
      if is_function(answer), do: answer.(), else: answer
    end

    def reached?(position, target), do: position >= target
  end

  defp handle(answers) do
    {:ok, agent} = Agent.start_link(fn -> answers end)
    handle = Handle.new(:latest_test, Source, answers: agent, test: self())
    :ok = Handle.put_position(handle, 0, 0, :t)
    handle
  end

  defp deadline(ms), do: System.monotonic_time(:millisecond) + ms

  defp down, do: Larder.Error.new(:source_unavailable, "down")

  test "asks again after errors until the source answers" do
    handle = handle([{:error, down()}, {:error, down()}, {:ok, 42}])
    assert Latest.fetch(handle, deadline(10_000)) == {:ok, 42}
    for _ <- 1..3, do: assert_received({:asked, _})
  end

  test "a :timeout once the deadline passes, naming the source's last error" do
    handle = handle([{:error, down()}])

    assert {:error, %Larder.Error{reason: :timeout, details: details} = error} =
             Latest.fetch(handle, deadline(300))

    assert details.source_error == down()
    assert details.offset == 0
    assert Exception.message(error) =~ "down"
  end

  test "an ask that hangs is abandoned at the deadline, and its process killed" do
    handle = handle([fn -> Process.sleep(:infinity) end])
    assert {:error, %Larder.Error{reason: :timeout}} = Latest.fetch(handle, deadline(300))
    assert_received {:asked, asker}
    refute Process.alive?(asker)
    refute_receive _, 200
  end

  test "a latest/2 that raises or answers another shape fails as the source's error" do
    handle = handle([fn -> raise "boom" end, :nonsense, {:ok, 7}])
    assert Latest.fetch(handle, deadline(10_000)) == {:ok, 7}

    handle = handle([fn -> raise "boom" end])

    assert {:error,
            %Larder.Error{details: %{source_error: %Larder.Error{reason: :source_failed}}}} =
             Latest.fetch(handle, deadline(300))
  end
end
