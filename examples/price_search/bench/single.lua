-- wrk script: the single reference request, over and over.
-- wrk ... -s single.lua URL <request.json>
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"

function init(args)
  local f = assert(io.open(args[1], "r"))
  wrk.body = f:read("*a"):gsub("%s+$", "")
  f:close()
end

function done(summary, latency, requests)
  io.write(string.format(
    "WRK_JSON {\"requests\":%d,\"duration_us\":%d,\"p50_us\":%d,\"p99_us\":%d,\"errors\":%d,\"non_2xx\":%d}\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status))
end
