-- lua/ratewise/adaptive.lua on its own (rw.adaptive): a bucket whose rate
-- a CUBIC controller moves. limits_spec.lua and rate_headers_spec.lua try
-- it against the test server's limiter (the share of the rate it gets, a
-- limit that drops, a stated limit through providers) and its option
-- errors; this covers where it starts, what observe does to the rate its
-- bucket serves at, growth held back while nobody waits, and the
-- arithmetic of sync's stated limit.
local rw = require "ratewise"

describe("rw.adaptive", function()
  it("starts at rate, else max_rate, else 10 a second, and never below min_rate", function()
    assert.equal(10, rw.adaptive():rate())
    assert.equal(10, rw.adaptive({}):rate())
    assert.equal(4, rw.adaptive({ max_rate = 4 }):rate())
    assert.equal(3, rw.adaptive({ rate = 3, max_rate = 4 }):rate())
    assert.equal(0.5, rw.adaptive({ rate = 0.1 }):rate())
    assert.equal(0.2, rw.adaptive({ rate = 0.2, min_rate = 0.1 }):rate())
    local l = rw.adaptive { rate = 7, burst = 3 }
    assert.equal(3, l:capacity())
    assert.near(3, l:tokens(), 1e-6)
    assert.equal("ratewise.Adaptive (7/s now, burst 3)", tostring(l))
  end)

  it("takes a debit into debt at the rate learned (limiters' settle), and a refund larger than it holds", function()
    local l = rw.adaptive { rate = 10, burst = 5 }
    l:debit(8)
    assert.near(-3, l:tokens(), 0.05)
    assert.near(0.4, l:wait_time(), 0.02) -- the debt and one token, at 10 a second
    l:refund(20)
    assert.near(5, l:tokens(), 0.05)
    -- as a named limit asked for more than it holds
    local named = rw.limiters { tokens = l }
    assert.is_true(named:acquire { tokens = 12 })
    assert.near(-7, l:tokens(), 0.05)
  end)

  it("drops its bucket's rate to beta times the rate at a throttle: the next token comes that much later", function()
    local l = rw.adaptive { rate = 20, beta = 0.5 }
    assert.is_true((l:take()))
    assert.near(1 / 20, l:wait_time(), 0.005)
    l:observe({ status = 429, throttled = true }, rw.now())
    -- the curve climbs back from 10 at about 5 a second per second
    assert.near(10, l:rate(), 0.3)
    assert.near(1 / 10, l:wait_time(), 0.01)
    local ok, wait = l:take()
    assert.is_false(ok)
    assert.near(0.1, wait, 0.01)
    -- a throttle of a request sent before that drop is the same episode
    local before = l:rate()
    l:observe({ status = 429, throttled = true }, rw.now() - 1)
    assert.is_true(l:rate() >= before, "no second drop: " .. l:rate())
  end)

  it("takes anything but a throttle for a success, and a sent_at that is not a number for now", function()
    local l = rw.adaptive { rate = 20 }
    l:observe(nil)
    l:observe({ status = 503 }, "earlier")
    l:observe({ status = 429 }) -- a 429 fetch did not mark throttled: not a throttle
    assert.equal(20, l:rate())
  end)

  it("in slow start grows on successes only while callers wait for it", function()
    local l = rw.adaptive { rate = 10 }
    for _ = 1, 5 do l:observe({ status = 200 }, rw.now() - 0.1) end
    assert.equal(10, l:rate(), "nobody waiting and nothing sent: no growth")
    local rate_while_waiting, tokens_while_waiting
    rw.run(function()
      assert.is_true(l:acquire()) -- the one token
      local waiter = rw.spawn(function() return l:acquire() end)
      assert(rw.spawn(function()
        tokens_while_waiting = l:tokens()
        for _ = 1, 5 do l:observe({ status = 200 }, rw.now() - 0.1) end
        rate_while_waiting = l:rate()
        return true
      end):join())
      assert(waiter:join())
    end)
    assert.is_true(tokens_while_waiting < 0, "the waiter holds its place: " .. tokens_while_waiting)
    -- a round trip of 0.1 s: each success adds a tenth of a second's worth
    assert.near(10 + 5 * 10, rate_while_waiting, 2)
  end)

  it("sync takes a stated limit per window at once and never climbs above it, nor above max_rate", function()
    local l = rw.adaptive { max_rate = 50 }
    l:sync(100, 30, 120, 60)
    assert.equal(2, l:rate())
    for _ = 1, 20 do l:observe({ status = 200 }, rw.now() - 0.1) end
    assert.equal(2, l:rate())
    l:sync(100, 30, 6000, 60) -- 100 a second: max_rate wins
    assert.equal(50, l:rate())
    l:sync(100, 30, 1e12, 1e-3) -- no limit a client could reach: left alone
    assert.equal(50, l:rate())
    -- a throttle at the stated rate is jitter: a drop by near (0.95), not beta
    l:observe({ status = 429, throttled = true }, rw.now())
    assert.near(47.5, l:rate(), 0.3)
  end)

  it("sync without a window takes the longest reset seen, in whole seconds, afresh for a new limit", function()
    local l = rw.adaptive {}
    l:sync(90, 59.4, 100)
    assert.near(100 / 59, l:rate(), 1e-9)
    l:sync(80, 30, 100) -- a shorter reset of the same quota says nothing new
    assert.near(100 / 59, l:rate(), 1e-9)
    l:sync(10, 0.5, 300) -- another quota: its own resets count
    assert.near(300 / 0.5, l:rate(), 1e-9)
    l:sync(10, 20.7, 300)
    assert.near(300 / 20, l:rate(), 1e-9)
    local fresh = rw.adaptive {}
    fresh:sync(5, nil, 100) -- no reset seen yet: nothing stated
    assert.equal(10, fresh:rate())
  end)

  it("sync refuses a limit or window that is not one, naming it", function()
    local l = rw.adaptive {}
    for _, bad in ipairs { 0, 0.5, "100", 0 / 0, math.huge } do
      assert.error_matches(function() l:sync(1, 1, bad, 60) end, "limit must be a number of requests, at least 1",
        1, true)
    end
    for _, bad in ipairs { 0, -1, "60", math.huge } do
      assert.error_matches(function() l:sync(1, 1, 100, bad) end, "window must be a positive number of seconds",
        1, true)
    end
    assert.error_matches(function() rw.adaptive { near = 1 } end, "option 'near'", 1, true)
    assert.error_matches(function() rw.adaptive { burst = 0.5 } end, "option 'burst' must be at least 1", 1, true)
    assert.error_matches(function() rw.adaptive(5) end, "options must be a table", 1, true)
  end)
  it("when a counting window's door is shut, takes what the server accepted over the hint as the limit", function()
    local l = rw.adaptive { rate = 800 }
    local t = rw.now()
    -- 200 accepted within the last second, then refusals: the window is full
    for _ = 1, 200 do l:observe({ status = 200, headers = {} }, t - 0.001) end
    local throttle = { status = 429, throttled = true, headers = { ["retry-after"] = "1" } }
    l:observe(throttle, t) -- the drop: to beta of 800 or more, still far above the window's 200
    assert.is_true(l:rate() >= 0.7 * 800, "dropped to " .. l:rate())
    for _ = 1, 3 do l:observe(throttle, rw.now()) end
    -- just below the limit (near), and nothing sent while the window drains
    assert.is_true(l.controller.w_max > 150 and l.controller.w_max <= 200.5, "w_max " .. l.controller.w_max)
    assert.near(0.95 * l.controller.w_max, l.controller.rate, 1)
    assert.is_true(l:wait_time() > 0.1 and l:wait_time() <= 1.25, "held " .. l:wait_time())
  end)
  describe("dormant (a client's own when its caller gives none)", function()
    local bare = { status = 429, throttled = true, headers = {} }

    it("lets every request through at once, however many, until the server first throttles one", function()
      local l = rw.adaptive { dormant = true }
      assert.equal(math.huge, l:rate())
      for _ = 1, 1000 do
        local ok, wait = l:acquire()
        assert.is_true(ok)
        assert.is_nil(wait)
      end
      assert.equal(0, l:wait_time())
      assert.same({ true, 0 }, { l:take() })
      l:observe({ status = 200, headers = {} }, rw.now())
      assert.equal(math.huge, l:rate())
      assert.equal("ratewise.Adaptive (dormant until a throttle, burst 1)", tostring(l))
    end)

    it("wakes at the first throttle into slow start, deaf to the throttles of what it sent while asleep", function()
      local l = rw.adaptive { dormant = true }
      local slept_at = rw.now()
      l:observe(bare, slept_at)
      assert.equal(10, l:rate())
      assert.is_true(l.controller.slow)
      -- the rest of the storm it let through: no cut (10 * 0.7 would stay there for seconds)
      for _ = 1, 15 do l:observe(bare, slept_at) end
      assert.equal(10, l:rate())
      assert.is_true(l.controller.slow)
      assert.is_true((l:take()))
      assert.near(0.1, l:wait_time(), 0.01) -- now paced, at 10 a second
    end)

    it("a throttle of a request sent after it woke (and a round trip) cuts the rate as rw.adaptive's do", function()
      local l = rw.adaptive { dormant = true }
      l:observe(bare, rw.now())
      local later = rw.now() + 0.2
      l:observe(bare, later)
      assert.near(7, l:rate(), 0.01)
      assert.is_false(l.controller.slow)
    end)

    it("holds everything for the wait the waking throttle named, as a shut door is held", function()
      local l = rw.adaptive { dormant = true }
      l:observe({ status = 429, throttled = true, headers = { ["retry-after"] = "1" } }, rw.now())
      assert.near(1.2, l:wait_time(), 0.05)
      local ok, wait = l:acquire(1, nil, 0.5) -- a call with half a second left does not begin the wait
      assert.is_false(ok)
      assert.is_true(wait > 1)
    end)

    it("refuses a dormant that is not a boolean, naming it", function()
      assert.has_error(function() rw.adaptive { dormant = "yes" } end,
        "adaptive: option 'dormant' must be a boolean (got string \"yes\")")
    end)
  end)
end)
