-- wrk script: the reference requests in turn, one per line of a JSONL file,
-- each connection starting at a different line.
-- wrk ... -s mixed.lua URL <requests.jsonl>
local bodies = {}
local next_body = 1
local connections = 0

function init(args)
  for line in io.lines(args[1]) do
    if line:match("%S") then bodies[#bodies + 1] = line end
  end
  connections = connections + 1
  next_body = (connections * 37) % #bodies + 1
end

function request()
  local body = bodies[next_body]
  next_body = next_body % #bodies + 1
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, body)
end

function done(summary, latency, requests)
  io.write(string.format(
    "WRK_JSON {\"requests\":%d,\"duration_us\":%d,\"p50_us\":%d,\"p99_us\":%d,\"errors\":%d,\"non_2xx\":%d}\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status))
end
