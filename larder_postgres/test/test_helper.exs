# The Postgres tests (tagged :postgres) start a real PostgreSQL server from
# Debian's packages (the newest under /usr/lib/postgresql/<version>/bin) in
# a temporary data directory on a free loopback port
# (test/support/postgres_server.ex); `mix test --exclude postgres` skips
# them. scripts/setup installs the `postgresql` package.
#
# The suite must also pass on a loaded 2-core machine (CI, or two busy loops
# beside it): a message may take longer than ExUnit's default 100 ms to
# arrive. These are bounds on waiting, not on speed: no test asserts how
# fast anything is.
ExUnit.start(assert_receive_timeout: 5_000, timeout: 300_000, capture_log: true)
