# Integration tests (tagged :redis) start their own redis-server on a free
# loopback port; `make test` installs it and runs every test.
ExUnit.start()
