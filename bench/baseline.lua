-- `make bench-baseline`: ratewise against an earlier ratewise, to tell a
-- regression from the machine. The ratio to plain libcurl that `make bench`
-- prints moves with the machine (a shared one's noise swings it by more
-- than a change does), so "no slower than before" is measured head to head: this tree
-- and an earlier revision (by default the one before the waiting seam's
-- engine, issue 11), each in fresh processes, in alternating rounds against
-- one private nginx, doing the same shape (bench/shapes.lua, from this
-- tree, run by bench/baseline_child.lua over each tree's lua/ and core).
--
-- The revision is exported with `git archive` into a directory of its own
-- and built there with its own Makefile, for the same Lua as this run.
--
-- Knobs (environment):
--   BASELINE_REV       the earlier revision (default 03bc2ee, the last commit
--                      before "engine: pollable")
--   BASELINE_DIR       where it is built (default /tmp/ratewise-baseline-REV)
--   BASELINE_SHAPES    comma-separated: loop, sequential (default both)
--   BASELINE_REQUESTS  requests per run (default 40000 for loop, 20000 sequential)
--   BASELINE_ROUNDS    rounds (default 6)
--   BENCH_CONCURRENCY  tasks of the loop shape (default 64)
-- Prints each round's rates and CPU per request, then the medians and the
-- median of the rounds' ratios (now / then: above 1 is faster now; for CPU,
-- below 1 is cheaper now).
local common = require "bench.common"
local rounds = require "bench.rounds"

local format = string.format
local env_int, sh_quote, capture = common.env_int, common.sh_quote, common.capture
local floor, max = math.floor, math.max
local median = rounds.median

local REV = os.getenv("BASELINE_REV") or "03bc2ee"
local ROUNDS = env_int("BASELINE_ROUNDS", 6)
local CONC = env_int("BENCH_CONCURRENCY", 64)
local LUA = common.lua
local lua_name = LUA:match("[^/]+$")
local here = common.here

local function interp_make_name()
  if lua_name:match("^luajit") then return "luajit" end
  return lua_name
end

local function build_baseline()
  local sha, known = common.run_cmd("git rev-parse --short " .. sh_quote(REV .. "^{commit}") .. " 2>/dev/null")
  if not known then error("bench-baseline: no revision " .. REV .. " in this repository", 0) end
  local dir = os.getenv("BASELINE_DIR") or ("/tmp/ratewise-baseline-" .. sha)
  local build = "build-baseline-" .. interp_make_name()
  local core = dir .. "/" .. build .. "/ratewise/core.so"
  local f = io.open(core, "rb")
  if f then
    f:close()
  else
    io.write(format("building %s (%s) in %s\n", REV, sha, dir))
    io.flush()
    capture(format("rm -rf %s && mkdir -p %s && git archive %s | tar -x -C %s", sh_quote(dir), sh_quote(dir),
      sh_quote(sha), sh_quote(dir)))
    capture(format("make -s -C %s LUA=%s BUILD=%s %s/ratewise/core.so", sh_quote(dir), interp_make_name(),
      build, build))
  end
  return sha, format('LUA_PATH=%s LUA_CPATH=%s', sh_quote(dir .. "/lua/?.lua;" .. dir .. "/lua/?/init.lua;./?.lua;;"),
    sh_quote(dir .. "/" .. build .. "/?.so;;"))
end

-- One run of the child; returns { rate, failed, cpu_us }.
local function run_child(env, shape, url, n)
  local out = capture(format("%s %s bench/baseline_child.lua %s %s %d %d", env, sh_quote(LUA), shape, sh_quote(url),
    n, CONC))
  local rate, failed, cpu = (out or ""):match("^(%S+) (%S+) (%S+)")
  if not rate then error("bench-baseline: the " .. shape .. " run printed " .. tostring(out), 0) end
  return { rate = tonumber(rate), failed = tonumber(failed), cpu_us = tonumber(cpu) }
end

local function compare(shape, url, then_env, n)
  io.write(format("%s: this tree (now) / %s (then), %d requests x %d rounds, %s\n", shape, REV, n, ROUNDS, lua_name))
  run_child("", shape, url, max(1, floor(n / 10))) -- warm-up: nginx's and the page cache's
  run_child(then_env, shape, url, max(1, floor(n / 10)))
  local ratios, cpu_ratios, now_rates, then_rates, now_cpu, then_cpu = {}, {}, {}, {}, {}, {}
  local failed = 0
  for r = 1, ROUNDS do
    local a, b
    if r % 2 == 1 then
      a = run_child("", shape, url, n)
      b = run_child(then_env, shape, url, n)
    else
      b = run_child(then_env, shape, url, n)
      a = run_child("", shape, url, n)
    end
    failed = failed + a.failed + b.failed
    ratios[r], cpu_ratios[r] = a.rate / b.rate, a.cpu_us / b.cpu_us
    now_rates[r], then_rates[r], now_cpu[r], then_cpu[r] = a.rate, b.rate, a.cpu_us, b.cpu_us
    io.write(format("  round %d: now %7.0f req/s, %5.1f us CPU/req | then %7.0f req/s, %5.1f us CPU/req | "
      .. "rate %.3f, CPU %.3f\n", r, a.rate, a.cpu_us, b.rate, b.cpu_us, ratios[r], cpu_ratios[r]))
    io.flush()
  end
  io.write(format("  => now %.0f req/s, %.1f us CPU/req; then %.0f req/s, %.1f us CPU/req; now / then: rate %.2f, "
    .. "CPU %.2f (median of the rounds)\n\n", median(now_rates), median(now_cpu), median(then_rates),
    median(then_cpu), median(ratios), median(cpu_ratios)))
  return failed
end

local sha, then_env = build_baseline()
local dir = os.tmpname()
os.remove(dir)
capture("mkdir -p " .. sh_quote(dir))
local port = capture(format("bash %s/nginx.sh start %s", here, sh_quote(dir))):gsub("%s+$", "")
local url = "http://127.0.0.1:" .. port .. "/"
io.write(format("nginx on 127.0.0.1:%s; then = %s (%s)\n", port, REV, sha))
local ok, result = pcall(function()
  local failed = 0
  for shape in (os.getenv("BASELINE_SHAPES") or "loop,sequential"):gmatch("[^,]+") do
    local n = env_int("BASELINE_REQUESTS", shape == "loop" and 40000 or 20000)
    failed = failed + compare(shape, url, then_env, n)
  end
  return failed
end)
common.run_cmd(format("bash %s/nginx.sh stop %s; rm -rf %s", here, sh_quote(dir), sh_quote(dir)))
common.exit_on_failure(ok, result, ok and result or 0)
