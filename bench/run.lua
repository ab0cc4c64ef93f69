-- `make bench`: keep-alive GETs on loopback against one private nginx.
--
-- 1. Sequential: ratewise's rw.fetch against the same loop in plain C with
--    libcurl (bench/plain_curl), in alternating rounds.
-- 2. Concurrent: 64 ratewise tasks of rw.fetch (under rw.run) against one
--    libcurl multi handle keeping 64 transfers in flight (bench/multi_curl64),
--    in alternating rounds; then wrk with as many connections, the limit of
--    the machine, to put the figure in scale.
-- 3. 10,000 tasks waiting on a bucket, in a fresh process (bench/waiters.lua):
--    resident memory per waiting task, CPU used while they wait, cancel.
-- A benchmark, not a test: it fails only when a request fails (or a check of
-- part 3 does), not when a ratio misses its target.
--
-- Run from the repository root (the Makefile does), with LUA_PATH/LUA_CPATH
-- pointing at ./lua and ./build. Knobs (environment):
--   BENCH_REQUESTS       sequential: requests per round and contender (default 20000)
--   BENCH_ROUNDS         sequential: rounds (default 5)
--   BENCH_WARMUP         sequential: warm-up requests per contender (default 2000)
--   BENCH_CONC_REQUESTS  concurrent: requests per round and contender (default 40000)
--   BENCH_CONC_ROUNDS    concurrent: rounds (default 5)
--   BENCH_CONC_WARMUP    concurrent: warm-up requests per contender (default 5000)
--   BENCH_CONCURRENCY    concurrent: transfers in flight, tasks (default 64)
--   BENCH_WRK_SECONDS    wrk's duration (default 3); BENCH_WRK_THREADS its threads (default 1)
--   BENCH_WAITERS        tasks waiting on the bucket (default 10000)
--   BENCH_WAIT_SECONDS   how long they wait while CPU is measured (default 2)
local rw = require "ratewise"

local TARGET = 0.90      -- sequential ratio ratewise / plain libcurl
local CONC_TARGET = 0.85 -- concurrent ratio ratewise / plain libcurl multi (the seam issue's target)
local WAITER_TARGET = 2048 -- bytes of resident memory per waiting task
local function env_int(name, default)
  local v = tonumber(os.getenv(name) or "")
  if v and v >= 1 and v % 1 == 0 then return math.tointeger(v) end
  return default
end
local N = env_int("BENCH_REQUESTS", 20000)
local ROUNDS = env_int("BENCH_ROUNDS", 5)
local WARMUP = env_int("BENCH_WARMUP", 2000)
local CONC_N = env_int("BENCH_CONC_REQUESTS", 40000)
local CONC_ROUNDS = env_int("BENCH_CONC_ROUNDS", 5)
local CONC_WARMUP = env_int("BENCH_CONC_WARMUP", 5000)
local CONC = env_int("BENCH_CONCURRENCY", 64)
local WRK_SECONDS = env_int("BENCH_WRK_SECONDS", 3)
local WRK_THREADS = env_int("BENCH_WRK_THREADS", 1)
local WAITERS = env_int("BENCH_WAITERS", 10000)
local WAIT_SECONDS = env_int("BENCH_WAIT_SECONDS", 2)

local here = (arg and arg[0] or "bench/run.lua"):match("^(.*)/[^/]*$") or "."
local NGINX_SH = here .. "/nginx.sh"
local PLAIN = here .. "/plain_curl"
local MULTI = here .. "/multi_curl64"
local WAITERS_LUA = here .. "/waiters.lua"
-- The interpreter running this script (the lowest index of arg), for the
-- fresh process of part 3.
local LUA = "lua5.4"
if arg then
  local i = -1
  while arg[i] do
    LUA = arg[i]
    i = i - 1
  end
end

local format = string.format

local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- Runs a command, returns its standard output (trimmed), and whether it
-- exited with status 0.
local function run_cmd(cmd)
  local p = assert(io.popen(cmd, "r"))
  local out = p:read("*a")
  local ok, how, code = p:close()
  return (out:gsub("%s+$", "")), ok, how, code
end

-- Runs a command, returns its standard output (trimmed) or raises.
local function capture(cmd)
  local out, ok, how, code = run_cmd(cmd)
  if not ok then
    error(format("command failed (%s %s): %s", tostring(how), tostring(code), cmd), 0)
  end
  return out
end

local function median(t)
  local s = {}
  for i, v in ipairs(t) do s[i] = v end
  table.sort(s)
  local n = #s
  if n % 2 == 1 then return s[(n + 1) // 2] end
  return (s[n // 2] + s[n // 2 + 1]) / 2
end

---------------------------------------------------------------------------
-- The contenders

local agent = "ratewise/" .. rw._VERSION -- what rw.fetch sends as User-Agent

local function run_plain(url, n)
  local out = capture(format("%s %s %d %s", sh_quote(PLAIN), sh_quote(url), n, sh_quote(agent)))
  local rate = tonumber(out:match("rate=([%d.]+)"))
  if not rate then error("plain_curl printed no rate: " .. out, 0) end
  return rate
end

-- One libcurl multi handle, `conc` transfers in flight. It counts the
-- transfers that did not end in a 200 (and then exits 1): those are added
-- to plain_failures, not raised, so that the run goes on to report them.
-- Returns the rate, the failures and the CPU microseconds per request.
local plain_failures = 0
local function run_multi(url, n, conc)
  local out = run_cmd(format("%s %s %d %d %s", sh_quote(MULTI), sh_quote(url), n, conc, sh_quote(agent)))
  local rate = tonumber(out:match("rate=([%d.]+)"))
  local failed = tonumber(out:match("failures=(%d+)"))
  if not rate or not failed then error("multi_curl64 printed no rate: " .. out, 0) end
  plain_failures = plain_failures + failed
  return rate, failed, tonumber(out:match("cpu_us=([%d.]+)"))
end

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

local failures, shown = 0, {}
local function note_failure(res, err)
  local why = res and ("status " .. tostring(res.status)) or tostring(err)
  if not shown[why] then
    shown[why] = true
    io.stderr:write("rw.fetch failed: ", why, "\n")
  end
end

-- `count` keep-alive GETs through rw.fetch; returns how many failed.
local function fetch_loop(url, count)
  local fetch, opts, failed = rw.fetch, { on_retry = false }, 0
  for _ = 1, count do
    local res, err = fetch(url, opts)
    if not res or res.status ~= 200 then
      failed = failed + 1
      note_failure(res, err)
    end
  end
  return failed
end

local function run_ratewise(url, n)
  local now = rw.now
  local t0 = now()
  local failed = fetch_loop(url, n)
  local secs = now() - t0
  failures = failures + failed
  return n / secs, failed
end

-- `conc` tasks under rw.run, each looping over its share of the n fetches;
-- their transfers share the scheduler's one libcurl multi handle. Returns
-- the rate, the failures, CPU microseconds and minor page faults per request.
local conc_failures = 0
local function run_ratewise_concurrent(url, n, conc)
  local now, spawn = rw.now, rw.spawn
  local failed = 0
  local function worker(count)
    failed = failed + fetch_loop(url, count)
  end
  local f0, c0, t0 = minor_faults(), os.clock(), now()
  rw.run(function()
    for w = 1, conc do
      local count = n // conc + (w <= n % conc and 1 or 0)
      if count > 0 then spawn(worker, count) end
    end
  end)
  local secs, cpu, f1 = now() - t0, os.clock() - c0, minor_faults()
  conc_failures = conc_failures + failed
  return n / secs, failed, cpu * 1e6 / n, f0 and f1 and (f1 - f0) / n
end

-- wrk, installed from Debian when missing (as root). Returns its rate and
-- a note on errors, or nil and why there is no figure.
local function ensure_wrk()
  if os.execute("command -v wrk >/dev/null 2>&1") then return true end
  if capture("id -u") ~= "0" then return nil, "wrk is not installed and installing it needs root" end
  io.write("installing wrk (apt-get install -y wrk)\n")
  io.flush()
  os.execute("{ export DEBIAN_FRONTEND=noninteractive; apt-get install -y -qq wrk"
    .. " || { apt-get update -qq && apt-get install -y -qq wrk; }; } >/dev/null 2>&1")
  if os.execute("command -v wrk >/dev/null 2>&1") then return true end
  return nil, "apt-get install wrk failed"
end

local function run_wrk(url, conc)
  local ok, why = ensure_wrk()
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

-- Part 3, in a fresh interpreter; returns its key=value pairs.
local function run_waiters()
  local out, ok = run_cmd(format("%s %s %d %d", sh_quote(LUA), sh_quote(WAITERS_LUA), WAITERS, WAIT_SECONDS))
  local r = {}
  for k, v in out:gmatch("([%w_]+)=([%d.]+)") do r[k] = tonumber(v) end
  if not r.rss_per_task then error("waiters.lua printed no figures: " .. out, 0) end
  r.ok = ok
  return r
end

---------------------------------------------------------------------------
-- The run

local function sequential(url)
  -- Warm-up: connection, caches, CPU frequency; results thrown away.
  run_plain(url, WARMUP)
  run_ratewise(url, WARMUP)

  local plain, ours = {}, {}
  for r = 1, ROUNDS do
    -- Alternate which contender goes first, so drift hits both alike.
    if r % 2 == 1 then
      plain[r] = run_plain(url, N)
      ours[r] = run_ratewise(url, N)
    else
      ours[r] = run_ratewise(url, N)
      plain[r] = run_plain(url, N)
    end
    io.write(format("  round %d: plain libcurl %8.0f req/s, ratewise %8.0f req/s, ratio %.3f\n",
      r, plain[r], ours[r], ours[r] / plain[r]))
    io.flush()
  end

  local mp, mo = median(plain), median(ours)
  local ratio = mo / mp
  io.write(format("sequential keep-alive GET, loopback nginx, %d requests x %d rounds\n", N, ROUNDS))
  io.write(format("  plain libcurl (easy handle reused)   %6.0f req/s\n", mp))
  io.write(format("  ratewise rw.fetch                    %6.0f req/s\n", mo))
  io.write(format("  ratio ratewise / libcurl             %.2f   (target >= %.2f%s)\n",
    ratio, TARGET, ratio >= TARGET and "" or ", NOT met"))
  local ratios = {}
  for r = 1, ROUNDS do ratios[r] = ours[r] / plain[r] end
  -- Each round's two runs are back to back, so this one shrugs off the
  -- machine's drift better than the ratio of the medians above.
  io.write(format("  ratio, median of the per-round ones  %.2f\n", median(ratios)))
  io.write(format("  rw.fetch failures                    %d of %d\n",
    failures, (ROUNDS * N) + WARMUP))
  io.flush()
end

local function concurrent(url)
  io.write(format("concurrent keep-alive GET, %d in flight: rounds\n", CONC))
  run_multi(url, CONC_WARMUP, CONC)
  run_ratewise_concurrent(url, CONC_WARMUP, CONC)
  local plain, ours, ratios, plain_cpus, our_cpus, our_faults = {}, {}, {}, {}, {}, {}
  for r = 1, CONC_ROUNDS do
    local plain_cpu, our_cpu, faults, _
    if r % 2 == 1 then
      plain[r], _, plain_cpu = run_multi(url, CONC_N, CONC)
      ours[r], _, our_cpu, faults = run_ratewise_concurrent(url, CONC_N, CONC)
    else
      ours[r], _, our_cpu, faults = run_ratewise_concurrent(url, CONC_N, CONC)
      plain[r], _, plain_cpu = run_multi(url, CONC_N, CONC)
    end
    ratios[r] = ours[r] / plain[r]
    -- CPU per request tells the contenders' own cost from the machine's
    -- noise; page faults show glibc trimming the heap's top and growing it
    -- again (what libcurl's 16 KiB receive buffer per transfer caused
    -- before the engine sized it to the responses, see src/engine.c).
    plain_cpus[r], our_cpus[r], our_faults[r] = plain_cpu or 0 / 0, our_cpu, faults or 0 / 0
    io.write(format("  round %d: libcurl multi %6.0f req/s, %4.1f us CPU/req | ratewise %6.0f req/s, "
      .. "%4.1f us CPU/req, %.2f page faults/req | ratio %.3f\n",
      r, plain[r], plain_cpus[r], ours[r], our_cpus[r], our_faults[r], ratios[r]))
    io.flush()
  end
  local wrk_rate, wrk_note = run_wrk(url, CONC)
  return { plain = median(plain), ours = median(ours), ratio_rounds = median(ratios),
    plain_cpu = median(plain_cpus), our_cpu = median(our_cpus), our_faults = median(our_faults),
    wrk = wrk_rate, wrk_note = wrk_note }
end

-- 10000 -> "10,000"
local function thousands(n)
  local s = tostring(n)
  repeat
    local k
    s, k = s:gsub("^(%d+)(%d%d%d)", "%1,%2")
  until k == 0
  return s
end

local function line(label, fmt, ...)
  io.write(format("  %-40s " .. fmt .. "\n", label, ...))
end

local function report(c, w)
  local ratio = c.ours / c.plain
  io.write(format("concurrent keep-alive GET, %d in flight, loopback nginx, %d requests x %d rounds\n",
    CONC, CONC_N, CONC_ROUNDS))
  line(format("plain libcurl multi (%d easy handles)", CONC), "%6.0f req/s", c.plain)
  line(format("ratewise, %d tasks of rw.fetch", CONC), "%6.0f req/s", c.ours)
  line("ratio ratewise / libcurl multi", "%.2f   (target >= %.2f%s)",
    ratio, CONC_TARGET, ratio >= CONC_TARGET and "" or ", NOT met")
  line("ratio, median of the per-round ones", "%.2f", c.ratio_rounds)
  line("CPU per request, libcurl multi / rw", "%.1f us / %.1f us (ratewise: %.2f page faults/req)",
    c.plain_cpu, c.our_cpu, c.our_faults)
  local wrk_label = format("wrk -t%d -c%d -d%ds", math.min(WRK_THREADS, CONC), CONC, WRK_SECONDS)
  if c.wrk then
    line(wrk_label, "%6.0f req/s; ratewise at %.2f of it%s", c.wrk, c.ours / c.wrk,
      c.wrk_note and (" (wrk: " .. c.wrk_note .. ")") or "")
  else
    line(wrk_label, "no figure: %s", tostring(c.wrk_note))
  end
  local total = CONC_ROUNDS * CONC_N + CONC_WARMUP
  line("failures (status not 200, or errors)", "rw.fetch %d of %d, libcurl multi %d of %d",
    conc_failures, total, plain_failures, total)
  io.write(format("%s tasks waiting on a bucket\n", thousands(WAITERS)))
  line("resident memory per waiting task", "%4.0f B (target < %d%s); Lua heap %.0f B",
    w.rss_per_task, WAITER_TARGET, w.rss_per_task < WAITER_TARGET and "" or ", NOT met", w.heap_per_task)
  line(format("CPU while they wait %d s", WAIT_SECONDS), "%.3f s (%.1f %%)",
    w.wait_cpu_s, 100 * w.wait_cpu_s / w.wait_s)
  line("start them waiting / cancel them all", "%.3f s / %.3f s; live tasks after cancel: %d",
    w.start_s, w.cancel_s, w.live_after_cancel)
end

local waiters_ok = true
local function bench(port)
  local url = format("http://127.0.0.1:%d/", port)
  io.write(format("nginx on 127.0.0.1:%d; ratewise %s; %s\n", port, rw._VERSION,
    require("ratewise.core").curl_version or "libcurl"))
  sequential(url)
  local c = concurrent(url)
  local w = run_waiters()
  waiters_ok = w.ok
  report(c, w)
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

if not ok then
  io.stderr:write("bench failed: ", tostring(err), "\n")
  os.exit(1)
end
local bad = false
if failures > 0 then
  io.stderr:write(format("bench: %d sequential rw.fetch call(s) did not return status 200\n", failures))
  bad = true
end
if conc_failures > 0 or plain_failures > 0 then
  io.stderr:write(format("bench: concurrent requests that did not return status 200: rw.fetch %d, libcurl multi %d\n",
    conc_failures, plain_failures))
  bad = true
end
if not waiters_ok then
  io.stderr:write("bench: the waiting-tasks check failed (see above)\n")
  bad = true
end
if bad then os.exit(1) end
