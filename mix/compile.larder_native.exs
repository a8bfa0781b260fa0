# The Mix compiler step that builds the two NIF crates with cargo (release
# mode) and installs their libraries into priv/native/: native/larder_native
# (liblarder_native.so, loaded by Larder.Native's @on_load) and
# native/larder_kafka (liblarder_kafka.so, librdkafka inside, loaded only
# when a Kafka source is first used). It runs before the Elixir compiler, so
# Larder.Native finds its library when loaded. The Kafka crate's first build
# compiles librdkafka from source (see the README for its cost).
defmodule Mix.Tasks.Compile.LarderNative do
  @moduledoc false
  use Mix.Task.Compiler

  @crates [{"native/larder_native", "larder_native"}, {"native/larder_kafka", "larder_kafka"}]

  @impl true
  def run(_args) do
    cargo = find_cargo()
    env = [{"PATH", Path.dirname(cargo) <> ":" <> (System.get_env("PATH") || "")}]
    results = Enum.map(@crates, fn {crate, lib} -> build(cargo, env, crate, lib) end)
    # Links priv/ into _build now: the Elixir compiler loads Larder.Native
    # (running its @on_load) before Mix would otherwise do it.
    Mix.Project.build_structure()
    if Enum.any?(results, &match?({:ok, _}, &1)), do: {:ok, []}, else: {:noop, []}
  end

  defp build(cargo, env, crate, lib) do
    manifest = Path.join(crate, "Cargo.toml")

    case System.cmd(cargo, ["build", "--release", "--quiet", "--manifest-path", manifest],
           env: env,
           stderr_to_stdout: true
         ) do
      {_out, 0} ->
        install(crate, lib)

      {out, status} ->
        Mix.shell().error(out)
        Mix.raise("cargo build of #{crate} failed (exit status #{status}); see the output above")
    end
  end

  defp find_cargo do
    home_cargo = Path.expand("~/.cargo/bin/cargo")

    cond do
      path = System.find_executable("cargo") ->
        path

      File.exists?(home_cargo) ->
        home_cargo

      true ->
        Mix.raise(
          "cargo not found: install Rust with scripts/setup (rustup), then run mix compile"
        )
    end
  end

  # Copies through a temporary file and a rename, so a VM that has the old
  # library mapped keeps a valid file.
  defp install(crate, lib) do
    ext = if match?({:unix, :darwin}, :os.type()), do: "dylib", else: "so"
    built = Path.join([crate, "target", "release", "lib#{lib}.#{ext}"])
    dest = Path.join(["priv", "native", "lib#{lib}.so"])

    if File.exists?(dest) and File.read!(dest) == File.read!(built) do
      {:noop, []}
    else
      File.mkdir_p!(Path.dirname(dest))
      tmp = dest <> ".tmp"
      File.cp!(built, tmp)
      File.rename!(tmp, dest)
      Mix.shell().info("Compiled #{crate} -> #{dest}")
      {:ok, []}
    end
  end
end
