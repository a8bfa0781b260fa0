-- wrk script: bulk NDJSON bodies of N requests (default 1,000), the
-- reference requests cycled, each line given an "id" 0..N-1.
-- wrk ... -s bulk.lua URL <requests.jsonl> [N]
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/x-ndjson"

function init(args)
  local requests = {}
  for line in io.lines(args[1]) do
    if line:match("%S") then requests[#requests + 1] = line end
  end
  local n = tonumber(args[2] or "1000")
  local lines = {}
  for i = 0, n - 1 do
    local request = requests[i % #requests + 1]
    lines[#lines + 1] = "{\"id\":" .. i .. "," .. request:sub(request:find("{") + 1)
  end
  wrk.body = table.concat(lines, "\n") .. "\n"
end

dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "report.lua")
