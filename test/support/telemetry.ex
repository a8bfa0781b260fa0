# A stand-in for the :telemetry library in tests (Debian packages none): the
# calls Larder makes (execute/3, span/3) and attach_many/4, detach/1 to
# route events to handlers, so each event can be asserted with
# assert_receive. Compiled into the test build only, so Larder sees
# :telemetry loaded there and emits its events.
defmodule :telemetry do
  @moduledoc false

  @table :larder_test_telemetry_handlers

  # {handler_id, event, fun, config}, in a table owned by a process that
  # lives as long as the test run.
  def attach_many(id, events, fun, config) when is_function(fun, 4) do
    table = table()

    if :ets.member(table, id) do
      {:error, :already_exists}
    else
      :ets.insert(table, {id, events, fun, config})
      :ok
    end
  end

  def detach(id) do
    :ets.delete(table(), id)
    :ok
  end

  def execute(event, measurements, metadata) when is_map(measurements) and is_map(metadata) do
    for {_id, events, fun, config} <- handlers(), event in events do
      fun.(event, measurements, metadata, config)
    end

    :ok
  end

  # As :telemetry.span/3: start, then stop with the metadata fun returns, or
  # exception with kind, reason and stacktrace before re-raising.
  def span(prefix, start_meta, fun) do
    start = System.monotonic_time()
    context = make_ref()
    start_meta = Map.put(start_meta, :telemetry_span_context, context)

    execute(
      prefix ++ [:start],
      %{system_time: System.system_time(), monotonic_time: start},
      start_meta
    )

    try do
      {result, stop_meta} = fun.()
      now = System.monotonic_time()

      execute(
        prefix ++ [:stop],
        %{duration: now - start, monotonic_time: now},
        Map.put(stop_meta, :telemetry_span_context, context)
      )

      result
    catch
      kind, reason ->
        now = System.monotonic_time()

        execute(
          prefix ++ [:exception],
          %{duration: now - start, monotonic_time: now},
          Map.merge(start_meta, %{kind: kind, reason: reason, stacktrace: __STACKTRACE__})
        )

        :erlang.raise(kind, reason, __STACKTRACE__)
    end
  end

  defp handlers do
    case :ets.whereis(@table) do
      :undefined -> []
      table -> :ets.tab2list(table)
    end
  end

  defp table do
    case :ets.whereis(@table) do
      :undefined ->
        parent = self()

        spawn(fn ->
          try do
            :ets.new(@table, [:named_table, :public, :set, read_concurrency: true])
          rescue
            ArgumentError -> :ok
          end

          send(parent, :table_ready)
          Process.sleep(:infinity)
        end)

        receive do
          :table_ready -> :ets.whereis(@table)
        end

      table ->
        table
    end
  end
end
