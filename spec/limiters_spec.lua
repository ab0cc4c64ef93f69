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

  describe("with named limits", function()
    it("takes a cost per limit from each member, 0 from a limit the cost does not name, all or none", function()
      local journal = {}
      local requests, input, output = member("requests", 10, journal), member("input", 1000, journal),
        member("output", 500, journal)
      local llm = rw.limiters { requests = requests, input_tokens = input, output_tokens = output }
      assert.is_true(llm:take { requests = 1, input_tokens = 300, output_tokens = 400 })
      assert.same({ 9, 700, 100 }, { requests.tokens, input.tokens, output.tokens })
      -- output cannot serve 400 more: nothing is taken, and the wait is output's
      local ok, wait = llm:take { requests = 1, input_tokens = 300, output_tokens = 400 }
      assert.is_false(ok)
      assert.equal(300, wait)
      assert.same({ 9, 700, 100 }, { requests.tokens, input.tokens, output.tokens })
      -- a take that fails part-way gives back what it took (names in sorted order: input, output, requests)
      for k in pairs(journal) do journal[k] = nil end
      requests.take_answers = { { false, 0.5 } }
      ok, wait = llm:take { requests = 1, input_tokens = 5 }
      assert.is_false(ok)
      assert.equal(0.5, wait)
      assert.same({ "input take 5", "requests take 1", "input refund 5" }, journal)
      assert.same({ 9, 700, 100 }, { requests.tokens, input.tokens, output.tokens })
      -- no cost: 1 of requests
      assert.is_true(llm:take())
      assert.same({ 8, 700, 100 }, { requests.tokens, input.tokens, output.tokens })
      llm:refund { requests = 1, output_tokens = 50 }
      assert.same({ 9, 700, 150 }, { requests.tokens, input.tokens, output.tokens })
      assert.equal("ratewise.Limiters (input_tokens, output_tokens, requests)", tostring(llm))
    end)

    it("waits for the member that needs longest, holding nothing meanwhile", function()
      local requests = rw.bucket { capacity = 10, rate = 0.1 }
      local tokens = rw.bucket { capacity = 1000, rate = 2000 }
      local llm = rw.limiters { requests = requests, tokens = tokens }
      assert.is_true(llm:acquire { requests = 1, tokens = 900 })
      local t0 = rw.now()
      assert.is_true(llm:acquire { requests = 1, tokens = 500 }) -- 400 short at 2,000 a second: 0.2 s
      local waited = rw.now() - t0
      assert.is_true(waited >= 0.18 and waited < 0.5, "waited " .. waited)
      assert.near(8, requests:tokens(), 0.1)
    end)

    it("raises for a cost that is a number, or names an unknown limit", function()
      local llm = rw.limiters { requests = rw.bucket { capacity = 10, rate = 1 },
        tokens = rw.bucket { capacity = 1000, rate = 100 } }
      assert.error_matches(function() llm:acquire(5) end,
        "acquire: give the cost per limit: { requests = 1, tokens = n } (the limits are requests, tokens; got 5)",
        nil, true)
      assert.error_matches(function() llm:take { requests = 1, tokenz = 5 } end,
        "take: the cost names 'tokenz', which is not one of the limits (requests, tokens)", nil, true)
      assert.error_matches(function() llm:wait_time { tokens = -1 } end,
        "the cost of 'tokens' must be a non-negative number (got -1)", nil, true)
      assert.same({ requests = 10, tokens = 1000 }, llm:capacity())
      local no_requests = rw.limiters { tokens = rw.bucket { capacity = 10, rate = 1 } }
      assert.error_matches(function() no_requests:acquire() end, "give the cost per limit, a table by name")
    end)

    it("serves a limit asked for more than it holds: a full bucket, and the rest as debt the next wait out", function()
      local tokens = rw.bucket { capacity = 1000, rate = 1000 }
      local llm = rw.limiters { requests = rw.bucket { capacity = 10, rate = 10 }, tokens = tokens }
      assert.is_true(llm:acquire { requests = 1, tokens = 2500 })
      assert.near(-1500, tokens:tokens(), 5)
      -- the next caller waits out the debt before its own
      assert.near(1.6, llm:wait_time { requests = 1, tokens = 100 }, 0.05)
      -- what it did not use comes back, whole: the bucket holds 1000 at most
      llm:settle({ requests = 1, tokens = 2500 }, { tokens = 300 })
      assert.near(700, tokens:tokens(), 5)
      assert.is_true(llm:acquire { requests = 1, tokens = 2500 })
      llm:refund { requests = 1, tokens = 2500 }
      assert.near(1000, tokens:tokens(), 5)
      -- a member that cannot take debt, or a cost of more than a minute of the rate, is refused
      local inner = rw.bucket { capacity = 100, rate = 100 }
      local no_debit = rw.limiters { tokens = {
        wait_time = function(_, n) return inner:wait_time(n) end, take = function(_, n) return inner:take(n) end,
        refund = function(_, n) return inner:refund(n) end, capacity = function() return 100 end } }
      assert.error_matches(function() no_debit:acquire { tokens = 150 } end,
        "150 tokens asked of member 'tokens', whose capacity is 100 and which cannot take the rest as debt", 1, true)
      assert.error_matches(function() llm:acquire { tokens = 60001 } end,
        "60001 tokens asked of member 'tokens', more than its bucket holds (1000) and than a minute of its rate "
        .. "(60000)", 1, true)
      -- while it waits for its full bucket, it holds nothing
      assert.is_true((tokens:take(600)))
      local ok, wait = llm:take { requests = 1, tokens = 5000 }
      assert.is_false(ok)
      assert.near(0.6, wait, 0.05)
      assert.near(400, tokens:tokens(), 5)
    end)

    it("serves as the one cost member under a limiter taking 1 (a client's route), the cost a table", function()
      local route = rw.bucket { capacity = 5, rate = 1 }
      local requests, tokens = rw.bucket { capacity = 10, rate = 1 }, rw.bucket { capacity = 100, rate = 1 }
      local named = rw.limiters { requests = requests, tokens = tokens }
      local both = rw.limiters { route, cost = named }
      assert.same({ requests = 10, tokens = 100 }, both:capacity())
      assert.is_true(both:acquire { requests = 1, tokens = 40 })
      assert.near(4, route:tokens(), 0.1)
      assert.near(9, requests:tokens(), 0.1)
      assert.near(60, tokens:tokens(), 0.1)
      both:settle({ requests = 1, tokens = 40 }, { tokens = 25 })
      assert.near(75, tokens:tokens(), 0.1)
      assert.near(4, route:tokens(), 0.1) -- (what it takes is 1 whatever the answer)
      assert.is_true(both:sync_limit("tokens", 50))
      assert.near(50, tokens:tokens(), 0.1)
      assert.error_matches(function() both:acquire(3) end, "give the cost per limit")
      assert.error_matches(function() rw.limiters { named } end,
        "member #1 has named limits (ratewise.Limiters (requests, tokens)), which take a cost per limit", nil, true)
      assert.error_matches(function() rw.limiters { route, cost = { named, rw.bucket { capacity = 1, rate = 1 } } }
      end, "cost member #1 has named limits: it must then be the only cost member")
    end)

    it("refuses named limits beside an array or a cost member, and names that are not words", function()
      local b, c = rw.bucket { capacity = 10, rate = 1 }, rw.bucket { capacity = 10, rate = 1 }
      assert.error_matches(function() rw.limiters { b, tokens = c } end,
        "limiters: unknown option 'tokens' beside member #1: give either named limits", nil, true)
      assert.error_matches(function() rw.limiters { requests = b, cost = c } end,
        "unknown option 'requests' beside 'cost'", nil, true)
      assert.error_matches(function() rw.limiters { ["input tokens"] = b } end,
        "a limit's name must be a word")
      assert.error_matches(function() rw.limiters { requests = b, tokens = 5 } end,
        "member 'tokens' must be a limiter")
      assert.error_matches(function() rw.limiters { requests = b, tokens = b } end,
        "the same limiter is given twice")
    end)

    it("settles: gives back what the answer did not use, takes what it used beyond, into debt", function()
      local requests = rw.bucket { capacity = 10, rate = 1 }
      local input = rw.bucket { capacity = 1000, rate = 1 }
      local output = rw.bucket { capacity = 1000, rate = 1 }
      local llm = rw.limiters { requests = requests, input_tokens = input, output_tokens = output }
      local taken = { requests = 1, input_tokens = 600, output_tokens = 800 }
      assert.is_true(llm:acquire(taken))
      -- the answer used 200 of its 800 output tokens, and its input was 900 tokens, not 600
      llm:settle(taken, { input_tokens = 900, output_tokens = 200 })
      assert.near(9, requests:tokens(), 0.1) -- not named: as taken
      assert.near(100, input:tokens(), 1)
      assert.near(800, output:tokens(), 1)
      -- beyond what the bucket holds: into debt, and the next caller waits it out
      llm:settle({ input_tokens = 100 }, { input_tokens = 400 })
      assert.near(-200, input:tokens(), 1)
      local wait = llm:wait_time { input_tokens = 1 }
      assert.is_true(wait > 200 and wait < 202, tostring(wait))
      -- nothing to settle, and an actual cost of the wrong shape
      llm:settle(taken, nil)
      assert.error_matches(function() llm:settle(taken, 300) end, "the actual cost must be a table by name")
      assert.error_matches(function() llm:settle(taken, { output_tokens = -1 }) end,
        "the actual cost of 'output_tokens' must be a non-negative number", nil, true)
      llm:settle(taken, { tokens = 1 }) -- not one of the limits: passed over
    end)

    it("settles positional composites on their cost members", function()
      local rpm, tpm = rw.bucket { capacity = 10, rate = 1 }, rw.bucket { capacity = 1000, rate = 1 }
      local both = rw.limiters { rpm, cost = tpm }
      assert.is_true(both:acquire(500))
      both:settle(500, 100)
      assert.near(9, rpm:tokens(), 0.1)
      assert.near(900, tpm:tokens(), 1)
    end)

    it("puts a debt no further off than the bucket's sync_horizon", function()
      local b = rw.bucket { capacity = 100, rate = 10, sync_horizon = 5 }
      b:debit(1e9)
      assert.is_true(b:wait_time(1) <= 5.01, tostring(b:wait_time(1)))
      assert.error_matches(function() b:debit(-1) end, "token count must be a positive number")
    end)

    it("syncs a named limit from what the server says of it, and requests through sync", function()
      local requests, tokens = rw.bucket { capacity = 10, rate = 1 }, rw.bucket { capacity = 1000, rate = 1 }
      local llm = rw.limiters { requests = requests, tokens = tokens }
      assert.is_true(llm:sync_limit("tokens", 250, 30))
      assert.near(250, tokens:tokens(), 1)
      assert.near(10, requests:tokens(), 0.1)
      llm:sync(4, 10)
      assert.near(4, requests:tokens(), 0.1)
      -- never raised by a sync
      llm:sync_limit("tokens", 5000, 1)
      assert.near(250, tokens:tokens(), 1)
      -- a limit the composite does not have is passed over
      assert.is_false(llm:sync_limit("output_tokens", 0, 10))
      assert.is_false(rw.limiters { requests, cost = tokens }:sync_limit("tokens", 0, 10))
      assert.error_matches(function() llm:sync_limit(nil, 1) end, "the limit's name must be a string")
    end)
  end)
end)
