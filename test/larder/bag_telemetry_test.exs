defmodule Larder.BagTelemetryTest do
  # The Larder.Bag events of Larder.Telemetry (dump and load spans), through
  # the test stand-in for :telemetry (test/support/telemetry.ex). Events of
  # other tests are told apart by their :path.
  use ExUnit.Case, async: true

  alias Larder.Bag

  # Each load logs a line at info (checked in Larder.Bag.SnapshotTest).
  @moduletag :capture_log

  @events for op <- [:dump, :load],
              kind <- [:start, :stop, :exception],
              do: [:larder, :bag, op, kind]

  setup ctx do
    :ok = Larder.Test.TelemetryEvents.forward({__MODULE__, ctx.test}, @events)

    dir =
      Path.join(System.tmp_dir!(), "larder_bag_telemetry_#{System.unique_integer([:positive])}")

    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf!(dir) end)
    %{path: Path.join(dir, "snap.bag"), dir: dir}
  end

  test "dump/2 is a span with the bag and the path; stop says :ok", %{path: path} do
    bag = Bag.new()
    Bag.insert_many(bag, [{:a, 1}, {:a, 2}])
    assert Bag.dump(bag, path) == :ok

    assert_receive {:event, [:larder, :bag, :dump, :start], start,
                    %{bag: ^bag, path: ^path, telemetry_span_context: ctx}}

    assert is_integer(start.system_time) and is_integer(start.monotonic_time)

    assert_receive {:event, [:larder, :bag, :dump, :stop], %{duration: duration},
                    %{bag: ^bag, path: ^path, result: :ok, telemetry_span_context: ^ctx}}

    assert is_integer(duration) and duration >= 0
    Bag.drop(bag)
  end

  test "a named bag is its name in the metadata; a failed dump stops with its error",
       ctx do
    name = :"#{__MODULE__}.#{ctx.test}"
    Bag.new(name: name)
    # A directory cannot be replaced by the snapshot file.
    path = ctx.dir
    assert {:error, %Larder.Error{reason: :file_error} = error} = Bag.dump(name, path)

    assert_receive {:event, [:larder, :bag, :dump, :start], _, %{bag: ^name, path: ^path}}

    assert_receive {:event, [:larder, :bag, :dump, :stop], _,
                    %{bag: ^name, path: ^path, result: :error, error: ^error}}

    Bag.drop(name)
  end

  test "load/2 is a span whose stop holds the new bag", %{path: path} do
    bag = Bag.new()
    Bag.insert(bag, :k, :v)
    :ok = Bag.dump(bag, path)

    assert {:ok, copy} = Bag.load(path)

    assert_receive {:event, [:larder, :bag, :load, :start], _,
                    %{bag: nil, path: ^path, telemetry_span_context: ctx}}

    assert_receive {:event, [:larder, :bag, :load, :stop], %{duration: _},
                    %{bag: ^copy, path: ^path, result: :ok, telemetry_span_context: ^ctx}}

    assert Bag.lookup(copy, :k) == [:v]
    Bag.drop(copy)
    Bag.drop(bag)
  end

  test "a load that fails stops with :error and its Larder.Error", %{path: path} do
    File.write!(path, "not a snapshot")
    assert {:error, %Larder.Error{reason: :corrupt_snapshot} = error} = Bag.load(path)

    assert_receive {:event, [:larder, :bag, :load, :stop], _,
                    %{path: ^path, result: :error, error: ^error}}
  end

  test "a dump that raises in the middle emits :exception", %{path: path} do
    bag = Bag.new()
    Bag.insert(bag, :k, :v)
    # The table goes while the dump is about to read it.
    %{tab: tab} = bag
    :ets.delete(tab)

    assert_raise ArgumentError, fn -> Bag.dump(bag, path) end

    assert_receive {:event, [:larder, :bag, :dump, :exception], %{duration: _},
                    %{bag: ^bag, path: ^path, kind: :error}}
  end

  test "telemetry: false turns a bag's events off, and load's", %{path: path} do
    bag = Bag.new(telemetry: false)
    Bag.insert(bag, :k, :v)
    :ok = Bag.dump(bag, path)
    {:ok, copy} = Bag.load(path, telemetry: false)
    :ok = Bag.dump(copy, path)

    refute_received {:event, _, _, %{path: ^path}}
    Bag.drop(copy)
    Bag.drop(bag)
  end

  test "a bag loaded with events on emits its own dumps", %{path: path} do
    bag = Bag.new(telemetry: false)
    :ok = Bag.dump(bag, path)
    {:ok, copy} = Bag.load(path)
    :ok = Bag.dump(copy, path)

    assert_receive {:event, [:larder, :bag, :dump, :stop], _, %{bag: ^copy, path: ^path}}
    Bag.drop(copy)
    Bag.drop(bag)
  end
end
