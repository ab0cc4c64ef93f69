-- bench/shapes.lua: ratewise's side of each shape `make bench` measures,
-- written the way users write it (issue 15). run.lua pairs each with its
-- plain C contender (bench/plain_curl, bench/multi_curl64) in
-- bench/rounds.lua's alternating rounds.
--
--   sequential      rw.fetch in a loop, one options table made once
--   loop            `conc` tasks under rw.run, each looping rw.fetch with one
--                   options table made once (the best case); with `size`,
--                   each body must be that long (`#res.body` is read, so the
--                   body really reached Lua, as the C contender keeps each)
--   map_shared      rw.map(urls, function(u) return rw.fetch(u, opts) end,
--                   {concurrency = conc}) with one shared opts
--   map_fresh       the same, with a fresh options table per call
--                   ({ max_elapsed = left, on_retry = false }): how a
--                   deadline is passed down
--   map_inherit     the same, with a per-call table inheriting from a base
--                   one (setmetatable({ max_elapsed = left }, { __index = base }))
--   headers         `conc` tasks looping rw.fetch with an options table
--                   holding an Authorization header, made once
--   client          `conc` tasks looping client:get(path) on an rw.client
--                   with that header
--   client_paths    the same on a client with its defaults (dedupe on),
--                   each task calling a path of its own ("/?task=3"): the
--                   URL changes from one call to the next
--   post_json       `conc` tasks looping rw.fetch with method = "POST" and
--                   a `json` table (an API's chat call): not replay-safe,
--                   each body encoded at its call
--   floor           not a shape users write: `conc` transfers kept in flight
--                   on ratewise's engine (ratewise.core) by a bare Lua loop,
--                   with no fetch, no tasks and no scheduler. What the
--                   binding of libcurl to Lua costs on its own: no code on
--                   top of the engine can beat it.
--   floor_tasks     the floor with a coroutine per request in flight, each
--                   yielding until a bare poll loop resumes it: the least
--                   any design that waits by yielding can cost.
--   floor_scheduler `conc` tasks under rw.run, each looping the seam's own
--                   transfer (runtime.transfer of fetch's request, the
--                   response given its methods) with no fetch: what the
--                   scheduler costs over floor_tasks, and fetch over it.
--
-- Each returns a measure for rounds.lua: { rate, failed, cpu_us, faults }
-- (CPU microseconds and minor page faults per request, of this process).
-- Portable to Lua 5.1 and LuaJIT.
local rw = require "ratewise"

local shapes = {}

local format, floor = string.format, math.floor
local fetch, now, spawn, map = rw.fetch, rw.now, rw.spawn, rw.map

-- The options every shape's calls have: no on_retry hook (its default
-- writes to stderr on a retry; the plain contenders retry nothing).
local BASE = { on_retry = false }

-- How far off the deadline of the per-call shapes is: far enough that no
-- call runs out of it, so `left` only costs what computing it costs.
local DEADLINE_SECONDS = 3600

-- Minor page faults of this process so far (/proc/self/stat, field 10).
local function minor_faults()
  local f = io.open("/proc/self/stat", "r")
  if not f then return nil end
  local stat = f:read("*a")
  f:close()
  local rest = stat:match("%) (.*)$") or ""
  local i = 2 -- the fields after the command's name start at field 3
  for field in rest:gmatch("%S+") do
    i = i + 1
    if i == 10 then return tonumber(field) end
  end
  return nil
end

-- The first failure of each kind goes to stderr, once.
local shown = {}
local function note_failure(res, err, size)
  local why
  if not res then
    why = tostring(err)
  elseif res.status ~= 200 then
    why = "status " .. tostring(res.status)
  else
    why = format("a body of %d bytes, not %d", #res.body, size)
  end
  if not shown[why] then
    shown[why] = true
    io.stderr:write("rw.fetch failed: ", why, "\n")
  end
end

-- Whether a call's result is what the plain contender counts as success:
-- status 200 and, when the shape has one, a body of exactly `size` bytes.
local function good(res, size)
  return res ~= nil and res.status == 200 and (size == nil or #res.body == size)
end

-- Times `work()` (which returns how many of its n calls failed). CPU per
-- request tells the contenders' own cost from the machine's noise; minor
-- page faults show the heap's top trimmed and grown again, or large blocks
-- mapped and unmapped (bench/README.md, "Where the time goes").
local function measure(n, work)
  local f0, c0, t0 = minor_faults(), os.clock(), now()
  local failed = work()
  local secs, cpu, f1 = now() - t0, os.clock() - c0, minor_faults()
  return { rate = n / secs, failed = failed, cpu_us = cpu * 1e6 / n, faults = f0 and f1 and (f1 - f0) / n }
end

-- `count` calls of rw.fetch(url, opts or BASE), or of call() when given;
-- returns how many failed.
local function fetch_loop(url, count, size, opts, call)
  local failed = 0
  opts = opts or BASE
  for _ = 1, count do
    local res, err
    if call then res, err = call() else res, err = fetch(url, opts) end
    if not good(res, size) then
      failed = failed + 1
      note_failure(res, err, size)
    end
  end
  return failed
end

function shapes.sequential(url, n)
  return measure(n, function() return fetch_loop(url, n) end)
end

-- `conc` tasks under rw.run, each looping over its share of the n fetches;
-- their transfers share the scheduler's one libcurl multi handle.
-- With opts, each call is rw.fetch(url, opts); with call, call().
function shapes.loop(url, n, conc, size, opts, call)
  return measure(n, function()
    local failed = 0
    local function worker(count)
      -- Not `failed = failed + fetch_loop(...)`: that reads `failed` before
      -- the loop yields, and would lose the other tasks' counts.
      local mine = fetch_loop(url, count, size, opts, call)
      failed = failed + mine
    end
    rw.run(function()
      for w = 1, conc do
        local count = floor(n / conc) + (w <= n % conc and 1 or 0)
        if count > 0 then spawn(worker, count) end
      end
    end)
    return failed
  end)
end

-- The list rw.map is given: the caller's, made before the clock starts.
local lists = {}
local function url_list(url, n)
  local key = url .. " " .. n
  local list = lists[key]
  if not list then
    list = {}
    for i = 1, n do list[i] = url end
    lists = { [key] = list } -- one list kept at a time
  end
  return list
end

-- rw.map over n copies of url with `fn`; the results are counted after the
-- clock stops (a user reads them after map returns too).
local function run_map(url, n, conc, fn)
  local list = url_list(url, n)
  local results, errors
  local m = measure(n, function()
    results, errors = map(list, fn, { concurrency = conc })
    return 0
  end)
  for i = 1, n do
    if not good(results[i]) then
      m.failed = m.failed + 1
      note_failure(results[i], errors[i])
    end
  end
  return m
end

function shapes.map_shared(url, n, conc)
  local opts = BASE
  return run_map(url, n, conc, function(u) return fetch(u, opts) end)
end

function shapes.map_fresh(url, n, conc)
  local deadline = now() + DEADLINE_SECONDS
  return run_map(url, n, conc, function(u)
    return fetch(u, { max_elapsed = deadline - now(), on_retry = false })
  end)
end

-- A fresh metatable per call too, as the issue writes it (and as such code
-- is usually written inline).
function shapes.map_inherit(url, n, conc)
  local deadline, base = now() + DEADLINE_SECONDS, BASE
  return run_map(url, n, conc, function(u)
    return fetch(u, setmetatable({ max_elapsed = deadline - now() }, { __index = base }))
  end)
end

-- What most API calls carry: a credential. The plain contender sends the
-- same line (multi_curl64 --header).
shapes.AUTHORIZATION = "Bearer rw-bench-0123456789abcdef0123456789abcdef"

-- `conc` tasks looping rw.fetch with one options table holding a header
-- table (an Authorization line), made once.
function shapes.headers(url, n, conc)
  return shapes.loop(url, n, conc, nil, { on_retry = false, headers = { Authorization = shapes.AUTHORIZATION } })
end

-- `conc` tasks looping client:get(path) on one rw.client with that header.
-- Without dedupe: identical GETs in flight would share one transfer, and
-- the plain contender makes every request.
function shapes.client(base, path, n, conc)
  local client = rw.client { base_url = base, headers = { Authorization = shapes.AUTHORIZATION },
    on_retry = false, dedupe = false }
  return shapes.loop(nil, n, conc, nil, nil, function() return client:get(path) end)
end

-- `conc` tasks each looping client:get on a path of its own, on an
-- rw.client with the defaults users leave as they are (identical requests
-- in flight share one transfer: none here, each task's path is its own).
function shapes.client_paths(base, n, conc)
  local client = rw.client { base_url = base, headers = { Authorization = shapes.AUTHORIZATION },
    on_retry = false }
  return measure(n, function()
    local failed = 0
    rw.run(function()
      for w = 1, conc do
        local count = floor(n / conc) + (w <= n % conc and 1 or 0)
        local path = "/?task=" .. w
        if count > 0 then
          spawn(function()
            local mine = fetch_loop(nil, count, nil, nil, function() return client:get(path) end)
            failed = failed + mine
          end)
        end
      end
    end)
    return failed
  end)
end

-- What most calls to a model's API are: a JSON body POSTed, without an
-- idempotency key (not replay-safe: libcurl must never send it twice).
shapes.POST_PAYLOAD = { model = "bench-model", max_tokens = 16,
  messages = { { role = "user", content = "Say ok." } } }

function shapes.post_json(url, n, conc)
  return shapes.loop(url, n, conc, nil, { on_retry = false, method = "POST", json = shapes.POST_PAYLOAD })
end

-- The floor: the request fetch makes for a GET of `url` with no options
-- (the same bytes on the wire), started again on the engine as each one
-- finishes, `conc` in flight; each response is made as fetch's is (the
-- header table left to be read lazily) and its status checked.
-- Measures n requests of a floor: run(engine, request) -> failures, on a
-- fresh engine (closed after) with the request fetch makes for a GET of
-- url with no options.
local function on_floor(url, n, run)
  local core = require "ratewise.core"
  local engine = core.engine {}
  local request = { url = url, method = "GET", headers = { "User-Agent: ratewise/" .. core.version },
    follow_redirects = true, timeout = 30, transport = false }
  local measured = measure(n, function() return run(engine, request) end)
  engine:close()
  return measured
end

-- 1 for a result that is not a 200 (noted), else 0.
local function floor_failed(res, err)
  if res and res.status == 200 then return 0 end
  note_failure(res, err and err.message)
  return 1
end

function shapes.floor(url, n, conc)
  return on_floor(url, n, function(engine, request)
    local failed, started, finished = 0, 0, 0
    local done = {}
    local function start()
      local transfer, err = engine:start(request)
      if not transfer then error("bench: the engine could not start a transfer: " .. tostring(err), 0) end
      started = started + 1
    end
    for _ = 1, math.min(conc, n) do start() end
    while finished < n do
      local _, k = engine:poll(1, done)
      for i = 1, k do
        local transfer = done[i]
        done[i] = nil
        local res, err = transfer:result(true)
        transfer:close()
        finished = finished + 1
        failed = failed + floor_failed(res, err)
        if started < n then start() end
      end
    end
    return failed
  end)
end

-- The floor with the seam's coroutines: `conc` coroutines, each starting
-- fetch's request on the engine with itself for the owner, yielding until
-- a bare loop on the engine's poll resumes it, then making the response
-- and checking its status. No fetch and no scheduler: what a design that
-- waits by yielding a coroutine per request costs at the least, and so the
-- most any such library's own code can score.
function shapes.floor_tasks(url, n, conc)
  local create, resume, yield, running = coroutine.create, coroutine.resume, coroutine.yield, coroutine.running
  return on_floor(url, n, function(engine, request)
    local failed, finished = 0, 0
    local function worker(count)
      local co = running()
      for _ = 1, count do
        local transfer, err = engine:start(request, co)
        if not transfer then error("bench: the engine could not start a transfer: " .. tostring(err), 0) end
        yield()
        local res, rerr = transfer:result(true, true, true)
        finished = finished + 1
        failed = failed + floor_failed(res, rerr)
      end
    end
    for w = 1, conc do
      local count = floor(n / conc) + (w <= n % conc and 1 or 0)
      if count > 0 then assert(resume(create(worker), count)) end
    end
    local done, owners = {}, {}
    while finished < n do
      local _, k = engine:poll(1, done, nil, owners)
      for i = 1, k do
        local co = owners[i]
        done[i], owners[i] = nil, nil
        local ok, err = resume(co)
        if not ok then error(err, 0) end
      end
    end
    return failed
  end)
end

function shapes.floor_scheduler(url, n, conc)
  local core, runtime, response = require "ratewise.core", require "ratewise.runtime", require "ratewise.response"
  local request = { url = url, method = "GET", headers = { "User-Agent: ratewise/" .. core.version },
    follow_redirects = true, timeout = 30, transport = false }
  local transfer, mt = runtime.transfer, response.mt
  return shapes.loop(url, n, conc, nil, nil, function()
    local res, err = transfer(request, nil, mt)
    return res, err and err.message
  end)
end

-- Every shape `make bench` (run.lua) and `make bench-instructions`
-- (instructions.lua) measure, in their order: its key (BENCH_ONLY's
-- names), the path it fetches, its target (nil: none), the size of each
-- body, its plain contender (plain_curl for sequential; else multi_curl64,
-- with --keep where ratewise keeps every result, --copy where each body
-- is handed over as an owned copy (a Lua string), and --header where it
-- sends shapes.AUTHORIZATION), and ratewise's side: run(base, n, conc),
-- base being the server's URL without a path.
shapes.list = {
  { key = "sequential", path = "/", target = 0.95, plain = "plain_curl",
    run = function(base, n) return shapes.sequential(base .. "/", n) end },
  { key = "loop64", path = "/", target = 0.90,
    run = function(base, n, conc) return shapes.loop(base .. "/", n, conc) end },
  { key = "map_shared", path = "/", target = 0.90, keep = true,
    run = function(base, n, conc) return shapes.map_shared(base .. "/", n, conc) end },
  { key = "map_fresh", path = "/", target = 0.90, keep = true,
    run = function(base, n, conc) return shapes.map_fresh(base .. "/", n, conc) end },
  { key = "map_inherit", path = "/", target = 0.90, keep = true,
    run = function(base, n, conc) return shapes.map_inherit(base .. "/", n, conc) end },
  { key = "headers", path = "/", target = 0.90, header = true,
    run = function(base, n, conc) return shapes.headers(base .. "/", n, conc) end },
  { key = "client", path = "/", target = 0.90, header = true,
    run = function(base, n, conc) return shapes.client(base, "/", n, conc) end },
  { key = "client_paths", path = "/", target = 0.90, header = true, paths = true,
    run = function(base, n, conc) return shapes.client_paths(base, n, conc) end },
  { key = "post_json", path = "/", target = 0.90, post = true,
    run = function(base, n, conc) return shapes.post_json(base .. "/", n, conc) end },
  { key = "body_64k", path = "/body/64k", target = 0.90, size = 65536, copy = true,
    run = function(base, n, conc) return shapes.loop(base .. "/body/64k", n, conc, 65536) end },
  { key = "body_1m", path = "/body/1m", target = 0.90, size = 1048576, copy = true,
    run = function(base, n, conc) return shapes.loop(base .. "/body/1m", n, conc, 1048576) end },
  { key = "floor", path = "/", target = nil,
    run = function(base, n, conc) return shapes.floor(base .. "/", n, conc) end },
  { key = "floor_tasks", path = "/", target = nil,
    run = function(base, n, conc) return shapes.floor_tasks(base .. "/", n, conc) end },
  { key = "floor_scheduler", path = "/", target = nil,
    run = function(base, n, conc) return shapes.floor_scheduler(base .. "/", n, conc) end },
}

-- The targets are per interpreter (issue 30): under PUC Lua (5.1 to 5.4)
-- ratewise's own floor, the scheduler and the seam with no fetch, stays
-- below 0.90 of plain libcurl (bench/README.md), so no shape can be held to
-- 0.90 there; its target
-- is PUC_TARGET. LuaJIT and OpenResty keep each shape's own (0.95 for
-- sequential, 0.90 for the others).
shapes.PUC_TARGET = 0.85

--- target = shapes.target(shape, luajit): shape's target for the
-- interpreter ratewise's side runs on (luajit: LuaJIT or OpenResty), nil
-- for a shape with none.
function shapes.target(shape, luajit)
  if not shape.target or luajit then return shape.target end
  return math.min(shape.target, shapes.PUC_TARGET)
end

--- shape = shapes.find(key): the shape of shapes.list with that key, or nil.
function shapes.find(key)
  for _, shape in ipairs(shapes.list) do
    if shape.key == key then return shape end
  end
  return nil
end

--- flags = shapes.multi_flags(shape, quote): the flags of shape's
-- multi_curl64 contender ("--keep", "--copy", "--header 'Authorization: ...'",
-- "--paths", "--post BODY ..."), or nil for none; quote: the shell quoting
-- of bench/common.lua.
function shapes.multi_flags(shape, quote)
  local flags = {}
  if shape.post then
    -- the bytes fetch sends for POST_PAYLOAD, and the lines it adds for JSON
    local body = require("ratewise.json").encode(shapes.POST_PAYLOAD)
    flags[#flags + 1] = "--post " .. quote(body) .. " --header " .. quote("Content-Type: application/json")
      .. " --header " .. quote("Accept: application/json")
  end
  if shape.keep then flags[#flags + 1] = "--keep" end
  if shape.copy then flags[#flags + 1] = "--copy" end
  if shape.header then flags[#flags + 1] = "--header " .. quote("Authorization: " .. shapes.AUTHORIZATION) end
  if shape.paths then flags[#flags + 1] = "--paths" end
  return flags[1] and table.concat(flags, " ") or nil
end

return shapes
