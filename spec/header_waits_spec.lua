-- What a limiter takes from an answer's quota headers (a provider's
-- observe -> limiter:sync), against hostile or careless servers: the wait
-- is the server's reset, never stretched by a rate that drops meanwhile,
-- never past sync_horizon nor the call's time budget, and only answers
-- from the origin the request went to may sync the limiter (a redirect
-- target elsewhere has quotas of its own); and a Retry-After too small to
-- be a wait backs off. Against the loopback server, asserting what it saw
-- and when.
local rw = require "ratewise"
local server = require "spec.support.server"

local github, ietf = rw.providers.github, rw.providers.ietf

-- A GitHub answer whose quota is spent, the reset `reset` seconds from now.
local function spent(reset, limit)
  return { status = 200, body = "ok", headers = { ["x-ratelimit-remaining"] = "0",
    ["x-ratelimit-reset"] = tostring(reset), ["x-ratelimit-limit"] = tostring(limit or 1) } }
end

describe("a wait a limiter takes from a header", function()
  local s
  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  it("is the reset the server states, not stretched by the stated rate rw.adaptive drops to (github)", function()
    -- "1 request per window, resets in 2 s": the rate falls from 10 a
    -- second to its floor of 0.5 at once; counted in tokens at 10 a second,
    -- the reset became 40 s.
    s:script("/q", { spent(2, 1), { status = 200, body = "ok" } })
    local limiter = rw.adaptive {}
    local opts = { policy = github, limiter = limiter, max_elapsed = 10 }
    assert.equal(200, assert(rw.fetch(s:url("/q"), opts)).status)
    assert.is_true(limiter:wait_time() <= 2.05, "wait " .. limiter:wait_time())
    local started = rw.now()
    local res, err = rw.fetch(s:url("/q"), opts)
    assert.is_not_nil(res, tostring(err))
    local took = rw.now() - started
    assert.is_true(took >= 1.5 and took < 3.5, "the second call went after " .. took .. " s")
    local log = s:log("/q")
    assert.equal(2, #log)
    assert.is_true(log[2].t - log[1].t >= 1.5, "the server saw them " .. (log[2].t - log[1].t) .. " s apart")
  end)

  it("is the reset the server states for the ietf fields too, the window given", function()
    s:script("/q", { { status = 200, headers = { ratelimit = '"default";r=0;t=2',
      ["ratelimit-policy"] = '"default";q=1;w=3600' } } })
    local limiter = rw.adaptive { max_rate = 100 }
    assert(rw.fetch(s:url("/q"), { policy = ietf, limiter = limiter }))
    assert.near(1 / 3600 < 0.5 and 0.5 or 1 / 3600, limiter:rate(), 1e-9)
    local wait = limiter:wait_time()
    assert.is_true(wait > 1.5 and wait <= 2.05, "wait " .. wait)
  end)

  it("stops at sync_horizon, and past the budget ends the call at once", function()
    -- "1 request a day, resets in a day": a rate from 1000 a second to 0.5,
    -- which stretched it to 5.5 years
    s:script("/q", { spent(86400, 1), { status = 200, body = "ok" } })
    local limiter = rw.adaptive { max_rate = 1000 }
    local opts = { policy = github, limiter = limiter, max_elapsed = 1 }
    assert(rw.fetch(s:url("/q"), opts))
    local wait = limiter:wait_time()
    assert.is_true(wait > 86300 and wait <= 86400, "wait " .. wait)
    local started = rw.now()
    local res, err = rw.fetch(s:url("/q"), opts)
    assert.is_nil(res)
    assert.equal("budget", err.kind)
    assert.matches("the limiter would wait 86%d%d%d%.%d%d s", err.message)
    assert.is_true(rw.now() - started < 0.5, "the call ended at once")
    assert.equal(1, #s:log("/q"), "nothing more was sent")
    -- and a reset thirty years off is believed a day
    limiter = rw.adaptive { max_rate = 1000 }
    s:script("/far", { spent(999999999, 1) })
    assert(rw.fetch(s:url("/far"), { policy = github, limiter = limiter }))
    wait = limiter:wait_time()
    assert.is_true(wait > 86300 and wait <= 86400, "wait " .. wait)
  end)

  it("ends a call waiting in the limiter's queue when it would pass the call's budget", function()
    -- B queues for the token A took; A's answer then says the quota is
    -- spent for 30 s, more than B has left
    s:script("/a", { spent(30, 60) })
    s:script("/b", { { status = 200, body = "b" } })
    local limiter = rw.bucket { capacity = 1, rate = 1 }
    local b_res, b_err, b_took
    rw.run(function()
      local a = rw.spawn(function() return rw.fetch(s:url("/a"), { policy = github, limiter = limiter }) end)
      rw.spawn(function()
        local started = rw.now()
        b_res, b_err = rw.fetch(s:url("/b"), { policy = github, limiter = limiter, max_elapsed = 2 })
        b_took = rw.now() - started
      end)
      assert(a:join())
    end)
    assert.is_nil(b_res)
    assert.equal("budget", b_err.kind)
    assert.is_true(b_took < 2.5, "B ended within its budget: " .. b_took .. " s")
    assert.equal(0, #s:log("/b"))
  end)

  it("is not stretched in rw.bucket by the slow-down of a throttle that said the quota is spent", function()
    s:script("/q", { { status = 429, headers = { ["x-ratelimit-remaining"] = "0",
      ["x-ratelimit-reset"] = "3000", ["x-ratelimit-limit"] = "5000" } } })
    local limiter = rw.bucket { capacity = 1, rate = 1 }
    local res, err = rw.fetch(s:url("/q"), { policy = github, limiter = limiter, max_elapsed = 1 })
    assert.is_nil(res)
    assert.equal("budget", err.kind)
    assert.is_true(limiter:rate() < 1, "the throttle slowed the bucket down: " .. limiter:rate())
    local wait = limiter:wait_time()
    assert.is_true(wait > 2990 and wait <= 3000, "wait " .. wait)
  end)
end)

describe("a Retry-After below the backoff's first step", function()
  local s
  setup(function() s = server.start() end)
  teardown(function() s:stop() end)

  it("backs off as a zero one does, instead of retrying within a millisecond", function()
    local tiny = { status = 503, headers = { ["retry-after"] = "0.000001" } }
    s:script("/tiny", { tiny, tiny, tiny, { status = 200, body = "ok" } })
    local sources = {}
    local res, err = rw.fetch(s:url("/tiny"), { base = 0.1, jitter = "none", max_elapsed = 10,
      on_retry = function(info) sources[#sources + 1] = info.source end })
    assert.is_not_nil(res, tostring(err))
    assert.same({ "backoff", "backoff", "backoff" }, sources)
    local log = s:log("/tiny")
    assert.equal(4, #log)
    -- 0.1, 0.2 and 0.4 s apart, as the backoff's steps
    for i = 2, 4 do
      local gap, step = log[i].t - log[i - 1].t, 0.1 * 2 ^ (i - 2)
      assert.is_true(gap >= step * 0.9, ("retry %d came %.4f s after, not %.1f s"):format(i - 1, gap, step))
    end
  end)
end)

describe("quota headers from another origin", function()
  local api, elsewhere
  setup(function()
    api = server.start()
    elsewhere = server.start()
  end)
  teardown(function()
    api:stop()
    elsewhere:stop()
  end)
  before_each(function()
    api:reset()
    elsewhere:reset()
  end)

  for _, case in ipairs {
    { name = "rw.bucket", limiter = function() return rw.bucket { capacity = 2, rate = 2 } end },
    { name = "rw.adaptive", limiter = function() return rw.adaptive {} end },
  } do
    it("do not sync the API's own limiter after a redirect to them (" .. case.name .. ")", function()
      api:script("/download", { { action = "redirect", location = elsewhere:url("/blob") } })
      api:script("/items", { { status = 200, body = "items" } })
      -- the storage host's own quota, spent for a day
      elsewhere:script("/blob", { spent(86400, 60) })
      local limiter = case.limiter()
      local opts = { policy = github, limiter = limiter, max_elapsed = 2 }
      local res = assert(rw.fetch(api:url("/download"), opts))
      assert.equal(1, res.redirects)
      local started = rw.now()
      local items, err = rw.fetch(api:url("/items"), opts)
      assert.is_not_nil(items, tostring(err))
      assert.equal("items", items.body)
      assert.is_true(rw.now() - started < 1, "the next call was not stalled")
      assert.equal(1, #api:log("/items"))
    end)
  end

  it("of the API itself still sync it when a redirect stayed on its origin", function()
    api:script("/old", { { action = "redirect", location = "/new" } })
    api:script("/new", { spent(86400, 60) })
    local limiter = rw.bucket { capacity = 2, rate = 2 }
    assert(rw.fetch(api:url("/old"), { policy = github, limiter = limiter }))
    assert.is_true(limiter:wait_time() > 86000, "the API's quota is spent: " .. limiter:wait_time())
  end)
end)
