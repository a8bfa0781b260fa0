# The benchmark harness (bench/support/bench.ex) is not part of the library;
# these check its statistics and its interleaving, without timing anything.

defmodule Larder.BenchSupportTest do
  use ExUnit.Case, async: true

  alias Larder.Bench

  describe "summarize/3" do
    test "batch means give the max of the runs as their tail, not a p99" do
      r = Bench.summarize([5.0, 1.0, 3.0, 2.0, 4.0], 1000, 1)
      assert r.tail == "max of 5 runs"
      assert r.tail_us == 5.0
      assert r.median_us == 3.0
      assert {r.p25_us, r.p75_us, r.min_us, r.max_us} == {2.0, 4.0, 1.0, 5.0}
      assert r.per_op_median_us == 3.0 / 1000
      assert r.per_op_tail_us == 5.0 / 1000
      # kept for the readers of older results
      assert r.p99_us == Bench.percentile([1.0, 2.0, 3.0, 4.0, 5.0], 99)
    end

    test "enough single-operation samples give a real p99" do
      samples = Enum.map(1..1000, &(&1 * 1.0))
      r = Bench.summarize(Enum.shuffle(samples), nil, 1)
      assert r.tail == "p99"
      assert_in_delta r.tail_us, 990.01, 1.0e-6
      assert r.runs == 1000
    end

    test "few samples, parallel runners or batches are never called p99" do
      assert Bench.summarize(Enum.map(1..99, &(&1 * 1.0)), nil, 1).tail == "max of 99 runs"
      assert Bench.summarize(Enum.map(1..500, &(&1 * 1.0)), nil, 4).tail == "max of 500 runs"
      assert Bench.summarize(Enum.map(1..500, &(&1 * 1.0)), 10, 1).tail == "max of 500 runs"
    end
  end

  test "measure/2 with :each takes one sample per call" do
    r = Bench.measure(fn -> :ok end, warmup: 0, runs: 2, each: 60)
    assert r.runs == 120
    assert length(r.samples_us) == 120
    assert r.tail == "p99"
  end

  test "interleave/2 takes one run per column per round, in rotating order" do
    log = :ets.new(:log, [:ordered_set, :public])
    record = fn col -> fn -> :ets.insert(log, {System.unique_integer([:monotonic]), col}) end end

    results =
      Bench.interleave(
        [
          {"a", record.("a")},
          {"b", {record.("b"), runs: 2}},
          {"c", record.("c")},
          {"fixed", Bench.value(7, "words")}
        ],
        warmup: 1,
        runs: 3
      )

    order = for {_, col} <- :ets.tab2list(log), do: col
    # warm-ups, then rounds starting one column further each time; b stops after 2
    assert order == ~w(a b c) ++ ~w(a b c) ++ ~w(b c a) ++ ~w(c a)
    assert results["a"].runs == 3
    assert results["b"].runs == 2
    assert results["fixed"] == Bench.value(7, "words")
  end

  test "--json keeps the old fields and adds the new ones" do
    path = Path.join(System.tmp_dir!(), "larder_bench_#{System.unique_integer([:positive])}.json")
    on_exit(fn -> File.rm(path) end)

    ExUnit.CaptureIO.capture_io(fn ->
      Bench.start("t", ["--json", path])
      |> Bench.table("tbl", ["x", "y"])
      |> Bench.row("r", %{"x" => fn -> :ok end, "y" => fn -> :ok end}, warmup: 0, runs: 3)
      |> Bench.finish()
    end)

    json = File.read!(path)

    for field <-
          ~w(median_us p99_us min_us max_us mean_us runs ratio tail tail_us p25_us p75_us samples_us) do
      assert json =~ ~s("#{field}":), "#{field} missing"
    end
  end
end
