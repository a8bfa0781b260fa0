# The Larder.Replica.Source contract's conformance suite
# (Larder.Test.SourceConformance) run against the test sources the
# replica's tests use, so that what those tests show holds for a source
# that keeps the contract. Larder.Replica.RedisStream runs it in
# redis_stream_test.exs, Larder.Replica.Kafka in larder_kafka.

defmodule Larder.Replica.Source.PartitionedSourceTest do
  # An in-memory log of three partitions, with committed/2.
  use ExUnit.Case, async: true
  use Larder.Test.SourceConformance, source: Larder.Test.PartitionedSource

  alias Larder.Test.PartitionedSource, as: Log

  @moduletag :capture_log

  setup do
    log = Log.new(3)
    Larder.Test.SourceConformance.Logs.partitioned(Log, log)
  end
end

defmodule Larder.Replica.Source.NotifyingSourceTest do
  # The same log with notify/2.
  use ExUnit.Case, async: true
  use Larder.Test.SourceConformance, source: Larder.Test.NotifyingSource

  @moduletag :capture_log

  setup do
    log = Larder.Test.NotifyingSource.new(3)
    Larder.Test.SourceConformance.Logs.partitioned(Larder.Test.NotifyingSource, log)
  end
end

defmodule Larder.Replica.Source.EmptySourceTest do
  # A log that stays empty: the tests that need no entries.
  use ExUnit.Case, async: true
  use Larder.Test.SourceConformance, source: Larder.Test.EmptySource, writes: false

  @moduletag :capture_log

  setup do
    %{source_opts: [], bad_opts: [[table: 1]]}
  end
end
