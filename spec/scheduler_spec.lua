-- Tasks, waits and concurrent transfers, against the loopback test server.
local rw = require "ratewise"
local server = require "spec.support.server"
local socket = require "socket" -- a sleep that is not ratewise's own, for frame loops

local quiet = { on_retry = false }

local max_active = server.max_active

-- A for loop over a coroutine.wrap iterator that fetches its two items
-- from server s, putting what the loop gets in `items`.
local function iterate_fetches(s, items)
  for item in coroutine.wrap(function()
    for i = 1, 2 do coroutine.yield(assert(rw.fetch(s:url("/item/" .. i), quiet)).body) end
  end) do
    items[#items + 1] = item
  end
end

describe("the scheduler", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  describe("rw.run and rw.spawn", function()
    it("returns fn's results once every task under it has finished", function()
      local order = {}
      local a, b = rw.run(function(x)
        rw.spawn(function() rw.sleep(0.05); order[#order + 1] = "child" end)
        order[#order + 1] = "root"
        return x, "two"
      end, "one")
      assert.equal("one", a)
      assert.equal("two", b)
      assert.same({ "root", "child" }, order)
    end)

    it("join returns a task's results, or nil plus its error with a traceback", function()
      rw.run(function()
        local ok = rw.spawn(function(n) rw.sleep(0.01); return n * 2, "x" end, 21)
        local bad = rw.spawn(function() rw.sleep(0.01); error("kaput") end)
        local v, x = ok:join()
        assert.equal(42, v)
        assert.equal("x", x)
        local nothing, err = bad:join()
        assert.is_nil(nothing)
        assert.matches("kaput", err)
        assert.matches("stack traceback", err)
      end)
    end)

    it("raises fn's error, with its traceback", function()
      local ok, err = pcall(rw.run, function() rw.sleep(0.01); error("from the root") end)
      assert.is_false(ok)
      assert.matches("from the root", err)
      assert.matches("stack traceback", err)
    end)

    it("raises the error of a task under it that nobody joined", function()
      local ok, err = pcall(rw.run, function()
        rw.spawn(function() error("orphan failure") end)
        rw.sleep(0.01)
      end)
      assert.is_false(ok)
      assert.matches("never joined: .*orphan failure", err)
    end)

    it("reports tasks that wait for each other instead of hanging", function()
      local ok, err = pcall(rw.run, function()
        local me = rw.spawn(function() end)
        me:join()
        local a
        local b = rw.spawn(function() rw.sleep(0.01); return a:join() end)
        a = rw.spawn(function() rw.sleep(0.01); return b:join() end)
        a:join()
      end)
      assert.is_false(ok)
      assert.matches("deadlock", err)
    end)

    it("runs tasks concurrently: their sleeps overlap", function()
      local t0 = rw.now()
      rw.run(function()
        for _ = 1, 50 do rw.spawn(rw.sleep, 0.2) end
      end)
      local took = rw.now() - t0
      assert.is_true(took >= 0.2 and took < 0.3, "took " .. took)
    end)

    it("lets join from the main thread drive the scheduler", function()
      local task = rw.spawn(function() rw.sleep(0.02); return "done" end)
      assert.equal("done", task:join())
    end)

    it("rejects what is not a function", function()
      assert.error_matches(function() rw.run(42) end, "expected a function")
      assert.error_matches(function() rw.spawn("x") end, "expected a function")
    end)
  end)

  describe("rw.sleep", function()
    it("is never shorter than asked and overshoots by a few milliseconds at most", function()
      rw.run(function()
        for _, d in ipairs { 0.01, 0.05, 0.1 } do
          local t0 = rw.now()
          rw.sleep(d)
          local took = rw.now() - t0
          assert.is_true(took >= d, ("slept %.4f for %.4f"):format(took, d))
          assert.is_true(took < d + 0.015, ("slept %.4f for %.4f"):format(took, d))
        end
      end)
      local t0 = rw.now()
      rw.sleep(0.05) -- the main thread blocks
      assert.is_true(rw.now() - t0 >= 0.05)
    end)

    it("uses no CPU while every task waits", function()
      local cpu0, t0 = os.clock(), rw.now()
      rw.run(function()
        for _ = 1, 100 do rw.spawn(rw.sleep, 0.5) end
        rw.spawn(function()
          local b = rw.bucket { capacity = 1, rate = 4 }
          for _ = 1, 3 do b:acquire() end
        end)
      end)
      local cpu, wall = os.clock() - cpu0, rw.now() - t0
      assert.is_true(wall >= 0.5)
      assert.is_true(cpu < 0.05, ("%.3f s of CPU over %.3f s"):format(cpu, wall))
    end)

    it("follows the yield protocol inside a coroutine whose runner speaks it", function()
      local co = rw.speaks_protocol(coroutine.create(function() rw.sleep(0.25); return "woke" end))
      local ok, what, seconds = coroutine.resume(co)
      assert.is_true(ok)
      assert.equal("ratewise.sleep", what)
      assert.near(0.25, seconds, 0.01)
      -- Resumed early, it asks for the rest of the time.
      ok, what, seconds = coroutine.resume(co)
      assert.is_true(ok)
      assert.equal("ratewise.sleep", what)
      assert.is_true(seconds > 0 and seconds <= 0.25)
      socket.sleep(seconds)
      local _, result = coroutine.resume(co)
      assert.equal("woke", result)
    end)

    -- A generic for calls its iterator with the last item: a wait that is
    -- resumed with its own "ratewise.sleep" was taken for an item.
    it("says so when a for loop takes a wait's yield for an item", function()
      local co = rw.speaks_protocol(coroutine.create(function()
        for i = 1, 2 do coroutine.yield(assert(rw.fetch(s:url("/item/" .. i), quiet)).body) end
      end))
      local items = {}
      local ok, err = pcall(function()
        -- as coroutine.wrap's function is called: with the loop's state and last item
        for item in function(state, last) return select(2, assert(coroutine.resume(co, state, last))) end do
          items[#items + 1] = item
        end
      end)
      assert.is_false(ok)
      assert.matches("ratewise: a wait's yield (\"ratewise.sleep\") was taken for an item", err, 1, true)
      assert.same({ "ratewise.sleep" }, items) -- one, not one per wait
    end)

    -- Its runner (a for loop) does not speak the protocol: the waits block
    -- the thread, as the main thread's do, and the loop gets its items.
    it("serves a for loop over coroutine.wrap outside any task by blocking", function()
      s:script("/item/1", { { status = 200, body = "one" } })
      s:script("/item/2", { { status = 200, body = "two" } })
      local items = {}
      iterate_fetches(s, items)
      assert.same({ "one", "two" }, items)
    end)

    it("calls the host sleep set with rw.configure outside tasks", function()
      local asked = {}
      rw.configure { sleep = function(sec) asked[#asked + 1] = sec end }
      local ok, err = pcall(function()
        s:script("/h", { { status = 429, headers = { ["Retry-After"] = "7" } }, { status = 200 } })
        assert(rw.fetch(s:url("/h"), quiet))
      end)
      rw.configure { sleep = false }
      assert(ok, err)
      local found = false
      for _, sec in ipairs(asked) do if sec >= 7 and sec <= 7 * 1.2 then found = true end end
      assert.is_true(found)
      assert.error_matches(function() rw.configure { sleep = 5 } end, "'sleep'")
      assert.error_matches(function() rw.configure { slep = print } end, "unknown option 'slep'")
    end)
  end)

  describe("concurrent transfers", function()
    it("runs 20 slow requests at once", function()
      s:script("/slow", { { status = 200, body = "ok", delay = 0.3 } })
      local t0 = rw.now()
      local results = rw.map({}, function() end)
      assert.same({ n = 0 }, results)
      rw.run(function()
        local tasks = {}
        for i = 1, 20 do
          tasks[i] = rw.spawn(function() return assert(rw.fetch(s:url("/slow"), quiet)).status end)
        end
        for i = 1, 20 do assert.equal(200, tasks[i]:join()) end
      end)
      local took = rw.now() - t0
      assert.is_true(took < 1.5, "20 x 300 ms took " .. took .. " s")
      assert.equal(20, #s:log("/slow"))
      assert.is_true(max_active(s:log("/slow")) >= 10)
    end)

    it("rw.map keeps list order and honours its concurrency limit", function()
      s:script("/m", { { status = 200, delay = 0.05 } })
      local list = {}
      for i = 1, 24 do list[i] = i end
      local results, errors = rw.map(list, function(i)
        local res, err = rw.fetch(s:url("/m") .. "?i=" .. i, quiet)
        return res and (i * 10), err
      end, { concurrency = 4 })
      assert.equal(24, results.n)
      for i = 1, 24 do assert.equal(i * 10, results[i]) end
      assert.same({}, errors)
      local log = s:log("/m")
      assert.equal(24, #log)
      assert.equal(4, max_active(log))
      assert.error_matches(function() rw.map(list, print, { concurrency = 0 }) end, "'concurrency'")
    end)

    it("rw.map raises the first error and cancels the rest", function()
      local ok, err = pcall(rw.map, { 1, 2, 3, 4 }, function(i)
        if i == 2 then error("item two failed") end
        rw.sleep(0.05)
      end, { concurrency = 2 })
      assert.is_false(ok)
      assert.matches("item two failed", err)
    end)

    it("keeps the frame rate while tasks wait out a Retry-After", function()
      s:script("/ra", { { status = 429, headers = { ["Retry-After"] = "1" } }, { status = 200 } })
      local done = 0
      for _ = 1, 5 do
        rw.spawn(function()
          local res = rw.fetch(s:url("/ra"), quiet)
          if res then done = done + 1 end
        end)
      end
      local worst, frames, t0 = 0, 0, rw.now()
      while rw.step(0) > 0 and rw.now() - t0 < 5 do
        -- the step's CPU time: on a machine shared with other work a step
        -- can be descheduled for longer than it runs
        local f0 = os.clock()
        rw.step(0)
        worst = math.max(worst, os.clock() - f0)
        frames = frames + 1
        socket.sleep(1 / 120)
      end
      assert.equal(5, done)
      assert.is_true(worst < 0.01, ("the most CPU one step(0) used: %.4f s"):format(worst))
      assert.is_true(frames > 60, "only " .. frames .. " frames in the wait")
    end)

    it("step(timeout) returns the number of live tasks", function()
      assert.equal(0, rw.step(0))
      rw.spawn(rw.sleep, 0.05)
      assert.equal(1, rw.step(0))
      assert.equal(0, rw.step(1))
      assert.error_matches(function() rw.step(-1) end, "timeout")
    end)

    it("step's budget bounds the work of one call; what is left runs next, in order", function()
      local order = {}
      for id = 1, 5 do
        rw.spawn(function()
          order[#order + 1] = id
          rw.sleep(0)
          order[#order + 1] = id
        end)
      end
      -- a budget spent by the first task: one task a call, none skipped
      assert.equal(5, rw.step(0, 1e-9))
      assert.same({ 1 }, order)
      assert.equal(0, rw.pollable.timeout()) -- the rest is due at once
      while #order < 5 do rw.step(0, 1e-9) end
      assert.same({ 1, 2, 3, 4, 5 }, order)
      -- false: no budget, everything that is ready
      rw.step(0, false)
      assert.same({ 1, 2, 3, 4, 5, 1, 2, 3, 4, 5 }, order)
      assert.equal(0, rw.step(0))
      assert.error_matches(function() rw.step(0, 0) end, "budget must be a positive number of seconds or false")
      assert.error_matches(function() rw.step(0, 0 / 0) end, "budget")
      assert.error_matches(function() rw.step(0, math.huge) end, "budget")
      assert.error_matches(function() rw.step(0, "1") end, "budget")
    end)

    it("step's budget leaves the tasks it did not reach in place: a call's work does not grow with them", function()
      -- A call that ran out of budget moved every task it had not reached
      -- to the front of the queue, so its work grew with the tasks ready.
      -- The Lua instructions run in the scheduler (scheduler.lua and
      -- scheduler/) during fn(), counted (LuaJIT: interpreted, as its
      -- compiled code calls no hook).
      local function scheduler_instructions(fn)
        local count, jit = 0, rawget(_G, "jit")
        if jit then jit.flush(); jit.off() end
        debug.sethook(function()
          if debug.getinfo(2, "S").short_src:find("ratewise/scheduler", 1, true) then count = count + 1 end
        end, "", 1)
        fn()
        debug.sethook()
        if jit then jit.on() end
        return count
      end
      -- One budgeted call's count with `tasks` tasks ready, its first done.
      local function one_call(tasks)
        local ran = 0
        for _ = 1, tasks do rw.spawn(function() ran = ran + 1 end) end
        rw.step(0, 1e-9)
        local count = scheduler_instructions(function() rw.step(0, 1e-9) end)
        assert.equal(2, ran) -- one task a call
        rw.step(0, false)
        assert.equal(tasks, ran)
        return count
      end
      local few, many = one_call(10), one_call(5000)
      assert(many < 2 * few, string.format("a call with 5,000 tasks ready ran %d instructions of the scheduler, "
        .. "with 10 ready %d", many, few))
    end)

    it("step(0) leaves a task made ready during the call for after those it did not reach", function()
      local order = {}
      local waker = rw.semaphore(1)
      assert(waker:acquire())
      local sleeper = rw.spawn(function()
        waker:acquire()
        order[#order + 1] = "woken"
      end)
      rw.step(0, false) -- the sleeper waits on the semaphore
      assert.equal("waiting", sleeper:status())
      rw.spawn(function() order[#order + 1] = "a"; waker:release() end)
      rw.spawn(function() order[#order + 1] = "b" end)
      rw.step(0, 1e-9) -- "a" runs and wakes the sleeper; "b" was not reached
      assert.same({ "a" }, order)
      rw.step(0, false)
      assert.same({ "a", "b", "woken" }, order)
    end)
  end)

  describe("task:cancel", function()
    it("ends a sleeping task at once", function()
      local t0 = rw.now()
      rw.run(function()
        local sleeper = rw.spawn(function() rw.sleep(10) end)
        rw.sleep(0.01)
        sleeper:cancel()
        local r, err = sleeper:join()
        assert.is_nil(r)
        assert.equal("cancelled", err)
      end)
      assert.is_true(rw.now() - t0 < 0.5)
    end)

    it("gives up a bucket waiter's place", function()
      rw.run(function()
        local b = rw.bucket { capacity = 1, rate = 1 }
        b:acquire()
        local waiter = rw.spawn(function() b:acquire() end)
        rw.sleep(0.01)
        assert.is_true(b:tokens() < -0.9) -- the waiter holds a reservation
        waiter:cancel()
        assert.equal("cancelled", select(2, waiter:join()))
        assert.is_true(b:tokens() > -0.1)  -- ...which it gave back
      end)
    end)

    it("aborts a transfer in flight and frees its connection", function()
      s:script("/hang", { { action = "hang", delay = 30 } })
      local t0 = rw.now()
      rw.run(function()
        local fetcher = rw.spawn(function() return rw.fetch(s:url("/hang"), quiet) end)
        rw.sleep(0.1)
        fetcher:cancel()
        assert.equal("cancelled", select(2, fetcher:join()))
      end)
      assert.is_true(rw.now() - t0 < 1)
      -- The server saw the client go, and the next request goes through.
      assert.equal(1, #s:log("/hang"))
      assert.equal(200, assert(rw.fetch(s:url("/after"), quiet)).status)
    end)

    it("serves bucket waiters across tasks first come, first served", function()
      local order = {}
      rw.run(function()
        local b = rw.bucket { capacity = 1, rate = 50 }
        for i = 1, 6 do
          rw.spawn(function() b:acquire(); order[#order + 1] = i end)
        end
      end)
      assert.same({ 1, 2, 3, 4, 5, 6 }, order)
    end)
  end)

  -- A task's wait is a yield: from a function Lua calls from C (a
  -- table.sort comparator, a string.gsub callback) it cannot be made, and a
  -- coroutine of the caller's own inside a task would yield to the task's
  -- code, not to the scheduler. Each says so, sends nothing, and the other
  -- tasks go on.
  describe("a wait where a task cannot yield to the scheduler", function()
    local function failure_of(fn)
      local err, sibling
      rw.run(function()
        local other = rw.spawn(function() return assert(rw.fetch(s:url("/sibling"), quiet)).status end)
        local _, e = rw.spawn(fn):join()
        err = e
        sibling = other:join()
      end)
      assert.equal(200, sibling)
      return tostring(err)
    end

    it("says so when rw.fetch is called from a table.sort comparator", function()
      local err = failure_of(function()
        table.sort({ 3, 1, 2 }, function(a, b)
          rw.fetch(s:url("/sorted"), quiet)
          return a < b
        end)
      end)
      assert.matches("ratewise: a task cannot wait inside a function that Lua calls from C", err, 1, true)
      assert.matches("table.sort", err, 1, true)
      assert.equal(0, #s:log("/sorted"))
    end)

    it("says so when rw.fetch is called from a string.gsub callback", function()
      local err = failure_of(function()
        return (("a b"):gsub("%a", function(word)
          return assert(rw.fetch(s:url("/word/" .. word), quiet)).body
        end))
      end)
      assert.matches("ratewise: a task cannot wait inside a function that Lua calls from C", err, 1, true)
      assert.equal(0, #s:log("/word/a"))
    end)

    it("says so when rw.sleep is called from a table.sort comparator", function()
      local err = failure_of(function()
        table.sort({ 3, 1, 2 }, function(a, b) rw.sleep(0.01); return a < b end)
      end)
      assert.matches("ratewise: a task cannot wait inside a function that Lua calls from C", err, 1, true)
    end)

    it("says so when a coroutine.wrap iterator inside a task calls ratewise", function()
      local items = {}
      local err = failure_of(function() iterate_fetches(s, items) end)
      assert.matches("ratewise: a coroutine of your own inside a task", err, 1, true)
      assert.same({}, items) -- no "ratewise.sleep" items
      assert.equal(0, #s:log("/item/1"))
    end)
  end)

  describe("nothing is lost", function()
    it("500 requests through a flaky server each end in a response or an error", function()
      local rng, steps = 7, {}
      local function rand() rng = (rng * 1103515245 + 12345) % 2147483648; return rng / 2147483648 end
      for i = 1, 1200 do
        local r = rand()
        if r < 0.6 then steps[i] = { status = 200, body = "ok" }
        elseif r < 0.75 then steps[i] = { status = 503 }
        elseif r < 0.85 then steps[i] = { status = 429, headers = { ["Retry-After"] = "0" } }
        elseif r < 0.9 then steps[i] = { action = "drop" }
        elseif r < 0.95 then steps[i] = { status = 404 }
        else steps[i] = { status = 200, delay = 0.02 } end
      end
      s:script("/flaky", steps)
      local list = {}
      for i = 1, 500 do list[i] = i end
      local responses, errors = 0, 0
      local results, errs = rw.map(list, function()
        local res, err = rw.fetch(s:url("/flaky"), { on_retry = false, max_retries = 2, base = 0.005 })
        if res then responses = responses + 1 else errors = errors + 1 end
        return res, err
      end, { concurrency = 32 })
      assert.equal(500, responses + errors)
      for i = 1, 500 do
        assert.is_true((results[i] ~= nil) ~= (errs[i] ~= nil), "request " .. i)
      end
      assert.is_true(responses > 300)
      assert.is_true(errors > 0)
    end)
  end)
end)

-- A wait that can never end by the clock (NaN or infinite seconds) is
-- misuse: it used to spin at 100% CPU. Each case runs in a process of its
-- own under `timeout`, so that a regression fails here instead of hanging
-- the suite; each must end with an error, at once.
describe("waits that could never end", function()
  local subprocess = require "spec.support.subprocess"

  -- Runs `body` (Lua code using rw) in a subprocess; returns the error it
  -- raised and how long it took.
  local function outcome(body)
    local out, code = subprocess.run_lua('local rw = require "ratewise"\n'
      .. 'local scheduler = require "ratewise.scheduler"\n'
      .. 'local t0 = rw.now()\n'
      .. 'local ok, err = pcall(function()\n' .. body .. '\nend)\n'
      .. 'io.write(tostring(ok), " ", string.format("%.3f", rw.now() - t0), " ", tostring(err))\n')
    assert.are_not.equal(124, code, "still waiting after 5 s (spinning or hanging): " .. body)
    assert.equal(0, code, out)
    local ok, took, err = out:match("^(%a+) ([%d.]+) (.*)$")
    assert.equal("false", ok, "no error: " .. out)
    return err, tonumber(took)
  end

  -- { what, code, strings the error names }
  local rows = {
    { "rw.sleep(math.huge) in the main thread", "rw.sleep(math.huge)", { "sleep", "finite", "inf" } },
    { "rw.sleep(0/0) in the main thread", "rw.sleep(0/0)", { "sleep", "finite", "(got nan)" } },
    { "rw.sleep(math.huge) in a task", "rw.run(function() rw.sleep(math.huge) end)", { "sleep", "inf" } },
    { "rw.sleep(0/0) in a task", "rw.run(function() rw.sleep(0/0) end)", { "sleep", "nan" } },
    { "rw.sleep(math.huge) in a plain coroutine",
      "local co = coroutine.wrap(function() rw.sleep(math.huge) end) co() co()", { "sleep", "inf" } },
    { "rw.sleep(math.huge) with a host sleep configured",
      "rw.configure{sleep = function() end} rw.sleep(math.huge)", { "sleep", "inf" } },
    { "scheduler.sleep(math.huge) in the main thread", "scheduler.sleep(math.huge)", { "sleep", "inf" } },
    { "scheduler.sleep(0/0) in a task", "rw.run(function() scheduler.sleep(0/0) end)", { "sleep", "nan" } },
    { "runtime.sleep(-math.huge) with a per-call sleep",
      'require("ratewise.runtime").sleep(-math.huge, function() end)', { "sleep", "-inf" } },
    { 'a task yielding ("ratewise.sleep", 0/0)',
      'rw.run(function() coroutine.yield("ratewise.sleep", 0/0) end)',
      { '("ratewise.sleep", nan)', "plain-coroutine protocol", "finite" } },
    { 'a task yielding ("ratewise.sleep", math.huge), joined',
      'local t = rw.spawn(function() coroutine.yield("ratewise.sleep", math.huge) end)\n'
        .. 'local r, err = t:join()\n'
        .. 'assert(r == nil and t:status() == "done" and rw.step(0) == 0)\n'
        .. 'error(err, 0)',
      { '("ratewise.sleep", inf)', "plain-coroutine protocol" } },
    { 'a task yielding ("ratewise.sleep") with no seconds',
      'rw.run(function() coroutine.yield("ratewise.sleep") end)', { '("ratewise.sleep", nil)' } },
    { "a bucket whose rate would make every wait infinite",
      "local b = rw.bucket{capacity = 1, rate = 1e-320}\nb:acquire()\nb:acquire()",
      { "bucket", "'rate' is too small" } },
  }
  for _, row in ipairs(rows) do
    it("refuses " .. row[1] .. ", with an error naming it, at once", function()
      local err, took = outcome(row[2])
      for _, name in ipairs(row[3]) do
        assert.is_truthy(err:find(name, 1, true), string.format("%q is not in the error: %s", name, err))
      end
      assert.is_true(took < 1, took .. " s")
    end)
  end

  it("lets rw.step(math.huge) return when no task could make progress, instead of spinning", function()
    local out, code = subprocess.run_lua([[
      local rw = require "ratewise"
      local sem = rw.semaphore(1)
      sem:acquire() -- the main thread holds the only permit
      local done = rw.spawn(function() rw.sleep(0.05) end)
      rw.spawn(function() sem:acquire() end) -- waits for the main thread
      local t0, c0 = rw.now(), os.clock()
      local live = rw.step(math.huge)
      io.write(live, " ", done:status(), " ", string.format("%.3f %.3f", rw.now() - t0, os.clock() - c0))
    ]])
    assert.equal(0, code, out)
    local live, status, took, cpu = out:match("^(%d+) (%a+) ([%d.]+) ([%d.]+)$")
    assert.equal("1", live, out)
    assert.equal("done", status, out)
    assert.is_true(tonumber(took) >= 0.05 and tonumber(took) < 1, out)
    assert.is_true(tonumber(cpu) < 0.1, out)
  end)

end)

describe("the scheduler's timers of waits that ended early", function()
  local subprocess = require "spec.support.subprocess"
  -- A semaphore wait with a timeout of an hour that gets its permit at
  -- once leaves its timer behind, an hour ahead.
  local ping_pong = [[
    local rw = require "ratewise"
    local sem = rw.semaphore(1)
    local function cycles(n)
      rw.run(function()
        for _ = 1, n do
          sem:acquire()
          local waiter = rw.spawn(function()
            assert(sem:acquire(3600)) -- queued, with its timer an hour ahead
            sem:release()
          end)
          rw.sleep(0)
          sem:release() -- the waiter's permit comes first: its timer is left behind
          waiter:join()
        end
      end)
    end
  ]]

  it("do not pile up: 20,000 of them leave the Lua heap where it was", function()
    local out, code = subprocess.run_lua(ping_pong .. [[
      cycles(200)
      collectgarbage() collectgarbage()
      local before = collectgarbage("count")
      cycles(20000)
      collectgarbage() collectgarbage()
      io.write(string.format("%.0f", collectgarbage("count") - before))
    ]], 30)
    assert.equal(0, code, out)
    assert.is_true(tonumber(out) < 256, "the Lua heap grew by " .. out .. " KiB")
  end)

  it("do not hide a deadlock: the scheduler still says so at once", function()
    local out, code = subprocess.run_lua(ping_pong .. [[
      cycles(10)
      local never = rw.semaphore(1)
      never:acquire()
      local t0 = rw.now()
      local ok, err = pcall(rw.run, function() never:acquire() end)
      io.write(tostring(ok), " ", tostring(err), string.format(" %.2f", rw.now() - t0))
    ]], 5)
    assert.equal(0, code, out)
    assert.matches("^false .*deadlock.* 0%.%d%d$", out)
  end)
end)

describe("a run that goes on and on", function()
  local subprocess = require "spec.support.subprocess"

  -- A server loop lives in one rw.run for days, spawning a task per job.
  it("keeps no task it spawned once that task is done", function()
    local out, code = subprocess.run_lua([[
      local rw = require "ratewise"
      rw.run(function()
        local function jobs(n) for _ = 1, n do rw.spawn(function() rw.sleep(0) end):join() end end
        jobs(500)
        collectgarbage() collectgarbage()
        local before = collectgarbage("count")
        jobs(20000)
        collectgarbage() collectgarbage()
        io.write(string.format("%.0f", collectgarbage("count") - before))
      end)
    ]], 30)
    assert.equal(0, code, out)
    assert.is_true(tonumber(out) < 256, "the Lua heap grew by " .. out .. " KiB")
  end)
end)

describe("scheduler.event", function()
  local scheduler = require "ratewise.scheduler"

  it("wakes every task waiting when set, and later waits return at once", function()
    local ev = scheduler.event()
    local woke = {}
    rw.run(function()
      for i = 1, 3 do rw.spawn(function() woke[i] = ev:wait() end) end
      rw.sleep(0.05)
      assert.same({}, woke)
      ev:set()
      ev:set() -- a second set changes nothing
    end)
    assert.same({ true, true, true }, woke)
    assert.is_true(ev:wait())
    assert.equal("ratewise.Event (set)", tostring(ev))
  end)

  it("stops waiting after timeout seconds, answering false, in a task and outside any", function()
    local ev = scheduler.event()
    local answer, waited
    rw.run(function()
      local t0 = rw.now()
      answer = ev:wait(0.1)
      waited = rw.now() - t0
    end)
    assert.is_false(answer)
    assert.is_true(waited >= 0.09 and waited < 1, waited)
    local t0 = rw.now()
    assert.is_false(ev:wait(0.1))
    assert.is_true(rw.now() - t0 >= 0.09)
    assert.equal("ratewise.Event (not set)", tostring(ev))
  end)

  it("leaves a cancelled waiter out when set", function()
    local ev = scheduler.event()
    local waiter, other
    local after = 0
    rw.run(function()
      waiter = rw.spawn(function() ev:wait() after = after + 1 end)
      other = rw.spawn(function() ev:wait() after = after + 1 end)
      rw.sleep(0.02)
      waiter:cancel()
      rw.sleep(0.02)
      ev:set()
    end)
    assert.equal("cancelled", select(2, waiter:join()))
    assert.equal(1, after)
    assert.equal("done", other:status())
    assert.is_nil(select(2, other:join()))
  end)
end)

describe("rw.pcall", function()
  it("lets a task wait inside it on every Lua, and catches what it raises", function()
    local order = {}
    local results = rw.run(function()
      local a = rw.spawn(function()
        local ok, v = rw.pcall(function(x) rw.sleep(0.02); order[#order + 1] = "a"; return x * 2 end, 21)
        return ok, v
      end)
      local b = rw.spawn(function()
        rw.sleep(0.01)
        order[#order + 1] = "b"
        return rw.pcall(function() rw.sleep(0.01); error("boom", 0) end)
      end)
      local a_ok, a_v = a:join()
      local b_ok, b_err = b:join()
      return { a_ok, a_v, b_ok, b_err }
    end)
    assert.same({ true, 42, false, "boom" }, results)
    assert.same({ "b", "a" }, order) -- a waited inside rw.pcall while b ran
  end)

  it("passes a cancellation through to the task, which ends cancelled", function()
    local after
    rw.run(function()
      local t = rw.spawn(function()
        local ok, err = rw.pcall(rw.sleep, 10)
        after = { ok, err }
        error(err, 0)
      end)
      rw.sleep(0.01)
      t:cancel()
      local _, err = t:join()
      assert.equal("cancelled", err)
    end)
    assert.is_false(after[1])
    assert.equal("cancelled", tostring(after[2]))
  end)

  it("is pcall in the main thread", function()
    assert.same({ true, 3 }, { rw.pcall(function(a, b) return a + b end, 1, 2) })
    assert.same({ false, "x" }, { rw.pcall(error, "x", 0) })
  end)
end)

-- One owner per transfer (docs/internals.md, Invariants): who waits for a
-- transfer is its owner in the engine, and the scheduler alone sets it;
-- the behaviour is checked in engine_spec and stream_spec ("a stream's
-- readers"), this keeps a second writer from creeping in.
describe("a transfer's owner", function()
  it("is set by the scheduler alone: no other module of the library names one", function()
    local p = assert(io.popen("find lua/ratewise -name '*.lua' | sort"))
    local files, writers = 0, {}
    for path in p:lines() do
      files = files + 1
      local f = assert(io.open(path, "rb"))
      local text = f:read("*a")
      f:close()
      local n = 0
      for line in text:gmatch("[^\n]+") do
        n = n + 1
        local code = line:gsub("%-%-.*", "")
        if code:find("set_owner", 1, true) or code:find("[Ee]ngine[%(%)%s]*:%s*start%s*%([^,%)]+,") then
          writers[#writers + 1] = path .. ":" .. n
        end
      end
    end
    p:close()
    assert.is_true(files > 20, files .. " files found")
    -- the scheduler's waits (scheduler/waits.lua) are the one writer
    for _, where in ipairs(writers) do
      assert.matches("^lua/ratewise/scheduler/waits%.lua:", where)
    end
    assert.is_true(#writers >= 3, "the scheduler's own writers were not found: " .. table.concat(writers, ", "))
  end)
end)

-- issue 38, section 5: the scheduler's state is one record (scheduler.state()),
-- which its parts (lua/ratewise/scheduler/*.lua) share and keep nothing
-- beside.
describe("the scheduler's state", function()
  local scheduler = require "ratewise.scheduler"
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)

  it("is one record, holding nothing of a run once its tasks are done", function()
    local state = scheduler.state()
    assert.equal(state, scheduler.state())
    s:script("/one", { { status = 200, body = "one", delay = 0.05 } })
    local sem = rw.semaphore(1)
    local bodies = rw.run(function()
      local got = {}
      -- a permit that comes before its timeout leaves a stale timer behind
      local holder = rw.spawn(function()
        sem:acquire()
        rw.sleep(0.02)
        sem:release()
      end)
      local waiter = rw.spawn(function()
        assert.is_true(sem:acquire(10))
        sem:release()
      end)
      got[1] = assert(rw.fetch(s:url("/one"), quiet)).body
      holder:join()
      waiter:join()
      return got
    end)
    assert.same({ "one" }, bodies)
    rw.step(0) -- stale timers go as they surface
    assert.equal(0, state.live)
    assert.equal(0, state.ready_n)
    assert.equal(0, state.heap_n)
    assert.is_nil(state.current)
    assert.is_nil(state.work_until)
    assert.is_nil(next(state.fd_waiter))
    assert.is_nil(next(state.fd_ready))
    assert.is_nil(next(state.finished))
    assert.is_true(state.progress > 0)
  end)

  it("lets a task waiting on a timer cost what one waiting without a timer does", function()
    -- The timer's push runs on the waiting task's stack: a C call there
    -- (math.floor) grew the stack of every task that slept, for as long as
    -- it slept.
    local function bytes_a_task(wait)
      collectgarbage()
      collectgarbage()
      local before = collectgarbage("count")
      local tasks = {}
      for i = 1, 2000 do tasks[i] = rw.spawn(wait) end
      rw.step(0, false)
      collectgarbage()
      collectgarbage()
      local bytes = (collectgarbage("count") - before) * 1024 / #tasks
      for i = 1, #tasks do tasks[i]:cancel() end
      rw.step(0, false)
      return bytes
    end
    local ev = scheduler.event()
    local untimed = bytes_a_task(function() ev:wait() end)
    local timed = bytes_a_task(function() rw.sleep(100) end)
    assert.is_true(timed < untimed + 200,
      string.format("a sleeping task costs %.0f bytes, one waiting for an event %.0f", timed, untimed))
  end)

  it("is kept nowhere else: no part of the scheduler holds a table or a value it changes", function()
    -- A part's top-level locals are its module table, a metatable of a kind
    -- (Task), constants (UPPER_CASE), what it took from other modules, and
    -- functions; none is assigned again, and only state.lua makes the record.
    local p = assert(io.popen("ls lua/ratewise/scheduler/*.lua"))
    local found, parts = {}, 0
    for path in p:lines() do
      parts = parts + 1
      local f = assert(io.open(path, "rb"))
      local text = f:read("*a")
      f:close()
      local module = path:match("([%w_]+)%.lua$")
      local names = {}
      for line in text:gmatch("[^\n]+") do
        local declared, value = line:match("^local ([%w_, ]+) =%s*(.*)$")
        if not declared then declared = line:match("^local ([%w_]+)%s*$") end
        if declared and not line:match("^local function") then
          for name in declared:gmatch("[%w_]+") do
            names[name] = true
            local table_made = value and value:match("^{") ~= nil
            if table_made and name ~= module and not name:match("^%u[%l_]") and not name:match("^[%u_]+$")
                and not (module == "state" and name == "record") then
              found[#found + 1] = path .. ": a table of its own, " .. name
            end
          end
        end
      end
      local number = 0
      for line in text:gmatch("[^\n]*") do
        number = number + 1
        local code = line:gsub("%-%-.*", "")
        if not code:match("^local ") then
          for name in pairs(names) do
            if code:match("^%s*" .. name .. "%s*=[^=]") or code:match("^%s*" .. name .. "%s*,[%w_,%s]*=[^=]")
                or code:match("^%s*[%w_,%s]*,%s*" .. name .. "%s*=[^=]") then
              found[#found + 1] = path .. ":" .. number .. ": " .. name .. " assigned again"
            end
          end
        end
      end
    end
    p:close()
    assert.is_true(parts >= 6, parts .. " parts found")
    assert.same({}, found)
  end)
end)
