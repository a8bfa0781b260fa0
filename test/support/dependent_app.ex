# A fresh Mix project of someone else's that depends on Larder's packages:
# made by `mix new` in a folder, given deps and a program (a lib/ file),
# compiled and run with mix. For the dependency tests of the core
# (test/dependency_test.exs) and of the adapters.
defmodule Larder.Test.DependentApp do
  @moduledoc false

  import ExUnit.Assertions

  @doc """
  Makes the project `name` in `dir` with `deps` (the deps/0 list, as
  source text) and `program` (a file copied to lib/<name>.ex); returns its
  path.
  """
  def new!(dir, name, deps, program) do
    app = Path.join(dir, name)
    mix!(["new", app], dir)

    mix_exs = Path.join(app, "mix.exs")
    deps = "defp deps do\n    #{deps}\n  end"
    File.write!(mix_exs, Regex.replace(~r/defp deps do.*?\n  end/s, File.read!(mix_exs), deps))
    File.cp!(program, Path.join([app, "lib", name <> ".ex"]))
    app
  end

  @doc "Runs mix with `args` in `dir` (MIX_ENV=dev, and `env`); its output, or a failed assertion."
  def mix!(args, dir, env \\ []) do
    {out, status} =
      System.cmd(System.find_executable("mix"), args,
        cd: dir,
        env: [{"MIX_ENV", "dev"} | env],
        stderr_to_stdout: true
      )

    assert status == 0, "mix #{Enum.join(args, " ")} failed (exit status #{status}):\n#{out}"
    out
  end

  @doc "The applications built into the project's _build (dev), sorted."
  def built(app), do: app |> Path.join("_build/dev/lib") |> File.ls!() |> Enum.sort()
end
