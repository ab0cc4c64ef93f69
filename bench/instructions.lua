-- `make bench-instructions`: the shapes of `make bench`, each contender's
-- instructions a request as valgrind's callgrind counts them, and their
-- ratio. A count of instructions does not change with what else the
-- machine runs, where a rate does: on a busy host (another tenant's load
-- moves `make bench`'s plain contender by far more than a change does)
-- this is the figure that still compares. It is not time:
-- system calls, cache misses and the CPU's parallelism are not in it, so
-- it is a second witness beside `make bench`, not a replacement.
--
-- For each shape, both contenders run K and 3K requests under callgrind
-- against one private nginx (bench/nginx.sh); (Ir(3K) - Ir(K)) / 2K is the
-- cost of one request with the start-up (the process, the connections,
-- LuaJIT's compiling) cancelled out. The ratio is plain's instructions
-- over ratewise's, so that it reads like `make bench`'s (1.00: as cheap as
-- plain libcurl). Each ratio is held against bench/alarm.lua's, read when
-- issue 38 retired the instruction targets: an alarm, not a goal. ratewise's side is
-- bench/shapes.lua, run in a fresh process by this script's child mode;
-- the plain side is bench/plain_curl and bench/multi_curl64, with the
-- flags `make bench` gives them (--keep for the map shapes, --header for
-- headers and client).
--
-- Then the OpenResty shapes of `make bench-openresty` (openresty_sequential,
-- openresty_loop64, openresty_map_shared, openresty_map_fresh,
-- openresty_body_64k; not body_1m, whose warm-up round alone would take
-- callgrind minutes): ratewise's side is an
-- OpenResty nginx's one process under callgrind (spec.support.nginx's
-- `under`), which runs a warm-up round, then a round of K (or 3K) requests
-- in its worker (bench/openresty_handler.lua); so the worker's own event
-- loop and the driver's waits count too. The plain side is the same
-- multi_curl64 run as for the shape of the same name.
--
-- One request's count moves between runs even on an idle machine: under
-- callgrind the client is slow, and whether the server's answer is already
-- there when libcurl first reads decides whether a request takes one pass
-- of libcurl or two, for either contender. BENCH_INSTR_RUNS measures each
-- contender that many times, alternating, and keeps the median of each.
--
-- BENCH_INSTR_LATENCY_MS=N makes nginx answer every request N ms late
-- (bench/nginx.sh), as a real API does. The answer is then never there at
-- the first read, so a request's count stops moving (how much each mode
-- moves: bench/README.md, "Instructions a request"). Use it to compare two trees. The counts are
-- those of a request that waits (near the 0 ms runs' slower mode); the
-- alarm keeps a baseline for each mode.
--
-- Knobs: BENCH_INSTR_K (default 1280; the 64 KiB shape takes a quarter,
-- the 1 MiB one a thirty-second), BENCH_INSTR_RUNS (default 1),
-- BENCH_INSTR_LATENCY_MS (default 0),
-- BENCH_CONCURRENCY (default 64), and
-- BENCH_ONLY (shapes by key, comma-separated). Runs under Lua 5.4 and
-- LuaJIT (`make bench-instructions LUA=luajit`; the OpenResty shapes are
-- LuaJIT's whatever runs this script). About 8 minutes.
-- Fails when a request fails, never on a ratio.
local common = require "bench.common"
local shapes = require "bench.shapes"
local alarm = require "bench.alarm"
local nginx = require "spec.support.nginx"

local format = string.format
local env_int, sh_quote, run_cmd, capture = common.env_int, common.sh_quote, common.run_cmd, common.capture

local K = env_int("BENCH_INSTR_K", 1280)
local RUNS = env_int("BENCH_INSTR_RUNS", 1)
local LATENCY_MS = env_int("BENCH_INSTR_LATENCY_MS", 0)
local CONC = env_int("BENCH_CONCURRENCY", 64)
-- How many of K requests each shape runs: a large body's cost is counted
-- on fewer. Each body's copy into a Lua string is memcpy's `rep movsb`,
-- one instruction a byte, so it weighs far more here than in time.
local SHARE = { body_64k = 4, body_1m = 32 }

-- The plain contender's command for shape (shapes.list) on url, n requests.
local function plain_command(shape, url, n)
  if shape.plain == "plain_curl" then
    return format("%s %s %d %s", sh_quote(common.PLAIN), sh_quote(url), n, sh_quote(common.agent()))
  end
  local flags = shapes.multi_flags(shape, sh_quote)
  return format("%s %s%s %d %d %s", sh_quote(common.MULTI), flags and (flags .. " ") or "", sh_quote(url), n, CONC,
    sh_quote(common.agent()))
end

---------------------------------------------------------------------------
-- The child: `instructions.lua --run KEY BASE N` runs ratewise's side of
-- one shape once, and exits 1 if a request failed.

if arg and arg[1] == "--run" then
  local key, base, n = arg[2], arg[3], tonumber(arg[4])
  local shape = shapes.find(key)
  if not shape then error("instructions.lua --run: no shape " .. tostring(key), 0) end
  local m = shape.run(base, n, CONC)
  io.write(format("failed=%d\n", m.failed))
  os.exit(m.failed == 0 and 0 or 1)
end

---------------------------------------------------------------------------
-- The parent

-- The instructions callgrind counted for cmd (its standard output thrown
-- away), or raises with what it printed when cmd failed.
local function instructions(cmd)
  local out, ok = run_cmd("valgrind --tool=callgrind --callgrind-out-file=/dev/null " .. cmd .. " 2>&1 >/dev/null")
  local count = tonumber((out:match("Collected : (%d+)")))
  if not ok or not count then error(format("%s failed:\n%s", cmd, out), 0) end
  return count
end

-- One request's instructions: (Ir(3k) - Ir(k)) / 2k.
local function per_request(command_for, k)
  local low, high = instructions(command_for(k)), instructions(command_for(3 * k))
  return (high - low) / (2 * k)
end

local function median(sorted)
  local mid = math.floor((#sorted + 1) / 2)
  if #sorted % 2 == 1 then return sorted[mid] end
  return (sorted[mid] + sorted[mid + 1]) / 2
end

-- The median of RUNS measures of each contender, taken in turns so that a
-- busy minute weighs on both: plain, ours, spread = measured(plain_fn,
-- ours_fn), spread naming each one's range when RUNS > 1.
local function measured(plain_fn, ours_fn)
  local plains, ours = {}, {}
  for i = 1, RUNS do
    plains[i], ours[i] = plain_fn(), ours_fn()
  end
  table.sort(plains)
  table.sort(ours)
  local spread = RUNS > 1 and format("  (plain %.1fk - %.1fk, ratewise %.1fk - %.1fk)", plains[1] / 1000,
    plains[RUNS] / 1000, ours[1] / 1000, ours[RUNS] / 1000) or ""
  return median(plains), median(ours), spread
end

local wanted = common.only()
local rows = {}

-- The OpenResty shapes, each with the make bench shape whose plain
-- contender it is measured against, and the handler's kind of round.
local OPENRESTY = {
  { key = "openresty_sequential", plain = "sequential", kind = "sequential" },
  { key = "openresty_loop64", plain = "loop64", kind = "loop" },
  { key = "openresty_map_shared", plain = "map_shared", kind = "map" },
  { key = "openresty_map_fresh", plain = "map_fresh", kind = "map_fresh" },
  { key = "openresty_body_64k", plain = "body_64k", kind = "loop", size = 65536 },
}
local OPENRESTY_WARMUP = 2000

-- The instructions of an OpenResty nginx under callgrind that ran a
-- warm-up round and a round of n requests of kind on url (raises when a
-- request failed).
local function openresty_instructions(kind, url, n, size)
  local file = os.tmpname()
  local host = nginx.start { server = common.openresty_location(),
    under = "valgrind --tool=callgrind --callgrind-out-file=" .. sh_quote(file) }
  local ok, err = pcall(function()
    for _, count in ipairs { OPENRESTY_WARMUP, n } do
      local res, ferr = common.openresty_round(host, kind, url, count, CONC, size)
      local body = res and res.status == 200 and res.body or ""
      if not body:match("failed=0") then
        error(format("the OpenResty round failed: %s", res and (res.status .. " " .. res.body) or tostring(ferr)), 0)
      end
    end
  end)
  host:stop() -- callgrind writes its counts as the process exits
  local f = io.open(file, "r")
  local counted = f and f:read("*a") or ""
  if f then f:close() end
  os.remove(file)
  if not ok then error(err, 0) end
  local count = tonumber(counted:match("\nsummary: (%d+)") or counted:match("\ntotals: (%d+)"))
  if not count then error("callgrind wrote no count for the OpenResty nginx", 0) end
  return count
end

local function bench(base)
  local jit = rawget(_G, "jit")
  io.write(format("nginx at %s%s; ratewise %s on %s; %s; %d in flight; callgrind, (Ir(3K) - Ir(K)) / 2K, K = %d%s\n",
    base, LATENCY_MS > 0 and format(" (every answer %d ms late)", LATENCY_MS) or "", require("ratewise")._VERSION,
    jit and jit.version or _VERSION,
    require("ratewise.core").curl_version or "libcurl", CONC, K,
    RUNS > 1 and format(", the median of %d runs", RUNS) or ""))
  io.flush()
  local ours_cmd = format("%s %s --run", sh_quote(common.lua), sh_quote(common.here .. "/instructions.lua"))
  -- One row: the plain contender of shape against ours_of(k), ratewise's
  -- instructions a request for k (and 3k) requests.
  local function row_of(key, shape, ours_of)
    local k = math.max(1, math.floor(K / (SHARE[shape.key] or 1)))
    local url = base .. shape.path
    local plain, ours, spread = measured(function()
      return per_request(function(n) return plain_command(shape, url, n) end, k)
    end, function() return ours_of(url, k) end)
    local row = { key = key, plain = plain, ours = ours, ratio = plain / ours }
    rows[#rows + 1] = row
    io.write(format("  %-20s K = %-5d plain %8.1fk  ratewise %8.1fk  ratio %.2f%s\n", key, k, plain / 1000,
      ours / 1000, row.ratio, spread))
    io.flush()
  end
  for _, shape in ipairs(shapes.list) do
    if wanted(shape.key) then
      row_of(shape.key, shape, function(_, k)
        return per_request(function(n) return format("%s %s %s %d", ours_cmd, shape.key, sh_quote(base), n) end, k)
      end)
    end
  end
  for _, o in ipairs(OPENRESTY) do
    if wanted(o.key) then
      local shape = shapes.find(o.plain)
      row_of(o.key, shape, function(url, k)
        return (openresty_instructions(o.kind, url, 3 * k, o.size) - openresty_instructions(o.kind, url, k, o.size))
          / (2 * k)
      end)
    end
  end
  io.write("\n")
  io.write(format("  %-20s %12s %12s  %-5s  %s\n", "shape", "ratewise", "plain", "ratio", "alarm (bench/alarm.lua)"))
  local rang = 0
  for _, row in ipairs(rows) do
    local luajit = jit ~= nil or row.key:find("^openresty_") ~= nil
    local verdict = alarm.verdict(row.key, row.ratio, luajit, LATENCY_MS)
    if verdict:find("^ALARM") then rang = rang + 1 end
    io.write(format("  %-20s %11.1fk %11.1fk  %.2f   %s\n", row.key, row.ours / 1000, row.plain / 1000,
      row.ratio, verdict))
  end
  if rang > 0 then
    io.write(format("  %d shape(s) cost more than %+.0f %% of %s's: say why in the commit, or find the cause\n",
      rang, (alarm.ALLOWED - 1) * 100, alarm.COMMIT))
  end
  io.write("  (instructions a request; ratio = plain's / ratewise's. Not time: see `make bench`.\n"
    .. "  A copy counts one instruction a byte here (rep movsb): in the body shapes both contenders\n"
    .. "  hand each body over as a copy of its own, plain's by --copy.)\n")
end

assert(common.ensure_command("valgrind"))
local dir = capture("mktemp -d -t ratewise-instr.XXXXXX")
local ok, err = xpcall(function()
  local port = tonumber(capture(format("NGINX_LATENCY_MS=%d bash %s start %s", LATENCY_MS,
    sh_quote(common.here .. "/nginx.sh"), sh_quote(dir))))
  if not port then error("nginx.sh start printed no port", 0) end
  bench(format("http://127.0.0.1:%d", port))
end, debug.traceback)
os.execute(format("bash %s stop %s", sh_quote(common.here .. "/nginx.sh"), sh_quote(dir)))
os.execute("rm -rf " .. sh_quote(dir))
-- A request that failed shows as a command that failed, raised above.
common.exit_on_failure(ok, err, 0)
