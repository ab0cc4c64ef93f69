-- A retry inside OpenResty names the client request that caused it. A
-- ratewise task runs in the driver's light thread (an ngx.timer), so the
-- line nginx writes for it carries the timer's context, not the request's:
-- the task keeps the request's $request_id from its spawn, and its retry
-- line ends with "; request <id>". A fetch made in the handler itself logs
-- in the request's own context, where nginx names the request. A real nginx
-- with the Lua module (spec/support/nginx.lua) against the loopback server.
local rw = require "ratewise"
local server = require "spec.support.server"
local nginx = require "spec.support.nginx"

local escape = nginx.escape

local SERVER = [[
    # nginx keeps one $request_id for a request only where its
    # configuration uses the variable: a read from Lua alone makes a new one
    add_header X-Request-Id $request_id always;
    location = /spawn {
      content_by_lua_block {
        local rw = require "ratewise"
        local url = ngx.unescape_uri(ngx.var.arg_url)
        local api_key = ngx.var.arg_key
        local statuses = rw.map({ url }, function(u)
          -- a task spawned by the task carries the same request
          return rw.spawn(function()
            local res, err = rw.fetch(u, { headers = { ["X-Api-Key"] = api_key }, max_retries = 3 })
            return res and res.status or tostring(err)
          end):join()
        end)
        ngx.say(statuses[1])
      }
    }
    location = /direct {
      content_by_lua_block {
        local rw = require "ratewise"
        local res, err = rw.fetch(ngx.unescape_uri(ngx.var.arg_url), { max_retries = 3 })
        ngx.say(res and res.status or tostring(err))
      }
    }
]]

local KEY = "sk-secret-1234567890"

-- The error log's lines that contain needle.
local function lines_with(log, needle)
  local found = {}
  for line in log:gmatch("[^\n]+") do
    if line:find(needle, 1, true) then found[#found + 1] = line end
  end
  return found
end

describe("a retry inside OpenResty", function()
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

  -- The answer's body, and the request id nginx gave the request.
  local function request(path)
    local res, err = rw.fetch(n:url(path), { on_retry = false, max_retries = 0, timeout = 20 })
    assert(res, err and tostring(err))
    assert.equal(200, res.status, res.body)
    return res.body, res.headers["x-request-id"]
  end

  it("from a task names the request that spawned it, for two requests at once", function()
    local ids, bodies = {}, {}
    for i = 1, 2 do
      s:script("/r" .. i, { { status = 429, headers = { ["Retry-After"] = "0.3" } }, { status = 200 } })
    end
    rw.map({ 1, 2 }, function(i)
      bodies[i], ids[i] = request("/spawn?key=" .. KEY .. "&url=" .. escape(s:url("/r" .. i)))
    end, { concurrency = 2 })
    -- both ran together: each upstream saw its first attempt before the
    -- other's second
    assert.is_true(s:log("/r1")[1].t < s:log("/r2")[2].t and s:log("/r2")[1].t < s:log("/r1")[2].t)
    local log = n:error_log()
    for i = 1, 2 do
      assert.equal("200\n", bodies[i])
      assert.matches("^%x+$", ids[i])
      local retries = lines_with(log, "retrying GET " .. s:url("/r" .. i) .. " ")
      assert.equal(1, #retries, log)
      local line = retries[1]
      assert.matches("%(429, attempt 1/3, [%w-]+%); request " .. ids[i] .. ", context: ngx.timer", line)
      assert.is_nil(line:find(ids[3 - i], 1, true), line)
      -- the line is the driver timer's (nginx names no request there), and
      -- the request's line (its query has the key) is nowhere in it
      assert.is_nil(line:find(KEY, 1, true), line)
    end
  end)

  it("made in the handler itself is logged in the request's own context", function()
    s:script("/d", { { status = 429, headers = { ["Retry-After"] = "0.1" } }, { status = 200 } })
    assert.equal("200\n", (request("/direct?url=" .. escape(s:url("/d")))))
    local retries = lines_with(n:error_log(), "retrying GET " .. s:url("/d") .. " ")
    assert.equal(1, #retries)
    -- nginx's own suffix names the request; ratewise adds no label there
    assert.matches('request: "GET /direct?url=', retries[1], 1, true)
    assert.is_nil(retries[1]:find("; request ", 1, true), retries[1])
  end)
end)
