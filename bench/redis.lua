-- bench/redis.lua: what one acquire of a shared bucket costs, next to
-- what Redis itself can serve.
--
--   make bench-redis          (or: lua5.4 bench/redis.lua, from the root)
--
-- A private redis-server on loopback. Two contenders in one run, each
-- sending one command at a time (one connection, as the bucket does):
--   redis-benchmark -c 1   EVALSHA of the bucket's own script, the most
--                          one connection gets from this Redis;
--   rw.redis_bucket        b:acquire() in a loop (a rate so high that it
--                          never waits: the cost of the round trip alone).
-- Reported as acquires per second, their ratio, and the Redis commands
-- per acquire (INFO commandstats; the goal is one). Then the same through
-- 16 tasks of rw.run, which share the bucket's one connection.
local redis = require "spec.support.redis"
local rw = require "ratewise"
local redis_bucket = require "ratewise.redis_bucket"

local N = tonumber(os.getenv("BENCH_REDIS_REQUESTS") or "20000")
local ROUNDS = tonumber(os.getenv("BENCH_REDIS_ROUNDS") or "3")

local r = redis.start()
local ok, err = pcall(function()
  local sha = r:cli("SCRIPT", "LOAD", redis_bucket.SCRIPT)
  assert(sha:match("^%x+$"), "SCRIPT LOAD: " .. sha)

  local function redis_benchmark()
    local p = assert(io.popen(string.format("redis-benchmark -p %d -c 1 -n %d -q EVALSHA %s 1 "
      .. "'ratewise:{bench-rb}' 1 1000000000 1 reserve -1 0 2>&1", r.port, N, sha)))
    local out = p:read("*a")
    p:close()
    local rps = tonumber(out:match("([%d.]+) requests per second"))
    assert(rps, "redis-benchmark: " .. out)
    return rps
  end

  local bucket = rw.redis_bucket { redis = r.url, key = "bench", capacity = 1e9, rate = 1e6 }
  for _ = 1, 1000 do assert(bucket:acquire()) end -- connected, script loaded

  local function sequential()
    local t0 = rw.now()
    for _ = 1, N do assert(bucket:acquire()) end
    return N / (rw.now() - t0)
  end

  local function tasks()
    local t0 = rw.now()
    rw.run(function()
      for _ = 1, 16 do
        rw.spawn(function() for _ = 1, N / 16 do assert(bucket:acquire()) end end)
      end
    end)
    return N / (rw.now() - t0)
  end

  local function span(list, fmt)
    table.sort(list)
    return string.format(fmt, list[1]) .. (#list > 1 and string.format(" - " .. fmt, list[#list]) or "")
  end

  local theirs, ours, ratio, in_tasks = {}, {}, {}, {}
  r:cli("CONFIG", "RESETSTAT")
  for round = 1, ROUNDS do
    theirs[round] = redis_benchmark()
    ours[round] = sequential()
    ratio[round] = ours[round] / theirs[round]
    in_tasks[round] = tasks()
  end
  local stats = r:cli("INFO", "commandstats")
  -- The commands clients sent (commandstats also counts those the script
  -- calls: TIME, GET, SET), less redis-benchmark's EVALSHAs.
  local sent = { evalsha = true, eval = true, script = true, auth = true, select = true }
  local total = 0
  for name, calls in stats:gmatch("cmdstat_([%w|]+):calls=(%d+)") do
    if sent[name] or name:match("^script") then total = total + tonumber(calls) end
  end
  local per_acquire = (total - ROUNDS * N) / (ROUNDS * 2 * N)

  print(string.format("%d acquires a round, %d rounds, one connection", N, ROUNDS))
  print()
  print("| contender | acquires / s |")
  print("|---|---|")
  print(string.format("| redis-benchmark -c 1, EVALSHA of the script | %s |", span(theirs, "%.0f")))
  print(string.format("| rw.redis_bucket acquire, sequential | %s |", span(ours, "%.0f")))
  print(string.format("| ratio | %s |", span(ratio, "%.2f")))
  print(string.format("| rw.redis_bucket acquire, 16 tasks | %s |", span(in_tasks, "%.0f")))
  print(string.format("| Redis commands per acquire | %.3f |", per_acquire))
end)
r:destroy()
if not ok then
  io.stderr:write("bench: ", tostring(err), "\n")
  os.exit(1)
end
