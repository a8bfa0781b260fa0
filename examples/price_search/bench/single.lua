-- wrk script: the single reference request, over and over.
-- wrk ... -s single.lua URL <request.json>
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"

function init(args)
  local f = assert(io.open(args[1], "r"))
  wrk.body = f:read("*a"):gsub("%s+$", "")
  f:close()
end

dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "report.lua")
