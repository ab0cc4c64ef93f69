local rw = require "ratewise"

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
    assert.equal(0, b:reserve(1))
    local w1 = b:reserve(1)
    local w2 = b:reserve(1)
    assert.near(0.1, w1, 0.005)
    assert.near(0.2, w2, 0.005)
    assert.is_false((b:take(1)))
  end)

  it("acquire uses the sleep it is given, and gives the tokens back if that sleep fails", function()
    local b = rw.bucket { capacity = 1, rate = 1 }
    b:acquire()
    local asked
    b:acquire(1, function(s) asked = s end)
    assert.near(1, asked, 0.01)
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
    do
      local c <close> = rw.bucket { capacity = 1, rate = 1 }
      assert.is_true(c:take())
    end
  end)
end)
