-- lua/ratewise/policy.lua on its own (rw.policy, rw.policy.chain): the
-- hooks of a chain called directly, for their precedence, and two rules of
-- a policy's answers through rw.fetch. providers_spec.lua covers chains
-- through fetch (classify, delay, observe and prepare in order) and the
-- built-in providers.
local rw = require "ratewise"
local server = require "spec.support.server"

local function always(answer) return function() return answer end end

describe("rw.policy", function()
  it("is a policy object, and a policy given again is the same one", function()
    local p = rw.policy { name = "mine", classify = always("terminal") }
    assert.equal(p, rw.policy(p))
    assert.equal(p, rw.policy.new(p))
    assert.is_true(rw.policy.is_policy(p))
    assert.is_false(rw.policy.is_policy({ classify = always("terminal") }))
    assert.equal("mine", p.name)
    assert.equal("ratewise.Policy (mine)", tostring(p))
    assert.equal("ratewise.Policy (custom)", tostring(rw.policy {}))
    assert.is_nil(rw.policy {}.classify) -- a missing hook stays missing: the built-in applies
  end)

  it("chain: the first non-nil answer wins, false included", function()
    local says_no = rw.policy { name = "no", replayable = always(false) }
    local says_yes = rw.policy { name = "yes", replayable = always(true) }
    local silent = rw.policy { name = "silent", replayable = always(nil) }
    assert.is_false(rw.policy.chain(says_no, says_yes).replayable({ status = 429 }, "POST"))
    assert.is_true(rw.policy.chain(silent, says_yes).replayable({ status = 429 }, "POST"))
    assert.is_nil(rw.policy.chain(silent, silent).replayable(nil, "POST"))
  end)

  it("chain: each hook gets the caller's arguments, and later policies are not asked once one answered", function()
    local asked = {}
    local function delay(name, answer)
      return rw.policy { name = name, delay = function(res, attempt)
        asked[#asked + 1] = { name, res.status, attempt }
        return answer
      end }
    end
    local chained = rw.policy.chain(delay("a", nil), delay("b", 7), delay("c", 1))
    assert.equal(7, chained.delay({ status = 503 }, 2))
    assert.same({ { "a", 503, 2 }, { "b", 503, 2 } }, asked)
  end)

  it("chain: observe and prepare run for every policy in order, each seeing what the ones before did", function()
    local order = {}
    local chained = rw.policy.chain(
      { prepare = function(req) req.headers["X-A"] = "1" end,
        observe = function(res, limiter) order[#order + 1] = "a:" .. res.status .. ":" .. limiter end },
      { prepare = function(req) req.headers["X-B"] = req.headers["X-A"] .. "2" end,
        observe = function() order[#order + 1] = "b" end })
    local request = { headers = {} }
    chained.prepare(request)
    assert.same({ ["X-A"] = "1", ["X-B"] = "12" }, request.headers)
    chained.observe({ status = 200 }, "lim")
    assert.same({ "a:200:lim", "b" }, order)
  end)

  it("chain: skips nil arguments, names the unnamed '?', nests, and has only the hooks its members have", function()
    local a = rw.policy { name = "a", classify = always(nil) }
    local b = { classify = always("retryable") }
    local chained = rw.policy.chain(nil, a, nil, b)
    assert.equal("a+?", chained.name)
    assert.equal("retryable", chained.classify({ status = 404 }))
    assert.is_nil(chained.delay)
    assert.is_nil(chained.observe)
    assert.is_nil(chained.prepare)
    assert.is_nil(chained.replayable)
    local outer = rw.policy.chain(rw.policy { name = "first", classify = always("terminal") }, chained)
    assert.equal("first+a+?", outer.name)
    assert.equal("terminal", outer.classify({ status = 404 }))
    assert.equal("ratewise.Policy (first+a+?)", tostring(outer))
    local empty = rw.policy.chain()
    assert.equal("", empty.name)
    assert.is_nil(empty.classify)
  end)
end)

describe("a policy's answers through rw.fetch", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  local function recording(extra)
    local seen = {}
    local o = { on_retry = function(info) seen[#seen + 1] = { delay = info.delay, source = info.source } end,
      sleep = function() end, hint_jitter = 0 }
    for k, v in pairs(extra) do o[k] = v end
    return seen, o
  end

  it("a policy's delay is a server hint: max_delay does not cap it", function()
    s:script("/p", { { status = 503 }, { status = 200 } })
    local seen, o = recording { policy = rw.policy { delay = always(42) }, max_delay = 0.5 }
    assert(rw.fetch(s:url("/p"), o))
    assert.same({ { delay = 42, source = "policy" } }, seen)
    assert.equal(2, #s:log("/p"))
  end)

  it("hooks that answer nil leave the built-in rules: a 503 retried after its Retry-After, a 404 not", function()
    local p = rw.policy { classify = always(nil), delay = always(nil) }
    s:script("/b", { { status = 503, headers = { ["Retry-After"] = "3" } }, { status = 200 } })
    local seen, o = recording { policy = p }
    assert(rw.fetch(s:url("/b"), o))
    assert.same({ { delay = 3, source = "retry-after" } }, seen)
    s:script("/nf", { { status = 404 } })
    local _, err = rw.fetch(s:url("/nf"), o)
    assert.equal("terminal", err.kind)
    assert.equal(1, #s:log("/nf"))
  end)
end)
