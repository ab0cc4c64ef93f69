-- rw.redis_bucket when its Redis hangs, resumes, or stops being the
-- primary: against real redis-servers the suite starts, one stopped with
-- SIGSTOP (it accepts connections and answers nothing, as a hung server
-- does), one made a replica with REPLICAOF.
local rw = require "ratewise"
local redis = require "spec.support.redis"
local socket_sleep = require("socket").sleep

local needs_redis = rw.features.redis and it or function(name)
  pending(name .. " [this build has no Redis support: REDIS=0]")
end

local function signal(r, sig)
  local f = assert(io.open(r.dir .. "/redis.pid"))
  local pid = assert(tonumber(f:read("*l")))
  f:close()
  assert(os.execute("kill -" .. sig .. " " .. pid))
end

-- Hung from now on; resumed by the returned function, which is also run
-- however the spec ends (a stopped server would hang the next ones).
local function hang(r)
  signal(r, "STOP")
  local resumed = false
  local function resume()
    if not resumed then
      resumed = true
      signal(r, "CONT")
    end
  end
  finally(resume)
  return resume
end

local function connections_received(r)
  return tonumber(r:cli("INFO", "stats"):match("total_connections_received:(%d+)"))
end

-- The most admissions within any `span` seconds from `from` on.
local function busiest(times, from, span)
  local most, j = 0, 1
  for i = 1, #times do
    if times[i] >= from then
      if j < i then j = i end
      while j <= #times and times[j] < times[i] + span do j = j + 1 end
      if j - i > most then most = j - i end
    end
  end
  return most
end

describe("rw.redis_bucket with a hung Redis", function()
  local r

  setup(function() r = redis.start() end)
  teardown(function() r:destroy() end)
  before_each(function() r:cli("FLUSHALL") end)

  needs_redis("pays one timeout, then answers at once until the reconnect pause is over", function()
    local b = rw.redis_bucket { redis = r.url, key = "k", capacity = 100, rate = 100, timeout = 0.1 }
    assert.is_true((b:take()))
    local before = connections_received(r)
    local resume = hang(r)
    local took, slow = {}, 0
    local t0 = rw.now()
    while rw.now() - t0 < 1.3 do
      local t = rw.now()
      local ok, err = b:take()
      assert.is_nil(ok)
      assert.equal("limiter_unavailable", err.kind)
      took[#took + 1] = rw.now() - t
      -- (near the timeout: a loaded machine may hold a quick call up for
      -- tens of milliseconds)
      if took[#took] >= 0.09 then slow = slow + 1 end
    end
    resume()
    local opened = connections_received(r) - before
    -- 1.3 s: the first call's timeout, then one attempt (a new connection
    -- that gets no answer) each time the 0.5 s pause is over
    local shown = {}
    for i = 1, math.min(#took, 8) do shown[i] = string.format("%.3f", took[i]) end
    local summary = string.format("%d calls, %d paid the timeout, %d connections opened (first: %s)", #took, slow,
      opened, table.concat(shown, " "))
    assert.is_true(took[1] >= 0.09, summary)
    assert.is_true(#took > 100, summary)
    assert.is_true(slow >= 2 and slow <= 3, summary)
    assert.is_true(opened <= 3, summary)
    -- and back on Redis once it answers again and the pause is over
    socket_sleep(0.55)
    assert.is_true((b:take()))
  end)

  needs_redis("on_error = local: the local bucket serves at its rate while Redis hangs", function()
    local b = rw.redis_bucket { redis = r.url, key = "k", capacity = 1, rate = 50, timeout = 0.1,
      on_error = "local" }
    assert.is_true(b:acquire())
    hang(r)
    local admitted, slowest = 0, 0
    local t0 = rw.now()
    rw.run(function()
      for _ = 1, 2 do
        rw.spawn(function()
          while rw.now() - t0 < 1.2 do
            local t = rw.now()
            assert.is_true(b:acquire())
            slowest = math.max(slowest, rw.now() - t)
            admitted = admitted + 1
          end
        end)
      end
    end)
    local span = rw.now() - t0
    -- 50 a second, but for the first timeout (the local bucket holds one
    -- token when it takes over, the last state Redis showed)
    assert.is_true(admitted >= 50 * (span - 0.1) * 0.85,
      string.format("%d admitted in %.3f s at 50 a second (slowest call %.3f s)", admitted, span, slowest))
    assert.is_true(admitted <= 50 * span + 2, string.format("%d admitted in %.3f s", admitted, span))
  end)

  needs_redis("a call that timed out takes nothing when the hung Redis resumes and runs it", function()
    local buckets = {}
    for i = 1, 5 do
      -- one connection each, as five processes have
      buckets[i] = rw.redis_bucket { redis = r.url, key = "k", capacity = 5, rate = 0.5, timeout = 0.1 }
      assert.near(5, buckets[i]:tokens(), 0.1)
    end
    local resume = hang(r)
    rw.run(function()
      for i = 1, 5 do
        rw.spawn(function()
          local ok, err = buckets[i]:take()
          assert.is_nil(ok)
          assert.equal("limiter_unavailable", err.kind)
        end)
      end
    end)
    resume()
    assert.equal("PONG", r:cli("PING")) -- after the five takes that were waiting
    local fresh = rw.redis_bucket { redis = r.url, key = "k", capacity = 5, rate = 0.5 }
    local t0 = rw.now()
    assert.is_true(fresh:acquire(5))
    assert.is_true(rw.now() - t0 < 0.05, "the late scripts drained the bucket: " .. (rw.now() - t0) .. " s")
  end)

  needs_redis("a server clock that moved forward costs one more round trip, not a refusal", function()
    local b = rw.redis_bucket { redis = r.url, key = "k", capacity = 5, rate = 0.5, timeout = 0.1 }
    assert.near(5, b:tokens(), 0.1)
    -- as if Redis's clock had been set 10 s forward since it was read
    b.clock_offset = b.clock_offset - 10
    r:cli("CONFIG", "RESETSTAT")
    assert.is_true((b:take()))
    assert.near(4, b:tokens(), 0.1)
    assert.equal(3, tonumber(r:cli("INFO", "commandstats"):match("cmdstat_evalsha:calls=(%d+)")))
  end)

  needs_redis("adds no burst when it switches to its local bucket and back", function()
    -- two processes sharing 20 a second, capacity 10, half each locally
    local buckets = {}
    for i = 1, 2 do
      buckets[i] = rw.redis_bucket { redis = r.url, key = "switch", capacity = 10, rate = 20, timeout = 0.1,
        on_error = "local", local_share = 0.5 }
    end
    local times = {}
    local t0 = rw.now()
    local resume
    rw.run(function()
      for i = 1, 2 do
        rw.spawn(function()
          while rw.now() - t0 < 3.4 do
            assert.is_true(buckets[i]:acquire())
            times[#times + 1] = rw.now() - t0
          end
        end)
      end
      rw.spawn(function()
        rw.sleep(1)
        resume = hang(r)
        rw.sleep(1.2)
        resume()
      end)
    end)
    table.sort(times)
    -- the bucket starts full (10), and is drained within the first half second
    local most = busiest(times, 0.5, 1)
    local per_second = { 0, 0, 0, 0 }
    for _, t in ipairs(times) do
      local s = math.floor(t) + 1
      if per_second[s] then per_second[s] = per_second[s] + 1 end
    end
    assert.is_true(most <= 20 * 1.1 + 2, string.format("%d admitted within one second at 20 a second "
      .. "(Redis hung from 1 s to 2.2 s; each second: %s)", most, table.concat(per_second, " ")))
  end)
end)

describe("rw.redis_bucket when its node is no longer the primary (READONLY)", function()
  local r, other

  setup(function()
    r = redis.start()
    other = redis.start()
  end)
  teardown(function()
    r:cli("REPLICAOF", "NO", "ONE")
    r:destroy()
    other:destroy()
  end)

  needs_redis("drops the connection and connects again after the pause", function()
    local b = rw.redis_bucket { redis = r.url, key = "k", capacity = 5, rate = 5, timeout = 0.2 }
    local l = rw.redis_bucket { redis = r.url, key = "k", capacity = 5, rate = 5, timeout = 0.2, on_error = "local" }
    assert.is_true((b:take()))
    assert.is_true((l:take()))
    assert.equal("OK", r:cli("REPLICAOF", "127.0.0.1", other.port))
    local ok, err = b:take()
    assert.is_nil(ok)
    assert.equal("limiter_unavailable", err.kind)
    assert.matches("READONLY", err.message, 1, true)
    assert.is_true((l:take())) -- served locally
    -- both connections dropped: the one left is redis-cli's own
    local function clients()
      local list = r:cli("CLIENT", "LIST", "TYPE", "normal")
      return select(2, list:gsub("[^\n]+", "")) - 1, list -- less redis-cli's own
    end
    assert.equal(0, clients())
    local t0 = rw.now()
    ok, err = b:take() -- within the pause: at once, no new connection
    assert.is_nil(ok)
    assert.matches("no longer the primary", err.message, 1, true)
    assert.is_true(rw.now() - t0 < 0.01)
    assert.equal(0, clients())
    -- promoted back (as a failover may): reached again after the pause
    assert.equal("OK", r:cli("REPLICAOF", "NO", "ONE"))
    socket_sleep(0.55)
    assert.is_true((b:take()))
    assert.equal(1, clients())
    assert.equal("ratewise:{k}", r:cli("KEYS", "*"))
  end)
end)
