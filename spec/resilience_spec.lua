-- The resilience kit: circuit breakers, retry budgets and composite
-- limiters, on their own and through rw.fetch against the loopback server.
local rw = require "ratewise"
local server = require "spec.support.server"
-- The constructors init.lua exports as rw.circuit, rw.retry_budget and rw.limiters.
local new_circuit = rw.circuit
local new_budget = rw.retry_budget
local new_limiters = rw.limiters

local COOLDOWN = 0.15

local function opts(extra)
  local o = { on_retry = false }
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

local function no_sleep() end

-- Raises, with `text` (plain, not a pattern) in the message.
local function raises(text, fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "expected an error mentioning: " .. text)
  assert.is_truthy(tostring(err):find(text, 1, true), "error was: " .. tostring(err))
end

local function near(expected, actual, tolerance, what)
  assert.is_true(math.abs(actual - expected) <= tolerance,
    string.format("%s: expected %.3f (+/- %.3f), got %.3f", what or "value", expected, tolerance, actual))
end

describe("rw.circuit", function()
  local A, B = "http://a.example:80", "https://b.example:443"

  local function failing(c, origin, n)
    for _ = 1, n do c:record(origin, "failure") end
  end

  it("starts closed and lets everything through", function()
    local c = new_circuit {}
    assert.equal("closed", c:state(A))
    assert.is_true(c:allow(A))
    assert.same({}, c:states())
  end)

  it("opens after `failures` failures in a row and says how long until a trial", function()
    local c = new_circuit { failures = 3, cooldown = 30 }
    failing(c, A, 2)
    assert.equal("closed", c:state(A))
    assert.is_true(c:allow(A))
    c:record(A, "failure")
    assert.equal("open", c:state(A))
    local allowed, retry_in = c:allow(A)
    assert.is_false(allowed)
    near(30, retry_in, 0.05, "seconds until a trial")
  end)

  it("resets the count on a success; a neutral outcome neither counts nor resets", function()
    local c = new_circuit { failures = 3, cooldown = 30 }
    failing(c, A, 2)
    c:record(A, "success")
    failing(c, A, 2)
    assert.equal("closed", c:state(A))
    for _ = 1, 10 do c:record(A, "neutral") end
    assert.equal("closed", c:state(A))
    c:record(A, "failure") -- the third in a row: the neutral ones did not reset the count
    assert.equal("open", c:state(A))
  end)

  it("keeps origins apart", function()
    local c = new_circuit { failures = 2, cooldown = 30 }
    failing(c, A, 2)
    c:record(B, "failure")
    assert.equal("open", c:state(A))
    assert.is_false((c:allow(A)))
    assert.equal("closed", c:state(B))
    assert.is_true(c:allow(B))
    assert.same({ [A] = "open", [B] = "closed" }, c:states())
    c:record(B, "success")
    assert.same({ [A] = "open" }, c:states()) -- an origin in good health is forgotten
  end)

  it("after the cooldown lets exactly one trial through; a success closes it", function()
    local c = new_circuit { failures = 1, cooldown = COOLDOWN }
    c:record(A, "failure")
    rw.sleep(COOLDOWN + 0.02)
    assert.equal("half_open", c:state(A))
    assert.is_true(c:allow(A))
    for _ = 1, 3 do
      local allowed, retry_in = c:allow(A)
      assert.is_false(allowed)
      assert.is_true(retry_in > 0 and retry_in <= COOLDOWN, tostring(retry_in))
    end
    c:record(A, "success")
    assert.equal("closed", c:state(A))
    assert.is_true(c:allow(A))
    assert.is_true(c:allow(A))
  end)

  it("opens again for another cooldown when the trial fails", function()
    local c = new_circuit { failures = 2, cooldown = COOLDOWN }
    failing(c, A, 2)
    rw.sleep(COOLDOWN + 0.02)
    assert.is_true(c:allow(A))
    c:record(A, "failure")
    assert.equal("open", c:state(A))
    local allowed, retry_in = c:allow(A)
    assert.is_false(allowed)
    near(COOLDOWN, retry_in, 0.03, "a fresh cooldown")
    rw.sleep(COOLDOWN + 0.02)
    assert.is_true(c:allow(A))
    -- After a trial, one failure is not the start of a new count: the trial decides alone.
    c:record(A, "success")
    c:record(A, "failure")
    assert.equal("closed", c:state(A))
  end)

  it("is not wedged by a trial that never reports: a new trial after another cooldown", function()
    local c = new_circuit { failures = 1, cooldown = COOLDOWN }
    c:record(A, "failure")
    rw.sleep(COOLDOWN + 0.02)
    assert.is_true(c:allow(A)) -- this trial's caller goes away without recording
    assert.is_false((c:allow(A)))
    rw.sleep(COOLDOWN / 2)
    assert.is_false((c:allow(A)))
    assert.equal("half_open", c:state(A))
    rw.sleep(COOLDOWN / 2 + 0.02)
    assert.is_true(c:allow(A))
    assert.is_false((c:allow(A)))
    c:record(A, "success")
    assert.equal("closed", c:state(A))
  end)

  it("ignores late outcomes while open, and stale ones in half-open before a trial is out", function()
    local c = new_circuit { failures = 2, cooldown = COOLDOWN }
    failing(c, A, 2)
    c:record(A, "success") -- a request sent before it opened
    failing(c, A, 5)
    assert.equal("open", c:state(A))
    local _, retry_in = c:allow(A)
    assert.is_true(retry_in < COOLDOWN and retry_in > 0) -- failures while open did not extend it
    rw.sleep(COOLDOWN + 0.02)
    c:record(A, "success")
    assert.equal("half_open", c:state(A))
    c:record(A, "failure")
    assert.equal("half_open", c:state(A))
    assert.is_true(c:allow(A))
  end)

  it("tells on_change of every transition", function()
    local seen = {}
    local c = new_circuit { failures = 1, cooldown = COOLDOWN, on_change = function(origin, from, to)
      seen[#seen + 1] = origin .. " " .. from .. ">" .. to
    end }
    c:record(A, "failure")
    rw.sleep(COOLDOWN + 0.02)
    assert.is_true(c:allow(A))
    c:record(A, "failure")
    rw.sleep(COOLDOWN + 0.02)
    assert.is_true(c:allow(A))
    c:record(A, "success")
    assert.same({
      A .. " closed>open", A .. " open>half_open", A .. " half_open>open",
      A .. " open>half_open", A .. " half_open>closed",
    }, seen)
    local bad = new_circuit { failures = 1, on_change = function() error("hook broke") end }
    raises("'on_change' hook raised an error: ", bad.record, bad, A, "failure")
    assert.equal("open", bad:state(A)) -- the state moved before the hook ran
  end)

  it("refuses bad options, origins and outcomes, naming them", function()
    raises("option 'failures' must be a positive integer", new_circuit, { failures = 0 })
    raises("option 'failures' must be a positive integer", new_circuit, { failures = 2.5 })
    raises("option 'cooldown' must be a positive number", new_circuit, { cooldown = -1 })
    raises("option 'cooldown' must be a positive number", new_circuit, { cooldown = "30" })
    raises("option 'cooldown' must be a positive number", new_circuit, { cooldown = 0 / 0 })
    raises("option 'on_change' must be a function", new_circuit, { on_change = true })
    raises("unknown option 'threshold'", new_circuit, { threshold = 5 })
    raises("expected a table of options", new_circuit, 5)
    local c = new_circuit {}
    raises("outcome must be", c.record, c, A, "ok")
    raises("outcome must be", c.record, c, A, nil)
    raises("origin must be a non-empty string", c.allow, c, nil)
    raises("origin must be a non-empty string", c.record, c, "", "success")
  end)
end)

describe("rw.circuit through rw.fetch", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  local function origin_of(srv) return srv.base .. "" end -- "http://127.0.0.1:PORT"

  it("opens after `failures` 503s across calls; the next fetch ends at once, sending nothing", function()
    local c = new_circuit { failures = 3, cooldown = 30 }
    s:script("/down", { { status = 503 } })
    for _ = 1, 3 do
      local res, err = rw.fetch(s:url("/down"), opts { circuit = c, max_retries = 0 })
      assert.is_nil(res)
      assert.equal("exhausted", err.kind)
    end
    assert.equal("open", c:state(origin_of(s)))
    local events = {}
    local t0 = rw.now()
    local res, err = rw.fetch(s:url("/down"), opts { circuit = c, on_event = function(e)
      events[#events + 1] = e.type
    end })
    assert.is_true(rw.now() - t0 < 0.05)
    assert.is_nil(res)
    assert.equal("circuit_open", err.kind)
    assert.equal(0, err.attempts)
    assert.matches("nothing was sent", err.message)
    assert.same({ "request", "circuit_open" }, events)
    assert.equal(3, #s:log("/down"))
    -- Another path of the same origin is refused too.
    local _, err2 = rw.fetch(s:url("/elsewhere"), opts { circuit = c })
    assert.equal("circuit_open", err2.kind)
    assert.equal(0, #s:log("/elsewhere"))
  end)

  it("opens in the middle of one call's retries", function()
    local c = new_circuit { failures = 2, cooldown = 30 }
    s:script("/down", { { status = 503 } })
    local _, err = rw.fetch(s:url("/down"), opts { circuit = c, max_retries = 5, sleep = no_sleep })
    assert.equal("circuit_open", err.kind)
    assert.equal(2, err.attempts)
    assert.equal(503, err.status)
    assert.equal(2, #s:log("/down"))
  end)

  it("sends one trial after the cooldown; a 200 closes the circuit", function()
    local c = new_circuit { failures = 2, cooldown = COOLDOWN }
    s:script("/flaky", { { status = 503 }, { status = 503 }, { status = 200, body = "back" } })
    for _ = 1, 2 do rw.fetch(s:url("/flaky"), opts { circuit = c, max_retries = 0 }) end
    local _, err = rw.fetch(s:url("/flaky"), opts { circuit = c })
    assert.equal("circuit_open", err.kind)
    assert.equal(2, #s:log("/flaky"))
    rw.sleep(COOLDOWN + 0.02)
    assert.equal("half_open", c:state(origin_of(s)))
    local res = assert(rw.fetch(s:url("/flaky"), opts { circuit = c }))
    assert.equal("back", res.body)
    assert.equal(3, #s:log("/flaky"))
    assert.equal("closed", c:state(origin_of(s)))
    assert(rw.fetch(s:url("/flaky"), opts { circuit = c }))
    assert.equal(4, #s:log("/flaky"))
  end)

  it("lets one trial through among concurrent tasks; a failed trial opens it again", function()
    local c = new_circuit { failures = 1, cooldown = COOLDOWN }
    s:script("/trial", { { status = 503 }, { status = 503, delay = 0.1 } })
    rw.fetch(s:url("/trial"), opts { circuit = c, max_retries = 0 })
    assert.equal("open", c:state(origin_of(s)))
    rw.sleep(COOLDOWN + 0.02)
    local kinds = {}
    rw.run(function()
      for i = 1, 5 do
        rw.spawn(function()
          local _, err = rw.fetch(s:url("/trial"), opts { circuit = c, max_retries = 0 })
          kinds[i] = err.kind
        end)
      end
    end)
    table.sort(kinds)
    assert.same({ "circuit_open", "circuit_open", "circuit_open", "circuit_open", "exhausted" }, kinds)
    assert.equal(2, #s:log("/trial")) -- the first failure, then exactly one trial
    assert.equal("open", c:state(origin_of(s)))
  end)

  it("does not count a terminal 404", function()
    local c = new_circuit { failures = 2, cooldown = 30 }
    s:script("/gone", { { status = 404 } })
    for _ = 1, 5 do
      local _, err = rw.fetch(s:url("/gone"), opts { circuit = c })
      assert.equal("terminal", err.kind)
    end
    assert.equal("closed", c:state(origin_of(s)))
    assert.equal(5, #s:log("/gone"))
    s:script("/down", { { status = 503 } })
    rw.fetch(s:url("/down"), opts { circuit = c, max_retries = 0 })
    rw.fetch(s:url("/gone"), opts { circuit = c })
    assert.equal("closed", c:state(origin_of(s)))
    rw.fetch(s:url("/down"), opts { circuit = c, max_retries = 0 })
    assert.equal("open", c:state(origin_of(s)))
  end)

  it("counts transport failures: a dropped connection and a refused port", function()
    local c = new_circuit { failures = 2, cooldown = 30 }
    s:script("/drop", { { action = "drop" } })
    for _ = 1, 2 do
      local _, err = rw.fetch(s:url("/drop"), opts { circuit = c, max_retries = 0 })
      assert.equal("exhausted", err.kind)
      assert.is_nil(err.status)
    end
    assert.equal("open", c:state(origin_of(s)))

    local refused = "http://127.0.0.1:1"
    for _ = 1, 2 do
      local _, err = rw.fetch(refused .. "/", opts { circuit = c, max_retries = 0 })
      assert.equal("exhausted", err.kind)
    end
    assert.equal("open", c:state(refused .. ""))
    local _, err = rw.fetch(refused .. "/", opts { circuit = c })
    assert.equal("circuit_open", err.kind)
  end)
end)

describe("rw.retry_budget", function()
  it("allows retries up to `ratio` of the requests", function()
    local b = new_budget { ratio = 0.1, min_per_second = 0, window = 10 }
    assert.is_false(b:allow_retry())
    for _ = 1, 9 do b:request() end
    assert.is_false(b:allow_retry())
    b:request()
    assert.is_true(b:allow_retry())
    assert.is_false(b:allow_retry())
    for _ = 1, 20 do b:request() end
    assert.is_true(b:allow_retry())
    assert.is_true(b:allow_retry())
    assert.is_false(b:allow_retry())
    assert.same({ requests = 30, retries = 3, refused = 4, available = 0 }, b:stats())
  end)

  it("gives a quiet client a floor of min_per_second retries over the window", function()
    local b = new_budget { ratio = 0.1, min_per_second = 2, window = 1.5 }
    assert.equal(3, b:stats().available)
    for _ = 1, 3 do assert.is_true(b:allow_retry()) end
    assert.is_false(b:allow_retry())
    for _ = 1, 10 do b:request() end -- the ratio adds to the floor
    assert.is_true(b:allow_retry())
    assert.is_false(b:allow_retry())
  end)

  it("lets a request retry more than once with a ratio over 1", function()
    local b = new_budget { ratio = 3, min_per_second = 0 }
    b:request()
    for _ = 1, 3 do assert.is_true(b:allow_retry()) end
    assert.is_false(b:allow_retry())
  end)

  it("forgets requests and retries that slid out of the window", function()
    local b = new_budget { ratio = 0.5, min_per_second = 0, window = 0.3 }
    b:request(); b:request()
    assert.is_true(b:allow_retry())
    assert.is_false(b:allow_retry())
    rw.sleep(0.2)
    b:request(); b:request() -- two more, in a later part of the window
    assert.is_true(b:allow_retry())
    assert.is_false(b:allow_retry())
    rw.sleep(0.15) -- the first two requests and their retry have slid out; the rest have not
    assert.is_false(b:allow_retry())
    b:request(); b:request()
    assert.is_true(b:allow_retry())
    rw.sleep(0.35) -- everything has slid out
    assert.equal(0, b:stats().available)
    assert.is_false(b:allow_retry())
    b:request(); b:request()
    assert.is_true(b:allow_retry())
    assert.same({ requests = 8, retries = 4, refused = 4, available = 0 }, b:stats())
  end)

  it("counts totals over its whole life, not just the window", function()
    local b = new_budget { ratio = 1, min_per_second = 0, window = 0.1 }
    for _ = 1, 5 do b:request() end
    for _ = 1, 6 do b:allow_retry() end
    rw.sleep(0.15)
    local stats = b:stats()
    assert.equal(5, stats.requests)
    assert.equal(5, stats.retries)
    assert.equal(1, stats.refused)
  end)

  it("refuses bad options, naming them", function()
    raises("option 'ratio' must be a non-negative number", new_budget, { ratio = -0.1 })
    raises("option 'ratio' must be a non-negative number", new_budget, { ratio = "10%" })
    raises("option 'ratio' must be a non-negative number", new_budget, { ratio = math.huge })
    raises("option 'min_per_second' must be a non-negative number", new_budget, { min_per_second = -1 })
    raises("option 'window' must be a positive number", new_budget, { window = 0 })
    raises("option 'window' must be a positive number", new_budget, { window = 0 / 0 })
    raises("unknown option 'percent'", new_budget, { percent = 20 })
    raises("'ratio' and 'min_per_second' are both 0", new_budget, { ratio = 0, min_per_second = 0 })
    raises("expected a table of options", new_budget, nil)
    assert.is_true(new_budget({ ratio = 0, min_per_second = 1 }):allow_retry())
  end)
end)

describe("rw.retry_budget through rw.fetch", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  it("ends a fetch whose retry is refused with kind budget; the server sees only what the budget allows", function()
    local b = new_budget { ratio = 0.1, min_per_second = 0, window = 10 }
    s:script("/down", { { status = 503 } })
    local refusals = 0
    local on_event = function(e) if e.type == "budget_refused" then refusals = refusals + 1 end end
    for i = 1, 10 do
      local res, err = rw.fetch(s:url("/down"), opts { budget = b, max_retries = 3, sleep = no_sleep,
        on_event = on_event })
      assert.is_nil(res)
      assert.equal("budget", err.kind)
      assert.matches("retry budget", err.message)
      assert.equal(503, err.status)
      -- the tenth call brings the requests to 10, and 10 * 0.1 allows one retry
      assert.equal(i == 10 and 2 or 1, err.attempts)
    end
    assert.equal(11, #s:log("/down"))
    assert.equal(10, refusals)
    assert.same({ requests = 10, retries = 1, refused = 10, available = 0 }, b:stats())
  end)

  it("lets retries through while the budget has room", function()
    local b = new_budget { ratio = 0.1, min_per_second = 1, window = 2 }
    s:script("/flaky", { { status = 503 }, { status = 200 } })
    local res = assert(rw.fetch(s:url("/flaky"), opts { budget = b, sleep = no_sleep }))
    assert.equal(2, res.attempts)
    assert.same({ requests = 1, retries = 1, refused = 0, available = 1 }, b:stats())
  end)
end)

describe("rw.limiters", function()
  it("takes 1 from each positional member and n from the cost members", function()
    local rpm = rw.bucket { capacity = 10, rate = 0.001 }
    local tpm = rw.bucket { capacity = 1000, rate = 0.001 }
    local tpd = rw.bucket { capacity = 5000, rate = 0.001 }
    local both = new_limiters { rpm, cost = { tpm, tpd } }
    assert.is_true(both:acquire(300))
    assert.is_true(both:acquire())
    near(8, rpm:tokens(), 0.01, "rpm")
    near(699, tpm:tokens(), 0.01, "tpm")
    near(4699, tpd:tokens(), 0.01, "tpd")
    near(1000, both:capacity(), 0, "capacity")
    assert.equal(0, both:wait_time(699))
    near(1 / 0.001, both:wait_time(700), 0.01, "wait_time")
  end)

  it("takes from every member or from none", function()
    local rpm = rw.bucket { capacity = 5, rate = 0.001 }
    local tpm = rw.bucket { capacity = 100, rate = 10 }
    local both = new_limiters { rpm, cost = tpm }
    assert.is_true(both:take(90))
    local ok, wait = both:take(50)
    assert.is_false(ok)
    near(4, wait, 0.05, "seconds until 50 tokens")
    near(4, rpm:tokens(), 0.01, "rpm untouched by the failed take")
    both:refund(90)
    near(5, rpm:tokens(), 0.01, "rpm after refund")
    near(100, tpm:tokens(), 0.01, "tpm after refund")
  end)

  it("waits for the binding limiter (tpm) and holds no token of the free one meanwhile", function()
    local rpm = rw.bucket { capacity = 5, rate = 0.001 }
    local tpm = rw.bucket { capacity = 100, rate = 400 }
    local both = new_limiters { rpm, cost = tpm }
    local waited, rpm_during, tpm_during
    rw.run(function()
      both:acquire(100)
      local waiter = rw.spawn(function()
        local t0 = rw.now()
        both:acquire(80) -- tpm is empty: 80 / 400 = 0.2 s
        waited = rw.now() - t0
      end)
      rw.sleep(0.1)
      rpm_during, tpm_during = rpm:tokens(), tpm:tokens()
      waiter:join()
    end)
    near(0.2, waited, 0.05, "wait for tpm")
    near(4, rpm_during, 0.01, "rpm tokens during the wait") -- only the first acquire's token is gone
    near(40, tpm_during, 5, "tpm tokens during the wait")   -- refilling, nobody holding a reservation
    near(3, rpm:tokens(), 0.01, "rpm after")
  end)

  it("leaves nothing behind when a waiting task is cancelled", function()
    local rpm = rw.bucket { capacity = 5, rate = 0.001 }
    local tpm = rw.bucket { capacity = 100, rate = 100 }
    local both = new_limiters { rpm, cost = tpm }
    local emptied
    rw.run(function()
      both:acquire(100)
      emptied = rw.now()
      local waiter = rw.spawn(function() both:acquire(100) end)
      rw.sleep(0.05)
      waiter:cancel()
      local _, err = waiter:join()
      assert.equal("cancelled", err)
    end)
    near(4, rpm:tokens(), 0.01, "rpm")
    -- what tpm refilled since it was emptied, and nothing held for the
    -- cancelled waiter (a loaded machine stretches the 0.05 s sleep)
    local tokens, refilled = tpm:tokens(), math.min(100, (rw.now() - emptied) * 100)
    assert.is_true(tokens > 0 and tokens <= refilled + 0.5, "tpm refilling, nothing reserved: " .. tokens)
  end)

  it("serves tasks waiting on it concurrently, never overdrawing a member", function()
    local rpm = rw.bucket { capacity = 60, rate = 1 }
    local tpm = rw.bucket { capacity = 100, rate = 500 }
    local both = new_limiters { rpm, cost = tpm }
    local finished, lowest = {}, math.huge
    local t0 = rw.now()
    rw.run(function()
      local watching = true
      rw.spawn(function()
        while watching do
          lowest = math.min(lowest, tpm:tokens())
          rw.sleep(0.005)
        end
      end)
      local tasks = {}
      for i = 1, 6 do
        tasks[i] = rw.spawn(function()
          both:acquire(50)
          finished[#finished + 1] = rw.now() - t0
        end)
      end
      for i = 1, 6 do tasks[i]:join() end
      watching = false
    end)
    -- 300 tokens: 100 at once, then 200 at 500 per second.
    assert.equal(6, #finished)
    near(0, finished[2], 0.03, "second task")
    near(0.4, finished[6], 0.06, "last task")
    assert.is_true(lowest >= -1e-9, "tpm overdrawn: " .. lowest)
    near(54, rpm:tokens(), 0.5, "rpm")
  end)

  it("nests, and waits through a per-call sleep when given one", function()
    local a = rw.bucket { capacity = 1, rate = 20 }
    local b = rw.bucket { capacity = 50, rate = 1000 }
    local inner = new_limiters { a, cost = b }
    local outer = new_limiters { rw.bucket { capacity = 10, rate = 1 }, cost = inner }
    near(50, outer:capacity(), 0, "capacity")
    local sleeps = {}
    local function sleep(seconds)
      sleeps[#sleeps + 1] = seconds
      rw.sleep(seconds)
    end
    assert.is_true(outer:acquire(50, sleep))
    assert.equal(0, #sleeps)
    assert.is_true(outer:acquire(10, sleep))
    assert.is_true(#sleeps >= 1)
    near(0.05, sleeps[1], 0.01, "the longest member wait (a: 1 token at 20/s)")
  end)

  it("refuses members that are not limiters, and counts no member could serve, naming them", function()
    local b = rw.bucket { capacity = 10, rate = 1 }
    raises("member #2 must be a limiter", new_limiters, { b, {} })
    raises("member #1 must be a limiter", new_limiters, { "rpm" })
    raises("option 'cost' must be a limiter", new_limiters, { b, cost = 5 })
    raises("cost member #2 must be a limiter", new_limiters, { cost = { rw.bucket { capacity = 1, rate = 1 }, print } })
    raises("unknown option 'tpm'", new_limiters, { b, tpm = b })
    raises("the same limiter is given twice", new_limiters, { b, cost = b })
    raises("expected at least one limiter", new_limiters, {})
    raises("fewer than the 1 token", new_limiters, { rw.bucket { capacity = 0.5, rate = 1 } })
    local both = new_limiters { rw.bucket { capacity = 10, rate = 1 }, cost = b }
    raises("11 tokens asked of cost member #1, whose capacity is 10", both.acquire, both, 11)
    raises("token count must be a positive number", both.acquire, both, -1)
    raises("token count must be a positive number", both.wait_time, both, "5")
    raises("sleep must be a function", both.acquire, both, 1, 5)
  end)
end)

describe("rw.limiters through rw.fetch", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  it("paces attempts, taking `cost` tokens of the cost members each time", function()
    local rpm = rw.bucket { capacity = 100, rate = 1 }
    local tpm = rw.bucket { capacity = 100, rate = 400 }
    local both = new_limiters { rpm, cost = tpm }
    for _ = 1, 3 do assert(rw.fetch(s:url("/paced"), opts { limiter = both, cost = 80 })) end
    local log = s:log("/paced")
    assert.equal(3, #log)
    near(0.15, log[2].t - log[1].t, 0.05, "second request") -- 60 tokens short at 400/s
    near(0.2, log[3].t - log[2].t, 0.05, "third request")   -- 80 tokens short
    near(97, rpm:tokens(), 0.5, "rpm")
  end)
end)
