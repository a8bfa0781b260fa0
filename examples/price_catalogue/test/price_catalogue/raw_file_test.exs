defmodule PriceCatalogue.RawFileTest do
  use ExUnit.Case, async: true

  alias PriceCatalogue.RawFile

  @moduletag :tmp_dir

  test "reads a file whole, as File.read/1 does", %{tmp_dir: dir} do
    path = Path.join(dir, "data")
    data = :crypto.strong_rand_bytes(300_000)
    File.write!(path, data)
    assert RawFile.read(path) == {:ok, data}

    empty = Path.join(dir, "empty")
    File.write!(empty, "")
    assert RawFile.read(empty) == {:ok, ""}
  end

  test "a file without a size to seek to is read to its end" do
    # A /proc file cannot seek to its end, and has content.
    assert {:ok, text} = RawFile.read("/proc/version")
    assert {:ok, ^text} = File.read("/proc/version")
  end

  test "errors are File.read/1's POSIX reasons", %{tmp_dir: dir} do
    assert RawFile.read(Path.join(dir, "missing")) == {:error, :enoent}
    assert RawFile.read(dir) == {:error, :eisdir}
  end

  test "reads in the caller, not through the file server", %{tmp_dir: dir} do
    path = Path.join(dir, "data")
    File.write!(path, :crypto.strong_rand_bytes(100_000))
    server = Process.whereis(:file_server_2)
    :erlang.trace(server, true, [:receive])

    try do
      assert {:ok, _} = RawFile.read(path)
      # (Other tests, run meanwhile, may call the server: only this
      # process's calls count.)
      me = self()
      refute_received {:trace, ^server, :receive, {:"$gen_call", {^me, _}, _}}
    after
      :erlang.trace(server, false, [:receive])
    end
  end
end
