Code.require_file("session_registry.ex", __DIR__)

defmodule SessionRegistryTest do
  use ExUnit.Case, async: true

  for kind <- [:map, :proplist] do
    test "#{kind} info: sessions by user, merged info, close" do
      reg = SessionRegistry.new(info: unquote(kind))
      :ok = SessionRegistry.create_session(reg, "s1", "alice", "phone", 1, a: 1, b: 2)
      :ok = SessionRegistry.create_session(reg, "s2", "alice", "laptop", 2, a: 9)
      :ok = SessionRegistry.create_session(reg, "s3", "bob", "phone", 1, [])
      :ok = SessionRegistry.create_session(reg, "s1", "alice", "phone", 1, b: 3, c: 4)

      assert reg |> SessionRegistry.get_sessions("alice") |> Enum.map(& &1.sid) |> Enum.sort() ==
               ["s1", "s2"]

      assert {SessionRegistry.get_info(reg, "s1", :a), SessionRegistry.get_info(reg, "s1", :b),
              SessionRegistry.get_info(reg, "s1", :c)} == {1, 3, 4}

      assert SessionRegistry.get_info(reg, "s2", :b) == nil
      assert SessionRegistry.get_info(reg, "nope", :a) == nil

      :ok = SessionRegistry.close_session(reg, "s2")
      assert Enum.map(SessionRegistry.get_sessions(reg, "alice"), & &1.sid) == ["s1"]
      assert SessionRegistry.memory(reg) > 0
    end
  end

  for kind <- [:map, :proplist] do
    test "#{kind} info: concurrent create_session on one sid loses no info key" do
      reg = SessionRegistry.new(info: unquote(kind))
      :ok = SessionRegistry.create_session(reg, "s1", "alice", "phone", 1, base: 0)

      # Each writer merges keys of its own; a read-then-write without a lock
      # loses the keys of whichever writer read the session before another wrote.
      writers = 16
      rounds = 50

      1..writers
      |> Enum.map(fn w ->
        Task.async(fn ->
          for r <- 1..rounds do
            :ok = SessionRegistry.create_session(reg, "s1", "alice", "phone", 1, [{{w, r}, r}])
          end
        end)
      end)
      |> Enum.each(&Task.await(&1, 60_000))

      for w <- 1..writers, r <- 1..rounds do
        assert SessionRegistry.get_info(reg, "s1", {w, r}) == r
      end

      assert SessionRegistry.get_info(reg, "s1", :base) == 0
      assert [%{sid: "s1"}] = SessionRegistry.get_sessions(reg, "alice")
    end
  end

  test "map and proplist merges agree" do
    old = [a: 1, b: 2, c: 3]
    new = [b: 20, d: 4]

    assert SessionRegistry.merge_info(
             :proplist,
             SessionRegistry.merge_info(:proplist, [], old),
             new
           )
           |> Map.new() ==
             SessionRegistry.merge_info(:map, Map.new(old), new)
  end

  test "options are validated" do
    assert_raise ArgumentError, ~r/unknown keys \[:x\].*allowed keys are: \[:info\]/, fn ->
      SessionRegistry.new(x: 1)
    end

    assert_raise ArgumentError, ~r/option :info to be :map or :proplist/, fn ->
      SessionRegistry.new(info: :tuple)
    end

    for bad <- [:x, [1], [{:info, :map} | :tail]] do
      assert_raise ArgumentError, ~r/keyword list/, fn -> SessionRegistry.new(bad) end
    end
  end
end
