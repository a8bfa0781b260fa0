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

dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "report.lua")
