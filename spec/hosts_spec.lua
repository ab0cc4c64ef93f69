-- One waiting seam for every host (lua/ratewise/runtime.lua): each host
-- waits its own way, nothing blocks a host's loop, nothing naps where a
-- descriptor could be waited on, and nothing deadlocks where the host could
-- have waited. OpenResty has a spec of its own (openresty_spec.lua), luv an
-- example (examples/luv_loop.lua, run by examples_spec.lua).
local rw = require "ratewise"
local server = require "spec.support.server"
local socket = require "socket"

local quiet = { on_retry = false }

-- A build with the poll(2) backend (`make POLLER=poll`) has no descriptor
-- to wait on: there, hosts look again after naps of 1 to 16 ms while a
-- transfer is in flight (rw.pollable:timeout() says so), and these specs
-- hold them to that instead: a bounded count of wake-ups, none longer
-- than the longest nap.
local has_fd = rw.features.pollfd
local NAP_MAX = 0.016
local function most_wakeups(with_fd, seconds)
  return has_fd and with_fd or math.ceil(seconds / NAP_MAX) * 3
end

describe("the waiting seam", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  describe("in a cqueues controller", function()
    local cqueues = require "cqueues"

    -- Counts the controller's wake-ups of ratewise code: cqueues.poll is
    -- how ratewise waits there.
    local function counting_polls()
      local real, count = cqueues.poll, { n = 0 }
      cqueues.poll = function(...)
        count.n = count.n + 1
        return real(...)
      end
      return count, function() cqueues.poll = real end
    end

    it("reads a streamed response's events as they arrive", function()
      s:script("/events", { { action = "stream", chunks = { { 0.1, "data: a\n\n" }, { 0.2, "data: b\n\n" } } } })
      local cq = cqueues.new()
      local got, at = {}, {}
      local started = rw.now()
      cq:wrap(function()
        local res = assert(rw.fetch(s:url("/events"), { on_retry = false, stream = true }))
        local next_event = res:events() -- called, not in a for-in loop: Lua 5.1 cannot yield from one
        while true do
          local ev = next_event()
          if not ev then break end
          got[#got + 1] = ev.data
          at[#at + 1] = rw.now() - started
        end
      end)
      local ok, err = cq:loop()
      assert(ok, err)
      assert.same({ "a", "b" }, got)
      assert.is_true(at[1] < 0.25 and at[2] >= 0.25, ("events at %.2f and %.2f s"):format(at[1], at[2]))
    end)

    it("waits on the engine's descriptor, not on naps, while the controller runs its other coroutines", function()
      s:script("/slow", { { status = 200, delay = 0.5 } })
      local polls, restore = counting_polls()
      local cq = cqueues.new()
      local results, ticks = {}, 0
      local started = rw.now()
      for i = 1, 2 do
        cq:wrap(function()
          local res, err = rw.fetch(s:url("/slow"), quiet)
          results[i] = res and res.status or tostring(err)
        end)
      end
      cq:wrap(function()
        while not (results[1] and results[2]) do
          ticks = ticks + 1
          cqueues.sleep(0.05)
        end
      end)
      local ok, err = cq:loop()
      restore()
      assert(ok, err)
      assert.same({ 200, 200 }, results)
      assert.is_true(rw.now() - started < 0.9, "took " .. (rw.now() - started) .. " s")
      assert.is_true(ticks >= 8, "the other coroutine ticked " .. ticks .. " times")
      -- naps of 1 to 10 ms would have woken each fetch 50 times or more
      assert.is_true(polls.n < most_wakeups(40, 0.5), polls.n .. " wake-ups")
      assert.equal(2, #s:log("/slow"))
    end)

    it("sleeps with cqueues.sleep, and a client with concurrency 1 serves two coroutines", function()
      s:script("/one", { { status = 200, delay = 0.2 } })
      local c = rw.client { base_url = s.base, concurrency = 1, on_retry = false }
      local cq = cqueues.new()
      local done, slept = {}, nil
      for i = 1, 2 do
        cq:wrap(function()
          local res, err = c:get("/one")
          done[i] = res and res.status or tostring(err)
        end)
      end
      cq:wrap(function()
        local started = rw.now()
        rw.sleep(0.1)
        slept = rw.now() - started
      end)
      local ok, err = cq:loop()
      assert(ok, err)
      assert.same({ 200, 200 }, done)
      assert.is_true(slept >= 0.1 and slept < 0.3, tostring(slept))
      assert.equal(1, server.max_active(s:log("/one")))
    end)
  end)

  describe("in a coroutine whose runner speaks the yield protocol", function()
    -- A resumer that waits the way the yield asks: on the pollable's
    -- descriptor, at most pollable:timeout() seconds (luasocket's select
    -- takes any object with getfd).
    local function run_with_select(co)
      local resumes, value = 0, nil
      while coroutine.status(co) ~= "dead" do
        local ok, what, _, pollable = coroutine.resume(co)
        assert(ok, what)
        resumes = resumes + 1
        if what == "ratewise.sleep" and pollable then
          socket.select({ pollable }, nil, pollable:timeout() or 1)
        else
          value = what
        end
      end
      return value, resumes
    end

    it("yields naps while a transfer is in flight, and a sleep's own seconds", function()
      s:script("/slow", { { status = 200, delay = 0.5 } })
      local co = rw.speaks_protocol(coroutine.create(function()
        local res = assert(rw.fetch(s:url("/slow"), quiet))
        rw.sleep(0.2)
        return res.status
      end))
      local yields, longest, value = 0, 0, nil
      local transfer_longest
      while coroutine.status(co) ~= "dead" do
        local ok, what, seconds, pollable = coroutine.resume(co)
        assert(ok, what)
        if what == "ratewise.sleep" then
          yields = yields + 1
          if seconds > 0.1 and not transfer_longest then transfer_longest = longest end
          longest = math.max(longest, seconds)
          socket.select({ pollable }, nil, seconds) -- the yield's own seconds, with the descriptor
        else
          value = what
        end
      end
      assert.equal(200, value)
      assert.is_true(yields < math.ceil(0.5 / NAP_MAX) * 3, yields .. " yields for one 0.5 s transfer")
      -- a runner without the descriptor that slept any longer would see the answer late
      assert.is_true(transfer_longest <= NAP_MAX + 1e-6, "the longest yield in flight asked for " .. transfer_longest)
      assert.near(0.2, longest, 0.02)
    end)

    it("yields the scheduler's pollable, so that a resumer can wait on its descriptor", function()
      s:script("/slow", { { status = 200, delay = 0.5 } })
      local co = rw.speaks_protocol(coroutine.create(function()
        local res = assert(rw.fetch(s:url("/slow"), quiet))
        return res.status
      end))
      local status, resumes = run_with_select(co)
      assert.equal(200, status)
      assert.is_true(resumes < math.ceil(0.5 / NAP_MAX) * 3, resumes .. " resumes for one transfer")
    end)

    it("lets two coroutines share a client with concurrency 1, never blocking the thread", function()
      s:script("/one", { { status = 200, delay = 0.2 } })
      local c = rw.client { base_url = s.base, concurrency = 1, on_retry = false }
      local coroutines, results = {}, {}
      for i = 1, 2 do
        coroutines[i] = rw.speaks_protocol(coroutine.create(function()
          local res, err = c:get("/one")
          results[i] = res and res.status or tostring(err)
        end))
      end
      local longest = 0
      local deadline = rw.now() + 5
      while (coroutine.status(coroutines[1]) ~= "dead" or coroutine.status(coroutines[2]) ~= "dead")
        and rw.now() < deadline do
        for i = 1, 2 do
          if coroutine.status(coroutines[i]) ~= "dead" then
            local started = rw.now()
            local ok, what, seconds = coroutine.resume(coroutines[i])
            longest = math.max(longest, rw.now() - started)
            assert(ok, what)
            if what == "ratewise.sleep" then socket.sleep(math.min(seconds, 0.01)) end
          end
        end
      end
      assert.same({ 200, 200 }, results)
      assert.is_true(longest < 0.05, "a resume kept the thread for " .. longest .. " s")
      assert.equal(1, server.max_active(s:log("/one")))
    end)
  end)

  describe("with a host given to rw.configure", function()
    after_each(function() rw.configure { sleep = false } end)

    it("calls the host's sleep while a client's shared request runs, never blocking in a poll of its own", function()
      s:script("/slow", { { status = 200, delay = 0.3 } })
      local naps, longest = 0, 0
      rw.configure { sleep = function(seconds)
        naps = naps + 1
        longest = math.max(longest, seconds)
        socket.sleep(seconds)
      end }
      local c = rw.client { base_url = s.base, on_retry = false } -- dedupe runs the request as a task
      local res = assert(c:get("/slow"))
      assert.equal(200, res.status)
      assert.is_true(naps > 0, "the host sleep was never called")
      assert.is_true(longest <= 0.05, "one sleep was " .. longest .. " s")
    end)

    it("uses the host's wait on the scheduler's descriptor when it has one", function()
      s:script("/slow", { { status = 200, delay = 0.3 } })
      local waits = 0
      rw.configure {
        sleep = socket.sleep,
        wait = function(pollable, seconds)
          waits = waits + 1
          if has_fd then assert.is_number(pollable:pollfd()) else assert.is_nil(pollable:pollfd()) end
          socket.select({ pollable }, nil, seconds)
        end,
      }
      local res = assert(rw.client { base_url = s.base, on_retry = false }:get("/slow"))
      assert.equal(200, res.status)
      assert.is_true(waits > 0 and waits < most_wakeups(20, 0.3), waits .. " waits")
      assert.error_matches(function() rw.configure { sleep = false, wait = print } end, "'wait' needs a 'sleep'")
    end)

    it("leaves no descriptor watched when the host's wait fails", function()
      local scheduler = require "ratewise.scheduler"
      local listener = assert(socket.bind("127.0.0.1", 0))
      local ip, port = listener:getsockname()
      local conn = assert(socket.connect(ip, port))
      rw.configure { sleep = function() error("this host cannot wait here") end }
      local ok, err = pcall(scheduler.await_fd, conn:getfd(), "r", rw.now() + 1)
      rw.configure { sleep = false }
      conn:close()
      listener:close()
      assert.is_false(ok)
      assert.matches("this host cannot wait here", err)
      -- an armed watch would count as work in flight for ever
      assert.equal(0, scheduler.engine():running())
    end)
  end)

  -- issue 38: the seam's defects, each reproduced here first.
  describe("with a runner of plain coroutines", function()
    -- rw.speaks_protocol(co): the runner says it resumes co on the yields
    -- ("ratewise.sleep", seconds, pollable). Absent before the fix, when
    -- every coroutine yielded.
    local function speaking(co)
      if rw.speaks_protocol then rw.speaks_protocol(co) end
      return co
    end

    it("completes a fetch when it sleeps the seconds it is given, without the descriptor", function()
      s:script("/slow", { { status = 200, delay = 0.3 } })
      local co = speaking(coroutine.create(function()
        local res, err = rw.fetch(s:url("/slow"), { on_retry = false, max_retries = 0, timeout = 3 })
        return res and res.status or tostring(err)
      end))
      local started, value = rw.now(), nil
      while coroutine.status(co) ~= "dead" and rw.now() - started < 10 do
        local ok, what, seconds = coroutine.resume(co)
        assert(ok, what)
        if what == "ratewise.sleep" then socket.sleep(seconds) else value = what end
      end
      local took = rw.now() - started
      -- before: it slept libcurl's deadline (the 3 s timeout), and the request timed out
      assert.equal(200, value)
      assert.is_true(took < 1, ("took %.2f s"):format(took))
    end)

    -- A foreign runner (HAProxy's, Prosody's util.async) runs scripts in
    -- coroutines of its own and resumes only its own yields: any other
    -- yield is dropped, and the coroutine is never resumed again.
    local function foreign_run(fn)
      local co = coroutine.create(fn)
      local ok, what = coroutine.resume(co)
      while ok and what == "runner.wait" and coroutine.status(co) ~= "dead" do
        ok, what = coroutine.resume(co)
      end
      return co, ok, what
    end

    it("sends a fetch made in a foreign runner's coroutine, or says what to do; never hangs silently", function()
      s:script("/foreign", { { status = 200, body = "sent", delay = 0.1 } }) -- not answered within one step
      local co, ok, what = foreign_run(function()
        coroutine.yield("runner.wait")
        local res, err = rw.fetch(s:url("/foreign"), quiet)
        return res and res.body or tostring(err)
      end)
      assert.equal("dead", coroutine.status(co), "the coroutine was left suspended on " .. tostring(what))
      if ok then
        assert.equal("sent", what)
        assert.equal(1, #s:log("/foreign"))
      else
        assert.matches("rw.speaks_protocol", what, 1, true)
        assert.equal(0, #s:log("/foreign"))
      end
    end)

    it("raises, naming the fix, when a foreign runner's coroutine sleeps", function()
      local co, ok, what = foreign_run(function()
        rw.sleep(0.01)
        return "slept"
      end)
      assert.equal("dead", coroutine.status(co), "the coroutine was left suspended on " .. tostring(what))
      assert.is_true(ok and what == "slept" or what:find("rw.speaks_protocol", 1, true) ~= nil, tostring(what))
    end)
  end)

  describe("in a host that can only count time", function()
    -- A frame loop that sleeps what rw.pollable:timeout() says, then steps.
    local function frame_loop(fn, limit)
      local answer
      rw.spawn(function() answer = fn() end)
      local started = rw.now()
      while rw.step(0) > 0 and rw.now() - started < limit do
        local t = rw.pollable:timeout()
        socket.sleep(math.min(t or 0.05, limit))
      end
      return answer, rw.now() - started
    end

    it("gets a 1 s answer after about 1 s, following rw.pollable:timeout()", function()
      s:script("/second", { { status = 200, delay = 1 } })
      local status, took = frame_loop(function()
        local res, err = rw.fetch(s:url("/second"), { on_retry = false, max_retries = 0, timeout = 8 })
        return res and res.status or tostring(err)
      end, 10)
      assert.equal(200, status)
      assert.is_true(took < 1.5, ("took %.2f s"):format(took))
    end)

    it("gets a Retry-After: 2 answer after about 2 s", function()
      s:script("/later", { { status = 429, headers = { ["Retry-After"] = "2" } }, { status = 200 } })
      local status, took = frame_loop(function()
        local res, err = rw.fetch(s:url("/later"), { on_retry = false, timeout = 8 })
        return res and res.status or tostring(err)
      end, 12)
      assert.equal(200, status)
      assert.is_true(took >= 2 and took < 2.6, ("took %.2f s"):format(took))
    end)
  end)

  describe("in a frame loop", function()
    it("keeps each rw.step(0) short while 100 transfers are in flight", function()
      s:script("/frame", { { status = 200, delay = 0.5 } })
      local answered = 0
      for _ = 1, 100 do
        rw.spawn(function()
          if rw.fetch(s:url("/frame"), quiet) then answered = answered + 1 end
        end)
      end
      -- the frames in which all 100 wait: not those that start them and
      -- connect them (the step's budget spreads that over the first few
      -- frames, and libcurl connects a frame's new transfers in one call),
      -- nor those in which responses arrive (which build them). The server
      -- answers after 0.5 s: from 0.2 s on, all are connected and waiting.
      local worst_waiting, waiting_frames, live = 0, 0, 100
      -- A full collection first, so that the garbage of the specs before
      -- is not collected in the frames measured: under ASan, after the rest
      -- of the suite, the slowest step took 23 ms twice running, while this
      -- spec alone passed three runs of three.
      collectgarbage()
      local t0 = rw.now()
      local deadline = t0 + 10
      repeat
        local started = rw.now()
        local after = rw.step(0)
        local took = rw.now() - started
        if started - t0 > 0.2 and after == live and after == 100 then
          worst_waiting = math.max(worst_waiting, took)
          waiting_frames = waiting_frames + 1
        end
        live = after
        socket.sleep(1 / 60)
      until live == 0 or rw.now() > deadline
      assert.equal(100, answered)
      -- bench/hosts.lua measures it (a millisecond or so at most); a shared
      -- machine, and ASan's build, get room here
      assert.is_true(worst_waiting < 0.02, "the slowest step took " .. worst_waiting .. " s")
      assert.is_true(waiting_frames > 5, waiting_frames .. " frames")
    end)
  end)

  -- issue 38, section 4: a wait outside a task in a host with an event
  -- loop of its own blocks that loop; it says so once, naming what to do,
  -- and is served all the same. A process of its own fakes the globals
  -- WeeChat is found by, and fetches from the suite's server over the real
  -- transport. (Tarantool waits each fiber's own way: spec/host_tarantool_spec.lua.)
  describe("in a host whose loop a wait would block", function()
    local subprocess = require "spec.support.subprocess"

    -- out, code: `fake` (Lua setting the host's globals up) then `work`,
    -- in a process of its own; base is the server's URL there.
    local function in_host(fake, work)
      return subprocess.run_lua(string.format("local base = %q\n", s.base) .. fake .. "\n"
        .. 'local rw = require "ratewise"\n' .. work, 20)
    end

    local function count(text, plain)
      local n, at = 0, 1
      while true do
        local found = text:find(plain, at, true)
        if not found then return n end
        n, at = n + 1, found + #plain
      end
    end

    before_each(function()
      for i = 1, 3 do s:script("/loop/" .. i, { { status = 200, body = "body " .. i, delay = 0.05 } }) end
    end)

    -- WeeChat refuses such a wait instead (the real WeeChat:
    -- spec/host_weechat_spec.lua): its loop steps ratewise's tasks.
    it("in WeeChat, refuses with the fix before sending; lines go to its core buffer, not standard error", function()
      local out, code = in_host([[
        -- WeeChat replaces standard error: a line written there is lost
        io.stderr = { write = function() print("STDERR WRITTEN"); os.exit(7) end }
        _G.weechat = {
          hook_fd = function() return "0x1" end, hook_timer = function() return "0x2" end, unhook = function() end,
          prefix = function(name) return "<" .. name .. ">" end,
          print = function(buffer, line) print("weechat.print", buffer == "" and "core" or buffer, line) end,
        }
      ]], [[
        local ok, err = pcall(rw.fetch, base .. "/loop/1")
        print("refused", not ok, err)
        -- a task's error nobody joined: an error line, with WeeChat's prefix
        rw.spawn(function() error("boom") end)
        rw.step(0)
        print("stepped")
      ]])
      assert.equal(0, code, out)
      assert.matches("refused\ttrue\tratewise: a wait outside a task", out, 1, true)
      assert.matches("rw.spawn(function() ... end)", out, 1, true)
      assert.equal(0, #s:log("/loop/1"))
      assert.equal(0, count(out, "STDERR WRITTEN"), out)
      assert.matches("weechat.print\tcore\t<error>ratewise: a task failed and nobody joined it:", out, 1, true)
      assert.matches("stepped\n", out, 1, true)
    end)
  end)
end)
