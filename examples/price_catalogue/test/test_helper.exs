# The properties may take longer than ExUnit's default on a loaded 2-core
# machine: a bound on waiting, not on speed.
ExUnit.start(timeout: 300_000)
