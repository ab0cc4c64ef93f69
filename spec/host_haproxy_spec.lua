-- ratewise inside HAProxy 2.6 (Debian's, which links Lua 5.3), found with no
-- configuration (lua/ratewise/hosts/haproxy.lua). HAProxy runs headless on
-- loopback, in the foreground with one thread, in a temp dir, from
-- spec/support/hosts/haproxy/: the script requires ratewise and runs the
-- scenario (spec/support/hosts/scenario.lua) in an HAProxy task, with no
-- adapter code. While it runs, /ping (answered by HAProxy itself) and
-- /lua_ping (a Lua service, another Lua context) are timed from here.
local real_host = require "spec.support.real_host"
local haproxy = require "spec.support.haproxy"
local server = require "spec.support.server"
local socket = require "socket"

local read_file = server.read_file
local function once() return true end
local PING_EVERY = 0.05
local FIXTURES = real_host.ROOT .. "/spec/support/hosts/haproxy/"

-- Starts HAProxy on the fixtures' configuration, which loads
-- scenario_task.lua, and script after it when given; answers the handle,
-- its port and the results file.
local function start(s, script, tune)
  assert(read_file(haproxy.BINARY), "no " .. haproxy.BINARY .. ": `make deps` installs haproxy (the Makefile's "
    .. "DEB_REAL_HOSTS)")
  local dir = real_host.temp_dir()
  local port = server.free_port()
  local values = {
    RESULTS = dir .. "/results",
    BASE = s:url(""):gsub("/$", ""),
    ROOT = real_host.ROOT,
    CPATH = real_host.cpath("lua5.3"),
    MORE = script and ("lua-load " .. FIXTURES .. script) or "",
    PORT = tostring(port),
    TUNE = tune or "",
  }
  local config = assert(read_file(FIXTURES .. "haproxy.cfg.in")):gsub("@(%u+)@", values)
  real_host.write_file(dir .. "/haproxy.cfg", config)
  local h = haproxy.run { dir = dir, config = dir .. "/haproxy.cfg", seconds = 60 }
  h.port, h.results = port, values.RESULTS
  return h
end

local function url(h, path)
  return "http://127.0.0.1:" .. h.port .. path
end

-- Waits until HAProxy listens (it has read its configuration and loaded
-- the script, and its tasks start) and answers how long its first answer
-- to /ping took: a thread that the scenario's task blocked answers late.
-- nil when HAProxy exited first.
local function up(h)
  local deadline = socket.gettime() + 10
  repeat
    if not h:alive() then return nil end
    local c = socket.connect("127.0.0.1", h.port)
    if c then
      c:close()
      return real_host.ping(url(h, "/ping"), once, 0)
    end
    socket.sleep(0.02)
  until socket.gettime() > deadline
  return nil
end

local function get(h, path)
  local http = require "socket.http"
  http.TIMEOUT = 10
  local started = socket.gettime()
  local body, code = http.request(url(h, path))
  return body, code, socket.gettime() - started
end

describe("HAProxy 2.6 (real host, Lua 5.3)", function()
  if not real_host.enabled() then
    pending(select(2, real_host.enabled()))
    return
  end

  local s, h
  before_each(function()
    s = server.start()
    real_host.routes(s)
  end)
  after_each(function()
    if h then h:stop() end
    h = nil
    s:stop()
  end)

  it("runs the scenario in an HAProxy task while /ping and a Lua service stay on time", function()
    h = start(s)
    local first = up(h)
    assert(first, "HAProxy did not start:\n" .. h:output())
    local worst = { ping = first, lua_ping = 0 }
    -- pings while the scenario ran: it must not be over before they begin
    local during = 0
    local function finished()
      local text = read_file(h.results) or ""
      if text:find("done\n", 1, true) or not h:alive() then return true end
      during = during + 1
      return false
    end
    -- each of the two about ten times a second: the pings are HAProxy's
    -- work too, and count in the CPU the scenario measures
    local deadline = socket.gettime() + 25
    repeat
      worst.ping = math.max(worst.ping, real_host.ping(url(h, "/ping"), once, PING_EVERY))
      worst.lua_ping = math.max(worst.lua_ping, real_host.ping(url(h, "/lua_ping"), once, PING_EVERY))
    until finished() or socket.gettime() > deadline
    local results = real_host.results(h.results, 1, function() return h:alive() end)
    real_host.check(results, "HAProxy (output:\n" .. h:output() .. ")")
    for what, seconds in pairs(worst) do
      assert(seconds <= real_host.BOUND.late, ("HAProxy's /%s answered after %.3f s while ratewise waited (bound %g s)")
        :format(what, seconds, real_host.BOUND.late))
    end
    assert(during >= 20, ("only %d pings while the scenario ran"):format(during))
    -- ratewise's lines went to HAProxy's log (core.log), which -db shows
    assert.matches("%[info%] [^\n]*: retrying GET http://127%.0%.0%.1:%d+/rh/429/0 ", h:output())
    print(("\nHAProxy: one_429 %.2f s, one_slow %.2f s, ten_429 %.2f s, ten_slow %.2f s; CPU %.2f%% while waiting; "
      .. "worst /ping %.1f ms, /lua_ping %.1f ms"):format(results.one_429.seconds, results.one_slow.seconds,
      results.ten_429.seconds, results.ten_slow.seconds, 100 * results.one_429.cpu / results.one_429.seconds,
      1000 * worst.ping, 1000 * worst.lua_ping))

    assert.equal(1, #s:log("/hx/from_body"), "the task spawned in the body of the script did not run")

    -- a service waits too (a bare rw.fetch: a Retry-After, then the answer)
    s:script("/hx/429", {
      { status = 429, headers = { ["Retry-After"] = "1" }, body = "slow down" },
      { status = 200, body = "ok" },
    })
    local body, code, took = get(h, "/lua_fetch?/hx/429")
    assert.equal(200, code)
    assert.equal("200", body)
    assert(took >= 1 and took < 3, ("the service's call took %.2f s"):format(took))
    assert.equal(2, #s:log("/hx/429"))

    -- a service that spawns a task and returns: the task runs on without it
    s:script("/hx/spawned", { { status = 200, body = "ok", delay = 0.5 } })
    body, code = get(h, "/lua_spawn?/hx/spawned")
    assert.equal(200, code)
    assert.equal("spawned", body)
    local seen = socket.gettime() + 5
    while #s:log("/hx/spawned") == 0 and socket.gettime() < seen do socket.sleep(0.05) end
    assert.equal(1, #s:log("/hx/spawned"), "the spawned task's request never reached the server")
  end)

  it("runs a task spawned while the driver naps at once, and refuses a wait in a coroutine of the script's own",
      function()
    h = start(s)
    assert(up(h), "HAProxy did not start:\n" .. h:output())
    -- a task sleeping 5 s keeps the driver napping
    local body = get(h, "/lua_sleeper")
    assert.equal("sleeping", body)
    socket.sleep(0.2)
    s:script("/hx/prompt", { { status = 200, body = "ok" } })
    local asked = socket.gettime()
    body = get(h, "/lua_spawn?/hx/prompt")
    assert.equal("spawned", body)
    while #s:log("/hx/prompt") == 0 and socket.gettime() < asked + 6 do socket.sleep(0.01) end
    local took = socket.gettime() - asked
    assert.equal(1, #s:log("/hx/prompt"))
    -- (the driver looks at least every 50 ms; the bound leaves room for a loaded machine)
    assert(took < 0.5, ("a task spawned while the driver napped ran after %.2f s"):format(took))
    -- a coroutine of the script's own: refused at once, not spun
    local started = socket.gettime()
    body = get(h, "/lua_nested")
    assert.matches("ratewise: a wait in a coroutine of the script's own", body, 1, true)
    assert(socket.gettime() - started < 0.4, "the refused wait took its time")
  end)

  it("runs the scenario where HAProxy interrupts Lua every 10 instructions (tune.lua.forced-yield)", function()
    h = start(s, nil, "tune.lua.forced-yield 10")
    assert(up(h), "HAProxy did not start:\n" .. h:output())
    local results = real_host.results(h.results, 30, function() return h:alive() end)
    real_host.check(results, "HAProxy with forced yields (output:\n" .. h:output() .. ")")
  end)

  it("refuses a wait in a sample fetch or a converter, naming the fix, and sends nothing", function()
    h = start(s)
    assert(up(h), "HAProxy did not start:\n" .. h:output())
    local before = #s:log("/rh/ping")
    local body, code, took = get(h, "/in_fetch")
    assert.equal(200, code)
    -- the fetch failed: its variable was never set
    assert.equal("fetched= converted=", body)
    assert(took < 1, ("the fetch took %.2f s"):format(took))
    body, code = get(h, "/in_converter")
    assert.equal(200, code)
    assert.equal("fetched= converted=", body)
    local out = h:output()
    assert.matches("ratewise: a wait in an HAProxy sample fetch cannot be served", out, 1, true)
    assert.matches("ratewise: a wait in an HAProxy converter cannot be served", out, 1, true)
    assert.matches("Call ratewise from a task (core.register_task), a service", out, 1, true)
    assert.not_matches("yield not allowed.", out, 1, true)
    assert.equal(before, #s:log("/rh/ping"), "a request was sent from a fetch or a converter")
  end)

  local AT_START = { ["at_start.lua"] = "the body of a lua-load file", ["at_init.lua"] = "an init function" }
  for script, where in pairs(AT_START) do
    it("refuses a wait in " .. where .. ", naming the fix, and sends nothing", function()
      h = start(s, script)
      local deadline = socket.gettime() + 10
      while h:alive() and socket.gettime() < deadline do socket.sleep(0.05) end
      assert(not h:alive(), "HAProxy started with a wait in " .. where)
      local out = h:output()
      assert.matches("ratewise: a wait in the body of a lua-load file or in an init function", out, 1, true)
      assert.matches("Call ratewise from a task instead (core.register_task(fn)", out, 1, true)
      assert.equal(0, #s:log("/rh/ping"), "a request was sent from " .. where)
    end)
  end
end)
