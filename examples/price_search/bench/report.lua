-- The done/3 hook of the wrk scripts here: one WRK_JSON line with the
-- counts and latencies http_bench.exs reads. Loaded by each script with
-- dofile, from the script's own directory.
function done(summary, latency, requests)
  io.write(string.format(
    "WRK_JSON {\"requests\":%d,\"duration_us\":%d,\"p50_us\":%d,\"p99_us\":%d,\"errors\":%d,\"non_2xx\":%d}\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status))
end
