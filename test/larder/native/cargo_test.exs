defmodule Larder.Native.CargoTest do
  # Larder.Native.Cargo, the compile-time build of a package's NIF crate:
  # cargo builds the crate in release mode and the library is installed in
  # the project's priv/native (not again when unchanged); a crate cargo
  # cannot build is a Mix error naming it.
  use ExUnit.Case, async: true

  import ExUnit.CaptureIO

  alias Larder.Native.Cargo

  @moduletag :tmp_dir
  # A first build of a crate without dependencies: a few seconds.
  @moduletag timeout: 300_000

  defp crate!(root, name, lib_rs) do
    dir = Path.join([root, "native", name])
    File.mkdir_p!(Path.join(dir, "src"))

    File.write!(Path.join(dir, "Cargo.toml"), """
    [package]
    name = "#{name}"
    version = "0.1.0"
    edition = "2021"

    [lib]
    crate-type = ["cdylib"]
    """)

    File.write!(Path.join([dir, "src", "lib.rs"]), lib_rs)
    "native/#{name}"
  end

  test "builds the crate and installs lib<name>.so in priv/native, once", %{tmp_dir: root} do
    crate =
      crate!(root, "cargo_test_ok", "#[no_mangle]\npub extern \"C\" fn answer() -> i32 { 42 }\n")

    capture_io(fn -> assert Cargo.build!(root, crate, "cargo_test_ok") == :ok end)
    installed = Path.join([root, "priv", "native", "libcargo_test_ok.so"])
    assert File.regular?(installed)
    {:ok, %{inode: inode, mtime: mtime}} = File.stat(installed, time: :posix)

    # Unchanged: cargo has nothing to do and the file is not copied again.
    capture_io(fn -> assert Cargo.build!(root, crate, "cargo_test_ok") == :ok end)
    assert {:ok, %{inode: ^inode, mtime: ^mtime}} = File.stat(installed, time: :posix)
    refute File.exists?(installed <> ".tmp")
  end

  test "a crate cargo cannot build is a Mix error naming it, with cargo's output", %{
    tmp_dir: root
  } do
    crate = crate!(root, "cargo_test_bad", "this is not rust\n")

    # cargo's output goes to stderr, the "Building" line to stdout.
    out =
      capture_io(:stderr, fn ->
        capture_io(fn ->
          error = assert_raise Mix.Error, fn -> Cargo.build!(root, crate, "cargo_test_bad") end
          assert error.message =~ "cargo could not build the NIF crate #{Path.join(root, crate)}"
          assert error.message =~ "exit status"
        end)
      end)

    assert out =~ "error"
    refute File.exists?(Path.join([root, "priv", "native", "libcargo_test_bad.so"]))
  end

  test "a crate that is not there is a Mix error too", %{tmp_dir: root} do
    capture_io(:stderr, fn ->
      capture_io(fn ->
        assert_raise Mix.Error, ~r/cargo could not build the NIF crate/, fn ->
          Cargo.build!(root, "native/none", "none")
        end
      end)
    end)
  end
end
