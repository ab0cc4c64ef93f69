-- lua/ratewise/retry.lua on its own (rw.retry_delay, rw.backoff and the
-- module's helpers): which hint becomes which wait. parse_spec.lua covers
-- the order of the sources, an HTTP-date against opts.now and Date, an
-- epoch reset, remaining >= 1, zero hints and the backoff table with fixed
-- draws; this covers a reset read as seconds from now, the quota's state
-- when remaining is not a whole number, dates among repeated fields, hints
-- never shortened by max_delay in any form, the server's clock, and the
-- jitters' bounds over the real generator.
local rw = require "ratewise"
local core = require "ratewise.core"
local retry = require "ratewise.retry"

local none = { jitter = "none" }
local function http_date(t) return os.date("!%a, %d %b %Y %H:%M:%S GMT", t) end

describe("ratewise.retry: hints", function()
  it("reads x-ratelimit-reset below 1e9 as seconds from now, and above as an epoch", function()
    assert.same({ 10, "x-ratelimit-reset" }, { rw.retry_delay({ ["x-ratelimit-reset"] = "10" }, 0, none) })
    -- the same whatever the clock says: a delta needs no clock
    assert.same({ 10, "x-ratelimit-reset" }, { rw.retry_delay({ ["x-ratelimit-reset"] = "10" }, 0,
      { now = 1700000000 }) })
    assert.equal(999999999, retry.reset_in(999999999, 1700000000))
    assert.equal(0, retry.reset_in(1000000000, 1700000000)) -- an epoch long past, not decades to wait
    assert.equal(30, retry.reset_in(1700000030, 1700000000))
    assert.equal(0, retry.reset_in(1700000000, 1700000000))
    -- an epoch already past is a zero hint: backoff
    assert.same({ 1, "backoff" }, { rw.retry_delay({ ["x-ratelimit-reset"] = "1000000000" }, 0,
      { now = 1700000000, jitter = "none" }) })
  end)

  it("waits for the reset while the quota is spent or its state unknown, not while a request is left", function()
    local function source(remaining)
      local _, from = rw.retry_delay({ ["x-ratelimit-reset"] = "10", ["x-ratelimit-remaining"] = remaining }, 0, none)
      return from
    end
    assert.equal("x-ratelimit-reset", source("0"))
    assert.equal("x-ratelimit-reset", source("0.5")) -- less than one request left
    assert.equal("x-ratelimit-reset", source("lots")) -- not a number: the state is unknown
    assert.equal("backoff", source("1"))
    assert.equal("backoff", source("1.5"))
  end)

  it("takes the longest of repeated Retry-After fields whatever their forms, RFC 850 dates included", function()
    local now = 784111777 -- Sun, 06 Nov 1994 08:49:37 GMT
    local function wait(value) return (rw.retry_delay({ ["Retry-After"] = value }, 0, { now = now })) end
    assert.equal(40, wait("Sunday, 06-Nov-94 08:50:17 GMT, 5"))
    assert.equal(60, wait("Sun, 06 Nov 1994 08:49:47 GMT, Sun, 06 Nov 1994 08:50:37 GMT"))
    assert.equal(10, wait("5, Sun, 06 Nov 1994 08:49:47 GMT"))
    assert.equal(7, wait("garbage, 7, -3"))
    assert.equal(1.5, wait("1.5"))
  end)

  it("backs off from a hint below the backoff's first step, as from a zero one, never shorter than it", function()
    assert.same({ 1, "backoff" }, { rw.retry_delay({ ["Retry-After"] = "0.000001" }, 0, none) })
    assert.same({ 4, "backoff" }, { rw.retry_delay({ ["Retry-After"] = "0.000001" }, 2, none) })
    local low = { jitter = "full", random = function() return 0.001 end }
    assert.same({ 0.5, "backoff" }, { rw.retry_delay({ ["Retry-After"] = "0.5" }, 0, low) })
    assert.same({ 0.5, "retry-after" }, { rw.retry_delay({ ["Retry-After"] = "0.5" }, 0, { base = 0.5 }) })
  end)

  it("never shortens a hint for max_delay: seconds, an HTTP-date and a reset alike", function()
    local tight = { max_delay = 0.5, now = 1700000000 }
    assert.equal(3600, (rw.retry_delay({ ["Retry-After"] = "3600" }, 0, tight)))
    assert.equal(3600, (rw.retry_delay({ ["Retry-After"] = http_date(1700003600) }, 0, tight)))
    assert.equal(3600, (rw.retry_delay({ ["x-ratelimit-reset"] = "1700003600" }, 0, tight)))
    assert.equal(3600, (rw.retry_delay({ ["x-ratelimit-reset"] = "3600" }, 0, tight)))
    assert.equal(0.5, (rw.retry_delay({}, 9, { max_delay = 0.5, jitter = "none" }))) -- the backoff alone is capped
  end)

  it("skips a Retry-After that is negative, and goes on to the next source", function()
    assert.same({ 1, "backoff" }, { rw.retry_delay({ ["Retry-After"] = "-5" }, 0, none) })
    assert.same({ 4, "x-ratelimit-reset" }, { rw.retry_delay({ ["Retry-After"] = "-5", ["x-ratelimit-reset"] = "4" },
      0, none) })
    assert.is_nil(retry.retry_after({}))
    assert.is_nil(retry.hint({ ["x-ratelimit-remaining"] = "0" }))
  end)

  it("measures a date against the response's Date even when opts.now is given (docs/reference.md, "
    .. "rw.retry_delay: \"Dates are measured against the response's own Date header when there is one, else "
    .. "against opts.now\")", function()
    local server_now = math.floor(core.time()) - 3600
    local h = { ["Retry-After"] = http_date(server_now + 10), Date = http_date(server_now) }
    assert.same({ 10, "retry-after" }, { rw.retry_delay(h, 0, { now = math.floor(core.time()), jitter = "none" }) })
  end)
end)

describe("ratewise.retry: the server's clock", function()
  it("is the response's Date, unless the local clock is within that second or the Date is a day off", function()
    local t = core.time()
    if t % 1 > 0.7 then -- leave the second room for the calls below
      rw.sleep(1.05 - t % 1)
      t = core.time()
    end
    local second = math.floor(t)
    local got = retry.server_now({ Date = http_date(second) })
    assert.is_true(got >= t and got < t + 0.25, ("local clock to the microsecond: %.6f vs %.6f"):format(got, t))
    assert.equal(second - 3600, retry.server_now({ Date = http_date(second - 3600) }))
    assert.equal(second + 3600, retry.server_now({ date = http_date(second + 3600) }))
    for _, off in ipairs { 86400 * 2, -86400 * 2 } do
      local local_now = retry.server_now({ Date = http_date(second + off) })
      assert.is_true(math.abs(local_now - core.time()) < 0.25, "a Date " .. off .. " s off is not the server's clock")
    end
    assert.is_true(math.abs(retry.server_now({ Date = "yesterday" }) - core.time()) < 0.25)
    assert.is_true(math.abs(retry.server_now({}) - core.time()) < 0.25)
  end)
end)

describe("ratewise.retry: backoff", function()
  local DRAWS = 2000

  local function draws(attempt, opts)
    local out = {}
    for i = 1, DRAWS do out[i] = rw.backoff(attempt, opts) end
    return out
  end

  local function bounds(list)
    local lo, hi, sum = math.huge, -math.huge, 0
    for _, v in ipairs(list) do
      lo, hi, sum = math.min(lo, v), math.max(hi, v), sum + v
    end
    return lo, hi, sum / #list
  end

  it("full jitter: uniform in [0, cap), the cap taken before the draw", function()
    local lo, hi, mean = bounds(draws(3, { base = 0.5 }))
    assert.is_true(lo >= 0 and hi < 4, ("[%g, %g]"):format(lo, hi))
    assert.is_true(mean > 1.8 and mean < 2.2, "mean " .. mean) -- half of 4
    lo, hi = bounds(draws(30, { max_delay = 2 }))
    assert.is_true(lo >= 0 and hi < 2, ("capped: [%g, %g]"):format(lo, hi))
    assert.is_true(hi > 1.9, "the draws reach near the cap: " .. hi)
  end)

  it("equal jitter: uniform in [cap/2, cap)", function()
    local lo, hi, mean = bounds(draws(2, { jitter = "equal" }))
    assert.is_true(lo >= 2 and hi < 4, ("[%g, %g]"):format(lo, hi))
    assert.is_true(mean > 2.9 and mean < 3.1, "mean " .. mean)
  end)

  it("decorrelated jitter: in [base, min(max_delay, 3 * previous))", function()
    local lo, hi = bounds(draws(4, { jitter = "decorrelated", base = 0.5, previous = 2 }))
    assert.is_true(lo >= 0.5 and hi < 6, ("[%g, %g]"):format(lo, hi))
    lo, hi = bounds(draws(4, { jitter = "decorrelated", base = 0.5, previous = 2, max_delay = 3 }))
    assert.is_true(lo >= 0.5 and hi <= 3, ("capped: [%g, %g]"):format(lo, hi))
    assert.equal(3, rw.backoff(4, { jitter = "decorrelated", base = 0.5, previous = 2, max_delay = 3,
      random = function() return 0.99 end }))
  end)

  it("draws from the kernel's generator, in [0, 1), and refuses a random that answers outside it", function()
    local seen = {}
    for _ = 1, 100 do
      local u = retry.random()
      assert.is_true(u >= 0 and u < 1, tostring(u))
      seen[u] = true
    end
    local distinct = 0
    for _ in pairs(seen) do distinct = distinct + 1 end
    assert.is_true(distinct > 95, distinct .. " distinct draws of 100")
    for _, bad in ipairs { 0 / 0, -0.1, 1, "0.5" } do
      assert.error_matches(function() rw.backoff(1, { random = function() return bad end }) end,
        "option 'random' must return a number in [0, 1)", 1, true)
    end
    assert.error_matches(function() rw.retry_delay({}, 0, { random = function() return 2 end }) end,
      "retry_delay: option 'random' must return a number in [0, 1)", 1, true)
  end)
end)
