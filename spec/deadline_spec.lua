-- The `deadline` option (a time on rw.now()'s clock, beside max_elapsed,
-- the earlier of the two winning) and task:join(timeout), against a real
-- loopback server (spec/support/server.py), asserting what it saw.
local rw = require "ratewise"
local options = require "ratewise.options"
local server = require "spec.support.server"

-- How late past its deadline a call may end (the loaded machine's jitter
-- and the transfer's teardown).
local LATE = 0.25

describe("the deadline option", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  it("ends a call at the deadline when it comes before max_elapsed", function()
    s:script("/slow", { { status = 200, body = "late", delay = 3 } })
    local t0 = rw.now()
    local res, err = rw.fetch(s:url("/slow"), { deadline = t0 + 0.4, max_elapsed = 20, timeout = 30,
      on_retry = false })
    local took = rw.now() - t0
    assert.is_nil(res)
    assert.equal("budget", err.kind)
    assert.is_true(took >= 0.35 and took < 0.4 + LATE, "ended after " .. took .. " s")
    -- (the call begins a moment after t0: its first call may load modules)
    local said = tonumber(err.message:match("deadline (%d+%.%d+) s after the call began"))
    assert.is_true(said ~= nil and said > 0.3 and said <= 0.4, err.message)
    assert.equal(1, #s:log("/slow"))
  end)

  it("leaves max_elapsed in charge when it comes first", function()
    s:script("/slow", { { status = 200, body = "late", delay = 3 } })
    local t0 = rw.now()
    local res, err = rw.fetch(s:url("/slow"), { deadline = t0 + 20, max_elapsed = 0.4, on_retry = false })
    local took = rw.now() - t0
    assert.is_nil(res)
    assert.equal("budget", err.kind)
    assert.is_true(took >= 0.35 and took < 0.4 + LATE, "ended after " .. took .. " s")
    assert.matches("max_elapsed 0%.40 s", err.message)
    assert.equal(1, #s:log("/slow"))
  end)

  it("already past: the call fails at once with kind budget, and nothing is sent", function()
    s:script("/x", { { status = 200, body = "ok" } })
    local bucket = rw.bucket { capacity = 1, rate = 1 }
    for _, extra in ipairs { {}, { limiter = bucket }, { on_event = function() end } } do
      local o = { deadline = rw.now() - 0.5, on_retry = false }
      for k, v in pairs(extra) do o[k] = v end
      local t0 = rw.now()
      local res, err = rw.fetch(s:url("/x"), o)
      assert.is_nil(res)
      assert.equal("budget", err.kind)
      assert.equal(0, err.attempts)
      assert.is_true(rw.now() - t0 < 0.1)
      assert.matches("nothing was sent", err.message)
      assert.matches("the deadline had passed 0%.5%d s before the call began", err.message)
    end
    assert.equal(0, #s:log("/x"))
    -- (the bucket's token was not taken)
    assert.is_true(bucket:tokens() > 0.99)
  end)

  it("stops at once when a retry's wait would not fit before it, as max_elapsed does", function()
    s:script("/busy", { { status = 503, headers = { ["Retry-After"] = "2" }, body = "busy" },
      { status = 200, body = "ok" } })
    local t0 = rw.now()
    local res, err = rw.fetch(s:url("/busy"), { deadline = t0 + 1, on_retry = false })
    assert.is_nil(res)
    assert.equal("budget", err.kind)
    assert.equal(503, err.status)
    assert.is_true(rw.now() - t0 < 0.3, "waited before failing")
    assert.matches("would not fit", err.message)
    assert.matches("deadline 1%.00 s after the call began", err.message)
    assert.equal(1, #s:log("/busy"))
  end)

  it("lets a retry go that fits before it", function()
    s:script("/busy", { { status = 503, headers = { ["Retry-After"] = "1" }, body = "busy" },
      { status = 200, body = "ok" } })
    local t0 = rw.now()
    local res = assert(rw.fetch(s:url("/busy"), { deadline = t0 + 3, hint_jitter = 0, on_retry = false }))
    assert.equal(200, res.status)
    assert.equal(2, res.attempts)
    assert.is_true(rw.now() - t0 >= 0.95)
    assert.equal(2, #s:log("/busy"))
  end)

  it("is one table of options for every call of one piece of work", function()
    s:script("/item", { { status = 200, body = "ok", delay = 0.25 } })
    local t0 = rw.now()
    local work = { deadline = t0 + 0.6, on_retry = false }
    local results = {}
    for i = 1, 4 do
      local res, err = rw.fetch(s:url("/item"), work)
      results[i] = res and res.status or err.kind
    end
    local took = rw.now() - t0
    -- two fit, the third is cut short at the deadline, the fourth is never sent
    assert.same({ 200, 200, "budget", "budget" }, results)
    assert.is_true(took < 0.6 + LATE, "ended after " .. took .. " s")
    assert.equal(3, #s:log("/item"))
  end)

  it("reaches every call of a batch under rw.map, and through an inherited table", function()
    s:script("/item", { { status = 200, body = "ok", delay = 0.3 } })
    local t0 = rw.now()
    local base = { on_retry = false, max_retries = 0 }
    local work = setmetatable({ deadline = t0 + 0.45 }, { __index = base })
    local results = rw.map({ 1, 2, 3, 4 }, function()
      local res, err = rw.fetch(s:url("/item"), work)
      return res and res.status or err.kind
    end, { concurrency = 2 })
    local took = rw.now() - t0
    assert.same({ 200, 200, "budget", "budget", n = 4 }, results)
    assert.is_true(took < 0.45 + LATE, "ended after " .. took .. " s")
    assert.equal(4, #s:log("/item"))
  end)

  it("is taken by a client's calls, and refused by rw.client with the reason", function()
    s:script("/slow", { { status = 200, body = "late", delay = 3 } })
    local client = rw.client { base_url = s:url(""), on_retry = false }
    local t0 = rw.now()
    local res, err = client:get("/slow", { deadline = t0 + 0.3 })
    assert.is_nil(res)
    assert.equal("budget", err.kind)
    assert.is_true(rw.now() - t0 < 0.3 + LATE)
    assert.equal(1, #s:log("/slow"))
    local ok, why = pcall(rw.client, { base_url = s:url(""), deadline = t0 + 10 })
    assert.is_false(ok)
    assert.matches("client: unknown option 'deadline' %(a call's, not a client's: .*give it to each call", why)
  end)

  it("must be a finite number on rw.now()'s clock", function()
    local url = s:url("/never")
    for _, case in ipairs {
      { "soon", "option 'deadline' must be a time on rw.now%(%)'s clock, a finite number %(got string \"soon\"%)" },
      { 0 / 0, "option 'deadline' must be .*%(got nan%)" },
      { math.huge, "option 'deadline' must be .*%(got inf%)" },
      { os.time() + 5, "option 'deadline' is %d+ s away: it is a time on rw.now%(%)'s clock" },
    } do
      local ok, err = pcall(rw.fetch, url, { deadline = case[1] })
      assert.is_false(ok)
      assert.matches(case[2], err)
    end
    assert.equal(0, #s:log("/never"))
  end)

  it("is no part of a request's identity", function()
    assert.is_false(options.by_name.deadline.identity)
    for _, part in ipairs(options.identity) do assert.not_equal("deadline", part.name) end
  end)
end)

describe("task:join(timeout)", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  it("inside a task: nil, \"timeout\" once the seconds pass, and the task goes on", function()
    s:script("/slow", { { status = 200, body = "late", delay = 0.5 } })
    rw.run(function()
      local t0 = rw.now()
      local task = rw.spawn(rw.fetch, s:url("/slow"), { on_retry = false })
      local res, why = task:join(0.15)
      local waited = rw.now() - t0
      assert.is_nil(res)
      assert.equal("timeout", why)
      assert.is_true(waited >= 0.14 and waited < 0.15 + LATE, "waited " .. waited .. " s")
      assert.equal("waiting", task:status())
      -- not cancelled: its request goes on, and a join then has its answer
      res = assert(task:join())
      assert.equal(200, res.status)
      assert.equal("late", res.body)
      assert.is_true(rw.now() - t0 >= 0.45)
    end)
    assert.equal(1, #s:log("/slow"))
  end)

  it("outside any task: the main thread drives the scheduler until the timeout", function()
    s:script("/slow", { { status = 200, body = "late", delay = 0.5 } })
    local t0 = rw.now()
    local task = rw.spawn(rw.fetch, s:url("/slow"), { on_retry = false })
    local res, why = task:join(0.15)
    local waited = rw.now() - t0
    assert.is_nil(res)
    assert.equal("timeout", why)
    assert.is_true(waited >= 0.14 and waited < 0.15 + LATE, "waited " .. waited .. " s")
    res = assert(task:join(5))
    assert.equal(200, res.status)
    local took = rw.now() - t0
    assert.is_true(took >= 0.45 and took < 0.5 + LATE, "took " .. took .. " s")
    assert.equal(1, #s:log("/slow"))
  end)

  it("returns what join returns as soon as the task ends within the timeout", function()
    s:script("/quick", { { status = 200, body = "ok", delay = 0.1 } })
    local t0 = rw.now()
    local task = rw.spawn(function()
      local res = assert(rw.fetch(s:url("/quick"), { on_retry = false }))
      return res.status, res.body
    end)
    local status, body = task:join(5)
    assert.equal(200, status)
    assert.equal("ok", body)
    assert.is_true(rw.now() - t0 < 0.1 + LATE)
    local failing = rw.spawn(function() rw.sleep(0.05); error("boom") end)
    local none, err = failing:join(5)
    assert.is_nil(none)
    assert.matches("boom", err)
  end)

  it("with 0 answers at once, in a task or not", function()
    local task = rw.spawn(rw.sleep, 0.2)
    assert.same({ nil, "timeout" }, { task:join(0) })
    rw.run(function() assert.same({ nil, "timeout" }, { task:join(0) }) end)
    assert.is_true(select("#", task:join()) >= 0)
    assert.equal("done", task:status())
  end)

  it("still reports a failure that nobody joins once a join timed out", function()
    local ok, err = pcall(rw.run, function()
      local task = rw.spawn(function() rw.sleep(0.1); error("late failure") end)
      assert.equal("timeout", select(2, task:join(0.01)))
    end)
    assert.is_false(ok)
    assert.matches("never joined: .*late failure", err)
  end)

  it("raises for a timeout that is not a finite number", function()
    local task = rw.spawn(rw.sleep, 0)
    for _, bad in ipairs { "1", 0 / 0, math.huge } do
      local ok, err = pcall(task.join, task, bad)
      assert.is_false(ok)
      assert.matches("join: timeout must be a finite number of seconds", err)
    end
    task:join()
  end)
end)

describe("the deadline option on a client's call", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  -- A GET of `path` by client c with a deadline `within` s away, made while
  -- another task's GET of /slow is in flight: its result and how long it took.
  local function behind_a_slow_call(c, path, within)
    local took, res, err
    rw.run(function()
      local first = rw.spawn(function() return c:get("/slow") end)
      rw.sleep(0.05)
      local t0 = rw.now()
      res, err = c:get(path, { deadline = t0 + within })
      took = rw.now() - t0
      assert(first:join())
    end)
    return res, err, took
  end

  it("does not join an identical request in flight that ends after the call's deadline", function()
    s:script("/slow", { { status = 200, body = "late", delay = 1.5 }, { status = 200, body = "late", delay = 1.5 } })
    local c = rw.client { base_url = s.base, on_retry = false }
    local res, err, took = behind_a_slow_call(c, "/slow", 0.4)
    assert.is_nil(res)
    assert.equal("budget", err.kind)
    assert.is_true(took < 0.4 + LATE, "ended after " .. took .. " s")
    -- it made a request of its own, which its deadline cut
    assert.equal(2, #s:log("/slow"))
  end)

  it("waits for its turn under concurrency no longer than its deadline, and says so", function()
    s:script("/slow", { { status = 200, body = "late", delay = 1.5 } })
    local c = rw.client { base_url = s.base, on_retry = false, concurrency = 1 }
    local res, err, took = behind_a_slow_call(c, "/other", 0.3)
    assert.is_nil(res)
    assert.equal("budget", err.kind)
    assert.matches("did not come before the call's deadline; nothing was sent", err.message)
    assert.is_true(took >= 0.25 and took < 0.3 + LATE, "ended after " .. took .. " s")
    assert.equal(0, #s:log("/other"))
  end)
end)
