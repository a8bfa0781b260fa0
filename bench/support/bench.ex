# The benchmark harness behind every bench/*_bench.exs script and the demo.
# Hex is unreachable, so this stands in for Benchee: warm-up, repeated runs
# (interleaved across columns if asked), median and spread, per-operation
# percentiles where single operations are timed, N parallel runners, a
# side-by-side table with ratios against an anchor measured in the same run,
# JSON output (with the run's date, machine and command) and a quick mode.
defmodule Larder.Bench do
  @moduledoc false

  defstruct title: nil,
            quick?: false,
            json: nil,
            argv: [],
            tables: [],
            targets: [],
            date: nil,
            command: nil,
            machine: nil

  @type t :: %__MODULE__{}

  @typedoc """
  One measurement. Times are in microseconds.

  A sample is one timed run: one call of the measured function, or with
  `each: n` one of the `n` calls a run makes. `median_us`, `p25_us`,
  `p75_us`, `min_us`, `max_us` and `p99_us` are over the samples (`runs` of
  them; `samples_us` lists them in the order taken, when there are at most
  1,000). With `ops: n`, the
  `per_op_*` figures divide each sample by `n` and `ops_per_s` is the
  throughput over all runners.

  `tail_us` is what the tables print under the median, and `tail` says what
  it is: `"p99"` when the samples are single operations (no `:ops` above 1,
  one runner) and there are at least 100 of them; otherwise `"max of N
  runs"`, since the 99th percentile of a few batch means is their maximum,
  not a tail latency. `p99_us` stays the interpolated percentile whatever
  the count.
  """
  @type result :: %{
          required(:kind) => :time | :value,
          optional(atom()) => term()
        }

  # Fewer single-operation samples than this give no meaningful p99.
  @min_p99_samples 100
  # Results keep their samples up to this many.
  @max_kept_samples 1_000

  ## Setup

  @doc """
  Starts a benchmark run from the script's arguments.

  Understands `--quick` (short runs) and `--json PATH` (write results there);
  other arguments are kept in `bench.argv` for the script.

  The run records, for its JSON: the date it started (UTC, ISO 8601), the
  machine (see `machine/1`) and the command that started it. The command is
  read from the VM's own command line (`mix run bench/bag_bench.exs --quick`),
  prefixed with `cd DIR &&` when run from a folder of the repository other
  than its root (the Kafka benches run from `larder_kafka/`) and with the
  environment variables in `@command_env` that are set.

  Options: `:command` (a string, default read as above) for a caller that
  knows better, such as a script started by another program.
  """
  @spec start(String.t(), [String.t()], keyword()) :: t()
  def start(title, argv \\ System.argv(), opts \\ []) do
    command = start_opts!(opts)

    {opts, rest, _invalid} =
      OptionParser.parse(argv,
        strict: [quick: :boolean, json: :string],
        allow_nonexistent_atoms: true
      )

    bench = %__MODULE__{
      title: title,
      quick?: Keyword.get(opts, :quick, false),
      json: Keyword.get(opts, :json),
      argv: rest,
      date: DateTime.utc_now() |> DateTime.truncate(:second) |> DateTime.to_iso8601(),
      command: command || command(),
      machine: machine()
    }

    IO.puts("\n# #{title}#{if bench.quick?, do: " (quick)", else: ""}")
    IO.puts("# #{system_line()}")
    IO.puts("# #{machine_line(bench.machine)}; #{bench.date}")
    bench
  end

  defp start_opts!(opts) do
    unless Keyword.keyword?(opts) do
      raise ArgumentError, "expected options to be a keyword list, got: #{inspect(opts)}"
    end

    case Keyword.keys(opts) -- [:command] do
      [] -> :ok
      bad -> raise ArgumentError, "unknown options #{inspect(bad)}, valid options: [:command]"
    end

    case Keyword.get(opts, :command) do
      nil -> nil
      command when is_binary(command) -> command
      other -> raise ArgumentError, "expected :command to be a string, got: #{inspect(other)}"
    end
  end

  @doc "Picks `quick` when the run is `--quick`, else `full`."
  @spec pick(t(), term(), term()) :: term()
  def pick(%__MODULE__{quick?: true}, quick, _full), do: quick
  def pick(%__MODULE__{}, _quick, full), do: full

  ## Measuring

  @doc """
  Measures `fun`.

  Options:

    * `:warmup` - untimed runs first (default 1).
    * `:runs` - timed runs (default 5).
    * `:parallel` - runners that call `fun` at the same moment (default 1);
      a sample is the wall time until the last runner finishes.
    * `:ops` - operations one call of `fun` performs per runner; enables the
      `per_op_*` and `ops_per_s` figures.
    * `:each` - a run calls `fun` this many times and times each call, so
      that every call is a sample (one runner only): use it with a `fun`
      that does one operation, for real per-operation percentiles. Each
      sample includes one clock read (tens of nanoseconds).
    * `:setup` - `(-> state)` run untimed before every run; `fun` then gets
      the state.
    * `:teardown` - `(state -> any)` run untimed after every run.

  `fun` takes no argument, `(state)`, or `(state, runner_index)`; `state` is
  `nil` without `:setup`.
  """
  @spec measure((... -> any()), keyword()) :: result()
  def measure(fun, opts \\ []) do
    warmup = Keyword.get(opts, :warmup, 1)
    runs = Keyword.get(opts, :runs, 5)

    for _ <- 1..warmup//1, do: sample_run(fun, opts)
    samples = Enum.flat_map(1..max(runs, 1), fn _ -> sample_run(fun, opts) end)
    summarize(samples, Keyword.get(opts, :ops), Keyword.get(opts, :parallel, 1))
  end

  # One run (setup, timed calls, teardown); returns its samples in us.
  defp sample_run(fun, opts) do
    parallel = Keyword.get(opts, :parallel, 1)
    each = Keyword.get(opts, :each)
    setup = Keyword.get(opts, :setup)
    teardown = Keyword.get(opts, :teardown, fn _ -> :ok end)

    if each && parallel != 1 do
      raise ArgumentError, "expected :each without :parallel, got parallel: #{parallel}"
    end

    state = if setup, do: setup.(), else: nil
    :erlang.garbage_collect()

    samples =
      if each,
        do: timed_each(fun, state, each),
        else: [timed_run(fun, state, parallel)]

    teardown.(state)
    samples
  end

  defp timed_each(fun, state, n) do
    for _ <- 1..n//1 do
      start = System.monotonic_time()
      call(fun, state, 0)
      elapsed_us(start)
    end
  end

  @doc """
  Stores workload data in `:persistent_term` under `key` and returns the
  stored term, which lives off the calling process's heap.

  The harness collects the caller's garbage before every timed run. With a
  large data set on the heap, that collection (and any during the run)
  copies it, leaves the caches cold, and makes a contender pay for the
  data set's size rather than for its own work. `release_off_heap/0`
  erases everything stored this way.
  """
  @spec off_heap(term(), data) :: data when data: var
  def off_heap(key, data) do
    :persistent_term.put({__MODULE__, key}, data)
    :persistent_term.get({__MODULE__, key})
  end

  @doc "Erases every term stored by `off_heap/2`."
  @spec release_off_heap() :: :ok
  def release_off_heap do
    for {{__MODULE__, _} = key, _} <- :persistent_term.get(), do: :persistent_term.erase(key)
    :ok
  end

  @doc """
  Runs `fun` in a process of its own, spawned with `spawn_opts` (for
  example `min_heap_size:` for a floor that builds one large list, so it
  pays for no copying collections as its heap grows), and returns its
  result; a raise there is raised here. What `fun` reads is copied into
  that process unless it is held off the heap (`off_heap/2`).
  """
  @spec in_process((() -> result), keyword()) :: result when result: term()
  def in_process(fun, spawn_opts \\ []) do
    parent = self()
    ref = make_ref()

    {pid, monitor} =
      :erlang.spawn_opt(
        fn ->
          result =
            try do
              {:ok, fun.()}
            catch
              kind, reason -> {:raise, kind, reason, __STACKTRACE__}
            end

          send(parent, {ref, result})
        end,
        [:monitor | spawn_opts]
      )

    receive do
      {^ref, result} ->
        Process.demonitor(monitor, [:flush])

        case result do
          {:ok, value} -> value
          {:raise, kind, reason, stack} -> :erlang.raise(kind, reason, stack)
        end

      {:DOWN, ^monitor, :process, ^pid, reason} ->
        exit(reason)
    end
  end

  @doc "Records a figure that is not a time, such as memory in words."
  @spec value(number(), String.t()) :: result()
  def value(number, unit), do: %{kind: :value, value: number, unit: unit}

  defp timed_run(fun, state, 1) do
    start = System.monotonic_time()
    call(fun, state, 0)
    elapsed_us(start)
  end

  defp timed_run(fun, state, parallel) do
    parent = self()
    go = make_ref()

    pids =
      for i <- 0..(parallel - 1) do
        spawn_link(fn ->
          receive do
            ^go -> :ok
          end

          call(fun, state, i)
          send(parent, {:done, self()})
        end)
      end

    start = System.monotonic_time()
    Enum.each(pids, &send(&1, go))
    Enum.each(pids, fn pid -> receive(do: ({:done, ^pid} -> :ok)) end)
    elapsed_us(start)
  end

  defp elapsed_us(start) do
    System.convert_time_unit(System.monotonic_time() - start, :native, :nanosecond) / 1_000
  end

  defp call(fun, _state, _i) when is_function(fun, 0), do: fun.()
  defp call(fun, state, _i) when is_function(fun, 1), do: fun.(state)
  defp call(fun, state, i) when is_function(fun, 2), do: fun.(state, i)

  @doc """
  Summarizes samples (in us, one per timed run or per call with `:each`)
  into a `t:result/0`. `ops` and `parallel` are `measure/2`'s options.
  """
  @spec summarize([number()], pos_integer() | nil, pos_integer()) :: result()
  def summarize(samples, ops, parallel) do
    sorted = Enum.sort(samples)
    n = length(sorted)
    median = percentile(sorted, 50)
    single_ops? = ops in [nil, 1] and parallel == 1
    {tail, tail_us} = tail_of(sorted, single_ops?)

    base = %{
      kind: :time,
      runs: n,
      parallel: parallel,
      median_us: median,
      p25_us: percentile(sorted, 25),
      p75_us: percentile(sorted, 75),
      p99_us: percentile(sorted, 99),
      min_us: hd(sorted),
      max_us: List.last(sorted),
      mean_us: Enum.sum(sorted) / n,
      tail: tail,
      tail_us: tail_us
    }

    # The samples themselves, for charts, unless there are very many.
    base = if n <= @max_kept_samples, do: Map.put(base, :samples_us, samples), else: base

    if ops do
      Map.merge(base, %{
        ops: ops,
        per_op_median_us: median / ops,
        per_op_p25_us: base.p25_us / ops,
        per_op_p75_us: base.p75_us / ops,
        per_op_p99_us: base.p99_us / ops,
        per_op_min_us: base.min_us / ops,
        per_op_max_us: base.max_us / ops,
        per_op_tail_us: tail_us / ops,
        ops_per_s: if(median > 0, do: ops * parallel * 1_000_000 / median, else: nil)
      })
    else
      base
    end
  end

  defp tail_of(sorted, true = _single_ops?) when length(sorted) >= @min_p99_samples,
    do: {"p99", percentile(sorted, 99)}

  defp tail_of([_] = sorted, _single_ops?), do: {"max of 1 run", List.last(sorted)}

  defp tail_of(sorted, _single_ops?),
    do: {"max of #{length(sorted)} runs", List.last(sorted)}

  @doc false
  def percentile([], _), do: nil

  def percentile(sorted, p) do
    n = length(sorted)
    rank = p / 100 * (n - 1)
    lo = floor(rank)
    hi = min(lo + 1, n - 1)
    a = Enum.at(sorted, lo)
    b = Enum.at(sorted, hi)
    a + (b - a) * (rank - lo)
  end

  ## Tables

  @doc """
  Starts a side-by-side table: one column per contender, one row per workload.
  Each cell shows the median and, under it, the tail (`p99` of single
  operations, or `max of N runs`, see `t:result/0`); `xN` is the median over
  the anchor column's median in the same row (below 1 is faster or smaller).

  Options: `:anchor` (a column name, default the first), `:per_op` (show
  per-operation times when measured with `:ops`, default `false`).
  """
  @spec table(t(), String.t(), [String.t()], keyword()) :: t()
  def table(bench, title, columns, opts \\ []) do
    table = %{
      title: title,
      columns: columns,
      anchor: Keyword.get(opts, :anchor, hd(columns)),
      per_op: Keyword.get(opts, :per_op, false),
      rows: []
    }

    IO.puts("\n## #{title}   (anchor: #{table.anchor}; xN = median / anchor median)")
    IO.puts(format_line(table, "", columns))
    %{bench | tables: [table | bench.tables]}
  end

  @doc """
  Measures one row of the current table and prints it.

  `cells` maps column names to a function measured with `measure_opts`, to
  `{fun, extra_measure_opts}`, or to an already computed result (such as one
  from `value/2`). Columns left out print as `-`. The measurement order
  follows the table's columns.

  With `interleave: true` in `measure_opts`, the columns take turns run by
  run, as `interleave/2` does.
  """
  @spec row(t(), String.t(), %{optional(String.t()) => term()} | keyword(), keyword()) :: t()
  def row(%__MODULE__{tables: [table | rest]} = bench, label, cells, measure_opts \\ []) do
    cells = Map.new(cells)
    {interleave?, measure_opts} = Keyword.pop(measure_opts, :interleave, false)

    results =
      if interleave? do
        run_interleaved(table, cells, measure_opts)
      else
        for col <- table.columns, Map.has_key?(cells, col), into: %{} do
          {col, run_cell(Map.fetch!(cells, col), measure_opts)}
        end
      end

    print_row(table, label, results)
    table = %{table | rows: table.rows ++ [%{label: label, results: results}]}
    %{bench | tables: [table | rest]}
  end

  defp run_cell(%{kind: _} = result, _opts), do: result

  defp run_cell({fun, opts}, base) when is_function(fun),
    do: measure(fun, Keyword.merge(base, opts))

  defp run_cell(fun, opts) when is_function(fun), do: measure(fun, opts)

  defp run_interleaved(table, cells, base) do
    for(col <- table.columns, Map.has_key?(cells, col), do: {col, cells[col]})
    |> interleave(base)
  end

  @doc """
  Measures several contenders in rounds and returns their results by column,
  for `row/4`.

  `cells` is a list (or map) of `{column, cell}` as in `row/4`: a function,
  `{fun, extra_measure_opts}`, or a result computed already (kept as is).
  Each column's options are `base` merged with its extra options. All the
  warm-ups run first; then round `i` takes one run of each column that has
  runs left, starting with a column that moves by one each round, so that a
  change in the machine's load hits every column alike instead of the ones
  measured last. Results are summarized as by `measure/2`.
  """
  @spec interleave([{String.t(), term()}] | %{optional(String.t()) => term()}, keyword()) ::
          %{optional(String.t()) => result()}
  def interleave(cells, base \\ []) do
    {done, timed} = Enum.split_with(cells, fn {_col, cell} -> match?(%{kind: _}, cell) end)

    timed =
      for {col, cell} <- timed do
        {fun, extra} = if is_function(cell), do: {cell, []}, else: cell
        {col, fun, Keyword.merge(base, extra)}
      end

    rounds = fn key, default ->
      Enum.reduce(timed, 0, fn {_, _, o}, acc -> max(acc, Keyword.get(o, key, default)) end)
    end

    for round <- 1..rounds.(:warmup, 1)//1,
        {_col, fun, o} <- timed,
        round <= Keyword.get(o, :warmup, 1),
        do: sample_run(fun, o)

    samples =
      for round <- 0..(rounds.(:runs, 5) - 1)//1,
          {col, fun, o} <- rotate(timed, round),
          round < max(Keyword.get(o, :runs, 5), 1) do
        {col, sample_run(fun, o)}
      end

    timed_results =
      for {col, _fun, o} <- timed, into: %{} do
        mine = for {^col, us} <- samples, sample <- us, do: sample
        {col, summarize(mine, Keyword.get(o, :ops), Keyword.get(o, :parallel, 1))}
      end

    Map.merge(Map.new(done), timed_results)
  end

  defp rotate([], _n), do: []

  defp rotate(list, n) do
    {front, back} = Enum.split(list, rem(n, length(list)))
    back ++ front
  end

  @doc """
  The ratio of `column`'s median over the anchor's in the row labelled
  `label` of the table titled `title`, or `nil`.
  """
  @spec ratio(t(), String.t(), String.t(), String.t()) :: float() | nil
  def ratio(bench, title, label, column) do
    with %{} = table <- Enum.find(bench.tables, &(&1.title == title)),
         %{} = row <- Enum.find(table.rows, &(&1.label == label)) do
      ratio_of(table, row.results, column)
    else
      _ -> nil
    end
  end

  @doc """
  The result measured for `column` in the row labelled `label` of the table
  titled `title` (a map as returned by `measure/2` or `value/2`), or `nil`.
  """
  @spec result(t(), String.t(), String.t(), String.t()) :: result() | nil
  def result(bench, title, label, column) do
    with %{} = table <- Enum.find(bench.tables, &(&1.title == title)),
         %{} = row <- Enum.find(table.rows, &(&1.label == label)) do
      row.results[column]
    else
      _ -> nil
    end
  end

  defp ratio_of(table, results, column) do
    anchor = results[table.anchor]
    cell = results[column]

    with %{} <- anchor, %{} <- cell, a when is_number(a) and a > 0 <- central(anchor, table) do
      central(cell, table) / a
    else
      _ -> nil
    end
  end

  defp central(%{kind: :value, value: v}, _table), do: v
  defp central(%{per_op_median_us: v}, %{per_op: true}), do: v
  defp central(%{median_us: v}, _table), do: v

  defp tail(%{kind: :value}, _table), do: nil
  defp tail(%{per_op_tail_us: v}, %{per_op: true}), do: v
  defp tail(%{per_op_p99_us: v}, %{per_op: true}), do: v
  defp tail(%{tail_us: v}, _table), do: v
  defp tail(%{p99_us: v}, _table), do: v

  defp print_row(table, label, results) do
    medians =
      for col <- table.columns do
        case results[col] do
          nil ->
            "-"

          result ->
            ratio = ratio_of(table, results, col)
            fmt_result(result, table) <> if(ratio, do: " x" <> fmt_ratio(ratio), else: "")
        end
      end

    IO.puts(format_line(table, label, medians))

    if Enum.any?(Map.values(results), &(&1.kind == :time)) do
      p99s =
        for col <- table.columns do
          case results[col] do
            %{kind: :time} = result ->
              Map.get(result, :tail, "p99") <> " " <> fmt_us(tail(result, table))

            _ ->
              ""
          end
        end

      IO.puts(format_line(table, "", p99s))
    end
  end

  defp fmt_result(%{kind: :value, value: v, unit: unit}, _), do: fmt_number(v) <> " " <> unit
  defp fmt_result(result, table), do: fmt_us(central(result, table))

  @label_width 44
  @cell_width 26

  # Cells are as wide as the longest column name, at least @cell_width.
  defp format_line(table, label, cells) do
    width = Enum.reduce(table.columns, @cell_width, &max(&2, String.length(&1) + 2))

    String.pad_trailing(label, @label_width) <>
      Enum.map_join(cells, "", &String.pad_trailing(&1, width))
  end

  @doc "Formats microseconds with a unit that fits."
  @spec fmt_us(number() | nil) :: String.t()
  def fmt_us(nil), do: "-"
  def fmt_us(us) when us >= 1_000_000, do: fmt_float(us / 1_000_000) <> " s"
  def fmt_us(us) when us >= 1_000, do: fmt_float(us / 1_000) <> " ms"
  def fmt_us(us) when us >= 1, do: fmt_float(us) <> " us"
  def fmt_us(us), do: fmt_float(us * 1_000) <> " ns"

  @doc "Formats a ratio."
  @spec fmt_ratio(number()) :: String.t()
  def fmt_ratio(r) when r >= 100, do: :erlang.float_to_binary(r / 1, decimals: 0)
  def fmt_ratio(r) when r >= 10, do: :erlang.float_to_binary(r / 1, decimals: 1)
  def fmt_ratio(r) when r >= 0.1 or r == 0, do: :erlang.float_to_binary(r / 1, decimals: 2)
  # Small ratios (a contender hundreds of times faster) keep two significant
  # digits, so 0.0054 does not print as 0.01.
  def fmt_ratio(r) do
    decimals = 1 - floor(:math.log10(abs(r)))
    :erlang.float_to_binary(r / 1, decimals: decimals)
  end

  defp fmt_float(f) when f >= 100, do: :erlang.float_to_binary(f / 1, decimals: 0)
  defp fmt_float(f) when f >= 10, do: :erlang.float_to_binary(f / 1, decimals: 1)
  defp fmt_float(f), do: :erlang.float_to_binary(f / 1, decimals: 2)

  defp fmt_number(n) when is_integer(n) and n >= 1_000_000, do: fmt_float(n / 1_000_000) <> "M"
  defp fmt_number(n) when is_integer(n) and n >= 10_000, do: fmt_float(n / 1_000) <> "k"
  defp fmt_number(n) when is_integer(n), do: Integer.to_string(n)
  defp fmt_number(n), do: fmt_float(n)

  ## Targets and output

  @doc """
  Prints a target check: `ok` or `MISSED`, with the measured figure. Targets
  are reported, never asserted: benchmarks do not fail the build.
  """
  @spec target(t(), String.t(), number() | nil, :<= | :>=, number()) :: t()
  def target(bench, what, measured, op, limit) do
    status =
      cond do
        measured == nil -> "n/a"
        op == :<= and measured <= limit -> "ok"
        op == :>= and measured >= limit -> "ok"
        true -> "MISSED"
      end

    shown = if measured, do: fmt_ratio(measured), else: "-"
    IO.puts("target  #{String.pad_trailing(what, 60)} #{shown} (want #{op} #{limit})  #{status}")
    entry = %{what: what, measured: measured, op: op, limit: limit, status: status}
    %{bench | targets: bench.targets ++ [entry]}
  end

  @doc "Prints the closing line and writes `--json PATH` if given."
  @spec finish(t()) :: t()
  def finish(bench) do
    if bench.json do
      File.mkdir_p!(Path.dirname(bench.json))
      File.write!(bench.json, Larder.Bench.JSON.encode(to_json(bench)))
      IO.puts("\nresults written to #{bench.json}")
    end

    bench
  end

  defp to_json(bench) do
    %{
      title: bench.title,
      quick: bench.quick?,
      date: bench.date,
      command: bench.command,
      machine: bench.machine,
      system: system_line(),
      targets: bench.targets,
      tables:
        for table <- Enum.reverse(bench.tables) do
          %{
            title: table.title,
            anchor: table.anchor,
            per_op: table.per_op,
            columns: table.columns,
            rows:
              for row <- table.rows do
                %{
                  label: row.label,
                  results:
                    Map.new(row.results, fn {col, r} ->
                      {col, Map.put(r, :ratio, ratio_of(table, row.results, col))}
                    end)
                }
              end
          }
        end
    }
  end

  defp system_line do
    "OTP #{System.otp_release()}, Elixir #{System.version()}, " <>
      "#{System.schedulers_online()} schedulers, #{:erlang.system_info(:system_architecture)}"
  end

  ## The machine and the command, for the results file

  @typedoc """
  The machine a run took place on, as written to the JSON: `cpu` (the first
  model name in /proc/cpuinfo), `cores_online` (logical processors online),
  `memory_bytes` (MemTotal in /proc/meminfo) and `os` (PRETTY_NAME from
  /etc/os-release, the kernel and its release). A figure that cannot be read
  is `nil`.
  """
  @type machine :: %{
          cpu: String.t() | nil,
          cores_online: pos_integer() | nil,
          memory_bytes: pos_integer() | nil,
          os: String.t() | nil
        }

  # The files are read up to this many bytes: the fields wanted come first.
  @max_read 65_536
  # Longer text from those files is cut to this many characters.
  @max_text 200

  @doc """
  Describes the machine from the files under `root` (`/`; another root for
  tests). Missing, unreadable or odd files give `nil` fields, never an
  exception.
  """
  @spec machine(Path.t()) :: machine()
  def machine(root \\ "/") do
    cores =
      case :erlang.system_info(:logical_processors_online) do
        n when is_integer(n) and n > 0 -> n
        _ -> nil
      end

    %{
      cpu: root |> Path.join("proc/cpuinfo") |> read_head() |> cpu_model(),
      cores_online: cores,
      memory_bytes: root |> Path.join("proc/meminfo") |> read_head() |> mem_total(),
      os: os(root)
    }
  end

  defp read_head(path) do
    case File.open(path, [:read, :binary]) do
      {:ok, io} ->
        try do
          case IO.binread(io, @max_read) do
            data when is_binary(data) -> data
            _ -> ""
          end
        after
          File.close(io)
        end

      {:error, _} ->
        ""
    end
  end

  # x86 says "model name"; some ARM kernels "Hardware" or "Model", MIPS
  # "cpu model".
  @cpu_keys ["model name", "hardware", "model", "cpu model"]

  defp cpu_model(cpuinfo) do
    # The first value of each key: a machine with cores of two kinds lists
    # both, and the first is as good a name as any.
    found =
      cpuinfo
      |> String.split("\n")
      |> Enum.reduce(%{}, fn line, found ->
        with [key, value] <- String.split(line, ":", parts: 2),
             key = key |> String.trim() |> String.downcase(),
             true <- key in @cpu_keys,
             text when is_binary(text) <- text(value) do
          Map.put_new(found, key, text)
        else
          _ -> found
        end
      end)

    Enum.find_value(@cpu_keys, &found[&1])
  end

  defp mem_total(meminfo) do
    case Regex.run(~r/^MemTotal:\s+(\d{1,15})\s*kB/m, meminfo) do
      [_, kb] -> if (n = String.to_integer(kb)) > 0, do: n * 1024
      _ -> nil
    end
  end

  defp os(root) do
    pretty =
      case Regex.run(~r/^PRETTY_NAME=(.*)$/m, read_head(Path.join(root, "etc/os-release"))) do
        [_, value] -> value |> String.trim() |> String.trim("\"") |> text()
        _ -> nil
      end

    {_family, name} = :os.type()

    release =
      text(read_head(Path.join(root, "proc/sys/kernel/osrelease"))) ||
        case :os.version() do
          {a, b, c} -> "#{a}.#{b}.#{c}"
          other -> to_string(other)
        end

    kernel = "#{name |> Atom.to_string() |> kernel_name()} #{release}"
    if pretty, do: "#{pretty}, #{kernel}", else: kernel
  end

  defp kernel_name("linux"), do: "Linux"
  defp kernel_name("darwin"), do: "Darwin"
  defp kernel_name(other), do: other

  # Printable text of at most @max_text characters, or nil when none is left.
  defp text(bin) do
    bin = if String.valid?(bin), do: bin, else: for(<<c <- bin>>, c < 128, into: "", do: <<c>>)

    bin
    |> String.replace(~r/[[:cntrl:][:space:]]+/u, " ")
    |> String.trim()
    |> String.slice(0, @max_text)
    |> case do
      "" -> nil
      text -> text
    end
  end

  defp machine_line(machine) do
    memory =
      if machine.memory_bytes,
        do: "#{:erlang.float_to_binary(machine.memory_bytes / 1_073_741_824, decimals: 1)} GiB"

    [
      machine.cpu,
      machine.cores_online && "#{machine.cores_online} cores online",
      memory,
      machine.os
    ]
    |> Enum.map_join(", ", &(&1 || "unknown"))
  end

  # Environment variables that change what a bench measures; the command
  # recorded names those that are set.
  @command_env ~w(MIX_ENV ANE_PATH CATALOGUE_DIR)
  # The repository's root: bench.ex is bench/support/bench.ex in it.
  @root Path.expand("../..", __DIR__)

  @doc """
  The command line that started this VM, as a shell would take it, or `nil`
  when the VM's arguments do not say (a bare `elixir -e`).

  `plain` are the VM's plain arguments (`/usr/bin/mix run bench/x.exs
  --quick` under Mix, `bench/x.exs --quick` under `elixir`), `cwd` the
  working folder and `env` the environment, all for tests.
  """
  @spec command([charlist() | String.t()], Path.t(), %{optional(String.t()) => String.t()}) ::
          String.t() | nil
  def command(
        plain \\ :init.get_plain_arguments(),
        cwd \\ File.cwd!(),
        env \\ System.get_env()
      ) do
    args = Enum.map(plain, &arg_string/1)

    words =
      case args do
        [] ->
          nil

        [first | rest] ->
          if Path.basename(first) == "mix", do: ["mix" | rest], else: ["elixir" | args]
      end

    if words do
      cd =
        if String.starts_with?(cwd, @root <> "/"),
          do: "cd #{shell_quote(Path.relative_to(cwd, @root))} && ",
          else: ""

      vars = for var <- @command_env, value = env[var], do: "#{var}=#{shell_quote(value)} "
      cd <> Enum.join(vars) <> Enum.map_join(words, " ", &shell_quote/1)
    end
  end

  defp arg_string(arg) when is_binary(arg), do: arg

  defp arg_string(arg) when is_list(arg) do
    case :unicode.characters_to_binary(arg) do
      bin when is_binary(bin) -> bin
      _ -> :erlang.list_to_binary(for c <- arg, is_integer(c), c in 0..255, do: c)
    end
  end

  defp shell_quote(""), do: "''"

  defp shell_quote(word) do
    if word =~ ~r/\A[A-Za-z0-9_@%+=:,.\/-]+\z/,
      do: word,
      else: "'" <> String.replace(word, "'", ~S('\'')) <> "'"
  end
end

# A minimal JSON encoder for benchmark results (no Jason: Hex is unreachable).
defmodule Larder.Bench.JSON do
  @moduledoc false

  def encode(term), do: IO.iodata_to_binary(enc(term))

  defp enc(nil), do: "null"
  defp enc(true), do: "true"
  defp enc(false), do: "false"
  defp enc(a) when is_atom(a), do: enc(Atom.to_string(a))
  defp enc(n) when is_integer(n), do: Integer.to_string(n)
  defp enc(f) when is_float(f), do: :erlang.float_to_binary(f, [:short])
  defp enc(s) when is_binary(s), do: [?", escape(s), ?"]
  defp enc(l) when is_list(l), do: [?[, Enum.map_intersperse(l, ?,, &enc/1), ?]]

  defp enc(m) when is_map(m) do
    [?{, Enum.map_intersperse(m, ?,, fn {k, v} -> [enc(to_string(k)), ?:, enc(v)] end), ?}]
  end

  defp enc(other), do: enc(inspect(other))

  defp escape(s) do
    for <<c::utf8 <- s>>, into: "" do
      case c do
        ?" -> "\\\""
        ?\\ -> "\\\\"
        ?\n -> "\\n"
        c when c < 0x20 -> "\\u" <> String.pad_leading(Integer.to_string(c, 16), 4, "0")
        c -> <<c::utf8>>
      end
    end
  end
end
