-- profile_conc.lua OP COUNT URL [IN_FLIGHT [MODE]]: COUNT GETs of URL with
-- IN_FLIGHT (default 64) at a time, through one layer of rw.fetch's stack,
-- for bench/profile_conc.sh (callgrind, page faults, rates). OPs, from the
-- bottom up:
--   engine    the engine binding driven directly, no tasks: start IN_FLIGHT
--             transfers, then poll; for each one done, result(), close(),
--             and start the next (the C engine + binding, Lua loop)
--   engine_noresult  the same without transfer:result()
--   transfer  IN_FLIGHT tasks under rw.run, each looping runtime.transfer
--             (+ scheduler and runtime glue)
--   fetch     IN_FLIGHT tasks under rw.run, each looping rw.fetch (the bench)
--   map_shared, map_fresh, map_inherit  rw.map over COUNT URLs with
--             concurrency IN_FLIGHT, the fetch options one shared table, a
--             fresh table per call, or a per-call table over a base (__index)
-- MODE "stats" prints the rate, CPU per request, and how often the engine
-- was polled (engine:poll calls, and how many transfers each call returned),
-- to set against multi_curl64's performs= and polls=. MODE "alloc" stops the
-- garbage collector and prints the bytes of Lua heap allocated per request
-- (what the collector has to sweep up afterwards).
local rw = require "ratewise"
local core = require "ratewise.core"
local runtime = require "ratewise.runtime"
local scheduler = require "ratewise.scheduler"

local op, count, url = arg[1], math.tointeger(tonumber(arg[2])), arg[3]
local conc = math.tointeger(tonumber(arg[4] or "64"))
local mode = arg[5]
local stats = mode == "stats"
assert(op and count and url and conc, "usage: profile_conc.lua OP COUNT URL [IN_FLIGHT [stats|alloc]]")

-- What fetch.lua hands the engine for a plain GET (see fetch.fetch).
local agent_line = "User-Agent: ratewise/" .. core.version
local function request()
  return { url = url, method = "GET", headers = { agent_line }, follow_redirects = true, timeout = 30 }
end

local engine = scheduler.engine()
local polls, polls_empty, polled_done = 0, 0, 0
if stats then -- count engine:poll calls (the wrapper costs a little)
  local methods = getmetatable(engine).__index
  local poll = methods.poll
  methods.poll = function(e, timeout, out)
    local done, n = poll(e, timeout, out)
    polls = polls + 1
    if n == 0 then polls_empty = polls_empty + 1 end
    polled_done = polled_done + n
    return done, n
  end
end

local function direct(with_result)
  local started, finished = 0, 0
  local function start()
    started = started + 1
    assert(engine:start(request()))
  end
  for _ = 1, math.min(conc, count) do start() end
  local done = {}
  while finished < count do
    local _, n = engine:poll(1, done)
    for i = 1, n do
      local t = done[i]
      done[i] = nil
      if with_result then assert(t:result().status == 200) end
      t:close()
      finished = finished + 1
      if started < count then start() end
    end
  end
end

local function tasks(body)
  rw.run(function()
    for w = 1, conc do
      local k = count // conc + (w <= count % conc and 1 or 0)
      if k > 0 then rw.spawn(body, k) end
    end
  end)
end

local ops = {}
function ops.engine() direct(true) end
function ops.engine_noresult() direct(false) end
function ops.transfer()
  tasks(function(k)
    for _ = 1, k do
      local res = runtime.transfer(request())
      assert(res and res.status == 200)
    end
  end)
end
function ops.fetch()
  local opts = { on_retry = false }
  tasks(function(k)
    for _ = 1, k do
      local res = rw.fetch(url, opts)
      assert(res and res.status == 200)
    end
  end)
end

-- rw.map over count URLs, 64 at a time: one options table for every call,
-- a fresh one per call, or one per call inheriting from a base (__index).
local function map_with(options_for)
  local urls = {}
  for i = 1, count do urls[i] = url end
  local results = rw.map(urls, function(u, i)
    local res = rw.fetch(u, options_for(i))
    assert(res and res.status == 200)
    return true
  end, { concurrency = conc })
  assert(#results == count)
end
function ops.map_shared()
  local opts = { on_retry = false }
  map_with(function() return opts end)
end
function ops.map_fresh()
  map_with(function() return { on_retry = false, max_elapsed = 60 } end)
end
function ops.map_inherit()
  local base = { on_retry = false, timeout = 30 }
  local mt = { __index = base }
  map_with(function() return setmetatable({ max_elapsed = 60 }, mt) end)
end

local f = ops[op] or error("unknown op " .. tostring(op))
if mode == "alloc" then
  local saved = count
  count = math.min(conc * 4, saved) -- warm-up: connections, pooled handles, tables at full size
  f()
  count = saved
  collectgarbage("collect")
  collectgarbage("stop")
  local k0 = collectgarbage("count")
  f()
  print(string.format("requests=%d lua_alloc_per_request=%.0f", count, (collectgarbage("count") - k0) * 1024 / count))
  os.exit(0)
end
local t0, c0 = rw.now(), os.clock()
f()
local secs, cpu = rw.now() - t0, os.clock() - c0
if stats then
  print(string.format("requests=%d rate=%.1f cpu_us=%.2f polls=%d empty_polls=%d done_per_poll=%.1f",
    count, count / secs, cpu * 1e6 / count, polls, polls_empty, polled_done / math.max(1, polls - polls_empty)))
end
