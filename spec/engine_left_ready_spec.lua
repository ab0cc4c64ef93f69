-- engine:timeout() after a poll whose budget left sockets that were ready:
-- 0 (look again now), as when finished transfers wait to be reported. A
-- host that waited on the engine's descriptor instead would be woken at
-- once (OpenResty: through the wake-up line's helper thread, two threads
-- woken for nothing). Against the suite's test server.
local core = require "ratewise.core"
local socket = require "socket"
local server = require "spec.support.server"

describe("engine:timeout() after a poll cut short by its budget", function()
  local s
  setup(function() s = server.start() end)
  teardown(function() s:stop() end)

  it("is 0 while sockets the poll was told were ready wait, and not after they are taken", function()
    local script = {}
    for i = 1, 4 do script[i] = { status = 200, body = "ok", delay = 0.6 } end
    s:script("/later", script)
    local e = assert(core.engine())
    local out = {}
    for _ = 1, 4 do assert(e:start { url = s:url("/later"), method = "GET" }) end
    -- sent, and libcurl's timers of the connections gone (nothing is due
    -- but the answers, 0.6 s later)
    local sent = socket.gettime() + 0.3
    while socket.gettime() < sent do assert.equal(0, select(2, e:poll(0.01, out))) end
    assert.is_nil(e:timeout())
    socket.sleep(0.5) -- every answer in: the sockets are readable
    local _, n = e:poll(0, out, 1e-9) -- a budget spent before the first socket
    assert.equal(0, n)
    assert.equal(0, e:timeout())
    local finished = 0
    local deadline = socket.gettime() + 5
    while finished < 4 and socket.gettime() < deadline do
      _, n = e:poll(0.05, out)
      finished = finished + n
    end
    assert.equal(4, finished)
    local left = e:timeout()
    assert.is_true(left == nil or left > 0, tostring(left))
    e:close()
  end)
end)
