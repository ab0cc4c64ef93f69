-- lua/ratewise/retry_budget.lua on its own (rw.retry_budget): Finagle's
-- rule, retries + 1 <= ratio * requests + min_per_second * window, over a
-- sliding window. resilience_spec.lua covers the ratio, the floor, a ratio
-- over 1, requests sliding out and the totals; this covers the defaults,
-- arithmetic that floats get a hair wrong, the floor refilling with time,
-- and that a refusal takes nothing.
local rw = require "ratewise"

describe("rw.retry_budget", function()
  it("defaults to ratio 0.1, min_per_second 10 and a 10 s window: 100 retries for a quiet client", function()
    local b = rw.retry_budget {}
    assert.equal(100, b:stats().available)
    for _ = 1, 50 do b:request() end
    assert.equal(105, b:stats().available) -- each request adds a tenth of a retry
    assert.equal("ratewise.RetryBudget (ratio 0.1, min_per_second 10, window 10 s)", tostring(b))
  end)

  it("allows exactly what the rule allows, where floats come out a hair under it", function()
    assert.is_true(0.29 * 100 < 29) -- the arithmetic the budget must not be fooled by
    local b = rw.retry_budget { ratio = 0.29, min_per_second = 0 }
    for _ = 1, 100 do b:request() end
    assert.equal(29, b:stats().available)
    for i = 1, 29 do assert.is_true(b:allow_retry(), "retry " .. i) end
    assert.is_false(b:allow_retry())
  end)

  it("counts a refusal and takes nothing for it: the next request's share is there at once", function()
    local b = rw.retry_budget { ratio = 0.5, min_per_second = 0 }
    b:request()
    for _ = 1, 3 do assert.is_false(b:allow_retry()) end
    b:request() -- 2 * 0.5 = 1 retry
    assert.is_true(b:allow_retry())
    assert.same({ requests = 2, retries = 1, refused = 3, available = 0 }, b:stats())
  end)

  it("refills its floor as retries slide out of the window", function()
    local b = rw.retry_budget { ratio = 0, min_per_second = 10, window = 0.2 } -- a floor of 2
    assert.is_true(b:allow_retry())
    assert.is_true(b:allow_retry())
    assert.is_false(b:allow_retry())
    assert.equal(0, b:stats().available)
    rw.sleep(0.25)
    assert.equal(2, b:stats().available)
    assert.is_true(b:allow_retry())
    assert.same({ requests = 0, retries = 3, refused = 1, available = 1 }, b:stats())
  end)

  it("keeps retries of a long window for the whole of it", function()
    local b = rw.retry_budget { ratio = 1, min_per_second = 0, window = 120 }
    b:request()
    assert.is_true(b:allow_retry())
    rw.sleep(0.05)
    assert.is_false(b:allow_retry())
    assert.equal(0, b:stats().available)
  end)
end)
