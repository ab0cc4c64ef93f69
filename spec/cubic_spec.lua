-- lua/ratewise/cubic.lua on its own: the CUBIC controller's arithmetic,
-- driven with explicit times (every method takes the time it is told of).
-- limits_spec.lua covers the drop, the episode rule, the near-drop and slow
-- start; this covers the growth curve point by point, the constants the
-- docs state, the limit a server states, and the demand cap after a drop.
local rw = require "ratewise"
local cubic = require "ratewise.cubic"

local function curve(w_max, k, dt)
  return w_max * (1 + cubic.SCALE * (dt - k) ^ 3)
end

describe("ratewise.cubic", function()
  it("has the documented constants (docs/limits.md)", function()
    assert.equal(0.7, cubic.BETA)
    assert.equal(0.002, cubic.SCALE)
    assert.equal(10, cubic.START)
    assert.equal(2, cubic.DEMAND)
    local c = cubic.new { rate = 50 }
    assert.equal(cubic.BETA, c.beta)
    assert.equal(c.beta, c.near) -- near defaults to beta
  end)

  it("after a loss follows w_max * (1 + SCALE * (t - K)^3), concave below w_max and convex above", function()
    local c = cubic.new { rate = 200 }
    assert.is_true(c:throttled(100, 99.5))
    local k = ((1 - cubic.BETA) / cubic.SCALE) ^ (1 / 3)
    local previous = -math.huge
    for _, dt in ipairs { 0, 0.5, 1, 2, 3, 4, 5, k, 6, 7, 8, 10, 12 } do
      local rate = c:current(100 + dt)
      assert.near(curve(200, k, dt), rate, 1e-6, "at " .. dt .. " s")
      assert.is_true(rate >= previous, "never falls while it climbs, at " .. dt .. " s")
      previous = rate
    end
    assert.near(200 * cubic.BETA, c:current(100), 1e-9)
    -- the steps shrink as the rate nears w_max, and grow again past it
    local before = c:current(100 + k - 1) - c:current(100 + k - 2)
    local at = c:current(100 + k + 0.5) - c:current(100 + k - 0.5)
    local after = c:current(100 + k + 2) - c:current(100 + k + 1)
    assert.is_true(at < before and at < after, ("steps %.4f, %.4f, %.4f"):format(before, at, after))
  end)

  it("takes as long to recover at 5 requests a second as at 500 (SCALE is relative to w_max)", function()
    local slow, fast = cubic.new { rate = 5 }, cubic.new { rate = 500 }
    slow:throttled(0, 0)
    fast:throttled(0, 0)
    for _, t in ipairs { 1, 2.5, 4, 5.3, 7 } do
      assert.near(slow:current(t) / 5, fast:current(t) / 500, 1e-9, "the same share of w_max at " .. t .. " s")
    end
  end)

  it("stays at its rate without slow start until the first throttle", function()
    local c = cubic.new { rate = 30 }
    for i = 1, 50 do c:succeeded(i * 0.1, i * 0.1 - 0.05) end
    assert.equal(30, c:current(5))
    assert.equal(30, c:current(500))
    assert.is_false(c:recovered()) -- with no ceiling there is no rate to be back at
  end)

  it("in slow start counts a round trip of at least MIN_ROUND_TRIP, and none that ends before it began", function()
    local c = cubic.new { rate = 10, slow_start = true }
    c:succeeded(1.001, 1) -- a 1 ms round trip: growth is 1 / MIN_ROUND_TRIP, not 1000
    assert.near(10 + 1 / cubic.MIN_ROUND_TRIP, c:current(1.001), 1e-9)
    local d = cubic.new { rate = 10, slow_start = true }
    d:succeeded(1, 1.5) -- a clock gone backwards is not a round trip
    assert.is_false(d.srtt)
    assert.near(10 + 1 / cubic.MIN_ROUND_TRIP, d:current(1), 1e-9)
    local e = cubic.new { rate = 10, slow_start = true, ceiling = 25 }
    for i = 1, 10 do e:succeeded(i, i - 0.5) end
    assert.equal(25, e:current(10)) -- slow start stops at the ceiling
    assert.is_false(e:recovered(), "still in slow start")
  end)

  it("takes a stated limit at once, out of slow start, capped by the ceiling it was given", function()
    local c = cubic.new { rate = 10, slow_start = true, ceiling = 50, floor = 2, near = 0.95 }
    c:stated(40)
    assert.is_false(c.slow)
    assert.equal(40, c:current(1))
    assert.equal(40, c:current(1e6)) -- never climbs above it
    assert.is_true(c:recovered())
    c:stated(80) -- more than the caller's ceiling allows
    assert.equal(50, c:current(2))
    -- a throttle at the stated rate is jitter: a drop by near, not beta
    assert.is_true(c:throttled(3, 3))
    assert.near(50 * 0.95, c:current(3), 1e-9)
    assert.is_false(c:recovered())
    -- a lower statement brings a rate above it down at once; a higher one
    -- does not lift a rate that dropped
    c:stated(30)
    local lowered = c:current(3)
    assert.is_true(lowered <= 30 and lowered > 25, "at once at most the new limit: " .. lowered)
    assert.equal(30, c:current(3 + 100))
    c:stated(45)
    assert.is_true(c:current(3) < 45)
    assert.equal(45, c:current(3 + 100))
    c:stated(1) -- below the floor
    assert.equal(2, c:current(200))
  end)

  it("after a drop, nobody waiting, climbs past w_max no further than DEMAND times the measured send rate", function()
    local base = rw.now() -- the measure's first window starts when the controller is made
    local c = cubic.new { rate = 100, demand = true }
    for i = 1, 400 do c:sent(base + i / 80) end -- 80 requests a second for 5 s
    local t0 = base + 5
    c:throttled(t0, t0)
    local k = ((1 - cubic.BETA) / cubic.SCALE) ^ (1 / 3)
    assert.near(curve(100, k, k / 2), c:current(t0 + k / 2), 1e-6) -- below w_max the cap does not apply
    local uncapped = curve(100, k, 3 * k)
    assert.is_true(uncapped > 300, "the curve alone would be at " .. uncapped)
    local capped = c:current(t0 + 3 * k)
    assert.is_true(capped > 150 and capped < 170, "about twice the 80 a second sent: " .. capped)
    assert.near(uncapped, c:current(t0 + 3 * k, true), 1e-6) -- callers waiting: the plain curve
    local idle = cubic.new { rate = 100, demand = true } -- nothing sent: back up to w_max only
    idle:throttled(t0, t0)
    assert.equal(100, idle:current(t0 + 3 * k))
  end)
end)
