-- A GitHub-style API through rw.client with the "github" provider, against
-- a local mock that speaks its dialect: x-ratelimit-remaining/-reset (epoch
-- seconds), 403 for a spent quota, Retry-After for the secondary limit, and
-- a stricter quota on /search/.
--
--   lua5.4 examples/github_like.lua     (from the repo root, after `make`)
package.path = "./?.lua;" .. package.path
local rw = require "ratewise"
local server = require "spec.support.server"

local api = server.start()
local reset = os.time() + 2
local function ok(remaining, body)
  return { status = 200, body = body, headers = { ["Content-Type"] = "application/json",
    ["x-ratelimit-remaining"] = tostring(remaining), ["x-ratelimit-reset"] = tostring(reset) } }
end
api:script("/repos/lua/lua", {
  ok(1, '{"full_name":"lua/lua","stargazers_count":8000}'),
  -- The primary quota is spent: 403 with remaining 0 until the reset.
  { status = 403, body = '{"message":"API rate limit exceeded"}', headers = {
    ["x-ratelimit-remaining"] = "0", ["x-ratelimit-reset"] = tostring(reset) } },
  ok(4999, '{"full_name":"lua/lua","stargazers_count":8001}'),
})
api:script("/repos/lua/luarocks", {
  -- The secondary limit: too many requests at once; GitHub says how long.
  { status = 403, body = '{"message":"You have exceeded a secondary rate limit"}',
    headers = { ["Retry-After"] = "1" } },
  ok(4998, '{"full_name":"luarocks/luarocks","stargazers_count":3000}'),
})
api:script("/search/code", { ok(29, '{"total_count":3}') })

local github = rw.client {
  base_url = api.base,
  headers = { Authorization = "Bearer ghp_demo_not_a_real_token", Accept = "application/vnd.github+json" },
  provider = "github",
  limiter = rw.bucket { capacity = 100, rate = 5000 / 3600 },
  routes = { ["/search/"] = rw.bucket { capacity = 1, rate = 2 } }, -- search has its own, stricter quota
  on_retry = function(info)
    print(string.format("  %s: waiting %.2f s (%s)", info.status, info.delay, info.source))
  end,
}

local t0 = rw.now()
local function show(label, res, err)
  if res then
    print(string.format("%-28s %d after %d attempt(s), at %.2f s: %s", label, res.status, res.attempts,
      rw.now() - t0, res:json() and (res:json().full_name or res:json().total_count) or ""))
  else
    print(label .. ": " .. tostring(err))
  end
end
show("GET /repos/lua/lua", github:get("/repos/lua/lua"))
show("GET /repos/lua/lua (quota)", github:get("/repos/lua/lua"))
show("GET /repos/lua/luarocks", github:get("/repos/lua/luarocks"))
for i = 1, 3 do show("GET /search/code #" .. i, github:get("/search/code", { query = { q = "coroutine" } })) end
local st = github:stats()
print(string.format("requests %d, attempts %d, retries %d, waited %.2f s", st.requests, st.attempts, st.retries,
  st.waited))
api:stop()
