-- ratewise in a real Apache 2.4 (Debian's apache2, mod_lua on PUC Lua 5.3),
-- with no code of ratewise's for it: a handler calls ratewise as plain
-- code, and each waiting call holds its worker thread (LuaScope thread:
-- one Lua state per worker thread, ratewise loaded once in each) while the
-- other threads serve other requests. The server runs in the foreground
-- from a private config in a temp dir (spec/support/hosts/apache/httpd.lua),
-- started and stopped here.
local real_host = require "spec.support.real_host"
local server = require "spec.support.server"
local httpd = require "spec.support.hosts.apache.httpd"
local redis = require "spec.support.redis"
local socket = require "socket"

-- How often another request of the server is timed while the scenario runs:
-- each costs the server's process CPU that the scenario counts as its own.
local PING_EVERY = 0.1

describe("ratewise in Apache mod_lua (Lua 5.3)", function()
  local enabled, why = real_host.enabled()
  local s, dir, h, run, r

  before_each(function()
    if not enabled then return end
    assert(httpd.binary(), "apache2 or its mod_lua is not installed: `make deps` installs Debian's apache2 "
      .. "(the Makefile's DEB_REAL_HOSTS)")
    s = server.start()
    real_host.routes(s)
    dir = real_host.temp_dir()
  end)

  after_each(function()
    if run then run:close() end
    if h then h:stop() end
    if r then r:destroy() end
    if s then s:stop() end
    if dir then os.execute("rm -rf '" .. dir .. "'") end
    run, h, s, dir, r = nil, nil, nil, nil, nil
  end)

  it("runs the scenario as plain handler code (LuaScope thread); other requests are served meanwhile", function()
    if not enabled then return pending(why) end
    h = httpd.start { dir = dir, scope = "thread" }
    local results_file = dir .. "/results"
    -- /run holds its worker thread until the scenario ends: sent here, its
    -- answer read once the other requests have been timed
    run = assert(socket.connect("127.0.0.1", tonumber(h.url:match(":(%d+)$"))))
    assert(run:send(("GET /run?base=%s&results=%s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"):format(
      s:url(""):gsub("/$", ""), results_file)))
    local deadline = socket.gettime() + 20
    local worst = real_host.ping(h.url .. "/ping", function()
      local text = server.read_file(results_file) or ""
      return text:find("\ndone\n", 1, true) ~= nil or socket.gettime() > deadline
    end, PING_EVERY)
    local results = real_host.results(results_file, 1)
    real_host.check(results, "Apache mod_lua (its log:\n" .. h:log() .. ")")
    assert(worst <= real_host.BOUND.late, ("/ping took %.1f ms while /run waited (bound %g ms)"):format(worst * 1000,
      real_host.BOUND.late * 1000))
    run:settimeout(5)
    local answer = run:receive("*a")
    assert.truthy(answer and answer:find("^HTTP/1%.1 200") and answer:find("\nran\n$"), tostring(answer))
    for i = 0, 10 do assert.equal(2, #s:log("/rh/429/" .. i), "/rh/429/" .. i) end
    -- ratewise's retry lines went to standard error, which Apache sends to its error log
    local error_log = server.read_file(dir .. "/error.log") or ""
    assert.truthy(error_log:find("retrying GET " .. s:url("/rh/429/0"), 1, true), error_log)
  end)

  -- seconds = spread(q): between the first and the last request to
  -- /rh/ping?q that the server saw
  local function spread(q)
    local first, last
    for _, record in ipairs(s:log("/rh/held")) do
      if record.query == q then
        first, last = math.min(first or record.t, record.t), math.max(last or record.t, record.t)
      end
    end
    return first and last - first
  end

  -- bodies = at_once(n, path): n requests to path at once, each holding a
  -- worker thread of its own
  local function at_once(n, path)
    local port = tonumber(h.url:match(":(%d+)$"))
    local conns, bodies = {}, {}
    for i = 1, n do
      conns[i] = assert(socket.connect("127.0.0.1", port))
      assert(conns[i]:send("GET " .. path .. " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"))
    end
    for i = 1, n do
      conns[i]:settimeout(10)
      local answer = conns[i]:receive("*a") or ""
      conns[i]:close()
      bodies[i] = answer:match("\r\n\r\n(.*)$")
    end
    return bodies
  end

  it("keeps a bucket per Lua state, and a Redis bucket shared by the worker threads", function()
    if not enabled then return pending(why) end
    r = redis.start()
    h = httpd.start { dir = dir, scope = "thread" }
    local N = 4
    -- two calls a second, no burst: each thread's own bucket lets its one
    -- call through at once; the shared one spaces the four by 0.5 s
    -- (each answer held 0.3 s: a thread done with its call cannot take a
    -- second of the four, whose own bucket would space it)
    s:script("/rh/held", { { status = 200, body = "held", delay = 0.3 } })
    local url = s:url("/rh/held")
    assert.same({ "200\n", "200\n", "200\n", "200\n" }, at_once(N, "/limited?url=" .. url .. "%3Fq%3Dlocal"))
    local apart = spread("q=local")
    assert(apart and apart < 0.4, "the threads' own buckets spaced the calls by " .. tostring(apart) .. " s")
    assert.same({ "200\n", "200\n", "200\n", "200\n" }, at_once(N, "/limited?url=" .. url .. "%3Fq%3Dredis&redis="
      .. r.url .. "&key=apache"))
    apart = spread("q=redis")
    assert(apart and apart >= (N - 1) * 0.5 - 0.15, ("the Redis bucket let %d calls through in %.2f s"):format(N,
      apart or -1))
  end)
end)
