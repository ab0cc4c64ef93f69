-- Several APIs at once, each behind its own bucket, under rw.run.
--
--   lua5.4 examples/fanout.lua     (from the repo root, after `make`; see the README)
--
-- Three local mock APIs stand in for three providers with different limits.
-- Every request to every API is in flight together; each bucket keeps its
-- own API under its limit, so no request draws a 429.
package.path = "./?.lua;" .. package.path
local rw = require "ratewise"
local server = require "spec.support.server"

local apis = {
  { name = "search",   limit = 10, requests = 12 },
  { name = "billing",  limit = 4,  requests = 6 },
  { name = "weather",  limit = 20, requests = 20 },
}

for _, api in ipairs(apis) do
  -- Each mock allows `limit` requests per second in bursts of `limit`, and
  -- never fails at random: this example is about pacing.
  api.server = server.start { args = { "--api-rate", tostring(api.limit), "--api-capacity",
    tostring(api.limit), "--api-fail", "0" } }
  -- A little under the API's own limit: the two clocks never agree exactly.
  api.bucket = rw.bucket { capacity = api.limit / 2, rate = api.limit * 0.9 }
end

io.stdout:setvbuf("line")
local started = rw.now()
rw.run(function()
  for _, api in ipairs(apis) do
    rw.spawn(function()
      local list = {}
      for i = 1, api.requests do list[i] = api.server:url("/api/" .. api.name .. "/" .. i) end
      local results = rw.map(list, function(url)
        return rw.fetch(url, { limiter = api.bucket })
      end, { concurrency = 8 })
      local ok, first429 = 0, false
      for i = 1, api.requests do
        if results[i] and results[i].status == 200 then ok = ok + 1 end
        if results[i] and results[i].attempts > 1 then first429 = true end
      end
      print(string.format("%-8s %2d/%d succeeded in %.2f s (limit %d/s)%s", api.name, ok, api.requests,
        rw.now() - started, api.limit, first429 and ", some retried" or ""))
    end)
  end
end)
local total = 0
for _, api in ipairs(apis) do total = total + api.requests end
print(string.format("all %d requests to %d APIs took %.2f s", total, #apis, rw.now() - started))

for _, api in ipairs(apis) do api.server:stop() end
