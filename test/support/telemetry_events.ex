# Routes :telemetry events to the test process, for assert_receive: the
# attach-and-detach every telemetry test starts with.
defmodule Larder.Test.TelemetryEvents do
  @moduledoc false

  @doc """
  Attaches handler `id` to `events` through the test stand-in for
  :telemetry: each event is sent to the calling process as
  `{:event, event, measurements, metadata}`. Detached when the test ends.
  """
  @spec forward(term(), [[atom()]]) :: :ok
  def forward(id, events) do
    me = self()

    :ok =
      :telemetry.attach_many(
        id,
        events,
        fn event, measurements, meta, _ -> send(me, {:event, event, measurements, meta}) end,
        nil
      )

    ExUnit.Callbacks.on_exit(fn -> :telemetry.detach(id) end)
  end
end
