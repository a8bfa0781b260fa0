defmodule Larder.ReleaseTest do
  # Builds examples/release_check, a small application that depends on Larder
  # by path, with `MIX_ENV=prod mix release` in a temporary directory, and
  # boots it: with `bin/release_check eval` (the Bag, Register and Table
  # checks), and as in production (`daemon`, then `rpc`), round-tripping a
  # value through a real Redis with Larder.Cache.Redis, whose client is
  # Larder's own: the release holds no Redis client library. It checks what
  # a user gets on a machine set up by scripts/setup. Tagged :release
  # (`mix test --exclude release` skips it); `make test` runs it.
  use ExUnit.Case, async: true

  alias Larder.Test.RedisServer

  @moduletag :release
  @moduletag timeout: 600_000

  @example Path.expand("../examples/release_check", __DIR__)
  @larder Path.expand("..", __DIR__)

  setup context do
    dir =
      Path.join(System.tmp_dir!(), "larder_#{context.test}_#{System.unique_integer([:positive])}")

    dir = String.replace(dir, ~r/[^\w\/.-]/, "_")
    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf!(dir) end)

    # The example's sources only: never a _build left by someone's own try.
    for entry <- ["mix.exs", "lib"] do
      File.cp_r!(Path.join(@example, entry), Path.join(dir, entry))
    end

    %{dir: dir}
  end

  test "an application ships as a release with Larder and OTP only", %{dir: dir} do
    bin = release!(dir)

    assert eval!(bin, "IO.inspect(ReleaseCheck.check())") =~ ":ok"

    refute File.ls!(Path.join([dir, "_build/prod/rel/release_check/lib"]))
           |> Enum.any?(&(&1 =~ "redis"))
  end

  @tag :redis
  test "the release starts Larder and reaches Redis with Larder.Cache.Redis", %{dir: dir} do
    server = RedisServer.start()
    on_exit(fn -> RedisServer.stop(server) end)

    bin = release!(dir)

    # Booted as in production: `daemon` runs the release's boot script, which
    # starts Larder before the application.
    env = [{"RELEASE_NODE", "release_check_#{System.unique_integer([:positive])}"}]
    {_, 0} = System.cmd(bin, ["daemon"], env: env, stderr_to_stdout: true)

    try do
      wait_up(bin, env, 100)

      apps =
        rpc!(bin, env, "IO.inspect(Enum.map(Application.started_applications(), &elem(&1, 0)))")

      assert apps =~ ":larder" and apps =~ ":release_check"
      refute apps =~ "eredis"
      assert rpc!(bin, env, "IO.inspect(ReleaseCheck.check())") =~ ":ok"
      assert rpc!(bin, env, "IO.inspect(ReleaseCheck.check_redis(#{server.port}))") =~ ":ok"
    after
      System.cmd(bin, ["stop"], env: env, stderr_to_stdout: true)
    end
  end

  # Waits (at most tries * 100 ms) until the daemon answers.
  defp wait_up(bin, env, tries) do
    case System.cmd(bin, ["pid"], env: env, stderr_to_stdout: true) do
      {_, 0} ->
        :ok

      {out, _} when tries <= 1 ->
        flunk("the release did not come up: #{out}")

      _ ->
        Process.sleep(100)
        wait_up(bin, env, tries - 1)
    end
  end

  defp rpc!(bin, env, code) do
    {out, status} = System.cmd(bin, ["rpc", code], env: env, stderr_to_stdout: true)
    assert status == 0, "#{bin} rpc failed (exit status #{status}):\n#{out}"
    out
  end

  defp release!(dir) do
    env = [{"MIX_ENV", "prod"}, {"LARDER_PATH", @larder}]

    {out, status} =
      System.cmd(System.find_executable("mix"), ["release", "--overwrite"],
        cd: dir,
        env: env,
        stderr_to_stdout: true
      )

    assert status == 0, "mix release failed (exit status #{status}):\n#{out}"
    Path.join(dir, "_build/prod/rel/release_check/bin/release_check")
  end

  defp eval!(bin, code) do
    {out, status} = System.cmd(bin, ["eval", code], stderr_to_stdout: true)
    assert status == 0, "#{bin} eval failed (exit status #{status}):\n#{out}"
    out
  end
end
