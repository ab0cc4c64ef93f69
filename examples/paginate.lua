-- Pagination as GitHub does it, through rw.client's pages iterator,
-- against a local mock: each page's Link header names the next one
-- (rel="next", with "last", "prev" and "first" beside it), the second
-- page is answered with a 403 of the secondary rate limit first, and the
-- client's limiter paces every page.
--
--   lua5.4 examples/paginate.lua     (from the repo root, after `make`)
package.path = "./?.lua;" .. package.path
local rw = require "ratewise"
local server = require "spec.support.server"

local api = server.start()
local issues = api.base .. "/repos/lua/lua/issues"
local function link(rels)
  local parts = {}
  for _, r in ipairs(rels) do
    parts[#parts + 1] = string.format('<%s?per_page=2&page=%d>; rel="%s"', issues, r[2], r[1])
  end
  return table.concat(parts, ", ")
end
local function page(body, rels)
  return { status = 200, body = body, headers = { ["Content-Type"] = "application/json", Link = link(rels) } }
end
api:script("/repos/lua/lua/issues", {
  page('[{"number":1},{"number":2}]', { { "next", 2 }, { "last", 3 } }),
  { status = 403, body = '{"message":"You have exceeded a secondary rate limit"}',
    headers = { ["Retry-After"] = "1" } },
  page('[{"number":3},{"number":4}]', { { "prev", 1 }, { "next", 3 }, { "last", 3 }, { "first", 1 } }),
  page('[{"number":5}]', { { "prev", 2 }, { "first", 1 } }),
})

local github = rw.client {
  base_url = api.base,
  headers = { Authorization = "Bearer ghp_demo_not_a_real_token", Accept = "application/vnd.github+json" },
  provider = "github",
  limiter = rw.bucket { capacity = 1, rate = 5 },
  on_retry = function(info)
    print(string.format("  %s: waiting %.2f s (%s)", info.status, info.delay, info.source))
  end,
}

local t0, numbers = rw.now(), {}
for p, err in github:pages("/repos/lua/lua/issues", { query = { per_page = 2 } }) do
  if not p then
    print("stopped: " .. tostring(err))
    break
  end
  for _, issue in ipairs(p:json()) do numbers[#numbers + 1] = issue.number end
  print(string.format("page %d issues, %d attempt(s), at %.2f s", #p:json(), p.attempts, rw.now() - t0))
end
print("issues " .. table.concat(numbers, " "))
local st = github:stats()
print(string.format("requests %d, attempts %d, retries %d", st.requests, st.attempts, st.retries))
api:stop()
