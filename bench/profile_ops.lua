-- profile_ops.lua OP COUNT URL: runs one piece of rw.fetch's work COUNT
-- times, for bench/profile.sh to count instructions under callgrind.
-- The difference between two COUNTs divided by their difference is the cost
-- of one operation, start-up excluded.
local rw = require "ratewise"
local core = require "ratewise.core"
local runtime = require "ratewise.runtime"
local scheduler = require "ratewise.scheduler"

local op, count, url = arg[1], math.tointeger(tonumber(arg[2])), arg[3]
assert(op and count and url, "usage: profile_ops.lua OP COUNT URL")

-- What fetch.lua hands the engine for a plain GET (see fetch.fetch).
local function request()
  return { url = url, method = "GET", headers = { "User-Agent: ratewise/" .. core.version },
    follow_redirects = true, timeout = 30 }
end

-- A response like nginx's, for timing fetch.lua without any I/O.
local function canned(req)
  return { status = 200, body = "ok", url = req.url, redirects = 0, time = 0.0001,
    headers = { server = "nginx/1.22.1", date = "Sun, 30 Nov 2025 07:00:00 GMT",
      ["content-type"] = "text/plain", ["content-length"] = "2", connection = "keep-alive" } }
end

local ops = {}

-- The whole call, as the benchmark makes it.
function ops.fetch()
  local res = rw.fetch(url, { on_retry = false })
  assert(res and res.status == 200)
end

-- runtime.transfer: scheduler/runtime glue + engine binding + libcurl.
function ops.transfer()
  local res = runtime.transfer(request())
  assert(res and res.status == 200)
end

-- The engine binding driven directly: start, poll until done, result, close.
function ops.engine()
  local e = scheduler.engine()
  local t = assert(e:start(request()))
  while not t:done() do e:poll(31) end
  assert(t:result().status == 200)
  t:close()
end

-- The same without transfer:result() (no response or header table).
function ops.engine_noresult()
  local e = scheduler.engine()
  local t = assert(e:start(request()))
  while not t:done() do e:poll(31) end
  t:close()
end

-- fetch.lua alone: runtime.transfer replaced by a canned response.
function ops.fetch_stub()
  runtime.transfer = canned
  local res = rw.fetch(url, { on_retry = false })
  assert(res.status == 200)
end

-- What the stub itself costs, to subtract from fetch_stub.
local some_request = { url = url }
function ops.stub_only()
  canned(some_request)
end

local f = ops[op] or error("unknown op " .. tostring(op))
for _ = 1, count do f() end
