local rw = require "ratewise"
local socket = require "socket"
local drift = require "spec.support.drift"

describe("rw.bucket", function()
  it("starts full", function()
    local b = rw.bucket { capacity = 5, rate = 1 }
    assert.near(5, b:tokens(), 0.01)
    for _ = 1, 5 do assert.is_true(b:take()) end
    assert.is_false((b:take()))
  end)

  it("take answers with the wait until the tokens would be there", function()
    local b = rw.bucket { capacity = 2, rate = 10 }
    assert.is_true(b:take(2))
    local ok, wait = b:take(1)
    assert.is_false(ok)
    assert.near(0.1, wait, 0.01)
    ok, wait = b:take(2)
    assert.is_false(ok)
    assert.near(0.2, wait, 0.01)
  end)

  it("refills fractionally on the monotonic clock", function()
    local b = rw.bucket { capacity = 10, rate = 100 }
    assert.is_true(b:take(10))
    local t0 = rw.now()
    while rw.now() - t0 < 0.025 do end -- a short busy wait: exactly what acquire must not do
    local tokens = b:tokens()
    assert.is_true(tokens >= 2.4 and tokens < 4, tostring(tokens))
  end)

  it("never holds more than its capacity", function()
    local b = rw.bucket { capacity = 3, rate = 1000 }
    local t0 = rw.now()
    while rw.now() - t0 < 0.01 do end
    assert.near(3, b:tokens(), 1e-9)
  end)

  it("acquire waits until the tokens are there", function()
    local b = rw.bucket { capacity = 1, rate = 20 }
    local t0 = rw.now()
    for _ = 1, 5 do b:acquire() end
    local elapsed = rw.now() - t0
    -- 1 token at once, then 4 more at 20/s: at least 0.2 s
    assert.is_true(elapsed >= 0.2 - 0.002, tostring(elapsed))
    assert.is_true(elapsed < 0.2 + 0.1, tostring(elapsed))
  end)

  it("acquire serves waiters first come, first served", function()
    -- Reservations queue: each later caller is told to wait longer.
    local b = rw.bucket { capacity = 1, rate = 10 }
    local first_at = rw.now()
    assert.equal(0, b:reserve(1))
    local w1 = b:reserve(1)
    local w2 = b:reserve(1)
    -- 0.1 s and 0.2 s after the first, less the time since it
    drift.near(w1, 0.1, -1, first_at, "the second's wait", 0.005)
    drift.near(w2, 0.2, -1, first_at, "the third's wait", 0.005)
    assert.is_true(w2 > w1, "the third waits longer: " .. w1 .. ", " .. w2)
    assert.is_false((b:take(1)))
  end)

  it("acquire uses the sleep it is given, and gives the tokens back if that sleep fails", function()
    local b = rw.bucket { capacity = 1, rate = 1 }
    b:acquire()
    local asked = {}
    b:acquire(1, function(s) asked[#asked + 1] = s; socket.sleep(s) end)
    assert.near(1, asked[1], 0.01)
    -- a sleep that ends early (socket.sleep rounds) is followed by one for what is left
    for i = 2, #asked do assert.is_true(asked[i] < 0.01, "asked again for " .. asked[i]) end
    local before = b:tokens()
    assert.has_error(function()
      b:acquire(1, function() error("cancelled") end)
    end, "cancelled")
    assert.near(before, b:tokens(), 0.01)
  end)

  it("rejects a request for more than the capacity", function()
    local b = rw.bucket { capacity = 3, rate = 1 }
    assert.error_matches(function() b:take(4) end, "could never be served")
    assert.error_matches(function() b:acquire(4) end, "could never be served")
    assert.error_matches(function() b:take(0) end, "positive")
    assert.error_matches(function() b:take(-1) end, "positive")
  end)

  it("rejects a non-positive rate or capacity, and unknown options", function()
    assert.error_matches(function() rw.bucket { capacity = 0, rate = 1 } end, "'capacity'")
    assert.error_matches(function() rw.bucket { capacity = 1, rate = -1 } end, "'rate'")
    assert.error_matches(function() rw.bucket { capacity = 1, rate = 0 } end, "'rate'")
    assert.error_matches(function() rw.bucket { capacity = 1, rate = 0 / 0 } end, "'rate'")
    assert.error_matches(function() rw.bucket { capacity = 1, rate = "fast" } end, "'rate'")
    assert.error_matches(function() rw.bucket { rate = 1 } end, "'capacity' is required")
    assert.error_matches(function() rw.bucket { capacity = 1, rate = 1, burst = 2 } end, "unknown option 'burst'")
    assert.has_error(function() rw.bucket() end)
  end)

  it("can be closed, and then refuses use", function()
    local b = rw.bucket { capacity = 1, rate = 1 }
    b:close()
    b:close()
    assert.error_matches(function() b:take() end, "closed")
    -- What a to-be-closed variable (Lua 5.4) calls at the end of its block;
    -- the metamethod is there on every Lua.
    local c = rw.bucket { capacity = 1, rate = 1 }
    assert.is_true(c:take())
    getmetatable(c).__close(c)
    assert.error_matches(function() c:take() end, "closed")
    if _VERSION == "Lua 5.4" then
      local closed = assert(load([[
        local rw = ...
        local d
        do
          local c <close> = rw.bucket { capacity = 1, rate = 1 }
          d = c
        end
        return d
      ]]))(rw)
      assert.error_matches(function() closed:take() end, "closed")
    end
  end)
end)

describe("rw.bucket's limits", function()
  local DAY = 86400

  it("lets a sync put the next token at most sync_horizon away: one day unless the bucket says", function()
    local b = rw.bucket { capacity = 10, rate = 1 }
    assert.equal(DAY, b:sync_horizon())
    b:sync(0, 99999999999 - os.time()) -- a reset 3,000 years ahead
    local wait = b:wait_time()
    assert.is_true(wait <= DAY and wait > DAY - 1, tostring(wait))
    b:sync(0, math.huge)
    assert.is_true(b:wait_time() <= DAY, tostring(b:wait_time()))

    local short = rw.bucket { capacity = 10, rate = 1, sync_horizon = 60 }
    assert.equal(60, short:sync_horizon())
    short:sync(0, 3600)
    wait = short:wait_time()
    assert.is_true(wait <= 60 and wait > 59, tostring(wait))
    -- A reset within the horizon is believed as it is.
    local near = rw.bucket { capacity = 10, rate = 1 }
    near:sync(0, 30)
    assert.near(30, near:wait_time(), 0.01)
  end)

  it("lets a sync through rw.limiters reach each member under the member's own horizon", function()
    local a = rw.bucket { capacity = 5, rate = 2, sync_horizon = 10 }
    local b = rw.bucket { capacity = 5, rate = 2 }
    local both = rw.limiters { a, b }
    both:sync(0, 1e12)
    assert.is_true(a:wait_time() <= 10 and a:wait_time() > 9.9, tostring(a:wait_time()))
    assert.is_true(b:wait_time() <= DAY and b:wait_time() > DAY - 1, tostring(b:wait_time()))
    assert.is_true(both:wait_time() <= DAY, tostring(both:wait_time()))
  end)

  it("checks sync_horizon, and names the nearest option when one is unknown", function()
    for _, bad in ipairs { 0, -1, 0 / 0, math.huge, "long" } do
      assert.error_matches(function() rw.bucket { capacity = 1, rate = 1, sync_horizon = bad } end,
        "option 'sync_horizon' must be a positive number", 1, true)
    end
    assert.error_matches(function() rw.bucket { capacity = 1, rate = 1, sync_horizon = 1e19 } end,
      "option 'sync_horizon' is too large", 1, true)
    assert.error_matches(function() rw.bucket { capacity = 1, rate = 1, horizon = 5 } end,
      "bucket: unknown option 'horizon' (did you mean 'sync_horizon'?)", 1, true)
  end)

  it("words an unknown option as options.lua does, with the same nearest name", function()
    local options = require "ratewise.options"
    local known = { "capacity", "rate", "sync_horizon", "slow_down" }
    for _, name in ipairs { "capacty", "rates", "burst", "slowdown", "sync", "ate", "x", "", "capacité", 1, 2.5, true,
      ("x"):rep(100) .. "\n", "rate\0x", "a\tb", ("r"):rep(40), ("r"):rep(41) } do
      local ok, err = pcall(rw.bucket, { capacity = 1, rate = 1, [name] = 1 })
      assert.is_false(ok)
      local _, expected = pcall(options.unknown, "bucket", name, known, 0)
      assert.equal(expected, err)
    end
  end)

  it("refuses a rate so small that its waits would be infinite, or so large that they lose meaning", function()
    assert.error_matches(function() rw.bucket { capacity = 1, rate = 1e-320 } end,
      "option 'rate' is too small", 1, true)
    assert.error_matches(function() rw.bucket { capacity = 1e6, rate = 1e-13 } end,
      "option 'rate' is too small", 1, true)
    assert.error_matches(function() rw.bucket { capacity = 1, rate = 1e19 } end,
      "option 'rate' is too large", 1, true)
    assert.is_truthy(rw.bucket { capacity = 1, rate = 1e-17 }) -- a token every 3 billion years: finite
  end)

  it("reports every wait as a finite number, however deep the reservations go", function()
    local b = rw.bucket { capacity = 1e6, rate = 1e-12 }
    for _ = 1, 10 do b:reserve(1e6) end -- 1e19 s of debt
    for _, wait in ipairs { b:wait_time(1), b:reserve(1), select(2, b:take(1)) } do
      assert.is_true(wait > 0 and wait <= 1e18, tostring(wait))
    end
  end)
end)

-- Inside a task, the scheduler claims a waiting task's place when its time
-- comes (runtime.claim, through scheduler.park): the task's stack holds no
-- frame of the bucket's code while it waits.
describe("rw.bucket's waiters in tasks", function()
  it("serve waiters in order, each once its tokens are its own", function()
    local b = rw.bucket { capacity = 1, rate = 20 }
    assert(b:acquire())
    local order, t0 = {}, rw.now()
    rw.run(function()
      for i = 1, 5 do
        rw.spawn(function()
          assert.is_true(b:acquire())
          order[#order + 1] = { i, rw.now() - t0 }
        end)
      end
    end)
    assert.equal(5, #order)
    for k, entry in ipairs(order) do
      assert.equal(k, entry[1])
      assert.is_true(entry[2] >= k * 0.05 - 0.005, ("waiter %d served at %.3f s"):format(k, entry[2]))
    end
    assert.is_true(b:tokens() < 0.5)
  end)

  it("give the tokens back when a waiter is cancelled after its claim, before it ran", function()
    local scheduler = require "ratewise.scheduler"
    local b = rw.bucket { capacity = 1, rate = 20 }
    assert(b:acquire())
    local waiter = rw.spawn(function() return b:acquire() end)
    rw.step(0, false) -- it waits for the next token, 0.05 s away
    socket.sleep(0.08)
    scheduler.timeout() -- fires the due timer: the claim makes the waiter ready, not run
    assert.equal("ready", waiter:status())
    waiter:cancel()
    rw.step(0, false)
    assert.equal("done", waiter:status())
    assert.is_true(b:tokens() > 0.9, "the claimed token was lost: " .. b:tokens())
  end)

  it("end a waiter with the bucket's error when the bucket is closed under it", function()
    local b = rw.bucket { capacity = 1, rate = 0.5 }
    assert(b:acquire())
    local err
    rw.run(function()
      local waiter = rw.spawn(function() return b:acquire() end)
      rw.sleep(0.01)
      b:close()
      local _, why = waiter:join()
      err = why
    end)
    assert.matches("bucket is closed", tostring(err))
  end)
  describe("against a counting window (cubic.lua: a shut door)", function()
    local throttle = { status = 429, throttled = true, headers = { ["retry-after"] = "1" } }
    local accepted = { status = 200, headers = {} }

    it("sends nothing for 1.2 hints once three requests sent since the drop are refused, none accepted between",
      function()
        local b = rw.bucket { capacity = 200, rate = 200 }
        local t = rw.now()
        b:observe(throttle, t - 0.001) -- the drop
        assert.is_true(b:wait_time() < 0.01, "a drop alone holds nothing: " .. b:wait_time())
        b:observe(throttle, t + 0.001)
        b:observe(throttle, t + 0.001)
        assert.is_true(b:wait_time() < 0.01, "two refusals are not yet a shut door: " .. b:wait_time())
        b:observe(throttle, t + 0.001)
        assert.near(1.2, b:wait_time(), 0.02)
        -- the refusals of requests still in flight are the same episode
        b:observe(throttle, rw.now())
        assert.near(1.2, b:wait_time(), 0.02)
        assert.near(190, b:rate(), 1)
      end)

    it("holds a long hint (a quota's reset) for the hint and a second, not a fifth more", function()
      local b = rw.bucket { capacity = 10, rate = 10 }
      local reset = { status = 429, throttled = true, headers = { ["retry-after"] = "3000" } }
      b:observe(reset, rw.now() - 0.001)
      for _ = 1, 3 do b:observe(reset, rw.now()) end
      assert.near(3001, b:wait_time(), 0.05)
    end)

    it("never holds where a request sent since the drop got through (a token bucket's jitter)", function()
      local b = rw.bucket { capacity = 1, rate = 200 }
      for _ = 1, 5 do
        b:observe(throttle, rw.now())
        b:observe(accepted, rw.now())
      end
      assert.is_true(b:wait_time() < 0.1, "held: " .. b:wait_time())
    end)

    it("never holds without a hint: a bare 429 names no window", function()
      local b = rw.bucket { capacity = 1, rate = 200 }
      local t = rw.now()
      for _ = 1, 5 do b:observe({ status = 429, throttled = true, headers = {} }, t) end
      assert.is_true(b:wait_time() < 0.1, "held: " .. b:wait_time())
    end)
  end)
end)
