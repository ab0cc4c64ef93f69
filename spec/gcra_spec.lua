-- lua/ratewise/gcra.lua on its own: the shared buckets' arithmetic (the
-- same text runs in Redis and in nginx workers), in microseconds, against
-- the definition: a bucket is its theoretical arrival time (tat), full again
-- at tat, holding (burst - (tat - now)) / interval tokens; and the checks
-- the shared buckets share. redis_spec and shared_bucket_spec try it
-- through real servers.
local gcra = require "ratewise.gcra"

local step = gcra.step
-- a bucket of 5 tokens at 10 a second: one token every 100 ms
local CAPACITY, INTERVAL = 5, 100000
local BURST = CAPACITY * INTERVAL
local NOW = 1700000000 * 1000000

local function run(op, tat, now, n, arg, arg2)
  return { step(op, { tat = tat, now = now, interval = INTERVAL, capacity = CAPACITY }, n, arg or 0, arg2 or 0) }
end

-- tokens left, in millionths, for a tat at `now`
local function tokens(tat, now) return math.floor((BURST - (tat - now)) * 1000000 / INTERVAL) end

describe("ratewise.gcra", function()
  it("lets a full bucket's whole burst through at once, and not a token more", function()
    local tat = 0 -- long past: a full bucket
    for i = 1, CAPACITY do
      local r = run("take", tat, NOW, 1)
      assert.equal(1, r[3], "take " .. i)
      assert.equal(NOW + i * INTERVAL, r[1]) -- the tat moves one interval a token
      assert.equal(0, r[2])
      assert.equal((CAPACITY - i) * 1000000, r[4])
      tat = r[1]
    end
    local r = run("take", tat, NOW, 1)
    assert.same({ nil, INTERVAL, 0, 0 }, { r[1], r[2], r[3], r[4] }) -- refused, tat unchanged
    -- one interval later, exactly one more
    r = run("take", tat, NOW + INTERVAL, 1)
    assert.equal(1, r[3])
    assert.equal(0, run("take", r[1], NOW + INTERVAL, 1)[3])
  end)

  it("takes n at once only when all n are there, and refills one token per interval", function()
    local tat = NOW + 3 * INTERVAL -- 2 tokens left
    assert.equal(0, run("take", tat, NOW, 3)[3])
    local r = run("take", tat, NOW, 2)
    assert.equal(1, r[3])
    assert.equal(NOW + BURST, r[1])
    -- 250 ms later: 2.5 tokens back
    r = run("peek", r[1], NOW + 250000, 1)
    assert.equal(2500000, r[4])
  end)

  it("peeks at the wait for n without taking: tat + n * interval - burst - now, rounded up", function()
    local tat = NOW + BURST -- empty
    local r = run("peek", tat, NOW + 150000, 2)
    assert.is_nil(r[1])
    assert.equal(tat + 2 * INTERVAL - BURST - (NOW + 150000), r[2])
    assert.equal(50000, r[2])
    assert.equal(0, r[3])
    assert.equal(tokens(tat, NOW + 150000), r[4])
    assert.equal(1500000, r[4])
    r = run("peek", tat, NOW + 150000.25, 2)
    assert.equal(50000, r[2]) -- 49999.75 rounds up: a wait never ends early
    assert.equal(0, run("peek", 0, NOW, CAPACITY)[2])
  end)

  it("reserves into debt, up to the longest wait allowed (-1: any)", function()
    local tat = NOW + BURST -- empty
    local r = run("reserve", tat, NOW, 3, -1)
    assert.same({ NOW + BURST + 3 * INTERVAL, 3 * INTERVAL, 1, -3000000 }, r)
    r = run("reserve", tat, NOW, 3, 3 * INTERVAL)
    assert.equal(1, r[3]) -- a wait of exactly the limit is allowed
    r = run("reserve", tat, NOW, 3, 3 * INTERVAL - 1)
    assert.same({ nil, 3 * INTERVAL, 0, 0 }, { r[1], r[2], r[3], r[4] })
    r = run("reserve", 0, NOW, 2, 0) -- tokens there: no wait
    assert.same({ NOW + 2 * INTERVAL, 0, 1, 3000000 }, r)
  end)

  it("refunds tokens by moving tat back, never past a full bucket", function()
    local r = run("refund", NOW + BURST, NOW, 2)
    assert.same({ NOW + 3 * INTERVAL, 0, 1, 2000000 }, r)
    r = run("refund", NOW + INTERVAL, NOW, 4)
    assert.same({ NOW, 0, 1, CAPACITY * 1000000 }, r)
  end)

  it("syncs to what the server says is left, only ever taking tokens away", function()
    -- 2.5 tokens left by the server's count, the bucket full by its own
    local r = run("sync", 0, NOW, 1, 2500000)
    assert.same({ NOW + 2.5 * INTERVAL, 0, 1, 2500000 }, r)
    -- the bucket already holds less than the server says: unchanged
    r = run("sync", NOW + 4 * INTERVAL, NOW, 1, 2500000)
    assert.is_nil(r[1])
    assert.equal(1000000, r[4])
    -- less than one token: the next one comes when the server's window resets
    r = run("sync", 0, NOW, 1, 0, 3000000)
    assert.equal(NOW + (CAPACITY - 1) * INTERVAL + 3000000, r[1])
    assert.equal(3000000, run("peek", r[1], NOW, 1)[2])
  end)

  it("treats a tat in the past as a full bucket, and answers nothing for an unknown op", function()
    assert.same(run("peek", 0, NOW, 1), run("peek", NOW - 1e9, NOW, 1))
    assert.equal(CAPACITY * 1000000, run("peek", NOW - 1, NOW, 1)[4])
    assert.same({}, { step("spend", { tat = 0, now = NOW, interval = INTERVAL, capacity = CAPACITY }, 1, 0, 0) })
  end)

  it("takes the bucket as one record and leaves it as it was: the caller stores new_tat", function()
    local bucket = { tat = NOW - 1e9, now = NOW, interval = INTERVAL, capacity = CAPACITY }
    local new = step("take", bucket, 2, 0, 0)
    assert.equal(NOW + 2 * INTERVAL, new)
    assert.same({ tat = NOW - 1e9, now = NOW, interval = INTERVAL, capacity = CAPACITY }, bucket)
  end)

  it("is kept as source text that loads on its own, as Redis and nginx load it", function()
    assert.is_string(gcra.SOURCE)
    local chunk = assert((rawget(_G, "loadstring") or load)(gcra.SOURCE .. "\nreturn gcra_step"))
    local fresh = chunk()
    assert.same(run("reserve", NOW, NOW, 2, -1),
      { fresh("reserve", { tat = NOW, now = NOW, interval = INTERVAL, capacity = CAPACITY }, 2, -1, 0) })
  end)
end)

describe("ratewise.gcra's checks", function()
  local bucket = { capacity_n = 5, horizon = 100 }

  local function raised(fn, ...)
    local ok, err = pcall(fn, ...)
    assert.is_false(ok)
    return tostring(err)
  end

  it("count: 1 by default; a count that is not positive or could never be served raises, naming the method", function()
    assert.equal(1, gcra.count(bucket, nil, "take"))
    assert.equal(2.5, gcra.count(bucket, 2.5, "take"))
    assert.equal(5, gcra.count(bucket, 5, "take"))
    for _, bad in ipairs { 0, -1, 0 / 0, math.huge, "2" } do
      assert.matches("bad argument #1 to 'acquire' (token count must be a positive number", raised(gcra.count,
        bucket, bad, "acquire"), 1, true)
    end
    assert.matches("6 tokens asked of a bucket whose capacity is 5: it could never be served",
      raised(gcra.count, bucket, 6, "take"), 1, true)
  end)

  it("max_wait: microseconds, -1 for any wait", function()
    assert.equal(-1, gcra.max_wait(nil, nil))
    assert.equal(-1, gcra.max_wait(nil, math.huge))
    assert.equal(250000, gcra.max_wait(function() end, 0.25))
    assert.equal(0, gcra.max_wait(nil, 0))
    assert.matches("sleep must be a function, got number", raised(gcra.max_wait, 5, nil), 1, true)
    assert.matches("max_wait must be a non-negative number of seconds", raised(gcra.max_wait, nil, -1), 1, true)
    assert.matches("max_wait must be a non-negative number of seconds", raised(gcra.max_wait, nil, 0 / 0), 1, true)
  end)

  it("sync_args: clamped to the capacity and the horizon, in millionths and microseconds", function()
    assert.same({ 2500000, 3000000 }, { gcra.sync_args(bucket, 2.5, 3) })
    assert.same({ 5000000, 100000000 }, { gcra.sync_args(bucket, 7, 500) })
    assert.same({ 0, 0 }, { gcra.sync_args(bucket, -1, -5) })
    assert.same({ 1000000, 0 }, { gcra.sync_args(bucket, 1, "soon") })
    assert.same({ 1000000, 0 }, { gcra.sync_args(bucket, 1, 0 / 0) })
    assert.is_nil(gcra.sync_args(bucket, "3", 1))
    assert.is_nil(gcra.sync_args(bucket, 0 / 0, 1))
  end)

  it("limits: both numbers required and positive, within what microsecond integers count", function()
    assert.same({ 5, 10 }, { gcra.limits("redis_bucket", { capacity = 5, rate = 10 }) })
    assert.matches("redis_bucket: option 'capacity' is required", raised(gcra.limits, "redis_bucket", { rate = 1 }),
      1, true)
    assert.matches("option 'rate' must be a positive number", raised(gcra.limits, "redis_bucket",
      { capacity = 1, rate = -2 }), 1, true)
    assert.matches("option 'capacity' is too large (at most 1e9)", raised(gcra.limits, "redis_bucket",
      { capacity = 2e9, rate = 1 }), 1, true)
    assert.matches("option 'rate' is too large (at most 1e6 a second)", raised(gcra.limits, "redis_bucket",
      { capacity = 1, rate = 2e6 }), 1, true)
    assert.matches("option 'rate' is too small for that capacity", raised(gcra.limits, "redis_bucket",
      { capacity = 1e9, rate = 1e-6 }), 1, true)
    assert.equal(7, gcra.positive("x", {}, "ttl", 7))
  end)
end)
