# Integration tests (tagged :redis) start their own redis-server on a free
# loopback port (support/redis_server.ex, shared with the benchmarks and the
# demo); `make test` installs it and runs every test.
#
# The suite must also pass on a loaded 2-core machine (CI, or two busy loops
# beside it): a message may take longer than ExUnit's default 100 ms to
# arrive, and the PropEr properties longer than 60 s to run. These are
# bounds on waiting, not on speed: no test asserts how fast anything is.
ExUnit.start(assert_receive_timeout: 5_000, timeout: 300_000)
Code.require_file("../support/redis_server.ex", __DIR__)
Code.require_file("../support/redis_cluster.ex", __DIR__)
Code.require_file("../support/redis_sentinel.ex", __DIR__)
