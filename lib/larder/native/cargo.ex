# Builds a package's NIF crate with cargo when the module that loads it is
# compiled, as Rustler's `use Rustler` does: `use Larder.Native.Cargo, crate:
# "native/larder_native", lib: "larder_native"` in Larder.Native (and in the
# adapters' NIF modules, such as larder_kafka's Larder.Kafka.Native). So each
# Mix project builds its own crate and nothing else: a dependent of the core
# alone never builds an adapter's crate (librdkafka, for Kafka).
defmodule Larder.Native.Cargo do
  @moduledoc false

  # rust-version of the crates (roaring 0.12 needs it).
  @rust_min {1, 90}

  @doc """
  At compile time: builds the crate at `:crate` (a path relative to the
  project's root, the current directory when Mix compiles a project or a
  dependency) in release mode, installs `lib<:lib>.so` into the project's
  `priv/native/` (linked into `_build` by Mix), and marks the crate's
  sources as external resources, so that Mix compiles the module again (and
  cargo runs) when one of them changes.
  """
  defmacro __using__(opts) do
    crate = Keyword.fetch!(opts, :crate)
    lib = Keyword.fetch!(opts, :lib)
    root = File.cwd!()

    build!(root, crate, lib)

    quote bind_quoted: [sources: sources(root, crate)] do
      for source <- sources, do: @external_resource(source)
    end
  end

  @doc "Runs cargo for the crate and installs its library (see `__using__/1`)."
  @spec build!(Path.t(), Path.t(), String.t()) :: :ok
  def build!(root, crate, lib) do
    cargo = cargo!()
    dir = Path.join(root, crate)
    target = Path.join(dir, "target")
    built = Path.join([target, "release", "lib#{lib}.#{extension()}"])

    unless File.exists?(built) do
      IO.puts(
        "Building the NIF crate #{crate} with cargo (release); a first build takes a few minutes"
      )
    end

    args = [
      "build",
      "--release",
      "--quiet",
      "--manifest-path",
      Path.join(dir, "Cargo.toml"),
      "--target-dir",
      target
    ]

    path_env = Path.dirname(cargo) <> ":" <> (System.get_env("PATH") || "")

    case System.cmd(cargo, args, env: [{"PATH", path_env}], stderr_to_stdout: true) do
      {_out, 0} ->
        install(built, Path.join([root, "priv", "native", "lib#{lib}.so"]))

      {out, status} ->
        IO.puts(:stderr, out)
        fail!("cargo could not build the NIF crate #{dir} (exit status #{status})" <> hint(out))
    end
  end

  # Every file cargo reads to build the crate, so that a change to one
  # compiles the NIF module again.
  defp sources(root, crate) do
    dir = Path.join(root, crate)

    [Path.join(dir, "Cargo.toml"), Path.join(dir, "Cargo.lock")] ++
      Path.wildcard(Path.join(dir, "src/**/*.rs"))
  end

  defp extension do
    if match?({:unix, :darwin}, :os.type()), do: "dylib", else: "so"
  end

  # Copied through a temporary file and a rename, so that a VM that has the
  # old library mapped keeps a valid file; not at all when it is unchanged.
  defp install(built, dest) do
    unless File.exists?(dest) and File.read!(dest) == File.read!(built) do
      File.mkdir_p!(Path.dirname(dest))
      tmp = dest <> ".tmp"
      File.cp!(built, tmp)
      File.rename!(tmp, dest)
    end

    # The module that loads the library is loaded (its @on_load run) as
    # soon as it is compiled, before Mix would link priv/ into _build.
    if Code.ensure_loaded?(Mix.Project) and Mix.Project.get(), do: Mix.Project.build_structure()
    :ok
  end

  # cargo on PATH, else rustup's default place; and a rustc new enough.
  defp cargo! do
    home_cargo = Path.expand("~/.cargo/bin/cargo")

    cargo =
      System.find_executable("cargo") ||
        (File.exists?(home_cargo) && home_cargo) ||
        fail!("""
        Larder builds its native code (a Rust NIF) when it is compiled, and needs
        Rust's cargo for that, which is neither on PATH nor in ~/.cargo/bin.
        Install Rust #{version_text(@rust_min)} or newer with rustup (https://rustup.rs):

            curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh

        (a C compiler is needed too: on Debian or Ubuntu, apt-get install build-essential),
        then open a new shell, or put ~/.cargo/bin on PATH, and run mix compile again.\
        """)

    check_rustc!(cargo)
    cargo
  end

  defp check_rustc!(cargo) do
    rustc = Path.join(Path.dirname(cargo), "rustc")
    rustc = if File.exists?(rustc), do: rustc, else: System.find_executable("rustc")

    version =
      with true <- is_binary(rustc),
           {out, 0} <- System.cmd(rustc, ["--version"], stderr_to_stdout: true),
           [_, major, minor] <- Regex.run(~r/^rustc (\d+)\.(\d+)/, out) do
        {String.to_integer(major), String.to_integer(minor)}
      else
        _ -> nil
      end

    if version && version < @rust_min do
      fail!("""
      Larder's native code needs Rust #{version_text(@rust_min)} or newer, and the
      rustc next to #{cargo} is #{version_text(version)}. With rustup: rustup update stable
      (then rustup default stable); otherwise put a newer Rust first on PATH
      (https://rustup.rs), and run mix compile again.\
      """)
    end

    :ok
  end

  defp version_text({major, minor}), do: "#{major}.#{minor}"

  # What the output of a failed build says about the machine.
  defp hint(out) do
    cond do
      out =~ "linker `cc` not found" or out =~ "failed to find tool" ->
        ": a C compiler is missing (on Debian or Ubuntu: apt-get install build-essential)"

      out =~ ~r/openssl|pkg-config|pkg_config/i ->
        ": OpenSSL's headers or pkg-config are missing (on Debian or Ubuntu: " <>
          "apt-get install libssl-dev pkg-config zlib1g-dev)"

      true ->
        "; see cargo's output above"
    end
  end

  defp fail!(message) do
    if Code.ensure_loaded?(Mix), do: Mix.raise(message), else: raise(message)
  end
end
