import Config

# The service's listener. PORT (or 8091) when :port is not set here; the
# tests take a free loopback port.
if config_env() == :test do
  config :price_search, port: 0, ip: {127, 0, 0, 1}
end
