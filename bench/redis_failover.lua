-- bench/redis_failover.lua: one shared limit through a Sentinel failover.
--
--   lua5.4 bench/redis_failover.lua   (from the root, with the suite's
--   LUA_PATH; BENCH_FAILOVER_SECONDS, BENCH_FAILOVER_ON_ERROR)
--
-- A primary, a replica and three redis-sentinels on loopback
-- (spec/support/redis_ha.lua, down-after-milliseconds 400). Four processes
-- of four tasks each fetch from the loopback test server through one
-- rw.redis_bucket of 100 a second (capacity 1) named by its sentinels,
-- with on_error = "local" and local_share = 0.25 (or "closed"). Midway the
-- primary stops. Reported:
--   * the requests the server saw a second over the run, and the most in
--     any one second (a sliding window over its log), against 100;
--   * the longest call against its budget (max_elapsed);
--   * how long after the primary stopped the limit was back in Redis (the
--     first script the new master ran).
local ha = require "spec.support.redis_ha"
local server = require "spec.support.server"
local subprocess = require "spec.support.subprocess"
local socket = require "socket"

local SECONDS = tonumber(os.getenv("BENCH_FAILOVER_SECONDS") or "12")
local ON_ERROR = os.getenv("BENCH_FAILOVER_ON_ERROR") or "local"
local RATE, PROCESSES, TASKS, BUDGET = 100, 4, 4, 2

local WORKER = [[
local rw = require "ratewise"
local url, sentinels, seconds, on_error, rate, tasks, budget = arg[1], arg[2], tonumber(arg[3]), arg[4],
  tonumber(arg[5]), tonumber(arg[6]), tonumber(arg[7])
local limiter = rw.redis_bucket { redis = "redis+sentinel://" .. sentinels .. "/mymaster", key = "failover",
  capacity = 1, rate = rate, on_error = on_error, local_share = 1 / 4 }
local ok, failed, slowest = 0, 0, 0
local stop_at = rw.now() + seconds
rw.run(function()
  for _ = 1, tasks do
    rw.spawn(function()
      while rw.now() < stop_at do
        local t0 = rw.now()
        local res, err = rw.fetch(url, { limiter = limiter, on_retry = false, max_retries = 0, max_elapsed = budget })
        slowest = math.max(slowest, rw.now() - t0)
        if res then ok = ok + 1 else
          failed = failed + 1
          if err.kind == "limiter_unavailable" then rw.sleep(0.05) end
        end
      end
    end)
  end
end)
print(string.format("ok %d failed %d slowest %.3f", ok, failed, slowest))
]]

local function scripts_run(node)
  local stats = node:cli("INFO", "commandstats")
  return (tonumber(stats:match("cmdstat_evalsha:calls=(%d+)")) or 0)
    + (tonumber(stats:match("cmdstat_eval:calls=(%d+)")) or 0)
end

local s = server.start()
local ok, err = pcall(function()
  local available, why = ha.available()
  if not available then
    print("redis_failover: not run (" .. why .. ")")
    return
  end
  local sentinel = ha.sentinel()
  local run_ok, run_err = pcall(function()
    local file = os.tmpname()
    local f = assert(io.open(file, "w"))
    f:write(WORKER)
    f:close()
    local outs, cmd = {}, {}
    for i = 1, PROCESSES do
      outs[i] = os.tmpname()
      cmd[#cmd + 1] = string.format("%stimeout %d %s %s %s %s %d %s %d %d %d > %s 2>&1 &", subprocess.env,
        SECONDS + 30, subprocess.lua, file, s:url("/f"), table.concat(sentinel.sentinels, ","), SECONDS, ON_ERROR,
        RATE, TASKS, BUDGET, outs[i])
    end
    local p = assert(io.popen("{ " .. table.concat(cmd, " ") .. " wait; } 2>&1"))
    -- midway, once the processes are pacing through Redis
    local deadline = socket.gettime() + 10
    while #s:log("/f") < 20 and socket.gettime() < deadline do socket.sleep(0.02) end
    socket.sleep(SECONDS / 2 - 1)
    local before = scripts_run(sentinel.replica)
    sentinel.primary:stop()
    local stopped = socket.gettime()
    local back
    while socket.gettime() - stopped < SECONDS do
      if scripts_run(sentinel.replica) > before then
        back = socket.gettime() - stopped
        break
      end
      socket.sleep(0.01)
    end
    p:read("*a")
    p:close()
    local sent, failed, slowest = 0, 0, 0
    for i = 1, PROCESSES do
      local o = assert(io.open(outs[i]))
      local text = o:read("*a")
      o:close()
      os.remove(outs[i])
      local n, m, t = text:match("ok (%d+) failed (%d+) slowest ([%d.]+)")
      assert(n, "a worker said: " .. text)
      sent, failed, slowest = sent + tonumber(n), failed + tonumber(m), math.max(slowest, tonumber(t))
    end
    os.remove(file)
    local log = s:log("/f")
    local times = {}
    for i, r in ipairs(log) do times[i] = r.t end
    table.sort(times)
    local most, first = 0, 1
    for last = 1, #times do
      while times[last] - times[first] >= 1 do first = first + 1 end
      most = math.max(most, last - first + 1)
    end
    local span = times[#times] - times[1]
    print(string.format("redis_failover (Sentinel, %d processes x %d tasks, %d/s, on_error %s, %d s):",
      PROCESSES, TASKS, RATE, ON_ERROR, SECONDS))
    print(string.format("  server saw %d requests: %.1f/s over the run (%+.1f%%), at most %d in one second",
      #times, #times / span, (#times / span / RATE - 1) * 100, most))
    print(string.format("  calls: %d ok, %d failed; the longest %.3f s against a budget of %d s", sent, failed,
      slowest, BUDGET))
    print(back and string.format("  the limit was back in Redis %.2f s after the primary stopped", back)
      or "  the limit was not back in Redis by the end of the run")
  end)
  sentinel:destroy()
  assert(run_ok, run_err)
end)
s:stop()
assert(ok, err)
