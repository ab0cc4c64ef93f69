-- rw.redis_bucket against a real redis-server the suite starts (Debian's,
-- no persistence, a free port), and the test server seeing what the
-- processes sharing it send.
local rw = require "ratewise"
local server = require "spec.support.server"
local redis = require "spec.support.redis"
local subprocess = require "spec.support.subprocess"
local socket_sleep = require("socket").sleep

-- A program that calls fetch through a shared bucket for `seconds` in two
-- tasks, and prints "ok N failed M kinds...".
local WORKER = [[
local rw = require "ratewise"
local url, redis_url, seconds, on_error, rate = arg[1], arg[2], tonumber(arg[3]), arg[4], tonumber(arg[5])
local limiter = rw.redis_bucket { redis = redis_url, key = "shared", capacity = 1, rate = rate,
  on_error = on_error, timeout = 0.2 }
local ok, failed, kinds, slowest = 0, 0, {}, 0
local stop_at = rw.now() + seconds
rw.run(function()
  for _ = 1, 2 do
    rw.spawn(function()
      while rw.now() < stop_at do
        local t0 = rw.now()
        local res, err = rw.fetch(url, { limiter = limiter, on_retry = false, max_retries = 0, max_elapsed = 5 })
        slowest = math.max(slowest, rw.now() - t0)
        if res then ok = ok + 1 else
          failed = failed + 1
          kinds[err.kind] = true
          if err.kind == "limiter_unavailable" then rw.sleep(0.05) end
        end
      end
    end)
  end
end)
local names = {}
for k in pairs(kinds) do names[#names + 1] = k end
print(string.format("ok %d failed %d slowest %.3f kinds %s", ok, failed, slowest, table.concat(names, ",")))
]]

local function workers(n, s_url, r_url, seconds, on_error, rate, during)
  return subprocess.run_lua_processes { code = WORKER, count = n, during = during,
    args = function() return table.concat({ s_url, r_url, seconds, on_error, rate }, " ") end }
end

-- A `during` for workers(): Redis (r) stops half a second after the server
-- (s) has seen the processes pace through it to `path`. Timed from their
-- launch, a loaded machine's late start once let 36 requests through
-- against a bound of 35, and once left most of a run without Redis. Returns
-- it, and a function that answers how many requests the server had seen
-- when Redis stopped.
local function stop_redis_once_paced(s, r, path)
  local seen
  return function()
    local deadline = rw.now() + 10
    while #s:log(path) < 5 and rw.now() < deadline do socket_sleep(0.02) end
    socket_sleep(0.5)
    r:stop()
    seen = #s:log(path)
  end, function() return seen end
end

local escape = require("spec.support.nginx").escape

-- In OpenResty: the bucket through a cosocket client (Debian's
-- lua-nginx-redis, resty.redis packaged as nginx.redis), or a URL.
local NGINX_SERVER = [[
    location = /through {
      content_by_lua_block {
        local rw = require "ratewise"
        local limit
        local red
        if ngx.var.arg_client == "object" then
          red = require("nginx.redis"):new()
          red:set_timeout(500)
          assert(red:connect("127.0.0.1", tonumber(ngx.var.arg_port)))
          limit = rw.redis_bucket { redis = red, key = "nginx", capacity = 1, rate = 20 }
        else
          limit = rw.redis_bucket { redis = "redis://127.0.0.1:" .. ngx.var.arg_port, key = "nginx",
            capacity = 1, rate = 20 }
        end
        local res, err = rw.fetch(ngx.unescape_uri(ngx.var.arg_url), { limiter = limit, on_retry = false,
          max_retries = 0 })
        if red then red:set_keepalive(10000, 10) end
        ngx.say(res and res.status or err.kind)
      }
    }
]]

-- Without Redis support (`make test REDIS=0`), what needs ratewise's own
-- Redis connection is pending, and the error a caller gets is checked.
local needs_redis = rw.features.redis and it or function(name)
  pending(name .. " [this build has no Redis support: REDIS=0]")
end

describe("rw.redis_bucket", function()
  local s, r

  setup(function()
    s = server.start()
    r = redis.start()
  end)
  teardown(function()
    s:stop()
    r:destroy()
  end)
  before_each(function()
    s:reset()
    r:cli("FLUSHALL")
  end)

  needs_redis("is one bucket for every object that names the same key, on the server's clock", function()
    local a = rw.redis_bucket { redis = r.url, key = "k", capacity = 2, rate = 10 }
    local b = rw.redis_bucket { redis = r.url, key = "k", capacity = 2, rate = 10 }
    local other = rw.redis_bucket { redis = r.url, key = "other", capacity = 2, rate = 10 }
    assert.is_true((a:take()))
    assert.is_true((b:take()))
    local ok, wait = a:take()
    assert.is_false(ok)
    assert.near(0.1, wait, 0.01)
    assert.near(0.1, b:wait_time(), 0.01)
    assert.near(0, b:tokens(), 0.05)
    assert.is_true((other:take(2)))
    local t0 = rw.now()
    assert.is_true(a:acquire())
    assert.near(0.1, rw.now() - t0, 0.03)
    b:refund()
    assert.is_true((a:take()))
  end)

  -- (limiters' settle: an answer that used more than was taken for it)
  needs_redis("debit takes at once, into debt shared by every object on the key, up to its sync_horizon",
      function()
    local a = rw.redis_bucket { redis = r.url, key = "k", capacity = 10, rate = 10, sync_horizon = 2 }
    local b = rw.redis_bucket { redis = r.url, key = "k", capacity = 10, rate = 10, sync_horizon = 2 }
    assert.is_true((a:take(4)))
    a:debit(8) -- 6 there: 2 short
    assert.near(-2, b:tokens(), 0.05)
    assert.near(0.3, b:wait_time(), 0.02) -- the debt and one token
    b:debit(15) -- more than the bucket holds, taken whole
    assert.near(-17, a:tokens(), 0.1)
    -- a refund may be more than the bucket holds too: what such a debit took comes back whole
    a:refund(15)
    assert.near(-2, b:tokens(), 0.1)
    b:debit(500) -- believed only up to the horizon: no token for 2 s, as a local bucket's floor
    assert.near(-19, a:tokens(), 0.2)
    a:debit(500) -- and debits do not stack past it
    assert.near(-19, b:tokens(), 0.2)
    assert.error_matches(function() a:debit(0) end, "debit")
    assert.error_matches(function() a:debit("3") end, "debit")
  end)

  needs_redis("keeps its key under a hash tag, and lets it expire once the bucket is full again", function()
    local b = rw.redis_bucket { redis = r.url, key = "api-key-7", capacity = 1, rate = 20 }
    assert.is_true((b:take()))
    assert.equal("ratewise:{api-key-7}", r:cli("KEYS", "*"))
    local ttl = tonumber(r:cli("PTTL", "ratewise:{api-key-7}"))
    assert.is_true(ttl > 0 and ttl <= 1100, "expires in " .. ttl .. " ms")
    assert.is_true(b:acquire()) -- the reservation pushes the expiry on
    socket_sleep(0.2)
    assert.near(1, b:tokens(), 0.01)
  end)

  needs_redis("reloads its script when Redis forgot it (NOSCRIPT), and takes one command per acquire", function()
    local b = rw.redis_bucket { redis = r.url, key = "k", capacity = 100, rate = 1000 }
    assert.is_true(b:acquire())
    r:cli("SCRIPT", "FLUSH")
    r:cli("CONFIG", "RESETSTAT")
    assert.is_true(b:acquire()) -- NOSCRIPT, then EVAL
    for _ = 1, 10 do assert(rw.fetch(s:url("/x"), { limiter = b, on_retry = false })) end
    local stats = r:cli("INFO", "commandstats")
    local evalsha = tonumber(stats:match("cmdstat_evalsha:calls=(%d+)"))
    local eval = tonumber(stats:match("cmdstat_eval:calls=(%d+)"))
    assert.equal(11, evalsha)
    assert.equal(1, eval)
    assert.equal(10, #s:log("/x"))
  end)

  needs_redis("keeps four processes to one rate: the server sees 100 a second, within 2 %", function()
    local results = workers(4, s:url("/shared"), r.url, 3, "closed", 100)
    local total = 0
    for _, out in ipairs(results) do
      local ok, failed = out:match("ok (%d+) failed (%d+)")
      assert(ok, out)
      assert.equal("0", failed, out)
      total = total + tonumber(ok)
    end
    local log = s:log("/shared")
    assert.equal(total, #log)
    local first, last = log[1].t, log[#log].t
    local rate = (#log - 1) / (last - first)
    assert.is_true(math.abs(rate - 100) <= 2, string.format("%d requests over %.3f s: %.2f a second", #log,
      last - first, rate))
  end)

  needs_redis("on_error = closed: with Redis stopped every call ends at once with kind limiter_unavailable", function()
    local stop, seen_at_stop = stop_redis_once_paced(s, r, "/closed")
    local results = workers(4, s:url("/closed"), r.url, 2, "closed", 50, stop)
    local shared = seen_at_stop()
    r:restart()
    for _, out in ipairs(results) do
      local ok, failed, slowest, kinds = out:match("ok (%d+) failed (%d+) slowest ([%d.]+) kinds (%S*)")
      assert(ok, out)
      assert.is_true(tonumber(ok) > 0, out)
      assert.is_true(tonumber(failed) > 0, out)
      assert.equal("limiter_unavailable", kinds, out)
      assert.is_true(tonumber(slowest) < 0.5, "a call took " .. slowest .. " s")
    end
    -- while Redis ran, 50 a second for all four (1 + 50 t in t seconds);
    -- what the server saw stopped when Redis did: nothing went out unpaced,
    -- but for the slots Redis had already reserved (one at most for each of
    -- the 8 tasks, waiting out its slot when Redis stopped)
    local log = s:log("/closed")
    local span = log[shared].t - log[1].t
    assert.is_true(shared <= 1 + 50 * span + 2, string.format("%d requests in %.3f s while Redis ran", shared, span))
    assert.is_true(#log - shared <= 8 + 2, (#log - shared) .. " requests after Redis stopped")
  end)

  needs_redis("on_error = local: with Redis stopped mid-run, four processes go on at their local rate, none fails",
    function()
    local stop, seen_at_stop = stop_redis_once_paced(s, r, "/local")
    local results = workers(4, s:url("/local"), r.url, 2, "local", 40, stop)
    local shared = seen_at_stop()
    r:restart()
    local total = 0
    for _, out in ipairs(results) do
      local ok, failed, slowest = out:match("ok (%d+) failed (%d+) slowest ([%d.]+)")
      assert(ok, out)
      assert.equal("0", failed, out)
      assert.is_true(tonumber(slowest) < 0.5, "a call took " .. slowest .. " s")
      total = total + tonumber(ok)
    end
    local log = s:log("/local")
    assert.equal(total, #log)
    -- A bucket of capacity 1 at 40 a second lets 1 + 40 t requests through
    -- in t seconds: while Redis ran, one such bucket for all four; after,
    -- one in each process. A request or two taken before the stop may
    -- arrive after it was counted.
    local shared_span = log[shared].t - log[1].t
    assert.is_true(shared <= 1 + 40 * shared_span + 2,
      string.format("%d requests in %.3f s while Redis ran", shared, shared_span))
    local after = #log - shared
    assert.is_true(after >= 40, after .. " requests after Redis stopped")
    local local_span = log[#log].t - log[shared + 1].t
    assert.is_true(after <= 4 * (1 + 40 * local_span) + 2,
      string.format("%d requests in %.3f s after Redis stopped", after, local_span))
  end)

  needs_redis("on_error = local: with Redis stopped each process goes on at its local rate, and back to Redis after",
    function()
    local b = rw.redis_bucket { redis = r.url, key = "k", capacity = 1, rate = 20, on_error = "local",
      timeout = 0.1 }
    assert.is_true(b:acquire())
    r:stop()
    finally(function() r:restart() end) -- the next specs need it, whatever happens here
    local t0 = rw.now()
    for _ = 1, 5 do assert.is_true(b:acquire()) end
    local took = rw.now() - t0
    assert.is_true(took >= 0.15 and took < 1, "the local bucket paced 5 acquires in " .. took .. " s")
    r:restart()
    socket_sleep(0.6) -- the reconnect pause (redis.RECONNECT_AFTER)
    assert.is_true(b:acquire())
    assert.equal("ratewise:{k}", r:cli("KEYS", "*"))
  end)

  needs_redis("picks up a restarted Redis: a call after the restart is served by it", function()
    local b = rw.redis_bucket { redis = r.url, key = "k", capacity = 5, rate = 5, timeout = 0.1 }
    assert.is_true((b:take()))
    r:stop()
    finally(function() r:restart() end) -- the next specs need it, whatever happens here
    local res, err = b:take()
    assert.is_nil(res)
    assert.equal("limiter_unavailable", err.kind)
    assert.matches("Redis at 127%.0%.0%.1:%d+", err.message)
    r:restart()
    socket_sleep(0.6)
    assert.is_true((b:take()))
  end)

  needs_redis("in rw.limiters: a Redis that fails ends the composite's acquire and the call with its error", function()
    local b = rw.redis_bucket { redis = r.url, key = "k", capacity = 5, rate = 5, timeout = 0.1 }
    -- The local member refills too slowly to hide a token taken from it
    -- (at 5 a second, an ASan run's 140 ms between its checks showed 4.69).
    local local_limit = rw.bucket { capacity = 5, rate = 0.01 }
    local both = rw.limiters { b, local_limit }
    assert.is_true(both:acquire())
    assert.near(4, b:tokens(), 0.3)
    r:stop()
    finally(function() r:restart() end)
    local ok, err = both:acquire()
    assert.is_nil(ok)
    assert.equal("limiter_unavailable", err.kind)
    local res, ferr = rw.fetch(s:url("/l"), { limiter = both, on_retry = false })
    assert.is_nil(res)
    assert.equal("limiter_unavailable", ferr.kind)
    assert.equal(0, #s:log("/l"))
    assert.near(4, local_limit:tokens(), 0.1) -- nothing taken from the member that could answer
  end)

  needs_redis("takes a broken or hostile server's huge reply for a protocol error, allocating nothing for it",
    function()
    local fake_redis = require "spec.support.fake_redis"
    for _, case in ipairs {
      { "*1111111111\r\n", "protocol error" },
      { "$2000000\r\n" .. string.rep("x", 2000000) .. "\r\n", "a reply of more than 1048576 bytes" },
    } do
      local fake = fake_redis.start { SCRIPT = case[1] }
      local b = rw.redis_bucket { redis = fake.url, key = "k", capacity = 1, rate = 1, timeout = 2 }
      local ok, err = b:take()
      fake:stop()
      assert.is_nil(ok)
      assert.equal("limiter_unavailable", err.kind)
      assert.matches(case[2], err.message, 1, true)
    end
  end)

  needs_redis("never shows the password of its URL, and refuses options that make no sense", function()
    local b = rw.redis_bucket { redis = "redis://:hunter2@127.0.0.1:1", key = "k", capacity = 1, rate = 1,
      timeout = 0.1 }
    local _, err = b:acquire()
    assert.equal("limiter_unavailable", err.kind)
    assert.is_nil(tostring(err):find("hunter2", 1, true))
    assert.error_matches(function() rw.redis_bucket { redis = r.url, key = "k", capacity = 1, rate = 1, ttl = 5 } end,
      "unknown option 'ttl'", 1, true)
    assert.error_matches(function() rw.redis_bucket { redis = r.url, key = "", capacity = 1, rate = 1 } end,
      "option 'key' must be a non-empty string", 1, true)
    assert.error_matches(function() rw.redis_bucket { redis = r.url, key = "k", rate = 1 } end,
      "option 'capacity' is required", 1, true)
    assert.error_matches(function()
      rw.redis_bucket { redis = r.url, key = "k", capacity = 1, rate = 1, on_error = "open" }
    end, "option 'on_error' must be \"closed\" or \"local\"", 1, true)
    local ok, msg = pcall(rw.redis_bucket, { redis = "http://:hunter2@x", key = "k", capacity = 1, rate = 1 })
    assert.is_false(ok)
    assert.matches("not a redis:// URL", msg)
    assert.is_nil(msg:find("hunter2", 1, true))
    assert.error_matches(function() rw.redis_bucket { redis = 5, key = "k", capacity = 1, rate = 1 } end,
      "must be a redis:// URL or a client with evalsha and eval", 1, true)
    assert.error_matches(function() b:acquire(2) end, "could never be served", 1, true)
  end)

  for _, client in ipairs { "object", "url" } do
    local test = client == "object" and it or needs_redis
    test("paces the requests of an nginx through Redis (" .. (client == "object" and "a cosocket client" or
      "a redis:// URL") .. ")", function()
      local nginx = require "spec.support.nginx"
      local n = nginx.start { server = NGINX_SERVER }
      local started, took
      local ok, err = pcall(function()
        local url = n:url("/through?client=" .. client .. "&port=" .. r.port .. "&url=" .. escape(s:url("/n")))
        started = rw.now()
        rw.run(function()
          for _ = 1, 4 do
            rw.spawn(function()
              for _ = 1, 3 do
                local res = assert(rw.fetch(url, { on_retry = false, max_retries = 0, timeout = 10 }))
                assert.equal("200\n", res.body)
              end
            end)
          end
        end)
        took = rw.now() - started
      end)
      n:stop()
      assert(ok, err)
      local log = s:log("/n")
      assert.equal(12, #log)
      -- Measured by the caller, not by when the server saw them: a request
      -- may reach the server late (the worker's first transfer), never
      -- early, so arrivals can bunch (CI saw requests 2 - 4 within 3 ms
      -- after a late second) while the grants, one every 1/20 s from a
      -- bucket of one token, cannot. The twelfth grant comes 11/20 s after
      -- the first.
      local gaps = {}
      for i = 2, 12 do gaps[#gaps + 1] = string.format("%.3f", log[i].t - log[i - 1].t) end
      assert.is_true(took >= 11 / 20 - 0.02,
        string.format("12 requests in %.3f s at 20 a second (gaps at the server: %s)", took, table.concat(gaps, " ")))
    end)
  end

  needs_redis("takes a client object with evalsha and eval (the shape of resty.redis)", function()
    local own = require("ratewise.redis").new { host = "127.0.0.1", port = r.port, timeout = 1 }
    local calls = {}
    local object = {
      evalsha = function(_, ...) calls[#calls + 1] = "evalsha"; local v = own:call("EVALSHA", ...)
        if type(v) == "table" and v.err then return nil, v.err end return v end,
      eval = function(_, ...) calls[#calls + 1] = "eval"; return own:call("EVAL", ...) end,
    }
    local b = rw.redis_bucket { redis = object, key = "obj", capacity = 2, rate = 10 }
    assert.is_true((b:take()))
    assert.is_true((b:take()))
    assert.is_false((b:take()))
    assert.same({ "eval", "eval", "eval" }, calls) -- no script("load"): EVAL each time
  end)
end)

describe("rw.redis_bucket against a broken or hostile Redis", function()
  local fake_redis = require "spec.support.fake_redis"
  local SHA = "$40\r\n" .. string.rep("a", 40) .. "\r\n"
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  -- A fake answering as given for the time of fn(fake).
  local function with_fake(replies, fn)
    local fake = fake_redis.start(replies)
    local ok, err = pcall(fn, fake)
    fake:stop()
    assert(ok, err)
  end

  needs_redis("reads a URL's userinfo to its last @, and shows no part of the password", function()
    with_fake({ AUTH = "-WRONGPASS invalid username-password pair\r\n" }, function(fake)
      local url = "redis://:p@ssw0rdSECRET@127.0.0.1:" .. fake.port .. "/2"
      local b = rw.redis_bucket { redis = url, key = "k", capacity = 1, rate = 1 }
      local ok, err = b:take()
      assert.is_nil(ok)
      assert.equal("limiter_unavailable", err.kind)
      assert.matches("Redis at 127.0.0.1:" .. fake.port .. ": AUTH: WRONGPASS", err.message, 1, true)
      assert.is_nil(tostring(err):find("SECRET", 1, true), tostring(err))
      assert.same({ "AUTH p@ssw0rdSECRET" }, fake:commands())
    end)
    with_fake({}, function(fake)
      local url = "redis://alice:p@ss/w0rd%40SECRET@127.0.0.1:" .. fake.port .. "/2"
      local b = rw.redis_bucket { redis = url, key = "k", capacity = 1, rate = 1 }
      b:take()
      assert.same({ "AUTH alice p@ss/w0rd@SECRET", "SELECT 2" }, { fake:commands()[1], fake:commands()[2] })
    end)
    local b = rw.redis_bucket { redis = "redis://:p@ssw0rdSECRET@127.0.0.1:1", key = "k", capacity = 1, rate = 1 }
    local _, err = b:take()
    assert.equal("limiter_unavailable", err.kind)
    assert.matches("Redis at 127.0.0.1:1:", err.message, 1, true)
    assert.is_nil(tostring(err):find("SECRET", 1, true), tostring(err))
  end)

  needs_redis("keeps the password and the user out of every error the server answers with", function()
    local echo = "-ERR alice sent hunter2SECRET, p%40ss\r\n"
    for _, replies in ipairs {
      { SCRIPT = echo },
      { SCRIPT = SHA, EVALSHA = echo },
      { SCRIPT = SHA, EVALSHA = "-NOSCRIPT\r\n", EVAL = echo },
      { SELECT = echo },
    } do
      with_fake(replies, function(fake)
        local b = rw.redis_bucket { redis = "redis://alice:hunter2SECRET@127.0.0.1:" .. fake.port .. "/1", key = "k",
          capacity = 1, rate = 1 }
        local ok, err = b:take()
        assert.is_nil(ok)
        assert.equal("limiter_unavailable", err.kind)
        assert.matches("ERR [redacted] sent [redacted], p%40ss", err.message, 1, true)
        assert.is_nil(tostring(err):find("SECRET", 1, true), tostring(err))
        assert.is_nil(tostring(err):find("alice", 1, true), tostring(err))
      end)
    end
  end)

  needs_redis("says only the code of an AUTH error, which may echo the password in any form", function()
    for _, echo in ipairs { "-WRONGPASS invalid password 'hunter2SECRE'\r\n", "-ERR bad password HUNTER2SECRET\r\n",
                            "-ERR alice sent hunter2SECRET\r\n" } do
      with_fake({ AUTH = echo }, function(fake)
        local b = rw.redis_bucket { redis = "redis://alice:hunter2SECRET@127.0.0.1:" .. fake.port, key = "k",
          capacity = 1, rate = 1 }
        local ok, err = b:take()
        assert.is_nil(ok)
        assert.equal("limiter_unavailable", err.kind)
        local code = echo:match("^%-(%u+)")
        assert.matches("AUTH: " .. code .. " (the server refused the credentials)", err.message, 1, true)
        assert.is_nil(tostring(err):upper():find("SECRE", 1, true), tostring(err))
        assert.is_nil(tostring(err):find("alice", 1, true), tostring(err))
      end)
    end
  end)

  -- What the script's reply must be: {wait, granted, tokens, time}, integers.
  local T = ":1700000000000000\r\n"
  local ABSURD = {
    { SCRIPT = ":1\r\n" }, { SCRIPT = "*0\r\n" }, { SCRIPT = "$-1\r\n" }, { SCRIPT = "$3\r\nabc\r\n" },
    { SCRIPT = SHA, EVALSHA = ":5\r\n" }, { SCRIPT = SHA, EVALSHA = "$-1\r\n" }, { SCRIPT = SHA, EVALSHA = "+OK\r\n" },
    { SCRIPT = SHA, EVALSHA = "*2\r\n:0\r\n:1\r\n" }, { SCRIPT = SHA, EVALSHA = "*3\r\n:0\r\n:1\r\n:0\r\n" },
    { SCRIPT = SHA, EVALSHA = "*5\r\n:0\r\n:1\r\n:0\r\n" .. T .. ":0\r\n" },
    { SCRIPT = SHA, EVALSHA = "*4\r\n:-5\r\n:1\r\n:0\r\n" .. T },
    { SCRIPT = SHA, EVALSHA = "*4\r\n:9223372036854775807\r\n:1\r\n:0\r\n" .. T },
    { SCRIPT = SHA, EVALSHA = "*4\r\n:9223372036854775807\r\n:0\r\n:0\r\n" .. T },
    { SCRIPT = SHA, EVALSHA = "*4\r\n:0\r\n:7\r\n:0\r\n" .. T },
    { SCRIPT = SHA, EVALSHA = "*4\r\n:0\r\n:-2\r\n:0\r\n" .. T },
    { SCRIPT = SHA, EVALSHA = "*4\r\n$1\r\n0\r\n:1\r\n:0\r\n" .. T },
    { SCRIPT = SHA, EVALSHA = "*4\r\n*1\r\n:0\r\n:1\r\n:0\r\n" .. T },
    { SCRIPT = SHA, EVALSHA = "*4\r\n$-1\r\n:1\r\n:0\r\n" .. T },
    { SCRIPT = SHA, EVALSHA = "*4\r\n:0\r\n:1\r\n:-9223372036854775808\r\n" .. T },
    { SCRIPT = SHA, EVALSHA = "*4\r\n:0\r\n:1\r\n:9223372036854775807\r\n" .. T },
    { SCRIPT = SHA, EVALSHA = "*4\r\n:0\r\n:1\r\n:0\r\n:-1\r\n" },
    { SCRIPT = SHA, EVALSHA = "*4\r\n:0\r\n:1\r\n:0\r\n:9223372036854775807\r\n" },
    { SCRIPT = SHA, EVALSHA = "*4\r\n:0\r\n:-1\r\n:0\r\n" .. T }, -- "too late" every time
    { SCRIPT = SHA, EVALSHA = "-NOSCRIPT\r\n", EVAL = ":1\r\n" },
  }

  needs_redis("takes any reply that is not the script's four integers for an unavailable limiter, and never raises",
    function()
      for _, replies in ipairs(ABSURD) do
        with_fake(replies, function(fake)
          local case = fake.url .. " " .. require("cjson").encode(replies)
          local b = rw.redis_bucket { redis = fake.url, key = "k", capacity = 2, rate = 1 }
          local t0 = rw.now()
          for _, call in ipairs {
            function() return b:take() end, function() return b:acquire(1, nil, 3) end,
            function() return b:acquire() end, function() return b:wait_time() end,
            function() return b:tokens() end,
          } do
            local ok, v, err = pcall(call)
            assert.is_true(ok, case .. ": " .. tostring(v))
            assert.is_nil(v, case)
            assert.equal("limiter_unavailable", err.kind, case)
          end
          assert.is_true(pcall(b.refund, b), case)
          assert.is_true(pcall(b.sync, b, 0, 1), case)
          local res, ferr = rw.fetch(s:url("/absurd"), { limiter = b, on_retry = false, max_elapsed = 3 })
          assert.is_nil(res, case)
          assert.equal("limiter_unavailable", ferr.kind, case)
          assert.is_true(rw.now() - t0 < 1, case .. ": took " .. (rw.now() - t0) .. " s")
          -- on_error = "local": the local bucket serves
          local l = rw.redis_bucket { redis = fake.url, key = "k", capacity = 2, rate = 1, on_error = "local" }
          assert.is_true((l:take()), case)
        end)
      end
      assert.equal(0, #s:log("/absurd"))
    end)

  needs_redis("never waits past the max_wait given, whatever the server grants", function()
    -- granted, with a wait of 5 s: a server that does not run the script
    with_fake({ SCRIPT = SHA, EVALSHA = "*4\r\n:5000000\r\n:1\r\n:0\r\n:1700000000000000\r\n" }, function(fake)
      local b = rw.redis_bucket { redis = fake.url, key = "k", capacity = 1, rate = 1 }
      local t0 = rw.now()
      local ok, wait = b:acquire(1, nil, 1)
      assert.is_false(ok)
      assert.equal(5, wait)
      local res, err = rw.fetch(s:url("/late"), { limiter = b, on_retry = false, max_elapsed = 3 })
      assert.is_nil(res)
      assert.equal("budget", err.kind)
      assert.is_true(rw.now() - t0 < 1, "took " .. (rw.now() - t0) .. " s")
    end)
    assert.equal(0, #s:log("/late"))
  end)
end)

describe("a build without Redis support (make REDIS=0)", function()
  if rw.features.redis then
    pending("this build has Redis support: `make test REDIS=0` runs these")
    return
  end

  -- (a client object still works: the nginx spec above with a cosocket
  -- client runs in this build too)
  it("raises a clear error for a redis:// URL, naming the build and not the password", function()
    local ok, err = pcall(rw.redis_bucket, { redis = "redis://:hunter2@127.0.0.1:6379", key = "k", capacity = 1,
      rate = 1 })
    assert.is_false(ok)
    assert.matches("ratewise was built without Redis support (REDIS=0): rebuild with hiredis", err, 1, true)
    assert.no.matches("hunter2", err, 1, true)
    assert.error_matches(function() require("ratewise.redis").new { host = "127.0.0.1", port = 6379 } end,
      "built without Redis support", 1, true)
    assert.is_nil(require("ratewise.core").redis_connect)
  end)
end)
