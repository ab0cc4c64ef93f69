-- `make bench-fast-paths`: what fetch's and rw.client's fast-path caches
-- (lua/ratewise/fetch/cache.lua; docs/internals.md, "The fast-path
-- caches") are worth in wall time. Issue 38 keeps a cache only where this
-- file's figures (bench/README.md) show a gain of more than 5 % on a
-- user-shaped benchmark, and spec/fast_paths_spec.lua shows it gives what
-- the general path gives.
--
-- The two contenders are ratewise as shipped and ratewise with
-- RATEWISE_FAST_PATHS=off (every fast-path cache keeps nothing, so each
-- call takes the general path), each run in a fresh process (the switch
-- is read once, as fetch/cache.lua loads), in alternating rounds
-- (bench/rounds.lua), on bench/shapes.lua's shapes against one private
-- loopback nginx (bench/nginx.sh). The ratio is "on" / "off": above 1, the
-- caches pay.
--
-- Knobs (environment):
--   BENCH_FP_REQUESTS  requests per round and contender (default 20000)
--   BENCH_FP_ROUNDS    rounds (default 5)
--   BENCH_CONCURRENCY  tasks (and transfers) in flight (default 64)
--   BENCH_ONLY         shapes by key, comma-separated (default: the
--                      shapes users write that reach a cache: sequential,
--                      loop64, map_fresh, headers, client, client_paths,
--                      post_json)
--   NGINX_LATENCY_MS   every answer that many ms late (bench/nginx.sh)
-- Fails only when a request fails.
local common = require "bench.common"
local rounds = require "bench.rounds"
local shapes = require "bench.shapes"

local format = string.format
local env_int, sh_quote, run_cmd = common.env_int, common.sh_quote, common.run_cmd

local CONC = env_int("BENCH_CONCURRENCY", 64)

---------------------------------------------------------------------------
-- The child: `fast_paths.lua --run KEY BASE N` runs ratewise's side of one
-- shape, a tenth of N off the clock first (connections, the caches
-- themselves), then N, and prints "rate=R failed=F cpu_us=C faults=P"
-- (P: minor page faults a request, -1 where /proc is not there).

if arg and arg[1] == "--run" then
  local key, base, n = arg[2], arg[3], tonumber(arg[4])
  local shape = shapes.find(key)
  if not shape then error("fast_paths.lua --run: no shape " .. tostring(key), 0) end
  local warm = shape.run(base, math.max(1, math.floor(n / 10)), CONC)
  collectgarbage("collect")
  local m = shape.run(base, n, CONC)
  local failed = warm.failed + m.failed
  io.write(format("rate=%.1f failed=%d cpu_us=%.2f faults=%.3f\n", m.rate, failed, m.cpu_us, m.faults or -1))
  os.exit(failed == 0 and 0 or 1)
end

---------------------------------------------------------------------------
-- The parent

local N = env_int("BENCH_FP_REQUESTS", 20000)
local ROUNDS = env_int("BENCH_FP_ROUNDS", 5)
local DEFAULT_SHAPES = { "sequential", "loop64", "map_fresh", "headers", "client", "client_paths", "post_json" }

local here = common.here
local NGINX_SH = here .. "/nginx.sh"

-- One run of a child, with the fast paths on or off: its measure.
local function child(fast_paths, key, base, n)
  local cmd = format("RATEWISE_FAST_PATHS=%s %s %s --run %s %s %d 2>&1", fast_paths, sh_quote(common.lua),
    sh_quote(here .. "/fast_paths.lua"), sh_quote(key), sh_quote(base), n)
  local out, ok = run_cmd(cmd)
  local rate, failed, cpu, faults = out:match("rate=([%d.]+) failed=(%d+) cpu_us=([%d.]+) faults=([%d.-]+)")
  if not rate then error(format("%s failed:\n%s", cmd, out), 0) end
  if not ok and tonumber(failed) == 0 then error(format("%s failed:\n%s", cmd, out), 0) end
  faults = tonumber(faults)
  return { rate = tonumber(rate), failed = tonumber(failed), cpu_us = tonumber(cpu),
    faults = faults >= 0 and faults or nil }
end

local keys = {}
if (os.getenv("BENCH_ONLY") or "") ~= "" then
  for key in os.getenv("BENCH_ONLY"):gmatch("[^,%s]+") do keys[#keys + 1] = key end
else
  keys = DEFAULT_SHAPES
end
for _, key in ipairs(keys) do
  if not shapes.find(key) then error("BENCH_ONLY: no shape " .. key, 0) end
end

local dir = common.capture("mktemp -d -t ratewise-fast-paths.XXXXXX")
local port = common.capture(format("bash %s start %s", sh_quote(NGINX_SH), sh_quote(dir)))
local base = "http://127.0.0.1:" .. port

local ok, err = pcall(function()
  io.write(format("nginx at %s%s; %s; ratewise with its fast paths (on) against RATEWISE_FAST_PATHS=off "
    .. "(off), a fresh process a run, %d in flight\n\n", base,
    (os.getenv("NGINX_LATENCY_MS") or "0") ~= "0" and format(" (every answer %s ms late)",
      os.getenv("NGINX_LATENCY_MS")) or "", _VERSION, CONC))
  local rows, failed = {}, 0
  for _, key in ipairs(keys) do
    local row = rounds.compare({ name = key, n = N, rounds = ROUNDS, warmup = 0,
      names = { ours = "on", plain = "off" },
      plain = function(n) return child("off", key, base, n) end,
      ours = function(n) return child("on", key, base, n) end })
    failed = failed + row.plain_failed + row.our_failed
    rows[#rows + 1] = row
  end
  io.write("\n")
  rounds.report(rows, { ours = "on", plain = "off" })
  return failed
end)
run_cmd(format("bash %s stop %s; rm -rf %s", sh_quote(NGINX_SH), sh_quote(dir), sh_quote(dir)))
if not ok then error(err, 0) end
if err > 0 then
  io.stderr:write(format("fast_paths.lua: %d request(s) failed\n", err))
  os.exit(1)
end
