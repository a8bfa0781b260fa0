defmodule Larder.Replica.BoundaryTest do
  # The replica's process layer (lib/larder/replica/: the server, the
  # reader and its read loop, applying, snapshots and their schedule, the
  # handle, the sources) names neither structure it can keep: what depends
  # on Larder.Table or Larder.Bag is in their targets,
  # lib/larder/replica/target/, behind Larder.Replica.Target. Checked on
  # the source and on the compiled modules' calls.
  use ExUnit.Case, async: true

  @dir Path.expand("../../../lib/larder/replica", __DIR__)

  @structures ["Larder.Table", "Larder.Bag"]

  # Every file of the replica but its targets'.
  defp files do
    @dir
    |> Path.join("*.ex")
    |> Path.wildcard()
  end

  test "no file of the replica's process layer names Larder.Table or Larder.Bag" do
    names = Enum.map(files(), &Path.basename/1)

    for file <-
          ~w(server.ex reader.ex read_loop.ex snapshot.ex snapshot_schedule.ex apply.ex target.ex) do
      assert file in names, "lib/larder/replica/#{file} is not checked"
    end

    for file <- files(), text = File.read!(file), name <- @structures do
      refute String.contains?(text, name), "#{Path.relative_to_cwd(file)} names #{name}"
    end
  end

  test "their modules call no function of Larder.Table or Larder.Bag, nor of their internals" do
    modules =
      for file <- files(),
          [_, name] <- Regex.scan(~r/^defmodule ([\w.]+) do/m, File.read!(file)),
          do: Module.concat([name])

    assert Larder.Replica.Server in modules and Larder.Replica.Reader in modules

    for mod <- modules do
      Code.ensure_loaded!(mod)
      {:ok, {^mod, [imports: imports]}} = :beam_lib.chunks(:code.which(mod), [:imports])

      for {callee, fun, arity} <- imports,
          name = inspect(callee),
          structure <- @structures,
          name == structure or String.starts_with?(name, structure <> ".") do
        flunk("#{inspect(mod)} calls #{name}.#{fun}/#{arity}")
      end
    end
  end
end
