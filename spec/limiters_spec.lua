-- lua/ratewise/limiters.lua on its own (rw.limiters): a composite takes
-- from all its members or from none. resilience_spec.lua covers buckets as
-- members (counts, waits, cancellation, concurrency, nesting, bad members);
-- this drives the composite with members that behave as a shared bucket
-- can (a take that fails after its wait said yes, a member that cannot
-- answer, one that answers a wait that is no wait), and covers max_wait,
-- sync and observe.
local rw = require "ratewise"

-- A limiter that records what is asked of it. `tokens` is what it holds;
-- take_answers, when set, is what its next takes answer instead.
local function member(name, tokens, journal)
  local m = { name = name, tokens = tokens, take_answers = {} }
  function m:wait_time(n)
    if self.wait_answer then return self.wait_answer[1], self.wait_answer[2] end
    return self.tokens >= n and 0 or (n - self.tokens)
  end
  function m:take(n)
    journal[#journal + 1] = self.name .. " take " .. n
    local forced = table.remove(self.take_answers, 1)
    if forced then return forced[1], forced[2] end
    if self.tokens < n then return false, n - self.tokens end
    self.tokens = self.tokens - n
    return true
  end
  function m:refund(n)
    journal[#journal + 1] = self.name .. " refund " .. n
    self.tokens = self.tokens + n
  end
  return m
end

describe("rw.limiters", function()
  it("gives back what it took when a member's take fails after its wait said yes", function()
    local journal = {}
    local a, b, c = member("a", 5, journal), member("b", 5, journal), member("c", 100, journal)
    local both = rw.limiters { a, b, cost = c }
    b.take_answers = { { false, 0.25 } } -- another process took b's last token in between
    local ok, wait = both:take(10)
    assert.is_false(ok)
    assert.equal(0.25, wait)
    assert.same({ "a take 1", "b take 1", "a refund 1" }, journal)
    assert.same({ 5, 5, 100 }, { a.tokens, b.tokens, c.tokens })
    -- a cost member that says no without a wait is asked for its wait
    local journal2 = {}
    local x, y = member("x", 5, journal2), member("y", 100, journal2)
    y.take_answers = { { false } }
    local composite = rw.limiters { x, cost = y }
    ok, wait = composite:take(40)
    assert.is_false(ok)
    assert.equal(1e-4, wait) -- y's own wait_time(40) is 0: rounded up, so that a loop cannot spin
    assert.same({ "x take 1", "y take 40", "x refund 1" }, journal2)
  end)

  it("answers nil and the error of a member that cannot answer, taking nothing from the others", function()
    local journal = {}
    local a, shared = member("a", 5, journal), member("shared", 5, journal)
    local both = rw.limiters { a, shared }
    local down = { kind = "redis", message = "connection refused" }
    shared.wait_answer = { nil, down }
    assert.same({ nil, down }, { both:wait_time() })
    assert.same({ nil, down }, { both:take() })
    assert.same({ nil, down }, { both:acquire() })
    assert.same({}, journal)
    -- its take fails the same way after its wait said yes: a's token comes back
    shared.wait_answer = nil
    shared.take_answers = { { nil, down } }
    assert.same({ nil, down }, { both:take() })
    assert.same({ "a take 1", "shared take 1", "a refund 1" }, journal)
    assert.equal(5, a.tokens)
  end)

  it("raises, naming the member, for a wait that is not a finite number of seconds", function()
    local journal = {}
    local a, b = member("a", 5, journal), member("b", 5, journal)
    local both = rw.limiters { a, cost = b }
    for _, case in ipairs { { 0 / 0, "nan" }, { math.huge, "inf" } } do
      b.wait_answer = { case[1] }
      assert.error_matches(function() both:wait_time(1) end,
        "cost member #1 answered a wait of " .. case[2], 1, true)
      assert.error_matches(function() both:acquire(1) end, "a limiter's wait must be a finite number", 1, true)
    end
    b.wait_answer = nil
    a.take_answers = { { false, 0 / 0 } }
    assert.error_matches(function() both:take(1) end, "member #1 answered a wait of nan", 1, true)
    assert.same({ "a take 1" }, journal) -- nothing taken was kept
  end)

  it("with max_wait answers false and the wait at once, taking nothing, when the wait would run past it", function()
    local rpm = rw.bucket { capacity = 2, rate = 1 }
    local tpm = rw.bucket { capacity = 10, rate = 10 }
    local both = rw.limiters { rpm, cost = tpm }
    assert.is_true(both:acquire(10))
    local t0 = rw.now()
    local ok, wait = both:acquire(10, nil, 0.5) -- tpm needs a second
    assert.is_false(ok)
    assert.near(1, wait, 0.05)
    assert.is_true(rw.now() - t0 < 0.1, "answered at once")
    assert.near(1, rpm:tokens(), 0.01) -- only the first acquire's token is gone
    ok = both:acquire(2, nil, 0.5) -- 0.2 s: within it
    assert.is_true(ok)
    local waited = rw.now() - t0
    assert.is_true(waited >= 0.19 and waited < 0.5, "waited " .. waited)
  end)

  it("passes sync to the members counting requests only, and observe to every member that has it", function()
    local calls = {}
    local function learner(name)
      local b = rw.bucket { capacity = 100, rate = 1 }
      return setmetatable({
        sync = function(_, ...) calls[#calls + 1] = { name, "sync", ... } end,
        observe = function(_, res, sent_at) calls[#calls + 1] = { name, "observe", res.status, sent_at } end,
      }, { __index = function(_, k)
        local v = b[k]
        if type(v) == "function" then return function(_, ...) return v(b, ...) end end
        return v
      end })
    end
    local requests, tokens = learner("rpm"), learner("tpm")
    local plain = rw.bucket { capacity = 5, rate = 1 } -- a bucket syncs too, and has no observe
    local both = rw.limiters { requests, plain, cost = tokens }
    both:sync(3, 20, 100, 60)
    both:observe({ status = 429 }, 12.5)
    assert.same({
      { "rpm", "sync", 3, 20, 100, 60 },
      { "rpm", "observe", 429, 12.5 },
      { "tpm", "observe", 429, 12.5 },
    }, calls)
    assert.near(3, plain:tokens(), 0.01)
  end)

  it("has no capacity bound without cost members, and accepts members without a capacity method", function()
    local journal = {}
    local bare = member("bare", 3, journal) -- wait_time, take and refund only
    local only = rw.limiters { bare }
    assert.equal(math.huge, only:capacity())
    assert.is_true(only:take())
    only:refund()
    assert.same({ "bare take 1", "bare refund 1" }, journal)
    local mixed = rw.limiters { bare,
      cost = { rw.bucket { capacity = 40, rate = 1 }, rw.bucket { capacity = 25, rate = 1 } } }
    assert.equal(25, mixed:capacity())
    assert.equal("ratewise.Limiters (1 taking 1, 2 taking the cost)", tostring(mixed))
  end)
end)
