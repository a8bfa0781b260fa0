# Integration tests (tagged :redis) start their own redis-server on a free
# loopback port (test/support/redis_server.ex, compiled with the test support,
# and for the benchmarks and the demo too: see mix.exs); `make test` installs
# redis-server and runs every test.
#
# The Kafka source's tests are larder_kafka's (larder_kafka/test).
#
# The suite must also pass on a loaded 2-core machine (CI, or two busy loops
# beside it): a message may take longer than ExUnit's default 100 ms to
# arrive, and the PropEr properties longer than 60 s to run. These are
# bounds on waiting, not on speed: no test asserts how fast anything is.
ExUnit.start(assert_receive_timeout: 5_000, timeout: 300_000, capture_log: true)
