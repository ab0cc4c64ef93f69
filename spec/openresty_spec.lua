-- ratewise inside OpenResty, with no configuration at all: a real nginx
-- (Debian's, with the Lua module on LuaJIT) whose handlers call rw.fetch
-- against the suite's test server. What the worker does while requests
-- wait is measured from outside: another location's latency, and the
-- worker's CPU time.
local rw = require "ratewise"
local server = require "spec.support.server"
local nginx = require "spec.support.nginx"

local escape = nginx.escape

local HTTP = [[
  lua_shared_dict results 1m;
]]

local SERVER = [[
    location = /fetch {
      content_by_lua_block {
        local rw = require "ratewise"
        ngx.update_time()
        local started = ngx.now()
        local res, err = rw.fetch(ngx.unescape_uri(ngx.var.arg_url), { max_retries = 3 })
        ngx.update_time()
        ngx.say(res and res.status or ("error " .. tostring(err)), " ", res and res.attempts or 0, " ",
          string.format("%.3f", ngx.now() - started))
      }
    }
    location = /stream {
      content_by_lua_block {
        local rw = require "ratewise"
        local res = assert(rw.fetch(ngx.unescape_uri(ngx.var.arg_url), { stream = true, on_retry = false }))
        for ev in res:events() do ngx.say(ev.event, " ", ev.data) ngx.flush(true) end
      }
    }
    location = /timer {
      content_by_lua_block {
        local ok, err = ngx.timer.at(0, function(premature, url)
          local rw = require "ratewise"
          local res, ferr = rw.fetch(url, { on_retry = false })
          ngx.shared.results:set("timer", res and tostring(res.status) or tostring(ferr))
        end, ngx.unescape_uri(ngx.var.arg_url))
        ngx.say(ok and "started" or err)
      }
    }
    location = /tasks {
      content_by_lua_block {
        -- ratewise's tasks in a handler: rw.map, rw.run with a task that
        -- waits for another's semaphore, and a client's shared calls
        local rw = require "ratewise"
        local url = ngx.unescape_uri(ngx.var.arg_url)
        local urls = {}
        for i = 1, 4 do urls[i] = url .. "/m?map=" .. i end
        local statuses = rw.map(urls, function(u)
          local res = rw.fetch(u, { on_retry = false })
          return res and res.status
        end, { concurrency = 2 })
        local order = {}
        rw.run(function()
          local sem = rw.semaphore(1)
          sem:acquire()
          local waiter = rw.spawn(function()
            sem:acquire()
            order[#order + 1] = "waiter"
            sem:release()
          end)
          rw.sleep(0.05)
          order[#order + 1] = "holder"
          sem:release()
          waiter:join()
        end)
        local api = rw.client { base_url = url, on_retry = false }
        local shared = {}
        local threads = {}
        for i = 1, 3 do
          threads[i] = ngx.thread.spawn(function()
            local res = api:get("/shared")
            shared[i] = res and res.status
          end)
        end
        for i = 1, 3 do ngx.thread.wait(threads[i]) end
        ngx.say(table.concat(statuses, ","), " ", table.concat(order, ","), " ", table.concat(shared, ","))
      }
    }
    location = /quick {
      content_by_lua_block {
        -- ten fetches one after another, timed
        local rw = require "ratewise"
        local url = ngx.unescape_uri(ngx.var.arg_url)
        ngx.update_time()
        local started = ngx.now()
        for _ = 1, 10 do assert(rw.fetch(url, { on_retry = false })) end
        ngx.update_time()
        ngx.say(string.format("%.3f", ngx.now() - started))
      }
    }
    location = /threads {
      content_by_lua_block {
        -- 16 light threads, each fetching 25 times, twice; the second time,
        -- how many ngx.semaphores the host made (its waiters are reused)
        local rw = require "ratewise"
        local semaphore = require "ngx.semaphore"
        local url = ngx.unescape_uri(ngx.var.arg_url)
        local function batch()
          local threads, statuses = {}, {}
          for t = 1, 16 do
            threads[t] = ngx.thread.spawn(function()
              for _ = 1, 25 do
                local res, err = rw.fetch(url, { on_retry = false })
                statuses[#statuses + 1] = res and res.status or tostring(err)
              end
            end)
          end
          for t = 1, 16 do assert(ngx.thread.wait(threads[t])) end
          return statuses
        end
        batch()
        local made, new = 0, semaphore.new
        semaphore.new = function(...) made = made + 1 return new(...) end
        local ok, statuses = pcall(batch)
        semaphore.new = new
        assert(ok, statuses)
        local counts = {}
        for _, status in ipairs(statuses) do counts[status] = (counts[status] or 0) + 1 end
        ngx.say(#statuses, " ", counts[200] or 0, " ", made)
      }
    }
    location = /one_driver {
      content_by_lua_block {
        -- ten fetches one after another (each in a task of its own, rw.run,
        -- with the arg `tasks`): how many light threads the host started
        -- for them, then whether its driver is still running once the
        -- worker has been idle a while
        local rw = require "ratewise"
        local url = ngx.unescape_uri(ngx.var.arg_url)
        local function fetch() return assert(rw.fetch(url, { on_retry = false })).status end
        ngx.sleep(0.3) -- a driver left from an earlier request ends first
        local started, at = 0, ngx.timer.at
        ngx.timer.at = function(...) started = started + 1 return at(...) end
        local ok, err = pcall(function()
          for _ = 1, 10 do assert((ngx.var.arg_tasks and rw.run(fetch) or fetch()) == 200) end
        end)
        ngx.timer.at = at
        assert(ok, err)
        ngx.sleep(0.3)
        ngx.say(started, " ", ngx.timer.running_count())
      }
    }
    location = /lone_then_other {
      content_by_lua_block {
        -- a light thread's lone fetch of a slow answer (its waiter drives
        -- it), then, while it waits, what the arg `then` names: another
        -- fetch ("fetch"), a task ("task"), or killing the first ("kill")
        -- and fetching
        local rw = require "ratewise"
        local slow, quick = ngx.unescape_uri(ngx.var.arg_slow), ngx.unescape_uri(ngx.var.arg_quick)
        ngx.sleep(0.3) -- a driver left from an earlier request ends first
        local started, at = 0, ngx.timer.at
        ngx.timer.at = function(...) started = started + 1 return at(...) end
        local first = ngx.thread.spawn(function() return rw.fetch(slow, { on_retry = false }) end)
        ngx.sleep(0.05)
        local other
        if ngx.var.arg_then == "task" then
          local task = rw.spawn(function() rw.sleep(0.01) return "task ran" end)
          ngx.sleep(0.05) -- the first waiter looks again meanwhile, a task now there
          other = task:join()
        else
          if ngx.var.arg_then == "kill" then ngx.thread.kill(first) end
          local res, err = rw.fetch(quick, { on_retry = false })
          other = res and res.status or tostring(err)
        end
        local first_status = "killed"
        if ngx.var.arg_then ~= "kill" then
          local _, res, err = ngx.thread.wait(first)
          first_status = res and res.status or tostring(err)
        end
        ngx.timer.at = at
        ngx.say(first_status, " ", other, " ", started)
      }
    }
    location = /result {
      content_by_lua_block { ngx.print(ngx.shared.results:get(ngx.var.arg_key) or "") }
    }
    location = /log_phase {
      content_by_lua_block { ngx.say("ok") }
      log_by_lua_block {
        local rw = require "ratewise"
        local ok, err = pcall(rw.fetch, ngx.unescape_uri(ngx.var.arg_url))
        ngx.shared.results:set("log_phase", tostring(ok) .. " " .. tostring(err))
      }
    }
]]

describe("ratewise in OpenResty", function()
  local s, n

  setup(function()
    s = server.start()
    n = nginx.start { http = HTTP, server = SERVER }
  end)
  teardown(function()
    if n then n:stop() end
    s:stop()
  end)
  before_each(function() s:reset() end)

  local function get(path)
    local res, err = rw.fetch(n:url(path), { on_retry = false, max_retries = 0, timeout = 20 })
    assert(res, err and tostring(err))
    return res.body
  end

  it("waits out a Retry-After with ngx.sleep: the worker serves others meanwhile and uses almost no CPU",
    function()
      s:script("/busy", { { status = 429, headers = { ["Retry-After"] = "2" } }, { status = 200 } })
      local pid = n:worker_pid()
      local cpu_before = nginx.cpu_seconds(pid)
      local answer, pings = nil, {}
      local started = rw.now()
      rw.run(function()
        local fetching = rw.spawn(function() return get("/fetch?url=" .. escape(s:url("/busy"))) end)
        for _ = 1, 6 do
          rw.sleep(0.25)
          local sent = rw.now()
          assert.equal("pong", get("/_ping"))
          pings[#pings + 1] = { took = rw.now() - sent, done = rw.now() - started }
        end
        answer = fetching:join()
      end)
      local cpu = nginx.cpu_seconds(pid) - cpu_before
      local status, attempts, took = answer:match("^(%d+) (%d+) ([%d.]+)")
      assert.equal("200", status, answer)
      assert.equal("2", attempts)
      assert.is_true(tonumber(took) >= 2 and tonumber(took) < 3, answer)
      -- The wait began after `started` and lasted 2 s: a worker blocked by
      -- it answers no ping before 2 s from `started`, one serving others
      -- meanwhile answers each ping (sent every 0.25 s) in a few ms. The
      -- criteria leave room for a shared machine's stalls (CI once held a
      -- ping 0.19 s, once 0.69 s, the other pings of those runs under 5 ms).
      local during, quick, shown = 0, 0, {}
      for i, ping in ipairs(pings) do
        if ping.done < 2 then during = during + 1 end
        if ping.took < 0.1 then quick = quick + 1 end
        shown[i] = string.format("%.4f (done at %.2f)", ping.took, ping.done)
      end
      local said = "the /_ping times (s): " .. table.concat(shown, ", ")
      assert.is_true(during >= 3, said)
      assert.is_true(quick >= #pings - 2, said)
      assert.is_true(cpu < 0.3, "the worker used " .. cpu .. " s of CPU")
      local log = s:log("/busy")
      assert.is_true(log[2].t - log[1].t >= 2)
      -- the default retry line goes to nginx's error log
      assert.matches("retrying GET http://127.0.0.1:%d+/busy in 2%.%d%d s %(429", n:error_log())
    end)

  it("runs 20 concurrent 1 s fetches in one worker together", function()
    s:script("/slow", { { status = 200, delay = 1 } })
    local started = rw.now()
    local urls = {}
    for i = 1, 20 do urls[i] = "/fetch?url=" .. escape(s:url("/slow")) end
    local answers = rw.map(urls, function(path) return get(path) end, { concurrency = 20 })
    local took = rw.now() - started
    for i = 1, 20 do assert.matches("^200 1 ", answers[i]) end
    assert.is_true(took < 1.8, "20 fetches of 1 s took " .. took .. " s")
    assert.equal(20, #s:log("/slow"))
    assert.is_true(server.max_active(s:log("/slow")) >= 15)
  end)

  -- What a handler stored under key once its work outside the request
  -- (a timer, the log phase) is done; "" if nothing came within 5 s.
  local function result_of(key)
    local deadline = rw.now() + 5
    local got = ""
    while got == "" and rw.now() < deadline do
      rw.sleep(0.05)
      got = get("/result?key=" .. key)
    end
    return got
  end

  it("reads a streamed response's events as they arrive, the worker serving others meanwhile", function()
    s:script("/events", { { action = "stream", headers = { ["Content-Type"] = "text/event-stream" },
      chunks = { { 0.2, "data: one\n\n" }, { 0.4, "event: end\ndata: two\n\n" } } } })
    local body
    rw.run(function()
      local reader = rw.spawn(function() body = get("/stream?url=" .. escape(s:url("/events"))) end)
      rw.sleep(0.3)
      local t0 = rw.now()
      assert.equal("pong", get("/_ping"))
      assert.is_true(rw.now() - t0 < 0.1)
      local _, err = reader:join()
      assert.is_nil(err)
    end)
    assert.equal("message one\nend two\n", body)
  end)

  it("runs ratewise's tasks in a handler: rw.map, rw.run, a client's shared calls", function()
    s:script("/t/shared", { { status = 200, delay = 0.3, body = "once" } })
    -- the worker used to crash (a task's coroutine made in the request,
    -- resumed by the driver's timer)
    assert.equal("200,200,200,200 holder,waiter 200,200,200\n", get("/tasks?url=" .. escape(s:url("/t"))))
    assert.equal(4, #s:log("/t/m"))
    assert.equal(1, #s:log("/t/shared")) -- three calls, one transfer
    assert.matches("^pong", get("/_ping"))
    assert.is_nil(n:error_log():find("exited on signal", 1, true))
  end)

  it("sends a transfer at once, though the driver looks seldom while a slow one runs", function()
    -- A slow fetch keeps the driver going, looking every 16 ms by now; each
    -- of ten quick fetches used to wait for its next look to be sent.
    s:script("/slow", { { delay = 3 } })
    local quick
    rw.run(function()
      rw.spawn(function() get("/fetch?url=" .. escape(s:url("/slow"))) end)
      rw.sleep(0.5)
      quick = tonumber(get("/quick?url=" .. escape(s:url("/q"))))
    end)
    assert.equal(10, #s:log("/q"))
    assert.is_true(quick < 0.05, "ten quick fetches took " .. quick .. " s") -- 0.016 s here, 0.08 before
  end)

  it("serves many light threads' fetches, reusing its waiters rather than making a semaphore each", function()
    s:script("/many", { { status = 200, body = "ok" } })
    local requests, ok, made = get("/threads?url=" .. escape(s:url("/many"))):match("^(%d+) (%d+) (%d+)")
    assert.equal("400", requests)
    assert.equal("400", ok)
    -- 16 waiting at once at most: a waiter more now and then, never one a request
    assert.is_true(tonumber(made) <= 16, made .. " semaphores made for 400 requests")
    assert.equal(800, #s:log("/many"))
  end)

  it("lets a handler's fetches one after another drive themselves: no driver, no light thread", function()
    s:script("/seq", { { status = 200, body = "ok" } })
    local started, running = get("/one_driver?url=" .. escape(s:url("/seq"))):match("^(%d+) (%d+)")
    assert.equal("0", started)
    assert.equal("0", running)
    assert.equal(10, #s:log("/seq"))
  end)

  it("keeps one driver for a handler's tasks one after another, and ends it once idle", function()
    s:script("/seq", { { status = 200, body = "ok" } })
    local started, running = get("/one_driver?tasks=1&url=" .. escape(s:url("/seq"))):match("^(%d+) (%d+)")
    assert.equal("1", started) -- not a light thread a task
    assert.equal("0", running)
    assert.equal(10, #s:log("/seq"))
  end)

  describe("a waiter driving its lone transfer", function()
    local function lone_then(what)
      s:script("/lone", { { status = 200, delay = 0.3 } })
      s:script("/other", { { status = 200 } })
      return get(string.format("/lone_then_other?then=%s&slow=%s&quick=%s", what, escape(s:url("/lone")),
        escape(s:url("/other"))))
    end

    it("hands over to the driver when another request's fetch starts meanwhile", function()
      -- the second fetch starts the driver, which both waits then go through
      assert.equal("200 200 1\n", lone_then("fetch"))
      assert.equal(1, #s:log("/lone"))
      assert.equal(1, #s:log("/other"))
    end)

    it("leaves a task started meanwhile to the driver", function()
      -- a task's coroutine must be made and resumed by the driver: run by
      -- the waiter's light thread, its resumption from the driver's fails
      assert.equal("200 task ran 1\n", lone_then("task"))
      assert.not_matches("%[alert%]", n:error_log())
      assert.not_matches("coroutine", n:error_log())
    end)

    it("leaves nothing stuck when its light thread is killed", function()
      assert.equal("killed 200 1\n", lone_then("kill"))
      -- and the worker's next lone fetch drives itself again once the
      -- killed one's transfer has ended
      s:script("/seq", { { status = 200, body = "ok" } })
      local started = get("/one_driver?url=" .. escape(s:url("/seq"))):match("^(%d+) ")
      assert.equal("0", started)
      assert.equal(10, #s:log("/seq"))
    end)
  end)

  it("fetches from an ngx.timer.at callback", function()
    assert.equal("started\n", get("/timer?url=" .. escape(s:url("/from-timer"))))
    assert.equal("200", result_of("timer"))
    assert.equal(1, #s:log("/from-timer"))
  end)

  it("refuses to wait in a phase that cannot yield, with a clear error, sending nothing", function()
    assert.equal("ok\n", get("/log_phase?url=" .. escape(s:url("/never"))))
    assert.matches("^false ratewise: cannot wait in nginx's log phase", result_of("log_phase"))
    -- nor later: the refused call left no transfer behind for the next
    -- turn of the worker's engine to send
    assert.matches("^200 ", get("/fetch?url=" .. escape(s:url("/after"))))
    assert.equal(1, #s:log("/after"))
    assert.equal(0, #s:log("/never"))
  end)
end)
