-- `make bench-peers`: ratewise against what users of other languages write
-- to call a rate-limited API, on one private loopback nginx answering "ok"
-- (bench/nginx.sh), in wall time. The contenders, each a program of its own
-- in bench/peers/ with the same command line (URL N CONC WARMUP) and the
-- same one-line answer (rate=.. failed=.. cpu_us=..):
--   ratewise  rw.fetch(url) with its defaults (ratewise_peer.lua, this Lua)
--   undici    Node's undici request() on one Agent, in p-retry (undici_peer.mjs)
--   httpx     Python's httpx in tenacity (httpx_peer.py, Debian's python3)
--   curl      plain libcurl, no retry layer: one multi handle keeping CONC
--             transfers in flight (bench/multi_curl64 --warmup)
-- Two shapes: sequential (one call at a time, CONC 1) and loop64 (CONC
-- calls in flight, each contender's workers looping over their share).
-- Every run of every contender makes the same N calls of the same URL
-- after the same WARMUP calls in its own fresh process. The runs are
-- interleaved: each round runs every contender once, and the order turns
-- by one from a round to the next, so that what else the machine does
-- falls on all of them alike. Per shape: each contender's median rate and
-- CPU per request, and ratewise / peer, the median of the rounds' ratios
-- and their range. A failed call, on any side, fails the run (exit 1). A
-- peer that is not installed is reported as not run, never given a figure.
--
-- Run from the repository root (the Makefile does), with LUA_PATH and
-- LUA_CPATH pointing at ./lua and ./build. Knobs (environment):
--   BENCH_PEERS_N        calls per run (default 10000)
--   BENCH_PEERS_WARMUP   warm-up calls per run, off the clock (default N / 10)
--   BENCH_PEERS_ROUNDS   rounds per shape (default 5)
--   BENCH_PEERS_CONC     calls in flight in loop64 (default 64)
--   BENCH_PEERS_PIN      which shapes run pinned, nginx's worker on CPU 0 and
--                        every contender on CPU 1 (2 cores or more):
--                        sequential (default), all or none
--   BENCH_ONLY           shapes (sequential, loop64) and peers (undici,
--                        httpx, curl) to run, comma-separated; ratewise
--                        always runs (default: all)
local common = require "bench.common"
local median, thousands = require("bench.rounds").median, require("bench.rounds").thousands

local format = string.format
local env_int, sh_quote, run_cmd, capture = common.env_int, common.sh_quote, common.run_cmd, common.capture

local N = env_int("BENCH_PEERS_N", 10000)
local WARMUP = env_int("BENCH_PEERS_WARMUP", math.ceil(N / 10))
local ROUNDS = env_int("BENCH_PEERS_ROUNDS", 5)
local CONC = env_int("BENCH_PEERS_CONC", 64)
local PEERS_DIR = common.here .. "/peers"
local PYTHON = "/usr/bin/python3"

local SHAPES = {
  { key = "sequential", conc = 1, label = "sequential: one call at a time" },
  { key = "loop64", conc = CONC, label = format("loop64: %d calls in flight", CONC) },
}

-- BENCH_ONLY names shapes, peers or both; what it leaves unnamed of a
-- kind it names nothing of runs in full.
local function selection()
  local named = {}
  for name in (os.getenv("BENCH_ONLY") or ""):gmatch("[^,%s]+") do named[name] = true end
  local function pick(keys)
    local any = false
    for _, k in ipairs(keys) do any = any or named[k] == true end
    return function(k) return not any or named[k] == true end
  end
  return pick { "sequential", "loop64" }, pick { "undici", "httpx", "curl" }
end
local shape_wanted, peer_wanted = selection()

---------------------------------------------------------------------------
-- The contenders: how to run one, and whether it is here at all

local function out_of(cmd)
  local out, ok = run_cmd(cmd .. " 2>&1")
  return ok and out or nil, out
end

-- A measure from a peer's one line, or a failed one.
local function parse(name, out, ok)
  local rate = tonumber(out:match("rate=([%d.]+)"))
  local failed = tonumber(out:match("failed=(%d+)"))
  if not rate or not failed then
    io.stderr:write(format("%s printed no rate: %s\n", name, out))
    return { rate = 0, failed = 1 }
  end
  if not ok and failed == 0 then failed = 1 end
  return { rate = rate, failed = failed, cpu_us = tonumber(out:match("cpu_us=([%d.]+)")) }
end

local CONTENDERS = {
  { key = "ratewise",
    present = function()
      local rw = require "ratewise"
      local jit = rawget(_G, "jit")
      return format("ratewise %s on %s, %s", rw._VERSION, jit and jit.version or _VERSION,
        (require("ratewise.core").curl_version or "libcurl"):match("^%S+"))
    end,
    run = function(url, n, conc)
      local out, ok = run_cmd(format("%s %s %s %d %d %d", sh_quote(common.lua),
        sh_quote(PEERS_DIR .. "/ratewise_peer.lua"), sh_quote(url), n, conc, WARMUP))
      return parse("ratewise_peer.lua", out, ok)
    end },
  { key = "undici",
    present = function()
      if not out_of("command -v node") then return nil, "node is not installed" end
      -- Imported as the peer imports them; their versions read from their
      -- package.json files (p-retry's exports do not include it).
      local probe = "await import('undici'); await import('p-retry'); const fs = await import('node:fs');"
        .. " const v = (p) => JSON.parse(fs.readFileSync('node_modules/' + p + '/package.json')).version;"
        .. " console.log(process.version, v('undici'), v('p-retry'))"
      local out, why = out_of(format("cd %s && node --input-type=module -e %s", sh_quote(PEERS_DIR), sh_quote(probe)))
      if not out then
        return nil, "undici or p-retry is missing (npm ci in bench/peers): " .. (why:match("[^\n]*Error[^\n]*")
          or why:sub(1, 200))
      end
      local node, undici, pretry = out:match("(%S+) (%S+) (%S+)")
      return format("Node %s, undici %s, p-retry %s", node, undici, pretry)
    end,
    run = function(url, n, conc)
      local out, ok = run_cmd(format("node %s %s %d %d %d", sh_quote(PEERS_DIR .. "/undici_peer.mjs"),
        sh_quote(url), n, conc, WARMUP))
      return parse("undici_peer.mjs", out, ok)
    end },
  { key = "httpx",
    present = function()
      local out, why = out_of(PYTHON .. [[ -c 'import sys, httpx, importlib.metadata as m;]]
        .. [[ print(sys.version.split()[0], httpx.__version__, m.version("tenacity"))']])
      if not out then
        return nil, "Debian's python3-httpx or python3-tenacity is missing (apt-get install python3-httpx"
          .. " python3-tenacity): " .. why
      end
      local python, httpx, tenacity = out:match("(%S+) (%S+) (%S+)")
      return format("Python %s, httpx %s, tenacity %s", python, httpx, tenacity)
    end,
    run = function(url, n, conc)
      local out, ok = run_cmd(format("%s %s %s %d %d %d", PYTHON, sh_quote(PEERS_DIR .. "/httpx_peer.py"),
        sh_quote(url), n, conc, WARMUP))
      return parse("httpx_peer.py", out, ok)
    end },
  { key = "curl",
    present = function()
      if not out_of("test -x " .. sh_quote(common.MULTI)) then
        return nil, common.MULTI .. " is not built (make -C bench)"
      end
      return "plain libcurl, no retry layer (bench/multi_curl64)"
    end,
    run = function(url, n, conc)
      local m = common.run_multi(url, n, conc, { size = 2, flags = "--warmup " .. WARMUP })
      return { rate = m.rate, failed = m.failed, cpu_us = m.cpu_us }
    end },
}

---------------------------------------------------------------------------
-- The rounds

-- Runs one shape's rounds; returns { [key] = { rates, cpus, ratios, failed } }.
local function run_shape(shape, url, here, placed)
  io.write(format("\n%s: %s calls after %s warm-up, %d rounds; %s\n", shape.label, thousands(N),
    thousands(WARMUP), ROUNDS, placed))
  local got = {}
  for _, c in ipairs(here) do got[c.key] = { rates = {}, cpus = {}, ratios = {}, failed = 0 } end
  for r = 1, ROUNDS do
    local line = {}
    for i = 1, #here do
      local c = here[(i + r - 2) % #here + 1]
      local m = c.run(url, N, shape.conc)
      local g = got[c.key]
      g.failed = g.failed + m.failed
      g.rates[r], g.cpus[#g.cpus + 1] = m.rate, m.cpu_us
      line[#line + 1] = format("%s %s", c.key, thousands(m.rate))
    end
    local ours = got.ratewise.rates[r]
    for _, c in ipairs(here) do
      if c.key ~= "ratewise" then
        local g = got[c.key]
        g.ratios[r] = ours / g.rates[r]
      end
    end
    io.write(format("  round %d: %s req/s\n", r, table.concat(line, ", ")))
    io.flush()
  end
  return got
end

local function range(t)
  local low, high = math.huge, -math.huge
  for _, v in ipairs(t) do
    if v < low then low = v end
    if v > high then high = v end
  end
  return low, high
end

local function report(result, here)
  local got = result.got
  io.write(format("%s; %s\n", result.shape.label, result.placed))
  io.write(format("  %-9s %9s  %-19s %11s  %-24s %s\n", "", "req/s", "(rounds)", "us CPU/req",
    "ratewise/peer (rounds)", "failed"))
  for _, c in ipairs(here) do
    local g = got[c.key]
    local low, high = range(g.rates)
    local ratio = "-"
    if c.key ~= "ratewise" then
      local rlow, rhigh = range(g.ratios)
      ratio = format("%.2f (%.2f - %.2f)", median(g.ratios), rlow, rhigh)
    end
    io.write(format("  %-9s %9s  %-19s %11s  %-24s %d of %s\n", c.key, thousands(median(g.rates)),
      format("(%s - %s)", thousands(low), thousands(high)),
      #g.cpus > 0 and format("%.1f", median(g.cpus)) or "-", ratio, g.failed,
      thousands(ROUNDS * (N + WARMUP))))
  end
end

local failed = 0

-- Where the processes run. Unpinned, a client and nginx that take turns
-- (the sequential shape) share one core in some runs and not in others,
-- and a wake-up across cores costs more than a call: a contender's rate
-- jumps between two modes from one run to the next, and a round's ratio
-- compares unlike runs. Pinned, nginx's worker has CPU 0 and the client
-- CPU 1 in every run. The 64-in-flight shape keeps both cores for
-- everyone by default: pinned, Node's helper threads (its garbage
-- collector, its compiler) would share the one core of its main thread,
-- which a Node user's machine does not do to it.
local function placement(dir)
  local want = os.getenv("BENCH_PEERS_PIN") or "sequential"
  if want ~= "sequential" and want ~= "all" and want ~= "none" then
    error("BENCH_PEERS_PIN must be sequential, all or none (got " .. want .. ")", 0)
  end
  local why
  if want == "none" then
    why = "BENCH_PEERS_PIN=none"
  elseif (tonumber(capture("nproc")) or 1) < 2 then
    why = "one core"
  elseif not out_of("command -v taskset") then
    why = "no taskset"
  elseif not out_of("command -v pgrep") then
    why = "no pgrep to find nginx's worker"
  end
  if why then return function() return "not pinned (" .. why .. ")" end end
  local f = assert(io.open("/proc/self/stat", "r"))
  local me = f:read("*l"):match("^(%d+)")
  f:close()
  local every = capture("taskset -pc " .. me):match(":%s*(%S+)$")
  local workers = {}
  for worker in capture("pgrep -P " .. capture("cat " .. sh_quote(dir .. "/nginx.pid"))):gmatch("%d+") do
    workers[#workers + 1] = worker
  end
  local function set(cpus, pid) capture(format("taskset -pc %s %s >/dev/null", cpus, pid)) end
  return function(shape)
    local pinned = want == "all" or shape.key == "sequential"
    for _, worker in ipairs(workers) do set(pinned and "0" or every, worker) end
    set(pinned and "1" or every, me)
    return pinned and "pinned: nginx's worker on CPU 0, every contender on CPU 1"
      or format("not pinned: nginx and every contender on CPUs %s", every)
  end
end

local function bench(port, dir)
  local url = format("http://127.0.0.1:%d/", port)
  local here, absent = {}, {}
  local place = placement(dir)
  io.write(format("%s, commit %s, %s cores; nginx on 127.0.0.1:%d\n", os.date("!%Y-%m-%d %H:%M UTC"),
    capture("git rev-parse --short HEAD 2>/dev/null || echo unknown"), capture("nproc"), port))
  for _, c in ipairs(CONTENDERS) do
    if c.key == "ratewise" or peer_wanted(c.key) then
      local what, why = c.present()
      if what then
        here[#here + 1] = c
        io.write(format("  %-9s %s\n", c.key, what))
      else
        absent[#absent + 1] = c.key
        io.write(format("  %-9s NOT RUN: %s\n", c.key, why))
      end
    end
  end
  io.flush()
  local results = {}
  for _, shape in ipairs(SHAPES) do
    if shape_wanted(shape.key) then
      local placed = place(shape)
      local got = run_shape(shape, url, here, placed)
      results[#results + 1] = { shape = shape, got = got, placed = placed }
      for _, g in pairs(got) do failed = failed + g.failed end
    end
  end
  io.write("\n")
  for _, r in ipairs(results) do report(r, here) end
  if #absent > 0 then
    io.write(format("not run (not installed, so no figure): %s\n", table.concat(absent, ", ")))
  end
end

local dir = capture("mktemp -d -t ratewise-bench-peers.XXXXXX")
local ok, err = xpcall(function()
  local port = tonumber(capture(format("bash %s start %s", sh_quote(common.here .. "/nginx.sh"), sh_quote(dir))))
  if not port then error("nginx.sh start printed no port", 0) end
  bench(port, dir)
end, debug.traceback)
-- Stopped whatever happened above (an error, a failed call, ^C).
os.execute(format("bash %s stop %s", sh_quote(common.here .. "/nginx.sh"), sh_quote(dir)))
os.execute("rm -rf " .. sh_quote(dir))
common.exit_on_failure(ok, err, failed)
