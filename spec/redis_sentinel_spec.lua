-- rw.redis_bucket through Redis Sentinel: a primary, a replica and three
-- redis-sentinels the suite starts on loopback (spec/support/redis_ha.lua),
-- tuned to fail over within a few seconds.
local rw = require "ratewise"
local ha = require "spec.support.redis_ha"
local fake_redis = require "spec.support.fake_redis"

local test, runs = ha.test(it, pending, rw.features.redis)

-- A command's calls on a server, from INFO commandstats.
local function calls(node, command)
  return tonumber(node:cli("INFO", "commandstats"):match("cmdstat_" .. command .. ":calls=(%d+)")) or 0
end

describe("rw.redis_bucket through Sentinel", function()
  local s

  setup(function()
    if runs then s = ha.sentinel() end
  end)
  teardown(function()
    if s then s:destroy() end
  end)

  test("checks with ROLE that the node a sentinel names is the master, and keeps the sentinels' password out "
    .. "of its errors", function()
    local address = "127.0.0.1"
    local port = tostring(s.replica.port)
    local fake = fake_redis.start {
      SENTINEL = string.format("*2\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n", #address, address, #port, port),
    }
    local ok, err = pcall(function()
      local b = rw.redis_bucket { key = "role", capacity = 5, rate = 1, redis = {
        -- the first sentinel is down: the next one is asked
        sentinels = { "127.0.0.1:1", "127.0.0.1:" .. fake.port }, master = "mymaster",
        sentinel_password = "sentinelSECRET",
      } }
      local taken, terr = b:take()
      assert.is_nil(taken)
      assert.equal("limiter_unavailable", terr.kind)
      assert.matches("Redis master 'mymaster' at 127.0.0.1:" .. port .. ": ROLE: it is a slave, not the master",
        terr.message, 1, true)
      assert.is_nil(tostring(terr):find("SECRET", 1, true), tostring(terr))
      assert.same({ "AUTH sentinelSECRET", "SENTINEL get-master-addr-by-name mymaster" }, fake:commands())
      assert.equal(0, calls(s.replica, "evalsha") + calls(s.replica, "eval") + calls(s.replica, "script"))
    end)
    fake:stop()
    assert(ok, err)
  end)

  test("refuses a Sentinel configuration that names no master, or two topologies", function()
    for _, case in ipairs {
      { { sentinels = { "127.0.0.1:26379" } }, "'master' must name the master" },
      { { sentinels = {}, master = "m" }, "'sentinels' must be a list" },
      { { sentinels = { "127.0.0.1:70000" }, master = "m" }, "'sentinels'[1]: the port must be from 1 to 65535" },
      { { sentinels = { "a" }, cluster = { "b" }, master = "m" }, "'sentinels' and 'cluster' are two topologies" },
      { { sentinels = { "a" }, master = "m", passwd = "x" }, "unknown field 'passwd'" },
      { "redis+sentinel://:pw@127.0.0.1:26379", "a redis+sentinel:// URL names the master after the sentinels" },
    } do
      assert.error_matches(function()
        rw.redis_bucket { key = "k", capacity = 1, rate = 1, redis = case[1] }
      end, "option 'redis': " .. case[2], 1, true)
    end
  end)

  test("follows the master through a failover: admits again within seconds, each call within its timeout",
    function()
    local url = "redis+sentinel://" .. table.concat(s.sentinels, ",") .. "/" .. s.master
    local b = rw.redis_bucket { redis = url, key = "failover", capacity = 100, rate = 100, timeout = 0.25 }
    assert.is_true((b:take()))
    assert.equal(1, calls(s.primary, "evalsha"))
    s.primary:stop()
    local stopped = rw.now()
    local back, failures, slowest, kinds = ha.until_admitted(b, stopped)
    assert.is_truthy(back, "the bucket admitted nothing for 15 s after the primary stopped")
    -- down-after-milliseconds 400, an election, the promotion seen by INFO
    -- (every second during a failover), then the reconnect pause
    assert.is_true(back < 8, string.format("admitting again %.2f s after the primary stopped", back))
    assert.is_true(failures > 0)
    assert.same({ limiter_unavailable = true }, kinds)
    assert.is_true(slowest < 0.25 + 0.1, string.format("a call took %.3f s against a timeout of 0.25 s", slowest))
    assert.matches("^master", s.replica:cli("ROLE"))
    assert.is_true(calls(s.replica, "evalsha") + calls(s.replica, "eval") > 0)
    -- and goes on admitting there
    for _ = 1, 10 do assert.is_true((b:take())) end
  end)
end)
