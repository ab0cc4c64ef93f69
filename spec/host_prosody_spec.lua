-- ratewise inside Prosody 0.12 (Debian's, which runs Lua 5.4), found with
-- no configuration (lua/ratewise/hosts/prosody.lua). Prosody runs headless
-- on loopback, in the foreground, in a temp dir, HTTP alone listening,
-- from spec/support/hosts/prosody/: its test module runs the scenario
-- (spec/support/hosts/scenario.lua) inside an HTTP handler, which Prosody
-- runs in a util.async runner, with no adapter code; /ping, another
-- request of the same server, is timed from here meanwhile.
local real_host = require "spec.support.real_host"
local server = require "spec.support.server"
local socket = require "socket"

local read_file = server.read_file
local BINARY = "/usr/bin/prosody"
local FIXTURES = real_host.ROOT .. "/spec/support/hosts/prosody/"
-- Each ping is a connection that Prosody's Lua accepts, parses and answers
-- (0.6 ms of its CPU), and the scenario's CPU figure is the whole
-- process's: five a second keep them a small part of it.
local PING_EVERY = 0.2

local shell_quote = real_host.shell_quote

local function alive(pid)
  local stat = read_file("/proc/" .. pid .. "/stat")
  local state = stat and stat:match(".*%) (%a)")
  return state ~= nil and state ~= "Z" and state ~= "X"
end

local Prosody = {}
Prosody.__index = Prosody

function Prosody:alive() return alive(self.pid) end

--- What Prosody wrote: its output, then its log.
function Prosody:output()
  return (read_file(self.dir .. "/out") or "") .. (read_file(self.dir .. "/prosody.log") or "")
end

function Prosody:url(path)
  return "http://127.0.0.1:" .. self.port .. "/ratewise_test" .. path
end

-- SIGTERM, as its users stop it; SIGKILL if it has not gone in 5 s.
function Prosody:stop()
  os.execute("kill -TERM " .. self.pid .. " 2>/dev/null")
  local deadline = socket.gettime() + 5
  while alive(self.pid) and socket.gettime() < deadline do socket.sleep(0.05) end
  if alive(self.pid) then os.execute("kill -KILL " .. self.pid .. " 2>/dev/null") end
  os.execute("rm -rf " .. shell_quote(self.dir))
end

-- Starts Prosody (under `timeout`) on the fixtures' configuration, with
-- ratewise, the scenario and the core on its module paths (LUA_PATH and
-- LUA_CPATH, which Prosody takes as the standalone interpreter does), and
-- waits until its HTTP port answers. at_load: a path its test module
-- fetches as it loads (in Prosody's startup).
local function start(s, at_load)
  assert(read_file(BINARY), "no " .. BINARY .. ": `make deps` installs prosody (the Makefile's DEB_REAL_HOSTS)")
  local dir = real_host.temp_dir()
  local port = server.free_port()
  local values = {
    DIR = dir,
    FIXTURES = FIXTURES,
    PORT = tostring(port),
    BASE = (s:url(""):gsub("/$", "")),
    ATLOAD = at_load or "",
  }
  local config = assert(read_file(FIXTURES .. "prosody.cfg.lua.in")):gsub("@(%u+)@", values)
  real_host.write_file(dir .. "/prosody.cfg.lua", config)
  assert(os.execute("mkdir " .. shell_quote(dir .. "/data")))
  local command = ("cd %s && LUA_PATH=%s LUA_CPATH=%s exec timeout 60 %s -F --config %s </dev/null >%s 2>&1 & echo $!")
    :format(shell_quote(dir), shell_quote(real_host.lua_path() .. ";;"),
      shell_quote(real_host.cpath("lua5.4") .. ";;"), BINARY, shell_quote(dir .. "/prosody.cfg.lua"),
      shell_quote(dir .. "/out"))
  local p = assert(io.popen(command))
  local pid = assert(tonumber(p:read("*l")), "could not start prosody")
  p:close()
  local h = setmetatable({ dir = dir, port = port, pid = pid, results = dir .. "/results" }, Prosody)
  if real_host.listening(port, 10, function() return h:alive() end) then return h end
  local out = h:output()
  h:stop()
  error("Prosody did not start listening:\n" .. out, 0)
end

local function get(h, path)
  local http = require "socket.http"
  http.TIMEOUT = 10
  local started = socket.gettime()
  local body, code = http.request(h:url(path))
  return body, code, socket.gettime() - started
end

-- A GET whose answer is read later: the scenario's handler answers once
-- the scenario is over.
local function send_get(h, path)
  local c = assert(socket.connect("127.0.0.1", h.port))
  assert(c:send(("GET /ratewise_test%s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"):format(path)))
  return c
end

local function read_answer(c, seconds)
  c:settimeout(seconds)
  local text, err, partial = c:receive("*a")
  c:close()
  return text or partial, err
end

describe("Prosody 0.12 (real host, Lua 5.4)", function()
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

  it("runs the scenario in an HTTP handler (a util.async runner) while /ping stays on time", function()
    h = start(s)
    local first = real_host.ping(h:url("/ping"), function() return true end, 0)
    local c = send_get(h, "/run")
    local during = 0
    local worst = real_host.ping(h:url("/ping"), function()
      local text = read_file(h.results) or ""
      if text:find("done\n", 1, true) or not h:alive() then return true end
      during = during + 1
      return false
    end, PING_EVERY)
    worst = math.max(first, worst)
    local results = real_host.results(h.results, 1, function() return h:alive() end)
    local answer = read_answer(c, 5) or ""
    real_host.check(results, "Prosody (output:\n" .. h:output() .. ")")
    assert(worst <= real_host.BOUND.late, ("Prosody's /ping answered after %.3f s while ratewise waited (bound %g s)")
      :format(worst, real_host.BOUND.late))
    assert(during >= 20, ("only %d pings while the scenario ran"):format(during))
    assert.matches("\r\n\r\nran$", answer)
    local out = h:output()
    -- ratewise's lines went to Prosody's log
    assert.matches("ratewise%s+info%s+[^\n]*retrying GET http://127%.0%.0%.1:%d+/rh/429/0 ", out)
    assert.not_matches("non-existent global", out, 1, true)
    print(("\nProsody: one_429 %.2f s, one_slow %.2f s, ten_429 %.2f s, ten_slow %.2f s; CPU %.2f%% while waiting; "
      .. "worst /ping %.1f ms"):format(results.one_429.seconds, results.one_slow.seconds,
      results.ten_429.seconds, results.ten_slow.seconds, 100 * results.one_429.cpu / results.one_429.seconds,
      1000 * worst))
  end)

  it("runs a task spawned from a timer's callback (no runner) from its loop", function()
    h = start(s)
    s:script("/px/spawned", {
      { status = 429, headers = { ["Retry-After"] = "1" }, body = "slow down" },
      { status = 200, body = "ok" },
    })
    local body, code = get(h, "/spawn?/px/spawned")
    assert.equal(200, code)
    assert.equal("spawned", body)
    local deadline = socket.gettime() + 5
    while not h:output():find("the spawned task's call ended", 1, true) and socket.gettime() < deadline do
      socket.sleep(0.05)
    end
    assert.matches("the spawned task's call ended: 200", h:output(), 1, true)
    assert.equal(2, #s:log("/px/spawned"))
  end)

  it("serves a wait in a module's load at startup (Prosody's startup runs in a runner)", function()
    s:script("/px/load", {
      { status = 429, headers = { ["Retry-After"] = "1" }, body = "slow down" },
      { status = 200, body = "ok" },
    })
    local started = socket.gettime()
    h = start(s, "/px/load")
    local deadline = socket.gettime() + 5
    while not h:output():find("the call at load ended", 1, true) and socket.gettime() < deadline do
      socket.sleep(0.05)
    end
    assert.matches("the call at load ended: 200", h:output(), 1, true)
    assert(socket.gettime() - started >= 1, "the Retry-After was not waited for")
    assert.equal(2, #s:log("/px/load"))
    assert.equal("pong", (get(h, "/ping")))
  end)

  local MISUSE = { ["/outside"] = "a timer's callback (no runner)", ["/nested"] = "a coroutine of its own in a runner" }
  for path, where in pairs(MISUSE) do
    it("refuses a wait in " .. where .. ", naming the fix, and sends nothing", function()
      h = start(s)
      local body, code, took = get(h, path)
      assert.equal(200, code)
      assert.matches("ratewise: a wait outside a util.async runner", body, 1, true)
      assert.matches("rw.spawn(function() ... end)", body, 1, true)
      assert(took < 1, ("the refusal took %.2f s"):format(took))
      assert.equal(0, #s:log("/rh/ping"), "a request was sent from " .. where)
      -- and Prosody goes on
      assert.equal("pong", (get(h, "/ping")))
    end)
  end
end)
