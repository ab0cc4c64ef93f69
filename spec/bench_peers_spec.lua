-- ratewise's side of `make bench-peers` (bench/peers/ratewise_peer.lua)
-- makes the calls it says it makes, and counts every failed one: the
-- benchmark's ratios divide by its rate, and its exit status rests on the
-- count. Run against the suite's loopback server, in a process of its own,
-- as bench/peers.lua runs it.
local server = require "spec.support.server"
local subprocess = require "spec.support.subprocess"

local PEER = "bench/peers/ratewise_peer.lua"

local function run_peer(url, n, conc, warmup)
  return subprocess.shell(subprocess.env .. "timeout 30 " .. subprocess.lua .. " " .. PEER .. " '" .. url .. "' "
    .. n .. " " .. conc .. " " .. warmup)
end

describe("bench/peers/ratewise_peer.lua", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() if s then s:stop() end end)
  before_each(function() s:reset() end)

  for _, conc in ipairs { 1, 4 } do
    it("makes the warm-up calls and then N, " .. conc .. " in flight, and prints its rate", function()
      -- 7 calls over 4 workers: shares of 2, 2, 2 and 1.
      local out, code = run_peer(s:url("/peer"), 7, conc, 2)
      assert.are.equal(0, code, out)
      assert.is_truthy(out:match("^rate=%d+%.%d failed=0 cpu_us=%d+%.%d%d\n$"), out)
      local log = s:log("/peer")
      assert.are.equal(9, #log)
      for _, r in ipairs(log) do assert.are.equal("GET", r.method) end
    end)
  end

  it("counts a status other than 200 as failed, says why once, and exits 1", function()
    s:script("/gone", { { status = 404, body = "no" } })
    local out, code = run_peer(s:url("/gone"), 3, 1, 1)
    assert.are.equal(1, code, out)
    assert.is_truthy(out:find("failed=4 ", 1, true), out)
    -- rw.fetch ends a call answered 404 with an error of kind "terminal".
    local _, shown = out:gsub("ratewise failed: [^\n]*404", "")
    assert.are.equal(1, shown, out)
    assert.are.equal(4, #s:log("/gone"))
  end)

  it("counts a 200 whose body is not \"ok\" as failed", function()
    s:script("/other", { { status = 200, body = "okay" } })
    local out, code = run_peer(s:url("/other"), 2, 2, 0)
    assert.are.equal(1, code, out)
    assert.is_truthy(out:find("failed=2 ", 1, true), out)
    assert.is_truthy(out:find('a body of 4 bytes, not "ok"', 1, true), out)
  end)

  it("refuses a bad command line", function()
    local out, code = run_peer(s:url("/peer"), 0, 1, 0)
    assert.are.equal(2, code, out)
    assert.is_truthy(out:find("usage:", 1, true), out)
  end)
end)
