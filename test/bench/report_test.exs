defmodule Larder.ReportTest do
  # `make report` on a small set of result files: bench results, an HTTP
  # load results file in the same tables/rows/results shape, what
  # `make bench-http` writes (fixtures/http_bench.json, from a 1 s run), a
  # file of another shape and a truncated one (both skipped, not fatal).
  # Needs gnuplot (gnuplot-nox, installed by scripts/setup).
  use ExUnit.Case, async: true

  @script Path.expand("../../bench/report/report.exs", __DIR__)
  @fixtures Path.expand("fixtures", __DIR__)

  setup do
    dir = Path.join(System.tmp_dir!(), "larder_report_#{System.unique_integer([:positive])}")
    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf!(dir) end)
    %{out: Path.join(dir, "report"), charts: Path.join(dir, "charts")}
  end

  test "writes index.html with one SVG chart per table and the README's charts", ctx do
    {log, status} =
      System.cmd(
        System.find_executable("elixir"),
        [@script, "--results", @fixtures, "--out", ctx.out, "--charts", ctx.charts],
        stderr_to_stdout: true
      )

    assert status == 0, log
    assert log =~ "skipped #{@fixtures}/other_shape.json"
    assert log =~ "skipped #{@fixtures}/truncated.json"

    html = File.read!(Path.join(ctx.out, "index.html"))
    svgs = ctx.out |> Path.join("svg/*.svg") |> Path.wildcard() |> Enum.map(&Path.basename/1)

    # two register tables, the HTTP table, and bench-http's two tables
    assert length(svgs) == 5
    for svg <- svgs, do: assert(html =~ ~s(src="svg/#{svg}"))
    assert "http_load-requests-per-connection-count.svg" in svgs
    assert html =~ "other_shape.json: no &quot;tables&quot; list"

    assert html =~
             "<td>hot key, 1 key 90/10: speed-up over ETS</td><td>1.45</td><td>&gt;= 2.50</td><td>MISSED</td>"

    hot =
      File.read!(
        Path.join(ctx.out, "svg/register_bench-16-runners-100-integer-lists-per-operation.svg")
      )

    # the anchor marked, the ratio and the median on the bar
    assert_contains(hot, ["<svg", "ETS (anchor)", "x0.69  34.4 us", "(quick run)"])

    http = File.read!(Path.join(ctx.out, "svg/http_load-requests-per-connection-count.svg"))
    assert_contains(http, ["x5.40  562 us", "bars: p50-p99", "x0.94  3937 req/s"])

    # make bench-http's results: req/s (searches/s for bulk) beside the Go
    # figures, which are marked as not from this run and get no ratio, and
    # latency as p50 with a bar to p99.
    throughput =
      File.read!(Path.join(ctx.out, "svg/http_bench-throughput-req-s-searches-s-for-bulk.svg"))

    assert_contains(throughput, [
      "Larder (anchor)",
      "Go (not same run)",
      "anchor  8210 req/s",
      "not same run  10099 req/s",
      "not same run  28052 req/s",
      "anchor  87280 searches/s",
      "not same run  59000 searches/s",
      "(quick run)"
    ])

    refute throughput =~ ~r/x\d[\d.]*  10099 req\/s/

    latency = File.read!(Path.join(ctx.out, "svg/http_bench-latency-p50-bar-to-p99.svg"))
    assert latency =~ "100 mixed requests, 4 connections (median, us; bars: p50-p99)"
    assert latency =~ "anchor  351 us"

    assert html =~ "<td>10099 req/s (not same run)</td>"
    assert html =~ "<td>100 mixed, 4 connections (req/s)</td><td>11712</td>"

    # The README's chart of the Register hot key: only that row.
    story = File.read!(Path.join(ctx.charts, "register-hot-key.svg"))
    assert story =~ "1 key, 90/10 get/put (hot key)"
    refute story =~ "16 keys"
    assert log =~ "no table for the README chart bag-fill"
  end

  defp assert_contains(text, parts), do: for(part <- parts, do: assert(text =~ part))

  test "the report's JSON decoder reads what the harness writes, and refuses the rest" do
    term = %{
      "title" => "t \"q\" \\ \n é",
      "n" => [0, -1, 1.5, 1.0e-7, 123_456_789_012],
      "nested" => %{"a" => [true, false, nil, []], "b" => %{}}
    }

    assert Larder.Report.JSON.decode(Larder.Bench.JSON.encode(term)) == {:ok, term}

    for bad <- [
          "",
          "{",
          "[1,]",
          ~s({"a":1,}),
          ~s({"a" 1}),
          "01x",
          ~S("\x"),
          String.duplicate("[", 100)
        ] do
      assert {:error, _} = Larder.Report.JSON.decode(bad), inspect(bad)
    end
  end
end
