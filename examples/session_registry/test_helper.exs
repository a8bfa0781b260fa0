# `mix test` requires a helper in each of its test paths (mix.exs): ExUnit
# is started, with the suite's options, by test/test_helper.exs.
