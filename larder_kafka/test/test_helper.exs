# The Kafka tests (tagged :kafka) start a real single-node Kafka 4 broker
# (KRaft) on free loopback ports from the jars that scripts/setup fetches
# into $LARDER_KAFKA_HOME (test/support/kafka_broker.ex); `mix test
# --exclude kafka` skips them (a broker takes 10-40 s to start on a loaded
# 2-core machine).
#
# The suite must also pass on a loaded 2-core machine (CI, or two busy loops
# beside it): a message may take longer than ExUnit's default 100 ms to
# arrive. These are bounds on waiting, not on speed: no test asserts how
# fast anything is.
ExUnit.start(assert_receive_timeout: 5_000, timeout: 300_000, capture_log: true)
