-- Inside OpenResty a waiting request wakes when its answer arrives (the
-- engine's wake-up line, src/wake.c), not after a nap: a call to a route
-- that answers after 50 ms takes about 50 ms, in a few looks of the
-- scheduler. A real nginx with the Lua module (spec/support/nginx.lua)
-- against the suite's test server.
local rw = require "ratewise"
local nginx = require "spec.support.nginx"
local server = require "spec.support.server"

-- /calls?url=U&n=N&threads=T: T light threads of one request, each making
-- N calls to U one after another; answers each call's milliseconds, then
-- the scheduler's looks (its steps) a call.
local SERVER = [[
    location = /calls {
      content_by_lua_block {
        local rw = require "ratewise"
        local scheduler = require "ratewise.scheduler"
        local url = ngx.unescape_uri(ngx.var.arg_url)
        local n, threads = tonumber(ngx.var.arg_n), tonumber(ngx.var.arg_threads)
        local step, steps, times, failed = scheduler.step, 0, {}, nil
        scheduler.step = function(...) steps = steps + 1 return step(...) end
        local function calls()
          for _ = 1, n do
            local started = rw.now()
            local res, err = rw.fetch(url, { on_retry = false, max_retries = 0 })
            times[#times + 1] = string.format("%.2f", (rw.now() - started) * 1000)
            if not res or res.status ~= 200 then failed = tostring(err or res.status) end
          end
        end
        local list = {}
        for t = 1, threads do list[t] = ngx.thread.spawn(calls) end
        for t = 1, threads do ngx.thread.wait(list[t]) end
        scheduler.step = step
        if failed then ngx.say("failed ", failed) return end
        ngx.say(table.concat(times, " "))
        ngx.say(string.format("%.2f", steps / (n * threads)))
      }
    }
    location = /sleeps {
      content_by_lua_block {
        local rw = require "ratewise"
        local got = rw.map({ 1, 2, 3 }, function(i) rw.sleep(0.03 * i) return i end, { concurrency = 3 })
        ngx.say(#got)
      }
    }
]]

local function median(list)
  table.sort(list)
  local m = #list
  return m % 2 == 1 and list[(m + 1) / 2] or (list[m / 2] + list[m / 2 + 1]) / 2
end

describe("a request waiting inside OpenResty", function()
  -- (nginx loads the core of the same build as this process's)
  if not require("ratewise.core").engine():pollfd() then
    pending("a poll(2) build has no descriptor to wake on: a waiting request naps, as docs/hosts.md says")
    return
  end
  local s, n
  setup(function()
    s = server.start()
    n = nginx.start { server = SERVER }
  end)
  teardown(function()
    if n then n:stop() end
    s:stop()
  end)
  before_each(function() s:reset() end)

  -- The calls' milliseconds (their median) and the scheduler's looks a call.
  local function calls(count, threads)
    s:script("/slow", { { status = 200, body = "ok", delay = 0.05 } })
    local url = s:url("/slow")
    local res, err = rw.fetch(n:url("/calls?n=" .. count .. "&threads=" .. threads .. "&url=" .. url),
      { on_retry = false, max_retries = 0, timeout = 30 })
    assert(res, err and tostring(err))
    assert.equal(200, res.status, res.body)
    local times_line, steps = res.body:match("^([^\n]*)\n([%d.]+)")
    assert(times_line, res.body)
    local times = {}
    for t in times_line:gmatch("%S+") do times[#times + 1] = tonumber(t) end
    assert.equal(count * threads, #times)
    assert.equal(count * threads, #s:log("/slow"))
    return median(times), tonumber(steps), times_line
  end

  it("waits for timers on the engine's clock: nginx logs no time-out of the line", function()
    local res, err = rw.fetch(n:url("/sleeps"), { on_retry = false, max_retries = 0, timeout = 30 })
    assert(res, err and tostring(err))
    assert.equal("3\n", res.body)
    local log = n:error_log()
    assert.is_nil(log:find("timed out", 1, true), log)
  end)

  -- alone (the request waits on the line itself), and with others (the
  -- driver waits on it for them all)
  for _, case in ipairs {
    { "alone: a call answered after 50 ms takes about 50 ms, in a few looks", 9, 1 },
    { "with others (the driver's wait): each call is woken by its answer", 4, 8 },
  } do
    it(case[1], function()
      local ms, steps, all = calls(case[2], case[3])
      assert.is_true(ms >= 50, all)
      assert.is_true(ms < 56, "median " .. ms .. " ms: " .. all)
      assert.is_true(steps <= 4, steps .. " looks a call")
    end)
  end
end)
