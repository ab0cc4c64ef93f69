-- bench/openresty_handler.lua: ratewise's side of `make bench-openresty`,
-- run by the OpenResty nginx that bench/openresty.lua starts
-- (content_by_lua_file): one request of that nginx runs one round of a shape
-- inside its worker, as user code in a handler would, and answers with its
-- figures. Query arguments:
--   shape   loop (`conc` light threads, ngx.thread.spawn, each looping
--           rw.fetch with one options table), map (rw.map over a list of
--           n URLs with one shared options table, concurrency `conc`),
--           map_fresh (the same with a fresh options table a call, which
--           carries the time left to a deadline), or sequential (rw.fetch
--           in a loop of the handler itself, one request at a time)
--   url     the target (a plain nginx, bench/nginx.sh)
--   n       requests in all; conc: light threads, or map's concurrency
--   size    when given, every body must be that many bytes (#res.body)
-- It answers "requests=N failed=F seconds=S rate=R cpu_us=C" (C: the
-- worker's CPU microseconds per request, user and system, from
-- /proc/self/stat, which is this worker's; set-up and a full garbage
-- collection before the clock starts are left out).
-- luacheck: globals ngx
local rw = require "ratewise"

local format, floor = string.format, math.floor
local fetch, now = rw.fetch, rw.now

-- Seconds of CPU this process has used, from /proc/self/stat (utime and
-- stime, fields 14 and 15, in clock ticks of 1/100 s).
local function cpu_seconds()
  local f = assert(io.open("/proc/self/stat", "r"))
  local stat = f:read("*a")
  f:close()
  local i, utime, stime = 2, nil, nil -- the fields after the command's name start at field 3
  for field in (stat:match("%) (.*)$") or ""):gmatch("%S+") do
    i = i + 1
    if i == 14 then utime = tonumber(field)
    elseif i == 15 then stime = tonumber(field) break end
  end
  return (utime + stime) / 100
end

local args = ngx.req.get_uri_args()
local shape, url = args.shape, args.url
local n, conc, size = tonumber(args.n), tonumber(args.conc), tonumber(args.size)
local shapes = { loop = true, map = true, map_fresh = true, sequential = true }
if not shapes[shape] or type(url) ~= "string" or not n or not conc then
  ngx.status = 400
  ngx.say("usage: ?shape=loop|map|map_fresh|sequential&url=URL&n=N&conc=C[&size=BYTES]")
  return
end

-- The options of every call: no on_retry hook (its default line goes to the
-- error log on a retry; the plain contender retries nothing).
local opts = { on_retry = false }
local failed, first_failure = 0, nil

local function good(res)
  return res ~= nil and res.status == 200 and (size == nil or #res.body == size)
end

local function note(res, err)
  failed = failed + 1
  if not first_failure then
    first_failure = not res and tostring(err) or res.status ~= 200 and ("status " .. tostring(res.status))
      or format("a body of %d bytes, not %d", #res.body, size)
  end
end

local work
if shape == "loop" then
  -- conc light threads of this request, each looping over its share.
  work = function()
    local threads = {}
    for t = 1, conc do
      local count = floor(n / conc) + (t <= n % conc and 1 or 0)
      if count > 0 then
        threads[#threads + 1] = ngx.thread.spawn(function()
          for _ = 1, count do
            local res, err = fetch(url, opts)
            if not good(res) then note(res, err) end
          end
        end)
      end
    end
    for t = 1, #threads do
      local ok, err = ngx.thread.wait(threads[t])
      if not ok then error(err, 0) end
    end
  end
elseif shape == "sequential" then
  work = function()
    for _ = 1, n do
      local res, err = fetch(url, opts)
      if not good(res) then note(res, err) end
    end
  end
else
  -- rw.map as it is written outside OpenResty; the list made before the
  -- clock starts, the results read after it stops.
  local list = {}
  for i = 1, n do list[i] = url end
  local call = function(u) return fetch(u, opts) end
  if shape == "map_fresh" then
    -- far enough off that no call runs out of it (as bench/shapes.lua's)
    local deadline = now() + 3600
    call = function(u) return fetch(u, { max_elapsed = deadline - now(), on_retry = false }) end
  end
  work = function()
    local results, errors = rw.map(list, call, { concurrency = conc })
    return function()
      for i = 1, n do
        if not good(results[i]) then note(results[i], errors[i]) end
      end
    end
  end
end

collectgarbage("collect")
collectgarbage("collect")
local c0, t0 = cpu_seconds(), now()
local after = work()
local secs, cpu = now() - t0, cpu_seconds() - c0
if after then after() end
ngx.say(format("requests=%d failed=%d seconds=%.6f rate=%.1f cpu_us=%.2f", n, failed, secs, n / secs,
  cpu * 1e6 / n))
if first_failure then ngx.say("first failure: ", first_failure) end
