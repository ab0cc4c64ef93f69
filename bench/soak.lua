-- The soak: many requests through the full stack (client-side limits,
-- tasks, retries, the engine) against a server that injects a random mix of
-- faults, with a fixed seed. It checks and prints that every request ended
-- in a response or an error (none lost, none reported twice), that none
-- outlived its budget, that memory stayed flat between the first and the
-- last thousand requests, and that no file descriptor leaked.
--
--   make soak                        10,000 requests (about a minute)
--   SOAK_REQUESTS=1000 make soak     the shortened form CI runs
--
-- Exits 1 when a check fails.
package.path = "./?.lua;" .. package.path
local rw = require "ratewise"
local core = require "ratewise.core"
local server = require "spec.support.server"

local N = tonumber(os.getenv("SOAK_REQUESTS") or "") or 10000
local CONCURRENCY = 32
local SEED = 20261130
local BUDGET = 2.0        -- max_elapsed of every request
local TOLERANCE = 0.05    -- what a call may outlive its budget by
local BATCH = math.min(1000, math.floor(N / 4))

local function rss_kib()
  local f = io.open("/proc/self/status")
  local status = f:read("*a")
  f:close()
  return tonumber(status:match("VmRSS:%s+(%d+)"))
end

local function open_fds()
  -- /proc/self in the shell would be the shell; ask for this process by its parent.
  local p = io.popen("ls /proc/$PPID/fd 2>/dev/null")
  local n = 0
  for _ in p:lines() do n = n + 1 end
  p:close()
  return n
end

-- The server's behaviour: one long script of steps, in a fixed random order.
-- Requests take the next step as they arrive, so each run sees the same mix.
local faults = {
  { weight = 55, step = { status = 200, body = "ok" } },
  { weight = 8, step = { status = 503 } },
  { weight = 5, step = { status = 429, headers = { ["Retry-After"] = "0" } } },
  { weight = 2, step = { status = 429, headers = { ["Retry-After"] = "Sun, 06 Nov 1994 08:49:37 GMT" } } },
  { weight = 2, step = { status = 429, headers = { ["Retry-After"] = "soon" } } },
  { weight = 5, step = { action = "drop" } },
  { weight = 3, step = { action = "reset" } },
  { weight = 2, step = { action = "garbage" } },
  { weight = 3, step = { action = "truncate", body = "partial" } },
  { weight = 5, step = { status = 200, body = "slowish", delay = 0.05 } },
  { weight = 1, step = { action = "hang", delay = 3 } },
  { weight = 1, step = { action = "slow", body = "0123456789", interval = 0.2 } },
  { weight = 3, step = { status = 404 } },
  -- A large body, served from a path of its own so that the script stays small.
  { weight = 2, step = { action = "redirect", location = "/soak-large" } },
  { weight = 3, step = { status = 500, body = "{\"error\":\"boom\"}" } },
}
local total_weight = 0
for _, f in ipairs(faults) do total_weight = total_weight + f.weight end

math.randomseed(SEED)
local steps = {}
for i = 1, N * 2 do
  local r, pick = math.random() * total_weight, faults[#faults]
  for _, f in ipairs(faults) do
    r = r - f.weight
    if r <= 0 then pick = f break end
  end
  steps[i] = pick.step
end
steps[#steps + 1] = { status = 200, body = "ok" }

local s = server.start()
s:script("/soak", steps)
s:script("/soak-large", { { status = 200, body = string.rep("x", 200000) } })
steps = nil -- luacheck: ignore (let the script go)
local before = rss_kib()

local bucket = rw.bucket { capacity = 64, rate = 20000 }
local ended, twice, over_budget, responses, errors, kinds = {}, 0, 0, 0, 0, {}
local worst = 0
local samples = {}
local done = 0

local function sample(label)
  collectgarbage()
  collectgarbage()
  local c_heap = core.malloc_in_use() -- nil where the C library cannot say
  samples[label] = { heap = collectgarbage("count"), rss = rss_kib(), fds = open_fds(),
    c_heap = c_heap and c_heap / 1024 }
end

local list = {}
for i = 1, N do list[i], ended[i] = i, false end -- sized now, so the checks add nothing as they go
local started = rw.now()
rw.map(list, function(i)
  local t0 = rw.now()
  local res, err = rw.fetch(s:url("/soak"), {
    limiter = bucket, max_retries = 2, base = 0.01, max_delay = 0.05,
    timeout = 0.3, max_elapsed = BUDGET, on_retry = false,
  })
  local took = rw.now() - t0
  if took > worst then worst = took end
  if took > BUDGET + TOLERANCE then over_budget = over_budget + 1 end
  if ended[i] then twice = twice + 1 end
  ended[i] = res and "response" or "error"
  if res then
    responses = responses + 1
  else
    errors = errors + 1
    kinds[err.kind] = (kinds[err.kind] or 0) + 1
  end
  done = done + 1
  if done == BATCH then sample("first") end
  -- Nothing is returned: rw.map would keep every response until the end,
  -- which is not what a long-running program does.
end, { concurrency = CONCURRENCY })
local elapsed = rw.now() - started
sample("last")

local lost = 0
for i = 1, N do if not ended[i] then lost = lost + 1 end end -- false: never ended
local log = s:log("/soak")
s:stop()

local first, last = samples.first, samples.last
local heap_growth = last.heap - first.heap
local rss_growth = last.rss - first.rss
-- "Flat": what the rest added after the first thousand is noise, not a
-- per-request leak. The verdict is on the memory the program holds (the
-- Lua heap, and the C heap in use); the resident size also moves with
-- memory that malloc keeps free for later, so it is printed, not judged.
local heap_ok = heap_growth < math.max(256, first.heap * 0.1)
local c_growth = first.c_heap and last.c_heap - first.c_heap
local c_ok = not c_growth or c_growth < math.max(256, first.c_heap * 0.1)
local fds_ok = last.fds <= first.fds + 2

local kind_list = {}
for k, v in pairs(kinds) do kind_list[#kind_list + 1] = k .. " " .. v end
table.sort(kind_list)
print(string.format("soak: %d requests, concurrency %d, seed %d, %d attempts seen by the server, %.1f s",
  N, CONCURRENCY, SEED, #log, elapsed))
print(string.format("  ended           %d responses + %d errors = %d of %d (lost %d, reported twice %d)",
  responses, errors, responses + errors, N, lost, twice))
print(string.format("  errors by kind  %s", #kind_list > 0 and table.concat(kind_list, ", ") or "none"))
print(string.format("  budget          longest call %.3f s of %.1f s allowed; over budget: %d", worst, BUDGET,
  over_budget))
print(string.format("  Lua heap        %.0f KiB after the first %d, %.0f KiB at the end (%+.0f KiB)%s",
  first.heap, BATCH, last.heap, heap_growth, heap_ok and "" or "  GROWING"))
if c_growth then
  print(string.format("  C heap in use   %.0f KiB after the first %d, %.0f KiB at the end (%+.0f KiB)%s",
    first.c_heap, BATCH, last.c_heap, c_growth, c_ok and "" or "  GROWING"))
end
print(string.format("  resident        %d KiB after the first %d, %d KiB at the end (%+d KiB)",
  first.rss, BATCH, last.rss, rss_growth))
print(string.format("  (resident before the first request: %d KiB)", before))
print(string.format("  open fds        %d after the first %d, %d at the end%s", first.fds, BATCH, last.fds,
  fds_ok and "" or "  LEAKING"))

local ok = lost == 0 and twice == 0 and over_budget == 0 and responses + errors == N
  and heap_ok and c_ok and fds_ok
print(ok and "soak: all checks passed" or "soak: FAILED")
os.exit(ok and 0 or 1)
