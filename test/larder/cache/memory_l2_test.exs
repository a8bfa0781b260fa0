defmodule Larder.Cache.MemoryL2Test do
  # The in-memory L2 the unit tests use passes the same contract as Redis.
  use ExUnit.Case, async: true
  use Larder.Test.L2Conformance

  setup do
    server = start_supervised!(Larder.Test.MemoryL2)
    %{l2_module: Larder.Test.MemoryL2, l2_opts: [server: server]}
  end
end
