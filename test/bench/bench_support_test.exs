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

  describe "the run's date, machine and command" do
    setup do
      path =
        Path.join(System.tmp_dir!(), "larder_bench_#{System.unique_integer([:positive])}.json")

      on_exit(fn -> File.rm(path) end)
      %{path: path}
    end

    defp run_to_json(path, opts) do
      ExUnit.CaptureIO.capture_io(fn ->
        Bench.start("t", ["--json", path, "--quick"], opts)
        |> Bench.table("tbl", ["x"])
        |> Bench.row("r", %{"x" => Bench.value(1, "n")})
        |> Bench.finish()
      end)

      {:ok, json} = Larder.Report.JSON.decode(File.read!(path))
      json
    end

    test "--json records the start in UTC, the machine, and the command", %{path: path} do
      before = DateTime.utc_now() |> DateTime.truncate(:second)
      json = run_to_json(path, [])
      later = DateTime.utc_now()

      assert {:ok, date, 0} = DateTime.from_iso8601(json["date"])
      assert json["date"] =~ ~r/\A\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\z/
      assert DateTime.compare(date, before) != :lt
      assert DateTime.compare(date, later) != :gt

      machine = json["machine"]
      assert machine["cores_online"] == :erlang.system_info(:logical_processors_online)
      # this is a Linux machine: /proc and /etc/os-release are there
      assert is_binary(machine["cpu"]) and machine["cpu"] != ""
      assert is_integer(machine["memory_bytes"]) and machine["memory_bytes"] > 0
      assert machine["os"] =~ "Linux"

      # the VM's own command line: this test runs under `mix test`
      assert json["command"] =~ ~r/\Amix test( |\z)/
      assert json["system"] =~ "OTP #{System.otp_release()}"
      assert json["quick"] == true
    end

    test "a caller can give the command", %{path: path} do
      json = run_to_json(path, command: "mix run bench/x.exs --quick")
      assert json["command"] == "mix run bench/x.exs --quick"

      assert_raise ArgumentError,
                   ~r/unknown options \[:comand\], valid options: \[:command\]/,
                   fn ->
                     Bench.start("t", [], comand: "x")
                   end

      assert_raise ArgumentError, ~r/expected :command to be a string/, fn ->
        Bench.start("t", [], command: :x)
      end
    end

    test "command/3 names the tool, the folder within the repository, and the set variables" do
      root = Path.expand("../..", __DIR__)
      plain = [~c"/usr/bin/mix", ~c"run", ~c"bench/bag_bench.exs", ~c"--json", ~c"b/x y.json"]

      assert Bench.command(plain, root, %{}) ==
               "mix run bench/bag_bench.exs --json 'b/x y.json'"

      assert Bench.command(plain, Path.join(root, "larder_kafka"), %{
               "ANE_PATH" => "/tmp/it's",
               "HOME" => "/root"
             }) ==
               "cd larder_kafka && ANE_PATH='/tmp/it'\\''s' mix run bench/bag_bench.exs --json 'b/x y.json'"

      assert Bench.command([~c"bench/x.exs", ~c"--quick"], "/elsewhere", %{}) ==
               "elixir bench/x.exs --quick"

      assert Bench.command([], root, %{}) == nil
    end

    @tag :tmp_dir
    test "machine/1 reads what is there and leaves out what is not", %{tmp_dir: root} do
      assert %{cpu: nil, memory_bytes: nil, os: os} = Bench.machine(root)
      # without os-release or osrelease: the kernel as the VM knows it
      assert os =~ ~r/\A\S+ \d+\.\d+\.\d+\z/

      File.mkdir_p!(Path.join(root, "proc/sys/kernel"))
      File.mkdir_p!(Path.join(root, "etc"))

      # an ARM board names its CPU by "Model"; a bad byte and a control
      # character do not reach the JSON
      File.write!(Path.join(root, "proc/cpuinfo"), """
      processor\t: 0
      BogoMIPS\t: 108.00
      CPU part\t: 0xd08

      Model\t\t: Raspberry Pi 4 \xFF\x01Model B
      """)

      File.write!(Path.join(root, "proc/meminfo"), "MemTotal:  lots kB\nMemFree: 1 kB\n")
      File.write!(Path.join(root, "proc/sys/kernel/osrelease"), "6.1.0-rpi7\n")
      File.write!(Path.join(root, "etc/os-release"), ~s(NAME="X"\nPRETTY_NAME="Raspbian 12"\n))

      m = Bench.machine(root)
      assert m.cpu == "Raspberry Pi 4 Model B"
      assert m.memory_bytes == nil
      assert m.os =~ ~r/\ARaspbian 12, \S+ 6\.1\.0-rpi7\z/

      # x86: the first "model name"; MemTotal in kB
      File.write!(Path.join(root, "proc/cpuinfo"), """
      processor\t: 0
      model\t\t: 207
      model name\t: Intel(R) Xeon(R) A
      processor\t: 1
      model name\t: Intel(R) Xeon(R) B
      """)

      File.write!(Path.join(root, "proc/meminfo"), "MemTotal:       24684092 kB\n")
      m = Bench.machine(root)
      assert m.cpu == "Intel(R) Xeon(R) A"
      assert m.memory_bytes == 24_684_092 * 1024

      # a huge file is read only as far as the fields' place
      File.write!(Path.join(root, "proc/cpuinfo"), :binary.copy("flags\t: x\n", 100_000))
      assert Bench.machine(root).cpu == nil
    end
  end
end
