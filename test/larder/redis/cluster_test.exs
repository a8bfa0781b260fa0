defmodule Larder.Cache.Redis.ClusterTest do
  # Slot routing without a server: CRC16 against the Redis Cluster spec's
  # vectors, hash tags, slot maps and redirects from well-formed and hostile
  # replies. cluster_real_test.exs checks the same code against a real
  # cluster.
  use ExUnit.Case, async: true

  alias Larder.Redis.Cluster
  alias Larder.Test.PropEr

  import Bitwise, only: [&&&: 2]

  describe "crc16/1 and slot/1" do
    test "the spec's CRC16 vector and its hash-tag examples" do
      assert Cluster.crc16("123456789") == 0x31C3
      assert Cluster.crc16("") == 0
      assert Cluster.slot("123456789") == (0x31C3 &&& 16_383)

      assert Cluster.slot("{user1000}.following") == Cluster.slot("{user1000}.followers")
      assert Cluster.slot("{user1000}.following") == Cluster.slot("user1000")
      # the first { and the next }: "{bar", then "bar"
      assert Cluster.slot("foo{{bar}}zap") == Cluster.slot("{bar")
      assert Cluster.slot("foo{bar}{zap}") == Cluster.slot("bar")
      # empty tag, no closing brace: the whole key
      assert Cluster.slot("foo{}{bar}") == (Cluster.crc16("foo{}{bar}") &&& 16_383)
      assert Cluster.slot("foo{bar") == (Cluster.crc16("foo{bar") &&& 16_383)
      assert Cluster.slot("}{x}") == Cluster.slot("x")
    end

    test "tagged/2 puts a cache's names in one slot, whatever its prefix" do
      for prefix <- ["ns:1", "", "a}b", "{x}", "}", "{", "n s", :binary.copy("p", 1000)] do
        gen = Cluster.tagged(prefix, "gen")
        channel = Cluster.tagged(prefix, "invalidate")
        assert Cluster.slot(gen) == Cluster.slot(channel), inspect(prefix)
        assert Cluster.slot(gen) == Cluster.slot(Cluster.tagged(prefix, "")), inspect(prefix)
      end

      assert Cluster.tagged("ns:1", "gen") == "{ns:1}:gen"
      refute Cluster.slot(Cluster.tagged("a}b", "g")) == Cluster.slot(Cluster.tagged("a}c", "g"))
    end
  end

  describe "slot_map/2" do
    test "a CLUSTER SLOTS reply: masters by slot, replicas ignored, empty host is the seed" do
      reply = [
        [0, 5460, ["127.0.0.1", 7000, "id0"], ["127.0.0.1", 7003, "id3"]],
        ["5461", "10922", ["", "7001", "id1", []]],
        [10_923, 16_383, ["h.example", 7002]]
      ]

      assert {:ok, map} = Cluster.slot_map(reply, "10.0.0.9")
      assert map.bad == 0
      assert Cluster.master(map, 0) == {"127.0.0.1", 7000}
      assert Cluster.master(map, 5460) == {"127.0.0.1", 7000}
      assert Cluster.master(map, 5461) == {"10.0.0.9", 7001}
      assert Cluster.master(map, 16_383) == {"h.example", 7002}
      assert length(Cluster.masters(map)) == 3
    end

    test "malformed entries are skipped and counted; uncovered slots have no master" do
      reply = [
        [0, 99, ["127.0.0.1", 7000]],
        [100, 16_384, ["127.0.0.1", 7000]],
        [200, 100, ["127.0.0.1", 7000]],
        [300, 400, ["127.0.0.1", 0]],
        [300, 400, ["127.0.0.1", 65_536]],
        [300, 400, ["127.0.0.1", "70x0"]],
        [300, 400, ["bad host", 7000]],
        [300, 400, [:atom, 7000]],
        [300, 400, [:binary.copy("h", 256), 7000]],
        [-1, 400, ["127.0.0.1", 7000]],
        [300, 400],
        :garbage
      ]

      assert {:ok, map} = Cluster.slot_map(reply, "127.0.0.1")
      assert map.bad == 11
      assert Cluster.master(map, 99) == {"127.0.0.1", 7000}
      assert Cluster.master(map, 100) == nil
      assert Cluster.master(map, 350) == nil
    end

    test "a range that overlaps an earlier one is counted, not used; 16,384 of them stay cheap" do
      reply = [[0, 100, ["a", 1]], [50, 200, ["b", 2]], [101, 16_383, ["c", 3]]]
      assert {:ok, map} = Cluster.slot_map(reply, "h")
      assert map.bad == 1
      assert Cluster.master(map, 60) == {"a", 1}
      assert Cluster.master(map, 150) == {"c", 3}

      # 16,383 overlapping entries read, and the 3,616 past 16,384 skipped unread as one
      hostile = List.duplicate([0, 16_383, ["a", 1]], 20_000)
      assert {:ok, %{bad: 16_384} = map} = Cluster.slot_map(hostile, "h")
      assert Cluster.master(map, 16_383) == {"a", 1}
    end

    test "a reply naming more than max_masters/0 masters is refused" do
      reply = fn n -> for i <- 0..(n - 1), do: [i, i, ["h", i + 1]] end
      max = Cluster.max_masters()
      assert {:ok, map} = Cluster.slot_map(reply.(max), "h")
      assert length(Cluster.masters(map)) == max

      assert {:error, {:too_many_masters, n}} = Cluster.slot_map(reply.(max + 1), "h")
      assert n == max + 1

      # the same master in many ranges is one master
      assert {:ok, _} = Cluster.slot_map(for(i <- 0..16_383, do: [i, i, ["h", 1]]), "h")
    end

    test "a reply that is not a list is refused" do
      assert {:error, :not_a_list} = Cluster.slot_map("ERR", "h")
      assert {:ok, %{bad: 0}} = Cluster.slot_map([], "h")
      assert {:ok, %{bad: 0}} = Cluster.slot_map([[0, 1, ["h", 1]] | :improper], "h")
    end
  end

  describe "redirect/2" do
    test "MOVED, ASK, TRYAGAIN, CLUSTERDOWN and the rest" do
      assert Cluster.redirect("MOVED 3999 127.0.0.1:6381", "s") ==
               {:moved, 3999, {"127.0.0.1", 6381}}

      assert Cluster.redirect("ASK 0 ::1:7000", "s") == {:ask, 0, {"::1", 7000}}
      assert Cluster.redirect("MOVED 16383 :7000", "seed") == {:moved, 16_383, {"seed", 7000}}
      assert Cluster.redirect("TRYAGAIN Multiple keys request during rehashing", "s") == :tryagain
      assert Cluster.redirect("CLUSTERDOWN The cluster is down", "s") == :clusterdown

      for bad <- [
            "MOVED 16384 h:1",
            "MOVED -1 h:1",
            "MOVED 1 h:0",
            "MOVED 1 h:65536",
            "MOVED 1 h",
            "MOVED 1 ?:7000",
            "MOVED 1  h:1",
            "MOVED x h:1",
            "ASK 1 h:1 extra",
            "MOVED 1 " <> :binary.copy("h", 300) <> ":1",
            "ERR wrong",
            "moved 1 h:1",
            "",
            :moved,
            {:error, "MOVED 1 h:1"}
          ] do
        assert Cluster.redirect(bad, "s") == :other, inspect(bad)
      end
    end
  end

  describe "hostile replies (PropEr)" do
    test "slot_map/2 and redirect/2 never raise" do
      entry =
        :proper_types.oneof([
          :proper_types.any(),
          [int_gen(), int_gen(), [host_gen(), int_gen() | :proper_types.any()]],
          [int_gen(), int_gen() | :proper_types.any()]
        ])

      reply = :proper_types.oneof([:proper_types.any(), :proper_types.list(entry)])

      error =
        :proper_types.oneof([
          :proper_types.any(),
          :proper_types.binary(),
          :proper_types.bind(
            {:proper_types.oneof(["MOVED ", "ASK ", "TRYAGAIN", "CLUSTERDOWN", ""]), int_gen(),
             host_gen(), int_gen()},
            fn {kind, slot, host, port} ->
              :proper_types.exactly(
                IO.iodata_to_binary([
                  kind,
                  to_string_safe(slot),
                  " ",
                  to_string_safe(host),
                  ":",
                  to_string_safe(port)
                ])
              )
            end,
            false
          )
        ])

      PropEr.check(
        :proper.forall({reply, error}, fn {reply, error} ->
          map_ok =
            case Cluster.slot_map(reply, "seed") do
              {:ok, %{slots: slots, bad: bad} = map} ->
                tuple_size(slots) == 16_384 and is_integer(bad) and bad >= 0 and
                  Enum.all?(0..16_383, fn slot ->
                    case Cluster.master(map, slot) do
                      nil -> true
                      {host, port} -> is_binary(host) and port in 1..65_535
                    end
                  end)

              {:error, :not_a_list} ->
                not is_list(reply)
            end

          redirect_ok =
            case Cluster.redirect(error, "seed") do
              {kind, slot, {host, port}} when kind in [:moved, :ask] ->
                slot in 0..16_383 and is_binary(host) and byte_size(host) in 1..255 and
                  port in 1..65_535

              other ->
                other in [:tryagain, :clusterdown, :other]
            end

          map_ok and redirect_ok
        end),
        numtests: 2_000
      )
    end
  end

  defp int_gen do
    :proper_types.oneof([
      :proper_types.integer(),
      :proper_types.integer(-2, 70_000),
      :proper_types.exactly(16_384),
      :proper_types.exactly(65_536),
      :proper_types.bind(
        :proper_types.integer(-5, 70_000),
        &:proper_types.exactly(Integer.to_string(&1)),
        false
      ),
      :proper_types.binary()
    ])
  end

  defp host_gen do
    :proper_types.oneof([
      :proper_types.exactly("127.0.0.1"),
      :proper_types.exactly(""),
      :proper_types.binary(),
      :proper_types.any()
    ])
  end

  defp to_string_safe(term) when is_binary(term), do: term
  defp to_string_safe(term) when is_integer(term), do: Integer.to_string(term)
  defp to_string_safe(term), do: inspect(term)
end
