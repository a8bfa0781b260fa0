defmodule Larder.Table.SnapshotTest do
  # Larder.Table.dump/2 and load/2: round trips that answer every search as
  # the original does, every damaged or foreign file an error (never a
  # crash, never a table left behind), bad arguments ArgumentError, and a
  # dump during writes one state of the table. Not async: "no table is
  # left" counts every ETS table of the VM, which other tests change.
  use ExUnit.Case, async: false

  alias Larder.Table
  alias Larder.Test.Isolated

  import Larder.Test.TableSnapshotFile, only: [parse: 1, frame: 1, frame: 2]

  # Each load logs a line at info (see "a load's log line").
  @moduletag :tmp_dir
  @moduletag :capture_log

  defp opts(store), do: [key: :id, index: [:a, {:m, &Map.get(&1, :tags, [])}], store: store]

  defp records(seed, n) do
    :rand.seed(:exsss, {seed, 2, 3})

    for i <- 1..n do
      key = if rem(i, 4) == 0, do: "k#{i}", else: i * 3

      record = %{
        id: key,
        a: Enum.random([:x, :y, 1, 1.0, "s", {:t, 1}]),
        tags: Enum.take_random([:p, :q, "r", 7, {1, [2]}], :rand.uniform(3) - 1),
        junk: i
      }

      # Some records lack a stored field: with `store:`, a dump writes
      # those as maps and the others as their values alone.
      if rem(i, 5) == 0, do: Map.delete(record, :a), else: record
    end
  end

  defp searches(seed) do
    :rand.seed(:exsss, {seed, 9, 9})
    values = [:x, :y, 1, 1.0, "s", {:t, 1}, :p, :q, "r", 7, {1, [2]}, :none]

    for _ <- 1..200 do
      case :rand.uniform(4) do
        1 -> [a: Enum.random(values)]
        2 -> [m: Enum.random(values)]
        3 -> [a: Enum.random(values), m: Enum.random(values)]
        4 -> [m: {:in, Enum.take_random(values, 3)}, a: {:in, Enum.take_random(values, 2)}]
      end
    end
  end

  defp build(store, seed, n) do
    table = Table.new(opts(store))
    records = records(seed, n)
    :ok = Table.insert_many(table, records)
    # Deletes free row ids (reused later) and empty some bitmaps' chunks.
    for %{id: id} <- Enum.take_every(records, 7), do: Table.delete(table, id)
    table
  end

  defp same?(a, b, seed) do
    sorted = &(&1 |> Table.stream() |> Enum.sort_by(fn r -> :erlang.term_to_binary(r.id) end))

    Table.size(a) == Table.size(b) and sorted.(a) == sorted.(b) and
      Enum.all?(searches(seed), fn q ->
        Table.search(a, q) == Table.search(b, q) and Table.count(a, q) == Table.count(b, q)
      end)
  end

  describe "round trip" do
    for store <- [nil, [:a, :tags]] do
      test "answers every search as the original (store: #{inspect(store)})", %{tmp_dir: dir} do
        for seed <- 1..4 do
          table = build(unquote(store), seed, 2_000)
          path = Path.join(dir, "t#{seed}")
          assert :ok = Table.dump(table, path)
          assert {:ok, copy} = Table.load(path, opts(unquote(store)))
          assert same?(table, copy, seed)

          # Later writes to both (freed ids reused, replaced records
          # re-indexed from the loaded index) keep them equal.
          more = records(seed + 100, 300)
          for t <- [table, copy], do: :ok = Table.insert_many(t, more)
          for t <- [table, copy], r <- Enum.take(more, 50), do: Table.delete(t, r.id)
          for t <- [table, copy], do: Table.insert(t, %{id: "fresh", a: :x, tags: [:p]})
          assert same?(table, copy, seed)

          for t <- [table, copy], do: Table.drop(t)
        end
      end
    end

    test "an empty table, a name and telemetry off", %{tmp_dir: dir} do
      path = Path.join(dir, "empty")
      :ok = Table.dump(Table.new(key: :id, index: [:a]), path)
      name = :"snap_#{System.unique_integer([:positive])}"
      copy = Table.load!(path, key: :id, index: [:a], name: name, telemetry: false)
      assert Table.size(name) == 0
      assert Table.search(copy, a: 1) == []
      :ok = Table.insert(name, %{id: 1, a: 1})
      assert Table.search(name, a: 1) == [%{id: 1, a: 1}]
    end

    # File.read/1 goes through the file server, which kept a reference to
    # the whole file (46 MB for the price catalogue) until its next garbage
    # collection, which an idle file server may never run.
    test "load/2 leaves no reference to the file's bytes in the file server", %{tmp_dir: dir} do
      path = Path.join(dir, "held")
      :ok = Table.dump(build(nil, 1, 2_000), path)
      size = File.stat!(path).size
      assert {:ok, copy} = Table.load(path, opts(nil))
      Table.drop(copy)
      {:binary, held} = Process.info(Process.whereis(:file_server_2), :binary)
      refute Enum.any?(held, fn {_, bytes, _} -> bytes == size end)
    end

    test "the loaded table belongs to the caller", %{tmp_dir: dir} do
      path = Path.join(dir, "owned")
      :ok = Table.dump(build(nil, 1, 100), path)
      parent = self()

      pid =
        spawn(fn ->
          send(parent, Table.load(path, opts(nil)))
          receive do: (:stop -> :ok)
        end)

      assert_receive {:ok, copy}
      ref = Process.monitor(copy.writer)
      send(pid, :stop)
      assert_receive {:DOWN, ^ref, :process, _, _}
      assert_raise ArgumentError, ~r/unknown Larder.Table/, fn -> Table.size(copy) end
    end
  end

  describe "bad files" do
    setup %{tmp_dir: dir} do
      path = Path.join(dir, "good")
      :ok = Table.dump(build([:a, :tags], 5, 3_000), path)
      %{good: File.read!(path), dir: dir}
    end

    defp load_file(dir, data, opts \\ opts([:a, :tags])) do
      path = Path.join(dir, "bad#{System.unique_integer([:positive])}")
      File.write!(path, data)
      Table.load(path, opts)
    end

    # Positions of each section's first bytes: header, each chunk's header
    # and payload, the trailer.
    defp sections(<<"LARDERTAB", 2, rest::binary>>), do: [0, 9] ++ chunk_offsets(rest, 10)

    defp chunk_offsets(<<0, _::binary-size(24)>>, at), do: [at, at + 5, at + 24]

    defp chunk_offsets(<<_k, size::32, _::64, _payload::binary-size(size), rest::binary>>, at),
      do:
        [at, at + 3, at + 11, at + 13, at + 13 + div(size, 2)] ++
          chunk_offsets(rest, at + 13 + size)

    test "a byte flipped in any section is an error, and no table is left", %{
      good: good,
      dir: dir
    } do
      tables = length(:ets.all())

      for at <- sections(good) do
        <<before::binary-size(at), byte, rest::binary>> = good

        assert {:error, %Larder.Error{reason: reason}} =
                 load_file(dir, <<before::binary, Bitwise.bxor(byte, 0x5A), rest::binary>>)

        assert reason in [:corrupt_snapshot, :definition_mismatch], "flip at #{at}"
      end

      assert length(:ets.all()) == tables
    end

    test "every truncation is an error", %{good: good, dir: dir} do
      step = max(div(byte_size(good), 300), 1)

      for len <- Enum.to_list(0..(byte_size(good) - 1)//step) ++ [byte_size(good) - 1] do
        assert {:error, %Larder.Error{reason: :corrupt_snapshot}} =
                 load_file(dir, binary_part(good, 0, len))
      end

      assert {:error, %Larder.Error{reason: :corrupt_snapshot}} = load_file(dir, good <> "x")
    end

    test "wrong magic or version, a Bag snapshot, an empty file, a huge length", %{
      good: good,
      dir: dir
    } do
      <<_::binary-size(9), 2, rest::binary>> = good

      for version <- [0, 3, 255] do
        assert {:error, %{reason: :corrupt_snapshot} = e} =
                 load_file(dir, "LARDERTAB" <> <<version>> <> rest)

        assert e.message =~ "version #{version}"
      end

      assert {:error, %{reason: :corrupt_snapshot}} = load_file(dir, "LARDERBAX" <> <<1>> <> rest)
      assert {:error, %{reason: :corrupt_snapshot}} = load_file(dir, "")

      bag = Larder.Bag.new()
      Larder.Bag.insert(bag, :a, 1)
      bag_path = Path.join(dir, "bag")
      :ok = Larder.Bag.dump(bag, bag_path)

      assert {:error, %{reason: :corrupt_snapshot, message: "not a Larder.Table snapshot"}} =
               Table.load(bag_path, opts(nil))

      huge = "LARDERTAB" <> <<1, 1, 0xFFFFFFFF::32, 1::32, 0::32>> <> "tiny"
      assert {:error, %{reason: :corrupt_snapshot}} = load_file(dir, huge)
      assert {:error, %{reason: :file_error}} = Table.load(Path.join(dir, "missing"), opts(nil))
    end

    # Version 1 wrote every stored record as a map; a replica's snapshot
    # from before version 2 must still load.
    test "a version 1 file (stored records as maps) loads", %{dir: dir} do
      table = build([:a, :tags], 5, 3_000)
      path = Path.join(dir, "v2")
      :ok = Table.dump(table, path)
      <<"LARDERTAB", 2, rest::binary>> = File.read!(path)
      fields = Enum.sort([:id, :a, :tags])

      chunks =
        for {kind, n, p} <- parse(rest) do
          if kind == 2 do
            items =
              for {id, stored} <- :erlang.binary_to_term(p) do
                if is_tuple(stored),
                  do: {id, Map.new(Enum.zip(fields, Tuple.to_list(stored)))},
                  else: {id, stored}
              end

            {2, n, :erlang.term_to_binary(items)}
          else
            {kind, n, p}
          end
        end

      assert Enum.any?(:erlang.binary_to_term(elem(hd(tl(parse(rest))), 2)), fn {_, r} ->
               is_tuple(r)
             end)

      assert {:ok, copy} = load_file(dir, frame(chunks, 1))
      assert same?(table, copy, 5)
    end

    # A forged row may hold as many keys as the stored fields but other
    # ones (a row is checked for its key only): its table still dumps, and
    # the dump loads.
    test "a loaded record of other keys dumps and loads again", %{good: good, dir: dir} do
      <<"LARDERTAB", 2, rest::binary>> = good
      [definition, {2, n, p} | others] = parse(rest)
      [{id, _values} | rows] = :erlang.binary_to_term(p)
      forged = [{id, %{id: id, a: 1, other: 2}} | rows]
      chunks = [definition, {2, n, :erlang.term_to_binary(forged)} | others]

      assert {:ok, table} = load_file(dir, frame(chunks))
      assert Table.get(table, id) == %{id: id, a: 1, other: 2}
      path = Path.join(dir, "again")
      assert :ok = Table.dump(table, path)
      assert {:ok, again} = Table.load(path, opts([:a, :tags]))
      assert Table.get(again, id) == %{id: id, a: 1, other: 2}
      assert same?(table, again, 5)
    end

    test "a file of another definition is refused", %{good: good, dir: dir} do
      for other <- [
            opts(nil),
            opts([:a]),
            [key: :other, index: [:a, {:m, & &1}], store: [:a, :tags]],
            [key: :id, index: [{:m, & &1}, :a], store: [:a, :tags]],
            [key: :id, index: [:a], store: [:a, :tags]]
          ] do
        assert {:error, %Larder.Error{reason: :definition_mismatch}} = load_file(dir, good, other)
      end
    end

    # Chunks re-framed with valid checksums: what only forgery (or a bug)
    # makes. Each is an error, in a separate VM in case the NIF crashed.
    test "forged chunks with valid checksums are errors (isolated VM)", %{good: good, dir: dir} do
      <<"LARDERTAB", 2, rest::binary>> = good
      chunks = parse(rest)
      # A stored record written as its values: [:a, :id, :tags].
      key_at = 1

      replace = fn kind, fun ->
        {before, [{^kind, _n, p} | after_]} = Enum.split_while(chunks, &(elem(&1, 0) != kind))
        items = fun.(:erlang.binary_to_term(p))
        before ++ [{kind, length(items), :erlang.term_to_binary(items)} | after_]
      end

      garbage = <<1::32, 20::32, 12346::little-32, 1::little-32>> <> :binary.copy(<<0xFF>>, 12)

      forged = [
        # Index postings: garbage Roaring bytes, a count of 2^32 - 1 chunks,
        # an empty bitmap, a term given twice, a term of an unknown index.
        replace.(4, fn [{t, _} | rest] -> [{t, garbage} | rest] end),
        replace.(4, fn [{t, b} | rest] -> [{t, <<0xFFFFFFFF::32, b::binary>>} | rest] end),
        replace.(4, fn [{t, _} | rest] ->
          [{t, <<1::32, 8::32, 12346::little-32, 0::little-32>>} | rest]
        end),
        replace.(4, fn [e | rest] -> [e, e | rest] end),
        replace.(4, fn [{{_, v}, b} | rest] -> [{{:nope, v}, b} | rest] end),
        replace.(4, fn [_ | rest] -> [:not_a_pair | rest] end),
        # Rows: a row whose key is not its id (as values, as a map), values
        # of the wrong count, a row id past 32 bits, neither values nor a
        # map, a non-list.
        replace.(2, fn [{id, r} | rest] -> [{id, put_elem(r, key_at, id + 1)} | rest] end),
        replace.(2, fn [{id, r} | rest] ->
          [{id, %{a: elem(r, 0), id: id + 1, tags: elem(r, 2)}} | rest]
        end),
        replace.(2, fn [{id, r} | rest] -> [{id, Tuple.append(r, 1)} | rest] end),
        replace.(2, fn [{id, r} | rest] -> [{id, Tuple.delete_at(r, 0)} | rest] end),
        replace.(2, fn [{_id, r} | rest] -> [{8_589_934_592, r} | rest] end),
        replace.(2, fn [{id, _} | rest] -> [{id, :x} | rest] end),
        replace.(2, fn [{id, _} | rest] -> [{id, {}} | rest] end),
        replace.(2, fn _ -> [{1}] end),
        # Keys pointing at no row, definition of the wrong shape.
        replace.(3, fn [{k, _id} | rest] -> [{k, 0xFFFFFFF0} | rest] end),
        replace.(1, fn [{k, s, n, _next, f}] -> [{k, s, n, 0, f}] end),
        replace.(1, fn [{k, s, n, next, _}] -> [{k, s, n, next, [next]}] end),
        replace.(1, fn [{k, s, n, next, _}] -> [{k, s, n, next, :bad}] end),
        # A compressed payload.
        Enum.map(chunks, fn
          {2, n, p} -> {2, n, :erlang.term_to_binary(:erlang.binary_to_term(p), compressed: 9)}
          other -> other
        end)
      ]

      paths =
        for {chunks, i} <- Enum.with_index(forged) do
          path = Path.join(dir, "forged#{i}")
          File.write!(path, frame(chunks))
          path
        end

      result =
        Isolated.run(
          quote do
            _ = [:tags, :junk]

            for path <- unquote(paths) do
              Larder.Table.load(path,
                key: :id,
                index: [:a, {:m, &Map.get(&1, :tags, [])}],
                store: [:a, :tags]
              )
            end
          end,
          120_000
        )

      assert {:ok, results} = result

      for {r, i} <- Enum.with_index(results) do
        assert {:error, %Larder.Error{reason: :corrupt_snapshot}} = r,
               "forgery #{i}: #{inspect(r)}"
      end
    end
  end

  describe "forged postings (isolated VM)" do
    # A real dump of 10 records (row ids 0..9, so the writer's next id is
    # 2^31), one index term's posting replaced and the file re-framed with
    # valid checksums. A loaded posting names only rows of the file: its
    # ids without a row are dropped (a search never returns them, count/2
    # does not count them), and what the load builds is bounded by the
    # rows, never by the ids a forged run names. These ran as one review
    # found them: 2^32 ids in 65,536 chunks of 15 bytes aborted the VM in
    # load/2 (memory allocation failed), 8,192 chunks took 20 s and 5 GB,
    # and 16 chunks loaded and searched 1,048,576 keys without rows. Each
    # VM runs with its address space capped (a regression aborts the peer,
    # not the machine).
    setup %{tmp_dir: dir} do
      files =
        for store <- [nil, [:a, :tags]], into: %{} do
          table = Table.new(opts(store))
          :ok = Table.insert_many(table, for(i <- 0..9, do: %{id: i, a: :x, tags: [:p]}))
          path = Path.join(dir, "ten#{inspect(store)}")
          :ok = Table.dump(table, path)
          Table.drop(table)
          {store, File.read!(path)}
        end

      %{files: files, dir: dir}
    end

    # `good` with the posting of {:a, :x} replaced by `posting`.
    defp with_posting(good, posting) do
      forge_index(good, fn items ->
        for {term, bytes} <- items,
            do: if(term == {:a, :x}, do: {term, posting}, else: {term, bytes})
      end)
    end

    # `good` with its (one) chunk of index entries changed by `fun`.
    defp forge_index(good, fun) do
      <<"LARDERTAB", 2, rest::binary>> = good

      rest
      |> parse()
      |> Enum.map(fn
        {4, _n, p} ->
          items = fun.(:erlang.binary_to_term(p))
          {4, length(items), :erlang.term_to_binary(items)}

        other ->
          other
      end)
      |> frame()
    end

    # The NIF's posting bytes: <<chunks::32, (bytes::32, roaring)*>>.
    defp posting(chunks),
      do:
        IO.iodata_to_binary([
          <<length(chunks)::32>> | for(c <- chunks, do: [<<byte_size(c)::32>>, c])
        ])

    # Roaring's portable serialisation of the 64Ki ids of range `high`: one
    # run container (cookie 12347 and one container, its run flag, key and
    # cardinality - 1, one run of 65,536 from 0). 15 bytes.
    defp full_run(high),
      do:
        <<12347::little-16, 0::little-16, 1, high::little-16, 65535::little-16, 1::little-16,
          0::little-16, 65535::little-16>>

    # One array container (cookie 12346, one container, its key and
    # cardinality - 1, its offset) of `ids`, all in one 64Ki range.
    defp array([first | _] = ids) do
      IO.iodata_to_binary([
        <<12346::little-32, 1::little-32, div(first, 65536)::little-16>>,
        <<length(ids) - 1::little-16, 16::little-32>>
        | for(id <- ids, do: <<rem(id, 65536)::little-16>>)
      ])
    end

    # Loads each of `paths` with `store` in a capped peer VM, and searches
    # `conditions` in what loads: its keys, sorted, and its count.
    defp load_isolated(paths, store, conditions \\ [a: :x]) do
      Isolated.run(
        quote do
          _ = [:tags, :junk]
          # The load's warning of dropped ids would print in the test's output.
          Logger.configure(level: :error)

          for path <- unquote(paths) do
            opts = [key: :id, index: [:a, {:m, &Map.get(&1, :tags, [])}], store: unquote(store)]

            case Larder.Table.load(path, opts) do
              {:ok, table} ->
                conditions = unquote(conditions)
                keys = Enum.sort(Larder.Table.search_keys(table, conditions))
                {:loaded, keys, Larder.Table.count(table, conditions)}

              {:error, %Larder.Error{reason: reason}} ->
                reason
            end
          end
        end,
        120_000,
        memory_mb: 4_096
      )
    end

    defp write_forged(dir, good, postings) do
      for {posting, i} <- Enum.with_index(postings) do
        path = Path.join(dir, "forged#{System.unique_integer([:positive])}_#{i}")
        File.write!(path, with_posting(good, posting))
        path
      end
    end

    for chunks <- [16, 8_192, 65_536] do
      test "#{chunks} full-run chunks (#{chunks * 65_536} ids in 10 rows) load as the 10 rows",
           %{files: files, dir: dir} do
        assert byte_size(full_run(0)) == 15
        forged = posting(for high <- 0..(unquote(chunks) - 1), do: full_run(high))
        # The same runs without the rows' range: every id is dropped, and
        # the term with them.
        away = posting(for high <- 1..(unquote(chunks) - 1), do: full_run(high))
        postings = [forged, away]
        expected = [{:loaded, Enum.to_list(0..9), 10}, {:loaded, [], 0}]

        results =
          for {store, good} <- files do
            {store, load_isolated(write_forged(dir, good, postings), store)}
          end

        assert results == for({store, _} <- files, do: {store, {:ok, expected}})
      end
    end

    test "ids just past the rows are dropped; the rows' own ids load", %{files: files, dir: dir} do
      next = 0x80000000
      rows = Enum.to_list(0..9)

      forged = [
        # The id after the last row, alone and after all the rows.
        {posting([array([10])]), []},
        {posting([array(Enum.to_list(0..10))]), rows},
        # As many ids as rows, one of them past the rows: a count of ids
        # alone does not catch it.
        {posting([array(Enum.to_list(1..10))]), Enum.to_list(1..9)},
        # The writer's next id, the largest id, a range with no row.
        {posting([array(Enum.to_list(0..9)), array([next])]), rows},
        {posting([array(Enum.to_list(0..9)), array([0xFFFFFFFF])]), rows},
        {posting([array(Enum.to_list(0..9)), array([65_536])]), rows},
        {posting([array([3, 5, 70]), array([65_536, 65_537])]), [3, 5]},
        # A run over the rows' range: 65,536 ids, 10 of them rows.
        {posting([full_run(0)]), rows},
        # The real posting.
        {posting([array(rows)]), rows}
      ]

      expected = {:ok, for({_, keys} <- forged, do: {:loaded, keys, length(keys)})}
      postings = for {posting, _} <- forged, do: posting

      results =
        for {store, good} <- files do
          {store, load_isolated(write_forged(dir, good, postings), store)}
        end

      assert results == for({store, _} <- files, do: {store, expected})
    end

    # A run of a few bytes cut down to rows that are not consecutive
    # becomes up to 8 KB of array or bitmap: 65,535 rows (one id missing
    # from their range) and 300 forged terms of 23 bytes, each a full run,
    # would build 19,660,500 ids from 7 KB of postings. Past 256 a row
    # (plus 8 a byte of postings, at least 2^24) the load refuses them;
    # 100 such terms load, cut down to the rows.
    test "ids built from runs cut down to the rows are bounded by the rows and bytes", %{
      dir: dir
    } do
      table = Table.new(opts(nil))
      :ok = Table.insert_many(table, for(i <- 0..65_534, do: %{id: i, a: :x, tags: [:p]}))
      good = Path.join(dir, "holed")
      :ok = Table.dump(table, good)
      Table.drop(table)

      paths =
        for terms <- [300, 100] do
          forged =
            forge_index(File.read!(good), fn items ->
              items ++ for(i <- 1..terms, do: {{:m, i}, posting([full_run(0)])})
            end)

          path = Path.join(dir, "holed#{terms}")
          File.write!(path, forged)
          path
        end

      rows = Enum.to_list(0..65_534)

      assert load_isolated(paths, nil, m: 100) ==
               {:ok, [:corrupt_snapshot, {:loaded, rows, 65_535}]}
    end

    # With :store the index keeps an id-to-terms map, one entry per (id,
    # term) pair: 65,536 rows and 300 forged terms of 23 bytes, each naming
    # every row, would make 19,660,800 of them from 7 KB of postings. Past
    # 256 a row (plus 8 a byte of postings, at least 2^24) a load refuses
    # them; without :store no pair is built and the same file loads.
    test "with :store, more (id, term) pairs than the rows and bytes allow are refused", %{
      dir: dir
    } do
      records = for i <- 0..65_535, do: %{id: i, a: :x, tags: [:p]}

      for store <- [nil, [:a, :tags]] do
        table = Table.new(opts(store))
        :ok = Table.insert_many(table, records)
        path = Path.join(dir, "wide#{inspect(store)}")
        :ok = Table.dump(table, path)
        Table.drop(table)

        forged =
          forge_index(File.read!(path), fn items ->
            items ++ for(i <- 1..300, do: {{:m, i}, posting([full_run(0)])})
          end)

        File.write!(path, forged)

        expected =
          if store,
            do: [:corrupt_snapshot],
            else: [{:loaded, Enum.to_list(0..65_535), 65_536}]

        assert load_isolated([path], store, m: 300) == {:ok, expected},
               "store: #{inspect(store)}"
      end
    end
  end

  describe "an impure index function" do
    # Without :store the writer recomputes a deleted record's old terms
    # with the index function: one that now computes other terms leaves the
    # record's id under the term it computed before. search/2 skips that
    # id; a dump holds it, and a load of the dump (a replica restarting
    # from its snapshot) must work and leave it out.
    test "a deleted record's id left under a stale term: the dump loads without it", %{
      tmp_dir: dir
    } do
      generation = :atomics.new(1, [])
      opts = [key: :id, index: [{:gen, fn _ -> [:atomics.get(generation, 1)] end}, :a]]
      table = Table.new(opts)
      :ok = Table.insert_many(table, for(i <- 1..5, do: %{id: i, a: :x}))
      :atomics.put(generation, 1, 1)
      :ok = Table.delete(table, 2)
      :ok = Table.delete(table, 4)

      # The stale ids are in the index: search/2 skips them, search_keys/2
      # (integer keys) and count/2 answer from the index alone.
      assert Enum.map(Table.search(table, gen: 0), & &1.id) == [1, 3, 5]
      assert Table.search_keys(table, gen: 0) == [1, 2, 3, 4, 5]
      assert Table.count(table, gen: 0) == 5

      path = Path.join(dir, "impure")
      :ok = Table.dump(table, path)
      Table.drop(table)

      log =
        ExUnit.CaptureLog.capture_log(fn ->
          assert {:ok, copy} = Table.load(path, opts)
          send(self(), {:copy, copy})
        end)

      assert_received {:copy, copy}
      assert log =~ "the index named 2 row ids that have no record in the file"
      assert Table.search_keys(copy, gen: 0) == [1, 3, 5]
      assert Table.count(copy, gen: 0) == 3
      assert Enum.map(Table.search(copy, gen: 0), & &1.id) == [1, 3, 5]
      assert Table.search_keys(copy, a: :x) == [1, 3, 5]

      # The loaded table goes on: the deleted keys come back under the
      # current terms only.
      :ok = Table.insert(copy, %{id: 2, a: :y})
      assert Table.search_keys(copy, gen: 0) == [1, 3, 5]
      assert Table.search_keys(copy, gen: 1) == [2]

      # A dump without stale ids loads without a warning.
      :ok = Table.delete(copy, 2)
      :ok = Table.dump(copy, path)
      Table.drop(copy)

      assert ExUnit.CaptureLog.capture_log([level: :warning], fn ->
               assert {:ok, again} = Table.load(path, opts)
               assert Table.count(again, gen: 0) == 3
             end) == ""
    end
  end

  describe "a load's log line" do
    test "one line at info: the table, the path, its records, the file's bytes and the time",
         %{tmp_dir: dir} = ctx do
      table = Table.new(opts(nil))
      :ok = Table.insert_many(table, records(7, 1_000))
      path = Path.join(dir, "logged")
      :ok = Table.dump(table, path)
      bytes = File.stat!(path).size

      log =
        ExUnit.CaptureLog.capture_log(fn ->
          {:ok, _} = Table.load(path, Keyword.put(opts(nil), :name, ctx.test))
        end)

      assert [line] = String.split(log, "\n", trim: true)

      assert line =~
               ~r/\[info\] +Larder.Table #{Regex.escape(inspect(ctx.test))} loaded from #{Regex.escape(inspect(path))}: 1000 records, #{bytes} bytes, in \d+\.\d ms$/

      # Without a name, the handle.
      log = ExUnit.CaptureLog.capture_log(fn -> {:ok, _} = Table.load(path, opts(nil)) end)
      assert log =~ ~r/#Larder.Table<key: :id, writer: #PID<[\d.]+>> loaded from/

      # A failed load logs nothing at info.
      File.write!(path, "junk")
      log = ExUnit.CaptureLog.capture_log(fn -> {:error, _} = Table.load(path, opts(nil)) end)
      assert log == ""
    end

    test "Logger.put_application_level(:larder, :warning) turns it off", %{tmp_dir: dir} do
      table = Table.new(opts(nil))
      :ok = Table.insert(table, %{id: 1, a: :x})
      path = Path.join(dir, "quiet")
      :ok = Table.dump(table, path)

      # This module is not async: no other test logs meanwhile.
      Logger.put_application_level(:larder, :warning)
      on_exit(fn -> Logger.delete_application_level(:larder) end)

      log = ExUnit.CaptureLog.capture_log(fn -> {:ok, _} = Table.load(path, opts(nil)) end)
      assert log == ""

      Logger.delete_application_level(:larder)
      log = ExUnit.CaptureLog.capture_log(fn -> {:ok, _} = Table.load(path, opts(nil)) end)
      assert log =~ "loaded from"
    end
  end

  describe "bad arguments" do
    test "raise ArgumentError naming the argument", %{tmp_dir: dir} do
      table = Table.new(key: :id)
      assert_raise ArgumentError, ~r/path/, fn -> Table.dump(table, :nope) end
      assert_raise ArgumentError, ~r/path/, fn -> Table.dump(table, "a\0b") end
      assert_raise ArgumentError, ~r/path/, fn -> Table.load(123, key: :id) end

      assert_raise ArgumentError,
                   ~r/expected a Larder.Table \(a handle or the name of one\), got: #Reference/,
                   fn ->
                     Table.dump(:erlang.make_ref(), "x")
                   end

      assert_raise ArgumentError, ~r/:key/, fn -> Table.load(Path.join(dir, "x"), []) end

      assert_raise ArgumentError, ~r/bogus/, fn ->
        Table.load(Path.join(dir, "x"), key: :id, bogus: 1)
      end

      Table.drop(table)

      assert_raise ArgumentError, ~r/unknown Larder.Table/, fn ->
        Table.dump(table, Path.join(dir, "d"))
      end
    end

    test "a name in use raises", %{tmp_dir: dir} do
      path = Path.join(dir, "named")
      :ok = Table.dump(Table.new(key: :id), path)
      name = :"snap_taken_#{System.unique_integer([:positive])}"
      _ = Table.new(key: :id, name: name)

      assert_raise ArgumentError, ~r/a Larder.Table named #{inspect(name)} already exists/, fn ->
        Table.load(path, key: :id, name: name)
      end
    end

    test "an unwritable path is a file error", %{tmp_dir: dir} do
      table = Table.new(key: :id)

      assert {:error, %Larder.Error{reason: :file_error}} =
               Table.dump(table, Path.join([dir, "no", "such", "dir"]))

      assert Table.size(table) == 0
    end
  end

  describe "concurrency" do
    # The writer takes the cut and a process of its own writes the file:
    # writes of every kind go on while that process is held in the middle,
    # and the file is the table as it was when the dump began.
    for store <- [nil, [:a, :tags]] do
      test "writes go on while a dump is held; the file is the table at the cut " <>
             "(store: #{inspect(store)})",
           %{tmp_dir: dir} do
        store = unquote(store)
        table = build(store, 11, 20_000)
        by_key = &Enum.sort_by(&1, fn r -> :erlang.term_to_binary(r.id) end)
        expected = by_key.(Table.stream(table))
        answers = for q <- searches(11), do: {Table.search(table, q), Table.count(table, q)}
        path = Path.join(dir, "held")

        {dumper, dump} =
          Larder.Test.Dumps.suspend_dump(fn -> [table.writer] end, fn ->
            Table.dump(table, path)
          end)

        writes =
          Task.async(fn ->
            keys = for %{id: key} <- Enum.take_random(expected, 600), do: key
            {replaced, rest} = Enum.split(keys, 200)
            {deleted, merged} = Enum.split(rest, 200)
            Table.insert_many(table, for(key <- replaced, do: %{id: key, a: :new, tags: [:p]}))
            for key <- deleted, do: Table.delete(table, key)
            # new keys take the ids the deletes freed
            Table.insert_many(table, for(i <- 1..300, do: %{id: "new#{i}", a: :x, tags: []}))
            for key <- merged, do: Table.merge(table, key, %{a: :merged})
            Table.update(table, hd(merged), %{id: hd(merged)}, &Map.put(&1, :a, :updated))
            # a build: a chunk of new integer keys above every key (a claim)
            Table.insert_many(table, for(i <- 1..1_000, do: %{id: 1_000_000 + i, a: :y}))
            {deleted, merged}
          end)

        try do
          assert {:ok, {deleted, merged}} = Task.yield(writes, 30_000),
                 "the writes waited for the dump"

          assert Task.yield(dump, 0) == nil
          assert Table.get(table, "new300").a == :x
          assert Table.get(table, hd(deleted)) == nil
          assert Table.get(table, List.last(merged)).a == :merged
          assert Table.size(table) == length(expected) + 1_000 + 300 - 200
        after
          Larder.Test.Dumps.resume(dumper)
        end

        assert Task.await(dump, 60_000) == :ok
        copy = Table.load!(path, opts(store))
        assert by_key.(Table.stream(copy)) == expected

        assert for(q <- searches(11), do: {Table.search(copy, q), Table.count(copy, q)}) ==
                 answers

        Table.drop(copy)
        Table.drop(table)
      end
    end

    test "a dump deletes the temporary files of killed dumps", %{tmp_dir: dir} do
      path = Path.join(dir, "swept")
      [{:token, token}] = :ets.lookup(Larder.SnapshotFile, :token)
      stale = "#{path}.#{System.pid()}.#{token}-#{System.unique_integer([:positive])}.tmp"
      File.write!(stale, "half a dump")
      :ok = Table.dump(Table.new(key: :id), path)
      refute File.exists?(stale)
      assert File.ls!(dir) == ["swept"]
    end
  end
end
