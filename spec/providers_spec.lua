-- rw.policy, rw.policy.chain and the built-in provider policies
-- (rw.providers.NAME), against the loopback server with the header shapes
-- each API really sends.
local rw = require "ratewise"
local server = require "spec.support.server"
local core = require "ratewise.core"

local floor = math.floor

-- The server's clock as an API sends it: whole seconds.
local function http_date(epoch) return os.date("!%a, %d %b %Y %H:%M:%S GMT", floor(epoch)) end

-- RFC 3339 in UTC; a fractional epoch keeps its fraction (".500Z").
local function rfc3339(epoch)
  local whole = floor(epoch)
  local frac = epoch - whole
  local text = os.date("!%Y-%m-%dT%H:%M:%S", whole)
  if frac > 0 then text = text .. string.format(".%03d", floor(frac * 1000 + 0.5)) end
  return text .. "Z"
end

local function opts(provider, extra)
  local o = { policy = provider, on_retry = false }
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

-- Options that record each retry's delay and source and do not wait: for
-- specs about which wait was chosen, not about waiting.
local function recording(provider, extra)
  local seen = {}
  local o = opts(provider, extra)
  o.sleep = function() end
  o.max_elapsed = o.max_elapsed or 10000
  if o.hint_jitter == nil then o.hint_jitter = 0 end -- exact waits: which wait, not its spread
  o.on_retry = function(info) seen[#seen + 1] = { delay = info.delay, source = info.source } end
  return seen, o
end

-- A limiter that only records what sync was told.
local function sync_recorder()
  local calls = {}
  local limiter = {
    acquire = function() return true end,
    sync = function(_, remaining, reset_in) calls[#calls + 1] = { remaining = remaining, reset_in = reset_in } end,
  }
  return limiter, calls
end

local function gap(log, i)
  return log[i + 1].t - log[i].t
end

-- Scheduling and loopback jitter: a wait is never shorter than asked, but the
-- server's timestamps are taken a little after the client's clock reads.
local EARLY = 0.02

-- A scripted Date is fixed when the script is written: taken just after a
-- second begins, it is still the server's true second when the response
-- goes out (taken late in a second, the clock could tick first and the
-- response carry a stale Date, a second behind: a flake seen in CI).
local function second_start()
  local t = core.time()
  rw.sleep(math.ceil(t) - t + 0.005)
  return floor(core.time())
end

describe("rw.providers", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  it("are policies named after their provider, loaded on first use", function()
    for _, name in ipairs { "github", "openai", "anthropic", "stripe", "ietf" } do
      local p = rw.providers[name]
      assert.is_true(rw.policy.is_policy(p), name)
      assert.equal(name, p.name)
      assert.equal(p, require("ratewise.providers." .. name))
    end
    assert.is_nil(rw.providers.no_such_api)
  end)

  it("answer nil when their headers are absent or garbage, so the built-in behaviour applies", function()
    local garbage = {
      ["x-ratelimit-remaining"] = "none", ["x-ratelimit-reset"] = "soon", ["retry-after"] = "later",
      ["retry-after-ms"] = "-5", ["x-ratelimit-reset-requests"] = "6 minutes",
      ["x-ratelimit-reset-tokens"] = "-1s", ["x-ratelimit-remaining-requests"] = "many",
      ["x-should-retry"] = "maybe", ["stripe-should-retry"] = "1",
      ["anthropic-ratelimit-requests-reset"] = "tomorrow",
      ["anthropic-ratelimit-tokens-reset"] = "2025-13-01T00:00:00Z",
      ["anthropic-ratelimit-requests-remaining"] = "-1", ["ratelimit"] = '"default";r=0;t=',
      ["ratelimit-remaining"] = "x",
      ["ratelimit-reset"] = "-3", ["ratelimit-policy"] = '"default";q=', date = "yesterday",
    }
    local responses = {
      { status = 429, headers = {} }, { status = 503, headers = {} }, { status = 429, headers = garbage },
      { status = 200, headers = garbage }, { status = 429 }, { status = 429, headers = "not a table" },
    }
    for _, name in ipairs { "github", "openai", "anthropic", "stripe", "ietf" } do
      local p = rw.providers[name]
      for i, res in ipairs(responses) do
        if p.classify then assert.is_nil(p.classify(res), name .. " classify #" .. i) end
        if p.delay then assert.is_nil(p.delay(res, 0), name .. " delay #" .. i) end
        if p.observe then
          local limiter, calls = sync_recorder()
          p.observe(res, limiter)
          assert.same({}, calls, name .. " observe #" .. i)
        end
      end
    end
  end)

  it("leave a limiter without a sync method alone, whatever kind of object it is", function()
    local res = { status = 200, headers = { ["x-ratelimit-remaining"] = "0", ["x-ratelimit-reset"] = "1",
      ["x-ratelimit-remaining-requests"] = "0", ["anthropic-ratelimit-requests-remaining"] = "0",
      ratelimit = '"d";r=0;t=1' } }
    local raising = setmetatable({}, { __index = function(_, k) error("no method " .. k) end })
    for _, name in ipairs { "github", "openai", "anthropic", "ietf" } do
      for _, limiter in ipairs { false, 42, "bucket", {}, { sync = "not a function" }, raising, io.stdout } do
        assert.has_no.errors(function() rw.providers[name].observe(res, limiter) end, name)
      end
    end
    -- and through fetch: a limiter with acquire only, whose other fields raise
    local acquired = 0
    local strict = setmetatable({}, { __index = function(_, k)
      if k == "acquire" then return function() acquired = acquired + 1 end end
      error("no method " .. k)
    end })
    s:script("/plain", { { status = 200, headers = { ["x-ratelimit-remaining"] = "0" } } })
    assert(rw.fetch(s:url("/plain"), opts(rw.providers.github, { limiter = strict })))
    assert.equal(1, acquired)
  end)

  describe("github", function()
    local github = rw.providers.github

    it("waits out the primary limit (403, x-ratelimit-remaining: 0) until x-ratelimit-reset", function()
      local reset = os.time() + 2
      s:script("/gh", {
        { status = 403, body = '{"message":"API rate limit exceeded for user ID 1."}',
          headers = { ["x-ratelimit-limit"] = "5000", ["x-ratelimit-remaining"] = "0",
            ["x-ratelimit-used"] = "5000", ["x-ratelimit-reset"] = tostring(reset),
            ["x-ratelimit-resource"] = "core" } },
        { status = 200, body = "{}" },
      })
      local res = assert(rw.fetch(s:url("/gh"), opts(github)))
      assert.equal(2, res.attempts)
      local log = s:log("/gh")
      assert.equal(2, #log)
      local at = string.format("retry at %.3f, reset at %d", log[2].wall, reset)
      assert.is_true(log[2].wall >= reset - EARLY, at)
      assert.is_true(log[2].wall < reset + 0.5, at)
    end)

    it("measures x-ratelimit-reset against the response's Date, the server's clock", function()
      -- The server's clock is 100 s behind ours: by our clock the reset is
      -- long past, by the server's it is 1 s away.
      local server_now = os.time() - 100
      s:script("/gh-date", {
        { status = 429, headers = { date = http_date(server_now), ["x-ratelimit-remaining"] = "0",
          ["x-ratelimit-reset"] = tostring(server_now + 1) } },
        { status = 200 },
      })
      assert(rw.fetch(s:url("/gh-date"), opts(github)))
      local log = s:log("/gh-date")
      assert.equal(2, #log)
      assert.is_true(gap(log, 1) >= 1 - EARLY, "retry after " .. gap(log, 1) .. " s")
    end)

    it("gives 0 for a reset already past by the server's clock", function()
      local now = os.time() - 3600 -- the server's clock, an hour behind ours
      assert.equal(0, github.delay({ status = 403, headers = { date = http_date(now),
        ["x-ratelimit-remaining"] = "0", ["x-ratelimit-reset"] = tostring(now - 30) } }, 0))
      assert.equal(30, github.delay({ status = 403, headers = { date = http_date(now),
        ["x-ratelimit-remaining"] = "0", ["x-ratelimit-reset"] = tostring(now + 30) } }, 0))
    end)

    it("waits retry-after on a secondary limit (403 with retry-after)", function()
      local seen, o = recording(github)
      s:script("/gh-ra", {
        { status = 403, body = '{"message":"You have exceeded a secondary rate limit."}',
          headers = { ["retry-after"] = "42", ["x-ratelimit-remaining"] = "4990",
            ["x-ratelimit-reset"] = tostring(os.time() + 3000) } },
        { status = 200 },
      })
      local res = assert(rw.fetch(s:url("/gh-ra"), o))
      assert.equal(2, res.attempts)
      assert.same({ { delay = 42, source = "retry-after" } }, seen)
    end)

    it("waits at least a minute, then twice as long, on a secondary limit without retry-after", function()
      local seen, o = recording(github)
      local secondary = { status = 403,
        body = '{"message":"You have exceeded a secondary rate limit. '
          .. 'Please wait a few minutes before you try again."}',
        headers = { ["x-ratelimit-remaining"] = "4990", ["x-ratelimit-reset"] = tostring(os.time() + 3000) } }
      s:script("/gh-2nd", { secondary, secondary, { status = 200 } })
      local res = assert(rw.fetch(s:url("/gh-2nd"), o))
      assert.equal(3, res.attempts)
      assert.same({ { delay = 60, source = "policy" }, { delay = 120, source = "policy" } }, seen)
    end)

    it("does not retry a plain 403, a permission error", function()
      s:script("/gh-403", { { status = 403, body = '{"message":"Resource not accessible by integration"}',
        headers = { ["x-ratelimit-remaining"] = "4999", ["x-ratelimit-reset"] = tostring(os.time() + 3000) } } })
      local res, err = rw.fetch(s:url("/gh-403"), opts(github))
      assert.is_nil(res)
      assert.equal("terminal", err.kind)
      assert.equal(403, err.status)
      assert.equal(1, #s:log("/gh-403"))
    end)

    it("feeds x-ratelimit-remaining and the reset into the limiter, so the next request waits for it", function()
      local bucket = rw.bucket { capacity = 10, rate = 50 }
      local server_now = second_start()
      s:script("/gh-obs", {
        { status = 200, headers = { date = http_date(server_now), ["x-ratelimit-remaining"] = "0",
          ["x-ratelimit-reset"] = tostring(server_now + 1) } },
        { status = 200, headers = { ["x-ratelimit-remaining"] = "4999" } },
      })
      assert(rw.fetch(s:url("/gh-obs"), opts(github, { limiter = bucket })))
      assert(rw.fetch(s:url("/gh-obs"), opts(github, { limiter = bucket })))
      local log = s:log("/gh-obs")
      assert.equal(2, #log)
      -- at the reset: the Date is the server's clock cut to the second, and
      -- the local clock within that second tells the rest of it
      local at = string.format("second request at %.3f, reset at %d", log[2].wall, server_now + 1)
      assert.is_true(log[2].wall >= server_now + 1 - EARLY, at)
      assert.is_true(log[2].wall < server_now + 1.5, at)
    end)

    it("passes remaining and reset_in to sync", function()
      local limiter, calls = sync_recorder()
      local now = os.time() + 3600 -- the server's clock, an hour ahead of ours
      github.observe({ status = 200, headers = { date = http_date(now), ["x-ratelimit-remaining"] = "17",
        ["x-ratelimit-reset"] = tostring(now + 600) } }, limiter)
      assert.same({ { remaining = 17, reset_in = 600 } }, calls)
    end)
  end)

  describe("openai", function()
    local openai = rw.providers.openai

    it("waits retry-after-ms (milliseconds) before the retry reaches the server", function()
      s:script("/oa", {
        { status = 429, body = '{"error":{"type":"requests","code":"rate_limit_exceeded"}}',
          headers = { ["retry-after-ms"] = "300", ["x-ratelimit-limit-requests"] = "60",
            ["x-ratelimit-remaining-requests"] = "0", ["x-ratelimit-reset-requests"] = "1s" } },
        { status = 200 },
      })
      -- (a base below the hint: a hint shorter than the backoff's first step
      -- is only the backoff's floor)
      local res = assert(rw.fetch(s:url("/oa"), opts(openai, { base = 0.2 })))
      assert.equal(2, res.attempts)
      local log = s:log("/oa")
      assert.is_true(gap(log, 1) >= 0.3 - EARLY, "retry after " .. gap(log, 1) .. " s")
      assert.is_true(gap(log, 1) < 0.8, "retry after " .. gap(log, 1) .. " s")
    end)

    it("prefers retry-after-ms, then retry-after, then the longer x-ratelimit-reset-* on a 429", function()
      local seen, o = recording(openai, { max_retries = 4 })
      s:script("/oa-order", {
        { status = 429, headers = { ["retry-after-ms"] = "1250", ["retry-after"] = "1" } },
        { status = 429, headers = { ["retry-after"] = "5", ["x-ratelimit-reset-requests"] = "20s" } },
        { status = 429, headers = { ["x-ratelimit-reset-requests"] = "120ms", ["x-ratelimit-reset-tokens"] = "6m0s" } },
        { status = 429, headers = { ["x-ratelimit-reset-requests"] = "1.5s", ["x-ratelimit-reset-tokens"] = "bad" } },
        { status = 200 },
      })
      assert(rw.fetch(s:url("/oa-order"), o))
      assert.same({ 1.25, 5, 360, 1.5 }, { seen[1].delay, seen[2].delay, seen[3].delay, seen[4].delay })
      assert.same({ "policy", "retry-after", "policy", "policy" },
        { seen[1].source, seen[2].source, seen[3].source, seen[4].source })
    end)

    it("reads x-ratelimit-reset-* only on a 429", function()
      assert.is_nil(openai.delay({ status = 503, headers = { ["x-ratelimit-reset-requests"] = "20s" } }, 0))
      assert.equal(20, openai.delay({ status = 429, headers = { ["x-ratelimit-reset-requests"] = "20s" } }, 0))
    end)

    it("does not retry a 503 that says x-should-retry: false", function()
      s:script("/oa-no", { { status = 503, headers = { ["x-should-retry"] = "false" } }, { status = 200 } })
      local res, err = rw.fetch(s:url("/oa-no"), opts(openai))
      assert.is_nil(res)
      assert.equal("terminal", err.kind)
      assert.equal(503, err.status)
      assert.equal(1, #s:log("/oa-no"))
    end)

    it("retries a 400 that says x-should-retry: true", function()
      s:script("/oa-yes", { { status = 400, headers = { ["x-should-retry"] = "True" } }, { status = 200 } })
      local res = assert(rw.fetch(s:url("/oa-yes"), opts(openai, { base = 0.01 })))
      assert.equal(2, res.attempts)
      assert.is_nil(openai.classify({ status = 200, headers = { ["x-should-retry"] = "true" } }))
    end)

    it("feeds x-ratelimit-remaining-requests and x-ratelimit-reset-requests into the limiter", function()
      local bucket = rw.bucket { capacity = 10, rate = 50 }
      s:script("/oa-obs", {
        { status = 200, headers = { ["x-ratelimit-remaining-requests"] = "0", ["x-ratelimit-reset-requests"] = "500ms",
          ["x-ratelimit-remaining-tokens"] = "149000", ["x-ratelimit-reset-tokens"] = "6m0s" } },
        { status = 200 },
      })
      assert(rw.fetch(s:url("/oa-obs"), opts(openai, { limiter = bucket })))
      assert(rw.fetch(s:url("/oa-obs"), opts(openai, { limiter = bucket })))
      local log = s:log("/oa-obs")
      assert.is_true(gap(log, 1) >= 0.5 - EARLY, "second request after " .. gap(log, 1) .. " s")
      assert.is_true(gap(log, 1) < 1, "second request after " .. gap(log, 1) .. " s")
      local limiter, calls = sync_recorder()
      openai.observe({ status = 200, headers = { ["x-ratelimit-remaining-requests"] = "59",
        ["x-ratelimit-reset-requests"] = "1s" } }, limiter)
      assert.same({ { remaining = 59, reset_in = 1 } }, calls)
    end)
  end)

  describe("replaying a POST the server refused", function()
    it("openai: a rate-limited POST is sent again (a 429 was not acted on)", function()
      s:script("/v1/chat", { { status = 429, headers = { ["retry-after-ms"] = "50" } }, { status = 200 } })
      local res = assert(rw.fetch(s:url("/v1/chat"), { method = "POST", body = "{}", policy = rw.providers.openai,
        on_retry = false }))
      assert.equal(2, res.attempts)
      assert.equal(2, #s:log("/v1/chat"))
    end)

    it("openai: a POST that failed with a 500 is not, unless x-should-retry says true", function()
      s:script("/v1/a", { { status = 500 }, { status = 200 } })
      local _, err = rw.fetch(s:url("/v1/a"), { method = "POST", policy = rw.providers.openai, on_retry = false })
      assert.equal("unsafe", err.kind)
      assert.equal(1, #s:log("/v1/a"))
      s:script("/v1/b", { { status = 500, headers = { ["x-should-retry"] = "true" } }, { status = 200 } })
      assert(rw.fetch(s:url("/v1/b"), { method = "POST", policy = rw.providers.openai, on_retry = false,
        sleep = function() end }))
      assert.equal(2, #s:log("/v1/b"))
    end)

    it("anthropic: an overloaded (529) POST is sent again", function()
      s:script("/v1/messages", { { status = 529 }, { status = 200 } })
      assert(rw.fetch(s:url("/v1/messages"), { method = "POST", policy = rw.providers.anthropic, on_retry = false,
        sleep = function() end }))
      assert.equal(2, #s:log("/v1/messages"))
    end)

    it("openai and anthropic: a POST the server timed out waiting for (408) is sent again", function()
      for _, name in ipairs { "openai", "anthropic" } do
        local path = "/v1/timeout-" .. name
        s:script(path, { { status = 408 }, { status = 200 } })
        local res = assert(rw.fetch(s:url(path), { method = "POST", body = "{}", policy = name, on_retry = false,
          sleep = function() end }))
        assert.equal(200, res.status)
        assert.equal(2, #s:log(path), name)
      end
    end)

    it("openai and anthropic: x-should-retry: false keeps even a 429's POST from a replay", function()
      for _, name in ipairs { "openai", "anthropic" } do
        assert.is_nil(rw.providers[name].replayable({ status = 429, headers = { ["x-should-retry"] = "false" } },
          "POST"), name)
        assert.is_true(rw.providers[name].replayable({ status = 502, headers = { ["x-should-retry"] = "true" } },
          "POST"), name)
        assert.is_nil(rw.providers[name].replayable({ status = 502, headers = {} }, "POST"), name)
      end
      assert.is_nil(rw.providers.openai.replayable({ status = 529, headers = {} }, "POST"))
      assert.is_true(rw.providers.anthropic.replayable({ status = 529, headers = {} }, "POST"))
    end)

    it("without a policy that says so, a POST is never replayed", function()
      s:script("/plain", { { status = 429, headers = { ["Retry-After"] = "0" } }, { status = 200 } })
      local _, err = rw.fetch(s:url("/plain"), { method = "POST", on_retry = false })
      assert.equal("unsafe", err.kind)
      assert.equal(1, #s:log("/plain"))
    end)
  end)

  describe("anthropic", function()
    local anthropic = rw.providers.anthropic

    it("retries 529 (overloaded)", function()
      s:script("/an-529", {
        { status = 529, body = '{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}' },
        { status = 200 },
      })
      local res = assert(rw.fetch(s:url("/an-529"), opts(anthropic, { base = 0.01 })))
      assert.equal(2, res.attempts)
      assert.equal(2, #s:log("/an-529"))
      -- without the policy, 529 is terminal
      s:script("/an-529", { { status = 529 } })
      local _, err = rw.fetch(s:url("/an-529"), { on_retry = false })
      assert.equal("terminal", err.kind)
    end)

    it("does not retry when x-should-retry: false, even a 529", function()
      s:script("/an-no", { { status = 529, headers = { ["x-should-retry"] = "false" } } })
      local _, err = rw.fetch(s:url("/an-no"), opts(anthropic))
      assert.equal("terminal", err.kind)
      assert.equal(1, #s:log("/an-no"))
    end)

    it("waits retry-after, else until the latest anthropic-ratelimit-*-reset on a 429", function()
      local seen, o = recording(anthropic)
      local now = os.time() - 50 -- the server's clock, behind ours
      s:script("/an-429", {
        { status = 429, headers = { ["retry-after"] = "7",
          ["anthropic-ratelimit-requests-reset"] = rfc3339(now + 30) } },
        { status = 429, headers = { date = http_date(now),
          ["anthropic-ratelimit-requests-remaining"] = "0",
          ["anthropic-ratelimit-requests-reset"] = rfc3339(now + 2),
          ["anthropic-ratelimit-tokens-reset"] = rfc3339(now + 5.5),
          ["anthropic-ratelimit-input-tokens-reset"] = rfc3339(now + 3),
          ["anthropic-ratelimit-output-tokens-reset"] = "garbage" } },
        { status = 200 },
      })
      assert(rw.fetch(s:url("/an-429"), o))
      assert.equal(7, seen[1].delay)
      assert.is_true(math.abs(seen[2].delay - 5.5) < 1e-6, tostring(seen[2].delay))
      assert.same({ "retry-after", "policy" }, { seen[1].source, seen[2].source })
    end)

    it("reads offsets and lower-case RFC 3339, and gives 0 for a reset already past", function()
      local now = os.time() - 600 -- the server's clock, behind ours
      local function wait(reset)
        return anthropic.delay({ status = 429, headers = { date = http_date(now),
          ["anthropic-ratelimit-tokens-reset"] = reset } }, 0)
      end
      assert.equal(30, wait(os.date("!%Y-%m-%dT%H:%M:%S+02:00", now + 30 + 7200)))
      assert.equal(30, wait(rfc3339(now + 30):lower()))
      assert.equal(0, wait(rfc3339(now - 30)))
    end)

    it("feeds the request quota into the limiter, so the next request waits for the reset", function()
      local bucket = rw.bucket { capacity = 10, rate = 50 }
      local now = second_start()
      s:script("/an-obs", {
        { status = 200, headers = { date = http_date(now), ["anthropic-ratelimit-requests-limit"] = "50",
          ["anthropic-ratelimit-requests-remaining"] = "0",
          ["anthropic-ratelimit-requests-reset"] = rfc3339(now + 0.5) } },
        { status = 200 },
      })
      assert(rw.fetch(s:url("/an-obs"), opts(anthropic, { limiter = bucket })))
      assert(rw.fetch(s:url("/an-obs"), opts(anthropic, { limiter = bucket })))
      local log = s:log("/an-obs")
      local at = string.format("second request at %.3f, reset at %.3f", log[2].wall, now + 0.5)
      assert.is_true(log[2].wall >= now + 0.5 - EARLY, at)
      assert.is_true(log[2].wall < now + 1, at)
    end)
  end)

  describe("stripe", function()
    local stripe = rw.providers.stripe

    it("retries a 409 and sends the same generated Idempotency-Key on every attempt of a POST", function()
      s:script("/st", {
        { status = 409, body = '{"error":{"type":"idempotency_error"}}' },
        { status = 409, body = '{"error":{"code":"lock_timeout"}}' },
        { status = 200 },
      })
      local res = assert(rw.fetch(s:url("/st"), opts(stripe, { method = "POST", body = "amount=100", base = 0.01 })))
      assert.equal(3, res.attempts)
      local log = s:log("/st")
      assert.equal(3, #log)
      local key = log[1].headers["idempotency-key"]
      assert.matches("^%x+%-%x+%-4%x+%-[89ab]%x+%-%x+$", key)
      assert.equal(key, log[2].headers["idempotency-key"])
      assert.equal(key, log[3].headers["idempotency-key"])
      -- a new call gets a new key
      assert(rw.fetch(s:url("/st"), opts(stripe, { method = "POST" })))
      assert.not_equal(key, s:log("/st")[4].headers["idempotency-key"])
    end)

    it("keeps a key the caller gave, as an option or as a header in any case", function()
      s:script("/st-key", { { status = 200 } })
      assert(rw.fetch(s:url("/st-key"), opts(stripe, { method = "POST", idempotency_key = "order-17" })))
      assert(rw.fetch(s:url("/st-key"), opts(stripe, { method = "post", headers = { ["IDEMPOTENCY-KEY"] = "mine" } })))
      local log = s:log("/st-key")
      assert.equal("order-17", log[1].headers["idempotency-key"])
      assert.equal("mine", log[2].headers["idempotency-key"])
    end)

    it("adds no key to other methods", function()
      s:script("/st-get", { { status = 200 } })
      assert(rw.fetch(s:url("/st-get"), opts(stripe)))
      assert(rw.fetch(s:url("/st-get"), opts(stripe, { method = "DELETE" })))
      for _, seen in ipairs(s:log("/st-get")) do assert.is_nil(seen.headers["idempotency-key"]) end
    end)

    it("follows Stripe-Should-Retry over the status", function()
      s:script("/st-no", { { status = 500, headers = { ["Stripe-Should-Retry"] = "false" } }, { status = 200 } })
      local _, err = rw.fetch(s:url("/st-no"), opts(stripe, { method = "POST" }))
      assert.equal("terminal", err.kind)
      assert.equal(1, #s:log("/st-no"))
      s:script("/st-yes", { { status = 400, headers = { ["Stripe-Should-Retry"] = "true" } }, { status = 200 } })
      local res = assert(rw.fetch(s:url("/st-yes"), opts(stripe, { method = "POST", base = 0.01 })))
      assert.equal(2, res.attempts)
    end)
  end)

  describe("ietf", function()
    local ietf = rw.providers.ietf

    it("waits t seconds of RateLimit: r=0 before the retry reaches the server", function()
      s:script("/ie", {
        { status = 429, headers = { ["RateLimit-Policy"] = '"default";q=100;w=60', RateLimit = '"default";r=0;t=1' } },
        { status = 200 },
      })
      local res = assert(rw.fetch(s:url("/ie"), opts(ietf)))
      assert.equal(2, res.attempts)
      local log = s:log("/ie")
      assert.is_true(gap(log, 1) >= 1 - EARLY, "retry after " .. gap(log, 1) .. " s")
      assert.is_true(gap(log, 1) < 1.5, "retry after " .. gap(log, 1) .. " s")
    end)

    it("reads every shape of the fields, most restrictive quota first", function()
      local cases = {
        { 7, { RateLimit = '"default";r=0;t=7' } },
        { 7, { RateLimit = '"default"; t=7; r=0' } },                 -- parameters in any order, spaces
        { 7, { RateLimit = 'default ;r=0 ;t=7' } },                   -- a token name, space before ';'
        { 30, { RateLimit = '"burst";r=5;t=1, "hour";r=0;t=30, "day";r=0;t=10' } },
        { 2, { RateLimit = '"x";r=0;t=2;pk=:cHJvamVjdC0xMjM=:' } },   -- a partition key
        { 60, { RateLimit = '"hour";r=0', ["RateLimit-Policy"] = '"day";q=1000;w=86400, "hour";q=100;w=60' } },
        { 9, { RateLimit = "limit=100, remaining=0, reset=9" } },     -- draft 07, a Dictionary
        { 4, { ["RateLimit-Remaining"] = "0", ["RateLimit-Reset"] = "4", ["RateLimit-Limit"] = "100" } },
        { 3, { RateLimit = '("a" "b");r=0;t=3' } },                   -- an inner list
      }
      for _, case in ipairs(cases) do
        assert.equal(case[1], ietf.delay({ status = 429, headers = case[2] }, 0), case[2].RateLimit)
      end
      assert.equal(5, ietf.delay({ status = 503, headers = { RateLimit = '"d";r=0;t=5' } }, 0))
    end)

    it("gives no wait for quota left, another status, or a malformed field", function()
      local none = {
        { status = 429, headers = { RateLimit = '"default";r=3;t=7' } },
        { status = 500, headers = { RateLimit = '"default";r=0;t=7' } },
        { status = 429, headers = { RateLimit = '"default;r=0;t=7' } },   -- unterminated string
        { status = 429, headers = { RateLimit = '"default";r=0;t=7,' } }, -- trailing comma
        { status = 429, headers = { RateLimit = '"default";r=-1;t=7' } },
        { status = 429, headers = { RateLimit = '"default";R=0;T=7' } },  -- keys are lower case
        { status = 429, headers = { RateLimit = '"default";r=0;t=7 garbage' } },
        { status = 429, headers = { RateLimit = '"default";r=0;t=1234567890123456' } },
        { status = 429, headers = { RateLimit = "\"d\";r=0;t=7\0" } },
        { status = 429, headers = { RateLimit = "" } },
        { status = 429, headers = { ["RateLimit-Remaining"] = "0", ["RateLimit-Reset"] = "soon" } },
      }
      for _, res in ipairs(none) do
        assert.is_nil(ietf.delay(res, 0), res.headers.RateLimit)
      end
    end)

    it("falls back to the built-in wait when the fields say nothing", function()
      local seen, o = recording(ietf)
      s:script("/ie-none", { { status = 429, headers = { RateLimit = "nonsense;;", ["Retry-After"] = "3" } },
        { status = 200 } })
      assert(rw.fetch(s:url("/ie-none"), o))
      assert.same({ { delay = 3, source = "retry-after" } }, seen)
    end)

    it("feeds the quota into the limiter, so the next request waits for the reset", function()
      local bucket = rw.bucket { capacity = 10, rate = 50 }
      s:script("/ie-obs", {
        { status = 200, headers = { ["RateLimit-Policy"] = '"default";q=10;w=1', RateLimit = '"default";r=0;t=1' } },
        { status = 200 },
      })
      assert(rw.fetch(s:url("/ie-obs"), opts(ietf, { limiter = bucket })))
      assert(rw.fetch(s:url("/ie-obs"), opts(ietf, { limiter = bucket })))
      local log = s:log("/ie-obs")
      assert.is_true(gap(log, 1) >= 1 - EARLY, "second request after " .. gap(log, 1) .. " s")
      assert.is_true(gap(log, 1) < 1.5, "second request after " .. gap(log, 1) .. " s")
      local limiter, calls = sync_recorder()
      ietf.observe({ status = 200, headers = { RateLimit = '"a";r=40;t=30, "b";r=3;t=2' } }, limiter)
      ietf.observe({ status = 200, headers = { ["RateLimit-Remaining"] = "12" } }, limiter)
      assert.same({ { remaining = 3, reset_in = 2 }, { remaining = 12 } }, calls)
    end)
  end)
end)

describe("rw.policy", function()
  local s

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  it("lets prepare add a header the server sees, without touching the caller's table", function()
    local mine = { Accept = "application/json" }
    local p = rw.policy {
      name = "tagger",
      prepare = function(request) request.headers["X-Request-Source"] = "ratewise-spec" end,
    }
    assert(rw.fetch(s:url("/prep"), { policy = p, headers = mine, on_retry = false }))
    local seen = s:log("/prep")[1]
    assert.equal("ratewise-spec", seen.headers["x-request-source"])
    assert.equal("application/json", seen.headers["accept"])
    assert.same({ Accept = "application/json" }, mine)
  end)

  it("lets classify make a 404 retryable, and delay choose the wait", function()
    local delays = {}
    local p = rw.policy {
      classify = function(res) if res.status == 404 then return "retryable" end end,
      delay = function(res) if res.status == 404 then return 0.2 end end,
    }
    s:script("/eventually", { { status = 404 }, { status = 200, body = "there" } })
    local res = assert(rw.fetch(s:url("/eventually"), {
      -- (a wait below the backoff's first step, base, would be backed off)
      policy = p, hint_jitter = 0, base = 0.1, on_retry = function(info) delays[#delays + 1] = info.delay end,
    }))
    assert.equal("there", res.body)
    local log = s:log("/eventually")
    assert.equal(2, #log)
    assert.same({ 0.2 }, delays)
    assert.is_true(gap(log, 1) >= 0.2 - EARLY)
  end)

  it("chains policies: the first non-nil answer wins, observe and prepare run for all in order", function()
    local order = {}
    local retry_404 = rw.policy {
      name = "retry_404",
      classify = function(res) if res.status == 404 then return "retryable" end end,
      observe = function() order[#order + 1] = "retry_404" end,
      prepare = function(request) request.headers["X-First"] = "1" end,
    }
    local stop_404 = rw.policy {
      name = "stop_404",
      classify = function(res) if res.status == 404 then return "terminal" end end,
      delay = function() return 0.01 end,
      observe = function() order[#order + 1] = "stop_404" end,
      prepare = function(request) request.headers["X-Second"] = "2" end,
    }
    s:script("/chain", { { status = 404 }, { status = 200 } })
    local seen, o = recording(rw.policy.chain(retry_404, stop_404), { base = 0.01 })
    local res = assert(rw.fetch(s:url("/chain"), o))
    assert.equal(2, res.attempts)
    assert.same({ { delay = 0.01, source = "policy" } }, seen) -- retry_404 has no delay: stop_404's answers
    assert.same({ "retry_404", "stop_404", "retry_404", "stop_404" }, order)
    local first = s:log("/chain")[1]
    assert.same({ "1", "2" }, { first.headers["x-first"], first.headers["x-second"] })

    s:reset()
    s:script("/chain", { { status = 404 }, { status = 200 } })
    local _, err = rw.fetch(s:url("/chain"), { policy = rw.policy.chain(stop_404, retry_404), on_retry = false })
    assert.equal("terminal", err.kind)
    assert.equal(1, #s:log("/chain"))
    assert.equal("stop_404+retry_404", rw.policy.chain(stop_404, retry_404).name)
  end)

  it("chains a provider with a policy of one's own", function()
    local p = rw.policy.chain(rw.providers.github, {
      prepare = function(request) request.headers["X-GitHub-Api-Version"] = "2022-11-28" end,
    })
    s:script("/gh-chain", { { status = 403, headers = { ["x-ratelimit-remaining"] = "4999" } } })
    local _, err = rw.fetch(s:url("/gh-chain"), { policy = p, on_retry = false })
    assert.equal("terminal", err.kind)
    assert.equal("2022-11-28", s:log("/gh-chain")[1].headers["x-github-api-version"])
  end)

  it("lets a replayable hook allow a retry of a POST", function()
    local seen = {}
    local p = rw.policy { replayable = function(res, method)
      seen[#seen + 1] = method
      return res and res.status == 503 or nil
    end }
    s:script("/rp", { { status = 503 }, { status = 200 } })
    assert(rw.fetch(s:url("/rp"), { method = "POST", policy = p, on_retry = false, sleep = function() end }))
    assert.same({ "POST" }, seen)
    assert.equal(2, #s:log("/rp"))
  end)

  it("raises for an unknown field or a hook that is not a function, naming it", function()
    assert.error_matches(function() rw.policy { clasify = function() end } end, "unknown field 'clasify'")
    assert.error_matches(function() rw.policy { delay = 5 } end, "hook 'delay' must be a function")
    assert.error_matches(function() rw.policy { name = 5 } end, "'name' must be a string")
    assert.error_matches(function() rw.policy.chain(rw.providers.openai, { retry = true }) end, "unknown field 'retry'")
    assert.error_matches(function() rw.fetch(s:url("/x"), { policy = { classify = function() end } }) end,
      "option 'policy'")
  end)
end)

-- One hostile or broken response must not stall every later call through a
-- shared bucket: a sync believes a reset only up to the bucket's
-- sync_horizon (a day by default), and a Date more than a day off the local
-- clock is not taken for the server's clock.
describe("a hostile rate-limit response", function()
  local s
  local DAY = 86400
  local EPOCH_1970 = "Thu, 01 Jan 1970 00:00:00 GMT"

  setup(function() s = server.start() end)
  teardown(function() s:stop() end)
  before_each(function() s:reset() end)

  -- One call through `provider` whose response carries `headers`, with
  -- `limiter`; returns what the server saw.
  local function call_with(provider, limiter, headers)
    s:script("/hostile", { { status = 200, headers = headers } })
    assert(rw.fetch(s:url("/hostile"), opts(provider, { limiter = limiter })))
    return s:log("/hostile")
  end

  it("github: x-ratelimit-reset 3,000 years ahead puts a shared bucket at most a day into debt", function()
    local bucket = rw.bucket { capacity = 10, rate = 1 }
    local log = call_with(rw.providers.github, bucket,
      { ["x-ratelimit-remaining"] = "0", ["x-ratelimit-reset"] = "99999999999" })
    assert.equal(1, #log)
    local wait = bucket:wait_time()
    assert.is_true(wait <= DAY and wait > DAY - 5, "the bucket waits " .. wait .. " s")
  end)

  it("github: the bucket's own sync_horizon bounds it further", function()
    local bucket = rw.bucket { capacity = 10, rate = 1, sync_horizon = 2 }
    call_with(rw.providers.github, bucket, { ["x-ratelimit-remaining"] = "0", ["x-ratelimit-reset"] = "99999999999" })
    assert.is_true(bucket:wait_time() <= 2, "the bucket waits " .. bucket:wait_time() .. " s")
    -- and the next call through it goes out after that wait, not in 3,000 years
    local t0 = rw.now()
    s:script("/after", { { status = 200 } })
    assert(rw.fetch(s:url("/after"), opts(rw.providers.github, { limiter = bucket })))
    assert.is_true(rw.now() - t0 < 3, "the next call took " .. (rw.now() - t0) .. " s")
    assert.equal(1, #s:log("/after"))
  end)

  it("github: a reset against Date: 1970 is measured by the local clock (5 s, not 56 years)", function()
    local bucket = rw.bucket { capacity = 10, rate = 1 }
    call_with(rw.providers.github, bucket, { date = EPOCH_1970, ["x-ratelimit-remaining"] = "0",
      ["x-ratelimit-reset"] = tostring(os.time() + 5) })
    local wait = bucket:wait_time()
    assert.is_true(wait > 3.5 and wait <= 5.5, "the bucket waits " .. wait .. " s")
    -- and so is the wait before a retry of a 403 that says so
    local seen, o = recording(rw.providers.github)
    s:script("/gh-1970", {
      { status = 403, headers = { date = EPOCH_1970, ["x-ratelimit-remaining"] = "0",
        ["x-ratelimit-reset"] = tostring(os.time() + 5) } },
      { status = 200 },
    })
    assert(rw.fetch(s:url("/gh-1970"), o))
    assert.equal(1, #seen)
    assert.is_true(seen[1].delay > 3.5 and seen[1].delay <= 5.5, "retried after " .. seen[1].delay .. " s")
  end)

  it("a Date more than a day off makes a Retry-After date count from the local clock", function()
    local later = os.time() + 30
    -- Against 1970 this date would be 56 years away; against 2100, long past.
    local d = rw.retry_delay({ date = EPOCH_1970, ["retry-after"] = http_date(later) }, 0)
    assert.is_true(d > 28 and d <= 30, tostring(d))
    d = rw.retry_delay({ date = "Fri, 01 Jan 2100 00:00:00 GMT", ["retry-after"] = http_date(later) }, 0)
    assert.is_true(d > 28 and d <= 30, tostring(d))
    -- A Date within a day of the local clock is still the server's clock.
    d = rw.retry_delay({ date = http_date(os.time() - 3600), ["retry-after"] = http_date(os.time() - 3600 + 30) }, 0)
    assert.equal(30, d)
  end)

  -- Each provider's own reset field, pushed out of all reason.
  local rows = {
    { "anthropic: an RFC 3339 reset in the year 9999", "anthropic",
      { ["anthropic-ratelimit-requests-remaining"] = "0",
        ["anthropic-ratelimit-requests-reset"] = "9999-12-31T23:59:59Z" } },
    { "anthropic: a reset against Date: 1970", "anthropic",
      { date = EPOCH_1970, ["anthropic-ratelimit-requests-remaining"] = "0",
        ["anthropic-ratelimit-requests-reset"] = "2030-01-01T00:00:00Z" } },
    { "openai: a reset of 99999999 hours", "openai",
      { ["x-ratelimit-remaining-requests"] = "0", ["x-ratelimit-reset-requests"] = "99999999h" } },
    { "ietf: t of 999999999999999 seconds", "ietf", { RateLimit = '"default";r=0;t=999999999999999' } },
    { "ietf: a window w of 999999999999999 seconds", "ietf",
      { RateLimit = '"default";r=0', ["RateLimit-Policy"] = '"default";q=10;w=999999999999999' } },
    { "ietf draft 06: RateLimit-Reset of 999999999999999", "ietf",
      { ["RateLimit-Remaining"] = "0", ["RateLimit-Reset"] = "999999999999999" } },
  }
  for _, row in ipairs(rows) do
    it(row[1] .. " puts a shared bucket at most a day into debt, through rw.limiters too", function()
      local bucket = rw.bucket { capacity = 10, rate = 1 }
      call_with(rw.providers[row[2]], rw.limiters { bucket }, row[3])
      local wait = bucket:wait_time()
      assert.is_true(wait <= DAY and wait > 60, "the bucket waits " .. wait .. " s")
    end)
  end
end)

-- The LLM providers' token rules on hand-made requests and answers (what
-- the mock counts of them: spec/llm_limits_spec.lua).
local function ceil_div(a, b) return math.ceil(a / b) end

describe("the LLM providers' token rules", function()
  local openai, anthropic = rw.providers.openai, rw.providers.anthropic
  local function answer(status, headers, body)
    return setmetatable({ status = status, headers = headers or {}, body = body or "" },
      require("ratewise.response").mt)
  end

  it("estimate a chat request as each provider counts it at admission", function()
    local body = { model = "m", max_tokens = 100, n = 3, system = "sys.",
      messages = { { role = "user", content = "héllo wörld" }, -- 11 characters, 13 bytes
        { role = "user", content = { { type = "text", text = "abcd" }, { type = "image" } } } } }
    assert.same({ requests = 1, tokens = (ceil_div(4 + 11 + 4, 4) + 100) * 3 }, openai.cost { json = body })
    body.max_tokens, body.max_completion_tokens = nil, 20
    assert.same({ requests = 1, tokens = (5 + 20) * 3 }, openai.cost { json = body })
    body.max_completion_tokens, body.n = nil, nil
    assert.same({ requests = 1, tokens = 5 + 4096 }, openai.cost { json = body })
    body.max_tokens = 300
    assert.same({ requests = 1, input_tokens = 5, output_tokens = 300 }, anthropic.cost { json = body })
    assert.is_nil(anthropic.cost { body = "not json" })
  end)

  it("settle: Anthropic from the usage, nothing for a refusal; OpenAI never", function()
    local taken = { requests = 1, input_tokens = 50, output_tokens = 400 }
    local ok = answer(200, {}, '{"usage": {"input_tokens": 60, "output_tokens": 90, "cache_creation_input_tokens": 5}}')
    assert.same({ input_tokens = 65, output_tokens = 90 }, anthropic.settle(ok, taken))
    assert.same({ requests = 0, input_tokens = 0, output_tokens = 0 }, anthropic.settle(answer(429), taken))
    assert.same({ requests = 0, input_tokens = 0, output_tokens = 0 }, anthropic.settle(answer(529), taken))
    assert.is_nil(anthropic.settle(answer(500), taken))
    assert.is_nil(anthropic.settle(answer(200, {}, "<html>"), taken))
    assert.is_nil(anthropic.settle(answer(200, {}, '{"usage": {"input_tokens": "x"}}'), taken))
    -- a hostile count (negative, or 1e999: infinite once decoded) is no count
    assert.is_nil(anthropic.settle(answer(200, {}, '{"usage": {"input_tokens": 1e999, "output_tokens": 5}}'), taken))
    assert.is_nil(anthropic.settle(answer(200, {}, '{"usage": {"input_tokens": 5, "output_tokens": -1}}'), taken))
    assert.same({ input_tokens = 5, output_tokens = 2 }, anthropic.settle(answer(200, {},
      '{"usage": {"input_tokens": 5, "output_tokens": 2, "cache_creation_input_tokens": 1e999}}'), taken))
    assert.is_nil(openai.settle)
  end)

  it("observe syncs the token limits a composite has from the remaining-token headers", function()
    local function named()
      local b = { requests = rw.bucket { capacity = 100, rate = 1 },
        tokens = rw.bucket { capacity = 10000, rate = 1 },
        input_tokens = rw.bucket { capacity = 10000, rate = 1 },
        output_tokens = rw.bucket { capacity = 10000, rate = 1 } }
      return rw.limiters(b), b
    end
    local limiter, b = named()
    openai.observe(answer(200, { ["x-ratelimit-remaining-requests"] = "40", ["x-ratelimit-reset-requests"] = "1s",
      ["x-ratelimit-remaining-tokens"] = "2500", ["x-ratelimit-reset-tokens"] = "6m0s",
      ["x-ratelimit-limit-tokens"] = "30000" }), limiter)
    assert.near(40, b.requests:tokens(), 0.1)
    assert.near(2500, b.tokens:tokens(), 1)
    assert.near(10000, b.output_tokens:tokens(), 1)
    limiter, b = named()
    local soon = rfc3339(os.time() + 30)
    anthropic.observe(answer(200, { ["anthropic-ratelimit-input-tokens-remaining"] = "700",
      ["anthropic-ratelimit-input-tokens-reset"] = soon, ["anthropic-ratelimit-output-tokens-remaining"] = "0",
      ["anthropic-ratelimit-output-tokens-reset"] = soon }), limiter)
    assert.near(700, b.input_tokens:tokens(), 1)
    local wait = b.output_tokens:wait_time(1)
    assert.is_true(wait > 20 and wait <= 31, tostring(wait)) -- nothing left: the next token at the reset
    assert.near(100, b.requests:tokens(), 0.1)
    -- a plain bucket is told of requests only
    local plain = rw.bucket { capacity = 100, rate = 1 }
    openai.observe(answer(200, { ["x-ratelimit-remaining-tokens"] = "3" }), plain)
    assert.near(100, plain:tokens(), 0.1)
  end)
end)
