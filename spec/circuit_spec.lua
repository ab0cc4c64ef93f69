-- lua/ratewise/circuit.lua on its own (rw.circuit): one breaker per
-- origin, closed -> open -> half_open -> closed. resilience_spec.lua covers
-- the transitions one by one and through rw.fetch; this covers the
-- defaults, the full cycle run twice (a closed circuit starts counting
-- afresh), the one probe among many callers, the cooldown counting down,
-- and a hook that raises on the move to half_open.
local rw = require "ratewise"

local A = "http://a.example:80"
local COOLDOWN = 0.1

local function failing(c, origin, n)
  for _ = 1, n do c:record(origin, "failure") end
end

describe("rw.circuit", function()
  it("defaults to 5 failures and a 30 s cooldown", function()
    local c = rw.circuit {}
    failing(c, A, 4)
    assert.equal("closed", c:state(A))
    c:record(A, "failure")
    assert.equal("open", c:state(A))
    local allowed, seconds = c:allow(A)
    assert.is_false(allowed)
    assert.is_true(seconds > 29.9 and seconds <= 30, tostring(seconds))
    assert.equal("ratewise.Circuit (failures 5, cooldown 30 s, 1 origin not closed)", tostring(c))
  end)

  it("counts the cooldown down, and opens for exactly the cooldown", function()
    local c = rw.circuit { failures = 1, cooldown = 0.3 }
    c:record(A, "failure")
    local _, first = c:allow(A)
    rw.sleep(0.1)
    local _, later = c:allow(A)
    assert.is_true(first > later, ("%.3f then %.3f"):format(first, later))
    -- the time slept, a loaded machine oversleeping
    assert.is_true(first - later >= 0.095 and first - later < 0.25, ("%.3f then %.3f"):format(first, later))
    rw.sleep(later + 0.01)
    assert.is_true(c:allow(A))
  end)

  it("runs closed -> open -> half_open -> closed twice, a closed circuit counting failures afresh", function()
    local seen = {}
    local c = rw.circuit { failures = 3, cooldown = COOLDOWN, on_change = function(_, from, to)
      seen[#seen + 1] = from .. ">" .. to
    end }
    for round = 1, 2 do
      failing(c, A, 2)
      assert.equal("closed", c:state(A), "round " .. round)
      c:record(A, "failure")
      assert.equal("open", c:state(A))
      rw.sleep(COOLDOWN + 0.02)
      assert.equal("half_open", c:state(A))
      assert.is_true(c:allow(A))
      c:record(A, "success")
      assert.equal("closed", c:state(A))
      assert.same({}, c:states()) -- a closed origin is forgotten: nothing counted carries over
    end
    assert.same({ "closed>open", "open>half_open", "half_open>closed",
      "closed>open", "open>half_open", "half_open>closed" }, seen)
  end)

  it("in half_open lets one probe through among many callers, whatever their number", function()
    local c = rw.circuit { failures = 1, cooldown = COOLDOWN }
    c:record(A, "failure")
    rw.sleep(COOLDOWN + 0.02)
    local let_through = 0
    rw.run(function()
      for _ = 1, 20 do
        rw.spawn(function()
          if c:allow(A) then let_through = let_through + 1 end
        end)
      end
    end)
    assert.equal(1, let_through)
    assert.equal("half_open", c:state(A))
  end)

  it("notices the end of the cooldown in states() too", function()
    local c = rw.circuit { failures = 1, cooldown = COOLDOWN }
    c:record(A, "failure")
    c:record("http://b.example:80", "failure")
    assert.same({ [A] = "open", ["http://b.example:80"] = "open" }, c:states())
    rw.sleep(COOLDOWN + 0.02)
    assert.same({ [A] = "half_open", ["http://b.example:80"] = "half_open" }, c:states())
    assert.equal("ratewise.Circuit (failures 1, cooldown 0.1 s, 2 origins not closed)", tostring(c))
  end)

  it("moves to half_open before a hook that raises on the way, and goes on from there", function()
    local broken = true
    local c = rw.circuit { failures = 1, cooldown = COOLDOWN, on_change = function(_, _, to)
      if broken and to == "half_open" then error("hook broke") end
    end }
    c:record(A, "failure")
    rw.sleep(COOLDOWN + 0.02)
    local ok, err = pcall(c.allow, c, A)
    assert.is_false(ok)
    assert.matches("the 'on_change' hook raised an error: .*hook broke", tostring(err))
    broken = false
    assert.equal("half_open", c:state(A))
    assert.is_true(c:allow(A))
    c:record(A, "success")
    assert.equal("closed", c:state(A))
  end)
end)
