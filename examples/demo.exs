# `make demo`: a demo of every capability, each printing a side-by-side table
# against the baseline its users have today (ETS, Redis), measured in this run.

IO.puts("""
Larder demo: every figure below is measured now, on this machine, side by side
with its baseline. Ratios are median / baseline median (below 1 is faster).
""")

for demo <- Path.wildcard(Path.join(__DIR__, "demo/*.exs")) |> Enum.sort() do
  Code.require_file(demo)
end
