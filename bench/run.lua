-- `make bench`: keep-alive GETs on loopback against one private nginx
-- (bench/nginx.sh), in the shapes users write (issue 15), each against a
-- plain C libcurl contender doing the same work, in alternating rounds
-- (bench/rounds.lua); ratewise's side of each is in bench/shapes.lua.
--
-- 0. The wire: one request of each contender, captured by a socket server
--    (bench/capture_request.py), must be the same bytes.
-- 1. sequential: rw.fetch in a loop vs the same loop on one reused libcurl
--    easy handle (bench/plain_curl). Target 0.95.
-- 2. loop64: 64 tasks under rw.run looping rw.fetch with one options table
--    vs one libcurl multi handle keeping 64 transfers in flight
--    (bench/multi_curl64); then wrk with as many connections, the limit of
--    the machine, to put the figure in scale. Target 0.90.
-- 3. map_shared: rw.map(urls, function(u) return rw.fetch(u, opts) end,
--    {concurrency = 64}) with one shared opts, vs the same multi keeping
--    every response (status, header block, body) until its clock stops, as
--    rw.map returns every result (multi_curl64 --keep). Target 0.90.
-- 4. map_fresh, map_inherit: the same with a per-call options table, fresh
--    ({ max_elapsed = left, on_retry = false }) or inheriting from a base
--    (setmetatable({ max_elapsed = left }, { __index = base })). Target 0.90.
-- 5. headers, client: 64 tasks looping rw.fetch with an options table that
--    holds an Authorization header, and client:get on an rw.client with it
--    (what most API code writes), vs the same multi sending that line;
--    client_paths: client:get on a client left with its defaults (dedupe
--    on), each task calling a path of its own, vs the multi with a URL per
--    handle (--paths); post_json: rw.fetch POSTing a JSON table (not
--    replay-safe), vs the multi POSTing the same bytes (--post). Target 0.90.
-- 6. body_64k, body_1m: 64 tasks looping rw.fetch on a 64 KiB (1 MiB) body,
--    each body's length read in Lua, vs the multi keeping each body in
--    memory (its bytes are counted and checked) and handing each over as a
--    copy of its own, as rw.fetch hands over a Lua string (--copy).
--    Target 0.90.
-- 7. floor: no shape users write, and no target: the engine driven by a
--    bare Lua loop (no fetch, no tasks), vs the same multi; the share of
--    plain libcurl that the binding of libcurl to Lua leaves to any code
--    above it (bench/shapes.lua). floor_tasks: the same with a coroutine
--    per transfer in flight, yielding until a bare poll loop resumes it:
--    what waiting by yielding costs at the least. floor_scheduler: 64
--    tasks under rw.run looping the seam's transfer, no fetch: the
--    scheduler's cost over floor_tasks, and so fetch's over it.
-- 8. waiters: 10,000 tasks waiting on a bucket, in a fresh process
--    (bench/waiters.lua): resident memory per waiting task, CPU used while
--    they wait, cancel.
-- Then the table of every shape's ratio (the median of the rounds' ratios,
-- and their range) against its target, "target met" or "NOT met". The
-- targets above are LuaJIT's; under PUC Lua each is at most 0.85
-- (shapes.target).
-- A benchmark, not a test: it fails only when a request fails (or a check of
-- part 8 does), not when a ratio misses its target.
--
-- Run from the repository root (the Makefile does), with LUA_PATH/LUA_CPATH
-- pointing at ./lua and ./build. Runs under Lua 5.4 and LuaJIT
-- (`make bench LUA=luajit`, which builds build-luajit/). Knobs (environment):
--   BENCH_REQUESTS       sequential: requests per round and contender (default 20000)
--   BENCH_ROUNDS         sequential: rounds (default 5)
--   BENCH_WARMUP         sequential: warm-up requests per contender (default 2000)
--   BENCH_CONC_REQUESTS  loop64, headers, client*, post_json, floor*: requests per round and contender (default 40000)
--   BENCH_CONC_ROUNDS    loop64, headers, client*, post_json, floor*: rounds (default 5)
--   BENCH_CONC_WARMUP    loop64, headers, client*, post_json, floor*: warm-up requests per contender (default 5000)
--   BENCH_CONCURRENCY    every concurrent shape: transfers in flight, tasks (default 64)
--   BENCH_MAP_REQUESTS   map_*: requests (the list's length) per round and contender (default 40000)
--   BENCH_MAP_ROUNDS     map_*: rounds (default 5)
--   BENCH_MAP_WARMUP     map_*: warm-up requests per contender (default 5000)
--   BENCH_64K_REQUESTS   body_64k: requests per round and contender (default 20000)
--   BENCH_1M_REQUESTS    body_1m: requests per round and contender (default 4000)
--   BENCH_BODY_ROUNDS    body_*: rounds (default 5)
--   BENCH_BODY_WARMUP    body_*: warm-up requests per contender (default: a tenth of a round)
--   BENCH_WRK_SECONDS    wrk's duration (default 3); BENCH_WRK_THREADS its threads (default 1)
--   BENCH_WAITERS        tasks waiting on the bucket (default 10000)
--   BENCH_WAIT_SECONDS   how long they wait while CPU is measured (default 2)
--   BENCH_ONLY           the parts to run, by the names above, comma-separated
--                        (default: all; the wire check always runs)
local rw = require "ratewise"
local common = require "bench.common"
local rounds = require "bench.rounds"
local shapes = require "bench.shapes"

local format = string.format
local env_int, sh_quote, run_cmd, capture = common.env_int, common.sh_quote, common.run_cmd, common.capture
local N = env_int("BENCH_REQUESTS", 20000)
local ROUNDS = env_int("BENCH_ROUNDS", 5)
local WARMUP = env_int("BENCH_WARMUP", 2000)
local CONC_N = env_int("BENCH_CONC_REQUESTS", 40000)
local CONC_ROUNDS = env_int("BENCH_CONC_ROUNDS", 5)
local CONC_WARMUP = env_int("BENCH_CONC_WARMUP", 5000)
local CONC = env_int("BENCH_CONCURRENCY", 64)
local MAP_N = env_int("BENCH_MAP_REQUESTS", 40000)
local MAP_ROUNDS = env_int("BENCH_MAP_ROUNDS", 5)
local MAP_WARMUP = env_int("BENCH_MAP_WARMUP", 5000)
local N_64K = env_int("BENCH_64K_REQUESTS", 20000)
local N_1M = env_int("BENCH_1M_REQUESTS", 4000)
local BODY_ROUNDS = env_int("BENCH_BODY_ROUNDS", 5)
local BODY_WARMUP = env_int("BENCH_BODY_WARMUP", nil)
local WRK_SECONDS = env_int("BENCH_WRK_SECONDS", 3)
local WRK_THREADS = env_int("BENCH_WRK_THREADS", 1)
local WAITERS = env_int("BENCH_WAITERS", 10000)
local WAIT_SECONDS = env_int("BENCH_WAIT_SECONDS", 2)

local wanted = common.only()

local here = common.here
local NGINX_SH = here .. "/nginx.sh"
local MULTI = common.MULTI
local WAITERS_LUA = here .. "/waiters.lua"
-- The interpreter running this script, for the fresh process of the waiters part.
local LUA = common.lua

---------------------------------------------------------------------------
-- The plain C contenders

local agent = common.agent() -- what rw.fetch sends as User-Agent


-- A full collection before each of ratewise's runs (see rounds.compare).
local function collect()
  collectgarbage("collect")
  collectgarbage("collect")
end

---------------------------------------------------------------------------
-- 0. The wire

-- One request of each contender to capture_request.py (common.check_wire):
-- the same bytes, or the ratios compare unlike work.
local function check_wire()
  local function c_run(cmd) return function(url) run_cmd(format(cmd, sh_quote(url), sh_quote(agent))) end end
  common.check_wire { contenders = {
    { "plain_curl", c_run(sh_quote(common.PLAIN) .. " %s 1 %s") },
    { "multi_curl64", c_run(sh_quote(MULTI) .. " %s 1 1 %s") },
    { "rw.fetch", function(url) rw.fetch(url, { on_retry = false }) end },
    { "floor", function(url) shapes.floor(url, 1, 1) end },
  } }
  -- and with the header of the headers and client shapes
  local line = "Authorization: " .. shapes.AUTHORIZATION
  common.check_wire { label = "with a header", contenders = {
    { "multi_curl64", c_run(sh_quote(MULTI) .. " --header " .. sh_quote(line) .. " %s 1 1 %s") },
    { "rw.fetch", function(url)
      rw.fetch(url, { on_retry = false, headers = { Authorization = shapes.AUTHORIZATION } })
    end },
    { "client:get", function(url)
      rw.client({ base_url = url, headers = { Authorization = shapes.AUTHORIZATION }, on_retry = false }):get("/")
    end },
  } }
end

---------------------------------------------------------------------------
-- wrk, to put the 64-task figure in scale

-- wrk's rate (installed from Debian when missing) and a note on its
-- errors, or nil and why there is no figure.
local function run_wrk(url, conc)
  local ok, why = common.ensure_command("wrk")
  if not ok then return nil, why end
  local out, exited = run_cmd(format("wrk -t%d -c%d -d%ds %s 2>&1",
    math.min(WRK_THREADS, conc), conc, WRK_SECONDS, sh_quote(url)))
  local rate = tonumber(out:match("Requests/sec:%s*([%d.]+)"))
  if not exited or not rate then return nil, "wrk failed: " .. out end
  local errors = {}
  local non2xx = out:match("Non%-2xx or 3xx responses:%s*(%d+)")
  if non2xx then errors[#errors + 1] = non2xx .. " non-2xx/3xx" end
  local sock = out:match("Socket errors:%s*([^\n]+)")
  if sock then errors[#errors + 1] = "socket errors: " .. sock end
  return rate, #errors > 0 and table.concat(errors, "; ") or nil
end

---------------------------------------------------------------------------
-- 7. Waiting tasks, in a fresh interpreter; returns its key=value pairs.

local WAITER_TARGET = 2048 -- bytes of resident memory per waiting task

local function run_waiters()
  local out, ok = run_cmd(format("%s %s %d %d", sh_quote(LUA), sh_quote(WAITERS_LUA), WAITERS, WAIT_SECONDS))
  local r = {}
  for k, v in out:gmatch("([%w_]+)=([%d.]+)") do r[k] = tonumber(v) end
  if not r.rss_per_task then error("waiters.lua printed no figures: " .. out, 0) end
  r.ok = ok
  return r
end

local function line(label, fmt, ...)
  io.write(format("  %-48s " .. fmt .. "\n", label, ...))
end

local function report_waiters(w)
  io.write(format("%s tasks waiting on a bucket\n", rounds.thousands(WAITERS)))
  line("resident memory per waiting task", "%4.0f B (target < %d: %s); Lua heap %.0f B",
    w.rss_per_task, WAITER_TARGET, w.rss_per_task < WAITER_TARGET and "target met" or "NOT met",
    w.heap_per_task)
  line(format("CPU while they wait %d s", WAIT_SECONDS), "%.3f s (%.1f %%)",
    w.wait_cpu_s, 100 * w.wait_cpu_s / w.wait_s)
  line("start them waiting / cancel them all", "%.3f s / %.3f s; live tasks after cancel: %d",
    w.start_s, w.cancel_s, w.live_after_cancel)
end

---------------------------------------------------------------------------
-- The shapes

-- What run.lua adds to each shape of shapes.list: the words of its row,
-- and its knobs (requests a round, rounds, warm-up).
local function shape_list(base)
  local knobs = {
    sequential = { n = N, rounds = ROUNDS, warmup = WARMUP },
    concurrent = { n = CONC_N, rounds = CONC_ROUNDS, warmup = CONC_WARMUP },
    map = { n = MAP_N, rounds = MAP_ROUNDS, warmup = MAP_WARMUP },
    body_64k = { n = N_64K, rounds = BODY_ROUNDS, warmup = BODY_WARMUP or math.ceil(N_64K / 10) },
    body_1m = { n = N_1M, rounds = BODY_ROUNDS, warmup = BODY_WARMUP or math.ceil(N_1M / 10) },
  }
  local rows_of = {
    sequential = { "sequential: rw.fetch / one easy handle", knobs.sequential },
    loop64 = { format("%d tasks looping rw.fetch / multi", CONC), knobs.concurrent },
    map_shared = { "rw.map, shared opts / multi", knobs.map },
    map_fresh = { "rw.map, fresh opts per call / multi", knobs.map },
    map_inherit = { "rw.map, opts per call via __index / multi", knobs.map },
    headers = { format("%d tasks, rw.fetch with a header / multi", CONC), knobs.concurrent },
    client = { format("%d tasks, client:get with a header / multi", CONC), knobs.concurrent },
    client_paths = { format("%d tasks, client:get, a path each / multi", CONC), knobs.concurrent },
    post_json = { format("%d tasks, rw.fetch POSTing JSON / multi", CONC), knobs.concurrent },
    body_64k = { format("%d tasks, 64 KiB bodies / multi", CONC), knobs.body_64k },
    body_1m = { format("%d tasks, 1 MiB bodies / multi", CONC), knobs.body_1m },
    floor = { format("floor: %d on the engine, bare loop / multi", CONC), knobs.concurrent },
    floor_tasks = { format("floor: %d coroutines on the engine / multi", CONC), knobs.concurrent },
    floor_scheduler = { format("floor: %d tasks, the seam without fetch / multi", CONC), knobs.concurrent },
  }
  local list = {}
  for _, shape in ipairs(shapes.list) do
    local name, k = rows_of[shape.key][1], rows_of[shape.key][2]
    local url = base .. shape.path
    local plain
    if shape.plain == "plain_curl" then
      plain = function(n) return common.run_plain(url, n) end
    else
      local flags = shapes.multi_flags(shape, sh_quote)
      plain = function(n) return common.run_multi(url, n, CONC, { size = shape.size, flags = flags }) end
    end
    list[#list + 1] = { key = shape.key, name = name, n = k.n, rounds = k.rounds, warmup = k.warmup,
      target = shapes.target(shape, rawget(_G, "jit") ~= nil), plain = plain,
      ours = function(n) return shape.run(base, n, CONC) end }
  end
  return list
end

local rows, failed_requests = {}, 0
local waiters_ok = true

local function bench(port)
  local base = format("http://127.0.0.1:%d", port)
  local jit = rawget(_G, "jit")
  io.write(format("nginx on 127.0.0.1:%d; ratewise %s on %s; %s; %d in flight\n", port, rw._VERSION,
    jit and jit.version or _VERSION, require("ratewise.core").curl_version or "libcurl", CONC))
  check_wire()
  local wrk_rate, wrk_note
  for _, shape in ipairs(shape_list(base)) do
    if wanted(shape.key) then
      local row = rounds.compare(shape, collect)
      rows[#rows + 1] = row
      failed_requests = failed_requests + row.plain_failed + row.our_failed
      if shape.key == "loop64" then
        wrk_rate, wrk_note = run_wrk(base .. "/", CONC)
        row.wrk = wrk_rate
      end
    end
  end
  local w
  if wanted("waiters") then
    w = run_waiters()
    waiters_ok = w.ok
  end

  io.write("\n")
  rounds.report(rows)
  for _, row in ipairs(rows) do
    if row.shape.key == "loop64" then
      local wrk_label = format("wrk -t%d -c%d -d%ds", math.min(WRK_THREADS, CONC), CONC, WRK_SECONDS)
      if wrk_rate then
        line(wrk_label, "%6.0f req/s; ratewise's 64 tasks at %.2f of it%s", wrk_rate, row.ours / wrk_rate,
          wrk_note and (" (wrk: " .. wrk_note .. ")") or "")
      else
        line(wrk_label, "no figure: %s", tostring(wrk_note))
      end
    end
  end
  for _, row in ipairs(rows) do
    line(format("failures, %s", row.shape.key), "rw.fetch %d of %d, plain %d of %d",
      row.our_failed, row.requests, row.plain_failed, row.requests)
  end
  if w then report_waiters(w) end
end

local dir = capture("mktemp -d -t ratewise-bench.XXXXXX")
local ok, err = xpcall(function()
  local port = tonumber(capture(format("bash %s start %s", sh_quote(NGINX_SH), sh_quote(dir))))
  if not port then error("nginx.sh start printed no port", 0) end
  bench(port)
end, debug.traceback)
-- Stopped whatever happened above (an error, a failed request, ^C).
os.execute(format("bash %s stop %s", sh_quote(NGINX_SH), sh_quote(dir)))
os.execute("rm -rf " .. sh_quote(dir))

if not waiters_ok then io.stderr:write("bench: the waiting-tasks check failed (see above)\n") end
common.exit_on_failure(ok, err, failed_requests)
if not waiters_ok then os.exit(1) end
