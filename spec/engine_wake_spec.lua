-- The engine's wake-up line (src/wake.c), as a host whose loop cannot wait
-- on the engine's descriptor uses it (OpenResty's, docs/hosts.md): a socket
-- of the host's connected to the engine's path gets a byte once the
-- engine's descriptor is readable, or the arming's seconds have passed,
-- once per arming, and on a kick.
-- Against the suite's test server.
local core = require "ratewise.core"
local socket = require "socket"
local unix = require "socket.unix"
local server = require "spec.support.server"

local function connect(path)
  local line = assert(unix())
  assert(line:connect(path))
  line:settimeout(2)
  return line
end

describe("the engine's wake-up line", function()
  if not core.engine():pollfd() then
    pending("a poll(2) build has no descriptor to wake on")
    return
  end
  local s
  setup(function() s = server.start() end)
  teardown(function() s:stop() end)

  it("lives in a directory only its user may enter, and goes with the engine", function()
    local e = assert(core.engine())
    local path = assert(e:wake_path())
    assert.equal(path, e:wake_path())
    local dir = path:match("^(.*)/[^/]+$")
    local p = assert(io.popen("stat -c %a " .. dir))
    assert.equal("700", p:read("*l"))
    p:close()
    e:close()
    assert.is_nil(io.open(path, "r"))
    local there = os.execute("test -e " .. dir) -- (true or 0 when there, by the Lua)
    assert.is_false(there == true or there == 0)
  end)

  it("says when nothing connected", function()
    local e = assert(core.engine())
    assert(e:wake_path())
    local ok, err = e:wake_accept()
    assert.is_nil(ok)
    assert.matches("no connection", err)
    e:close()
  end)

  it("writes a byte when an answer arrives, once per arming, and on a kick", function()
    s:script("/slow", { { status = 200, body = "ok", delay = 0.2 } })
    local e = assert(core.engine())
    local line = connect(assert(e:wake_path()))
    assert.is_true(e:wake_accept())
    e:wake_kick()
    assert.equal("k", line:receive(1))
    local t = assert(e:start { url = s:url("/slow"), method = "GET" })
    e:poll(0) -- connects and sends
    local started = socket.gettime()
    repeat
      e:wake_arm()
      local byte = assert(line:receive(1))
      assert.equal("w", byte)
      e:poll(0)
    until t:done()
    assert.is_true(socket.gettime() - started >= 0.15)
    -- not armed: nothing more comes
    line:settimeout(0.1)
    local none, err = line:receive(1)
    assert.is_nil(none)
    assert.equal("timeout", err)
    e:close()
    line:close()
  end)

  it("writes a byte once the seconds of an arming have passed, and not before", function()
    local e = assert(core.engine())
    local line = connect(assert(e:wake_path()))
    assert.is_true(e:wake_accept())
    local started = socket.gettime()
    e:wake_arm(0.1)
    assert.equal("w", line:receive(1))
    local took = socket.gettime() - started
    assert.is_true(took >= 0.1 and took < 0.5, took .. " s")
    -- armed without seconds, nothing due: no byte
    e:wake_arm()
    line:settimeout(0.2)
    assert.equal("timeout", select(2, line:receive(1)))
    assert.has_error(function() e:wake_arm(-1) end)
    e:close()
    line:close()
  end)

  it("keeps a timer that goes off sooner than a later arming's seconds: one early byte", function()
    local e = assert(core.engine())
    local line = connect(assert(e:wake_path()))
    assert.is_true(e:wake_accept())
    local started = socket.gettime()
    e:wake_arm(0.1)
    e:wake_arm(5) -- as a host's next wait does, its deadline counted anew
    assert.equal("w", line:receive(1))
    local took = socket.gettime() - started
    assert.is_true(took >= 0.1 and took < 0.5, took .. " s")
    -- gone off: the next arming sets it anew, sooner
    started = socket.gettime()
    e:wake_arm(5)
    e:wake_arm(0.1)
    assert.equal("w", line:receive(1))
    took = socket.gettime() - started
    assert.is_true(took >= 0.1 and took < 0.5, took .. " s")
    e:close()
    line:close()
  end)

  it("a newer connection takes the line's place, and the older one is closed", function()
    local e = assert(core.engine())
    local path = assert(e:wake_path())
    local first = connect(path)
    assert.is_true(e:wake_accept())
    local second = connect(path)
    assert.is_true(e:wake_accept())
    assert.equal("closed", select(2, first:receive(1)))
    e:wake_kick()
    assert.equal("k", second:receive(1))
    e:close()
    first:close()
    second:close()
  end)
end)
