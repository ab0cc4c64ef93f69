-- examples/host: a C program that embeds Lua and drives ratewise with
-- one rw.step(0) per frame.
local server = require "spec.support.server"

describe("examples/host", function()
  local s
  setup(function() s = server.start() end)
  teardown(function() s:stop() end)

  it("keeps its frames going while requests wait out a Retry-After", function()
    local busy = { status = 429, headers = { ["Retry-After"] = "1" } }
    s:script("/scores", { busy, busy, busy, { status = 200, body = "ok" } })
    local subprocess = require "spec.support.subprocess"
    local out, code = subprocess.shell(subprocess.env .. subprocess.host .. " " .. s:url("/scores") .. " 3")
    assert.equal(0, code, out)
    for i = 1, 3 do assert.matches("request " .. i .. ": 200 after 2 attempts", out) end
    local frames, seconds, worst_cpu =
      out:match("(%d+) frames in ([%d.]+) s, slowest rw.step%(0%): [%d.]+ ms %(most CPU in one: ([%d.]+) ms%)")
    assert.is_not_nil(frames, out)
    assert.is_true(tonumber(seconds) >= 1)
    -- 60 frames a second went on during the 1 s wait.
    assert.is_true(tonumber(frames) >= 50, out)
    -- No step worked long. Its CPU time, not its wall time: on a machine
    -- shared with other work a step can be descheduled for longer than
    -- it runs (19 ms once in CI, for a step that works ~0.5 ms).
    assert.is_true(tonumber(worst_cpu) < 10, out)
    assert.equal(6, #s:log("/scores"))
  end)
end)
