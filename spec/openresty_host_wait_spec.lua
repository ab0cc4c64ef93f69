-- A ratewise task that waits for nginx itself (ngx.sleep, a cosocket)
-- holds the driver's light thread, which runs every task: the tasks run
-- one after another. The host says so once in nginx's error log; a task
-- that waits with rw.sleep does not trigger it. A real nginx with the Lua
-- module (spec/support/nginx.lua).
local rw = require "ratewise"
local nginx = require "spec.support.nginx"

local SERVER = [[
    location = /tasks {
      content_by_lua_block {
        local rw = require "ratewise"
        local wait = ngx.var.arg_wait == "ngx" and ngx.sleep or rw.sleep
        ngx.update_time()
        local started = ngx.now()
        rw.map({ 1, 2, 3 }, function() wait(0.2) return true end, { concurrency = 3 })
        ngx.update_time()
        ngx.say(string.format("%.3f", ngx.now() - started))
      }
    }
]]

local WARNING = "a ratewise task waited for nginx itself"

local function count(haystack, needle)
  local n, at = 0, 1
  while true do
    local found = haystack:find(needle, at, true)
    if not found then return n end
    n, at = n + 1, found + 1
  end
end

describe("a ratewise task that waits for nginx itself", function()
  local n
  setup(function() n = nginx.start { server = SERVER } end)
  teardown(function() if n then n:stop() end end)

  local function took(wait)
    local res, err = rw.fetch(n:url("/tasks?wait=" .. wait), { on_retry = false, max_retries = 0, timeout = 20 })
    assert(res, err and tostring(err))
    assert.equal(200, res.status, res.body)
    return tonumber(res.body)
  end

  it("is not said of tasks that wait with rw.sleep, which wait together", function()
    local t = took("rw")
    assert.is_true(t < 0.4, "three 0.2 s waits took " .. t .. " s")
    assert.equal(0, count(n:error_log(), WARNING))
  end)

  it("is said once in the error log, naming the way out", function()
    local t = took("ngx")
    -- what the warning is about: the three waits ran one after another
    assert.is_true(t >= 0.55, "three 0.2 s ngx.sleep waits took " .. t .. " s")
    took("ngx")
    local log = n:error_log()
    assert.equal(1, count(log, WARNING), log)
    assert.matches("ngx.thread.spawn", log, 1, true)
  end)
end)
