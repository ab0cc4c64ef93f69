-- The ratewise demo: a batch of requests to a rate-limited API that also
-- fails now and then, through a client-side bucket and rw.fetch.
--
--   make demo                      starts a local mock API and runs this
--   lua5.4 examples/demo.lua URL   runs it against an API you started
--
-- The mock API allows 5 requests per second (burst 5) and answers 429 with
-- Retry-After beyond that; one request in ten fails with a bare 503. The
-- client's bucket is set a little too fast on purpose (6/s), so that some
-- 429s happen and you can watch them being waited out.
local rw = require "ratewise"

local base_url, mock = arg and arg[1], nil
if not base_url then
  package.path = "./?.lua;" .. package.path
  mock = require("spec.support.server").start()
  base_url = mock.base
end

local REQUESTS = 40
local bucket = rw.bucket { capacity = 5, rate = 6 }

local stats = {
  ok = 0, failed = 0, attempts = 0,
  retries_by_status = {}, waits_by_source = {}, waited = 0,
}

local function on_retry(info)
  local why = info.status and tostring(info.status) or ("network error: " .. tostring(info.error))
  print(string.format("  retrying %s %s in %.2f s (%s, attempt %d/%d, %s)",
    info.method, info.url, info.delay, why, info.attempt, info.max_retries, info.source))
  local key = info.status and tostring(info.status) or "network"
  stats.retries_by_status[key] = (stats.retries_by_status[key] or 0) + 1
  local w = stats.waits_by_source[info.source] or { count = 0, seconds = 0 }
  w.count, w.seconds = w.count + 1, w.seconds + info.delay
  stats.waits_by_source[info.source] = w
end

print(string.format("ratewise %s demo: %d requests to %s/api/items/N", rw._VERSION, REQUESTS, base_url))
print("client bucket: burst 5, 6 requests/s; the API allows 5 requests/s\n")

local started = rw.now()
for i = 1, REQUESTS do
  local res, err = rw.fetch(base_url .. "/api/items/" .. i, {
    limiter = bucket,
    max_retries = 4,
    base = 0.2,        -- fallback backoff starts small for a demo
    max_elapsed = 15,
    on_retry = on_retry,
  })
  if res then
    stats.ok = stats.ok + 1
    stats.attempts = stats.attempts + res.attempts
    print(string.format("request %2d: %d after %d attempt%s", i, res.status, res.attempts,
      res.attempts == 1 and "" or "s"))
  else
    stats.failed = stats.failed + 1
    stats.attempts = stats.attempts + err.attempts
    print(string.format("request %2d: failed: %s", i, tostring(err)))
  end
end
local total = rw.now() - started

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys)
  return keys
end

print("\nsummary")
print(string.format("  requests        %d (%d succeeded, %d failed)", REQUESTS, stats.ok, stats.failed))
print(string.format("  attempts        %d", stats.attempts))
local parts = {}
for _, k in ipairs(sorted_keys(stats.retries_by_status)) do
  parts[#parts + 1] = string.format("%s x%d", k, stats.retries_by_status[k])
end
print("  retries         " .. (#parts > 0 and table.concat(parts, ", ") or "none"))
parts = {}
for _, k in ipairs(sorted_keys(stats.waits_by_source)) do
  local w = stats.waits_by_source[k]
  parts[#parts + 1] = string.format("%s x%d (%.2f s)", k, w.count, w.seconds)
end
print("  waits           " .. (#parts > 0 and table.concat(parts, ", ") or "none"))
print(string.format("  total time      %.2f s", total))
print(string.format("  effective rate  %.2f successful requests/s (the API allows 5/s)", stats.ok / total))

if mock then mock:stop() end
