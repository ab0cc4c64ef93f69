-- lua/ratewise/fetch/decision.lua on its own, without a server, as
-- urllib3's test_retry.py tests its Retry: a table of cases (status,
-- headers, attempt, time left, method, policy -> decision). The clock and
-- the jitter's draw are fixed, so every wait is exact. What carries a
-- decision out (hooks, counters, the wait) is fetch/carry.lua's, covered by
-- the fetch specs against real servers.
local decision = require "ratewise.fetch.decision"
local plan = require "ratewise.fetch.plan"
local policy_module = require "ratewise.policy"
local providers = require("ratewise").providers

local NOW = 1000 -- the monotonic clock, which the deadline is on
local EPOCH = 1700000000 -- the wall clock, which HTTP-dates are read against
local URL = "http://api.test/x"
local function http_date(t) return os.date("!%a, %d %b %Y %H:%M:%S GMT", t) end

local function clock(u)
  return { now = function() return NOW end, time = function() return EPOCH end,
    random = function() return u or 0.5 end }
end

-- The call and outcome a case describes. Defaults: a replay-safe GET at
-- its first attempt, 100 s left, no jitter on a backoff or a hint.
local function inputs(case)
  local opts = { jitter = "none", hint_jitter = 0 }
  for k, v in pairs(case.opts or {}) do opts[k] = v end
  local retries = case.retries or 0
  local call = {
    method = case.method or "GET", shown_url = URL, safe = case.safe ~= false, policy = case.policy,
    budget = case.budget, retry_after = case.retry_after, retry_after_max = case.retry_after_max,
    retries = retries, attempts = retries + 1, deadline = NOW + (case.left or 100), max_elapsed = 120, opts = opts,
    budget_cut = case.budget_cut, answers = case.answers,
  }
  local res = case.status and { status = case.status, headers = case.headers or {} } or nil
  return call, res, case.error
end

local function decide(case)
  local call, res, terr = inputs(case)
  return decision.decide(call, res, terr, clock(case.u))
end

local function check(case, d)
  local want = case.want
  for k, v in pairs(want) do
    if k == "message" then
      assert(d.message and d.message:find(v, 1, true), ("%s: message %q lacks %q"):format(case.name,
        tostring(d.message), v))
    elseif k == "delay" then
      assert(d.delay and math.abs(d.delay - v) < 1e-9, ("%s: delay %s, expected %s"):format(case.name,
        tostring(d.delay), v))
    else
      assert(d[k] == v, ("%s: %s = %s, expected %s"):format(case.name, k, tostring(d[k]), tostring(v)))
    end
  end
end

local refused = { message = "connection refused", retryable = true, sent = false }
local timed_out = { message = "timed out", retryable = true, sent = true, timeout = true }
local bad_cert = { message = "certificate has expired", retryable = false, tls = true, sent = false }

local policy_with = policy_module.new
local function yes() return true end

local cases = {
  -- the verdict on a status
  { name = "200", status = 200, want = { action = "return", class = "success", throttled = false } },
  { name = "201", status = 201, want = { action = "return", class = "success" } },
  { name = "204", status = 204, want = { action = "return", class = "success" } },
  { name = "301 not followed", status = 301, want = { action = "return", class = "terminal" } },
  { name = "304", status = 304, want = { action = "return", class = "terminal" } },
  { name = "400", status = 400, want = { action = "fail", kind = "terminal",
    message = "GET " .. URL .. ": 400 is a terminal status, not retried" } },
  { name = "401", status = 401, want = { action = "fail", kind = "terminal" } },
  { name = "404", status = 404, want = { action = "fail", kind = "terminal", class = "terminal" } },
  { name = "413 without Retry-After", status = 413, want = { action = "fail", kind = "terminal" } },
  { name = "413 with Retry-After", status = 413, headers = { ["retry-after"] = "5" },
    want = { action = "retry", delay = 5, source = "retry-after", class = "retryable" } },
  { name = "408", status = 408, want = { action = "retry", delay = 1, source = "backoff", throttled = false } },
  -- a 429 that names no wait backs off from a shorter first step: such a
  -- limit (nginx's limit_req) refills in milliseconds
  { name = "429", status = 429, want = { action = "retry", delay = decision.THROTTLE_BASE, source = "backoff",
    throttled = true } },
  { name = "429 at its third retry", status = 429, retries = 2,
    want = { action = "retry", delay = 4 * decision.THROTTLE_BASE, source = "backoff" } },
  { name = "429 with the caller's base", status = 429, opts = { base = 2 },
    want = { action = "retry", delay = 2, source = "backoff" } },
  { name = "500", status = 500, want = { action = "retry", delay = 1, source = "backoff", backoff = 1 } },
  { name = "502", status = 502, want = { action = "retry", source = "backoff" } },
  { name = "503", status = 503, want = { action = "retry", source = "backoff" } },
  { name = "504", status = 504, want = { action = "retry", source = "backoff" } },
  { name = "503 at the third retry: 2^2 s", status = 503, retries = 2,
    want = { action = "retry", delay = 4, source = "backoff" } },

  -- the server's hint: a minimum wait
  { name = "Retry-After seconds", status = 503, headers = { ["retry-after"] = "7" },
    want = { action = "retry", delay = 7, source = "retry-after", throttled = true, hint = 7 } },
  { name = "Retry-After HTTP-date against Date", status = 429,
    headers = { ["retry-after"] = http_date(EPOCH + 30), date = http_date(EPOCH) },
    want = { action = "retry", delay = 30, source = "retry-after" } },
  { name = "Retry-After HTTP-date against the clock", status = 429,
    headers = { ["retry-after"] = http_date(EPOCH + 20) },
    want = { action = "retry", delay = 20, source = "retry-after" } },
  { name = "Retry-After: 0 backs off", status = 503, headers = { ["retry-after"] = "0" },
    want = { action = "retry", delay = 1, source = "backoff", throttled = true } },
  { name = "Retry-After below the backoff's first step backs off", status = 503,
    headers = { ["retry-after"] = "0.000001" },
    want = { action = "retry", delay = 1, source = "backoff", throttled = true } },
  { name = "a backoff never shorter than such a hint", status = 429, headers = { ["retry-after"] = "0.5" },
    opts = { jitter = "full" }, u = 0.001, want = { action = "retry", delay = 0.5, source = "backoff" } },
  { name = "a hint at the first step is the wait", status = 429, headers = { ["retry-after"] = "0.5" },
    opts = { base = 0.5 }, want = { action = "retry", delay = 0.5, source = "retry-after" } },
  { name = "a policy's hint below the first step backs off", status = 429, policy = policy_with { delay = yes },
    answers = { policy_delay = 0.000001 }, want = { action = "retry", delay = decision.THROTTLE_BASE,
      source = "backoff" } },
  { name = "a hint below the first step is not deferred", status = 429, headers = { ["retry-after"] = "0.000001" },
    retry_after = "defer", want = { action = "retry", delay = decision.THROTTLE_BASE, source = "backoff" } },
  { name = "the delay option cannot undercut such a hint", status = 429, headers = { ["retry-after"] = "0.5" },
    opts = { delay = yes, jitter = "full" }, u = 0.001, answers = { delay = 0.1 },
    want = { action = "retry", delay = 0.5, source = "backoff" } },
  { name = "a hint is not cut to max_delay", status = 429, headers = { ["retry-after"] = "30" },
    opts = { max_delay = 2 }, want = { action = "retry", delay = 30, source = "retry-after" } },
  { name = "a hint spread past itself", status = 429, headers = { ["retry-after"] = "10" },
    opts = { hint_jitter = 0.2 }, u = 0.5, want = { action = "retry", delay = 11, source = "retry-after" } },
  { name = "a spread hint kept within the time left", status = 429, headers = { ["retry-after"] = "10" },
    opts = { hint_jitter = 0.2 }, u = 0.5, left = 10.5, want = { action = "retry", delay = 10.25 } },
  { name = "x-ratelimit-reset with the quota spent", status = 429,
    headers = { ["x-ratelimit-reset"] = "12", ["x-ratelimit-remaining"] = "0" },
    want = { action = "retry", delay = 12, source = "x-ratelimit-reset" } },
  { name = "x-ratelimit-reset as an epoch", status = 429, headers = { ["x-ratelimit-reset"] = tostring(EPOCH + 8) },
    want = { action = "retry", delay = 8, source = "x-ratelimit-reset" } },
  { name = "x-ratelimit-reset with requests left is no hint", status = 503,
    headers = { ["x-ratelimit-reset"] = "12", ["x-ratelimit-remaining"] = "40" },
    want = { action = "retry", delay = 1, source = "backoff", throttled = false } },
  { name = "Retry-After before x-ratelimit-reset", status = 429,
    headers = { ["retry-after"] = "3", ["x-ratelimit-reset"] = "20", ["x-ratelimit-remaining"] = "0" },
    want = { action = "retry", delay = 3, source = "retry-after" } },
  { name = "a policy's hint longer than Retry-After", status = 429, headers = { ["retry-after"] = "10" },
    policy = policy_with { delay = yes }, answers = { policy_delay = 20 },
    want = { action = "retry", delay = 20, source = "policy" } },
  { name = "a policy's hint cannot undercut Retry-After", status = 429, headers = { ["retry-after"] = "10" },
    policy = policy_with { delay = yes }, answers = { policy_delay = 2 },
    want = { action = "retry", delay = 10, source = "retry-after" } },
  { name = "a policy without a hint: the headers'", status = 429, headers = { ["retry-after"] = "4" },
    policy = policy_with { delay = yes }, answers = { policy_delay = false },
    want = { action = "retry", delay = 4, source = "retry-after" } },
  { name = "the delay option cannot undercut the hint", status = 429, headers = { ["retry-after"] = "10" },
    opts = { delay = yes }, answers = { delay = 1 }, want = { action = "retry", delay = 10, source = "retry-after" } },
  { name = "the delay option may lengthen it", status = 429, headers = { ["retry-after"] = "10" },
    opts = { delay = yes }, answers = { delay = 15 }, want = { action = "retry", delay = 15, source = "delay" } },
  { name = "the delay option replaces the backoff", status = 500, opts = { delay = yes }, answers = { delay = 0.25 },
    want = { action = "retry", delay = 0.25, source = "delay" } },

  -- retry_after modes
  { name = "honor", status = 429, headers = { ["retry-after"] = "50" }, retry_after = "honor",
    want = { action = "retry", delay = 50 } },
  { name = "clamp", status = 429, headers = { ["retry-after"] = "50" }, retry_after = "clamp", retry_after_max = 5,
    want = { action = "retry", delay = 5, source = "retry-after" } },
  { name = "clamp, spread below the cap", status = 429, headers = { ["retry-after"] = "50" }, retry_after = "clamp",
    retry_after_max = 6, opts = { hint_jitter = 0.2 }, u = 0.5, want = { action = "retry", delay = 5.5 } },
  { name = "clamp leaves a shorter hint", status = 429, headers = { ["retry-after"] = "2" }, retry_after = "clamp",
    retry_after_max = 5, want = { action = "retry", delay = 2 } },
  { name = "fail_fast over the max", status = 429, headers = { ["retry-after"] = "50" }, retry_after = "fail_fast",
    retry_after_max = 5, want = { action = "fail", kind = "throttled",
      message = "the server asked to wait 50.00 s (retry-after), more than retry_after_max (5.00 s)" } },
  { name = "fail_fast within the max", status = 429, headers = { ["retry-after"] = "3" }, retry_after = "fail_fast",
    retry_after_max = 5, want = { action = "retry", delay = 3 } },
  { name = "defer", status = 429, headers = { ["retry-after"] = "3" }, retry_after = "defer",
    want = { action = "fail", kind = "deferred", hint = 3, message = "deferred to the caller" } },
  { name = "defer without a hint backs off", status = 503, retry_after = "defer",
    want = { action = "retry", source = "backoff" } },

  -- the time budget
  { name = "a hint that does not fit", status = 429, headers = { ["retry-after"] = "30" }, left = 10,
    want = { action = "fail", kind = "budget", hint = 30, message = "GET " .. URL .. ": a retry in 30.00 s "
      .. "(retry-after) would not fit the 10.00 s left (max_elapsed 120.00 s, 1 attempt)" } },
  { name = "a backoff that does not fit", status = 503, retries = 2, left = 3,
    want = { action = "fail", kind = "budget",
      message = "a retry in 4.00 s (backoff) would not fit the 3.00 s left" } },
  { name = "no time left at all", status = 503, left = -1,
    want = { action = "fail", kind = "budget", message = "would not fit the 0.00 s left" } },

  -- max_retries
  { name = "exhausted", status = 503, retries = 3, want = { action = "fail", kind = "exhausted",
    message = "GET " .. URL .. " failed after 4 attempts (max_retries 3), last: 503" } },
  { name = "max_retries 0", status = 429, opts = { max_retries = 0 },
    want = { action = "fail", kind = "exhausted", message = "failed after 1 attempt (max_retries 0), last: 429" } },
  { name = "max_retries 5 at the fourth retry", status = 503, retries = 3, opts = { max_retries = 5 },
    want = { action = "retry", delay = 8 } },

  -- replay safety
  { name = "unsafe POST", method = "POST", safe = false, status = 503, want = { action = "fail", kind = "unsafe",
    message = "POST " .. URL .. " was not retried after 503: POST is not replay-safe (give an idempotency_key, "
      .. "or set retry_non_idempotent)" } },
  { name = "unsafe POST a provider would replay: the provider named first", method = "POST", safe = false,
    status = 429, want = { action = "fail", kind = "unsafe",
    message = "POST " .. URL .. " was not retried after 429: POST is not replay-safe (give the API's provider, "
      .. 'policy = "openai" or "anthropic" (a client\'s provider option), when the API is theirs or speaks their '
      .. "dialect: its servers did not act on such an answer; else give an idempotency_key, or set "
      .. "retry_non_idempotent)" } },
  { name = "unsafe POST of a 500 with x-should-retry: true: the providers named", method = "POST", safe = false,
    status = 500, headers = { ["x-should-retry"] = "true" },
    want = { action = "fail", kind = "unsafe", message = 'policy = "openai" or "anthropic"' } },
  { name = "unsafe POST no provider would replay (x-should-retry: false)", method = "POST", safe = false,
    status = 429, headers = { ["x-should-retry"] = "false" },
    want = { action = "fail", kind = "unsafe", message = "(give an idempotency_key, or set retry_non_idempotent)" } },
  { name = "unsafe POST whose own replayable said no: no provider named", method = "POST", safe = false,
    status = 429, policy = policy_with { replayable = yes }, answers = { replayable = false },
    want = { action = "fail", kind = "unsafe", message = "(give an idempotency_key, or set retry_non_idempotent)" } },
  { name = "POST made safe (a key, retry_non_idempotent)", method = "POST", safe = true, status = 503,
    want = { action = "retry" } },
  { name = "unsafe POST answered 200", method = "POST", safe = false, status = 200, want = { action = "return" } },
  { name = "unsafe POST the policy says was not acted on", method = "POST", safe = false, status = 429,
    policy = policy_with { replayable = yes }, answers = { replayable = true }, want = { action = "retry" } },
  { name = "unsafe POST the policy does not clear", method = "POST", safe = false, status = 429,
    policy = policy_with { replayable = yes }, answers = { replayable = false },
    want = { action = "fail", kind = "unsafe" } },

  -- transport errors
  { name = "connection refused, unsafe POST: never sent, retried", method = "POST", safe = false, error = refused,
    want = { action = "retry", source = "backoff", class = "retryable" } },
  { name = "timeout after sending an unsafe POST", method = "POST", safe = false, error = timed_out,
    want = { action = "fail", kind = "unsafe", message = "was not retried after timed out" } },
  { name = "timeout of a GET", error = timed_out, want = { action = "retry", source = "backoff" } },
  { name = "timeout cut by the time budget", error = timed_out, budget_cut = true,
    want = { action = "fail", kind = "budget", message = "the attempt was cut short by the time budget" } },
  { name = "a stream's time read whole cut, before its headers", error = timed_out, budget_cut = "after_headers",
    want = { action = "retry" } },
  { name = "TLS verification", error = bad_cert, want = { action = "fail", kind = "network",
    message = "GET " .. URL .. ": TLS verification failed: certificate has expired" } },
  { name = "transport errors exhaust too", error = refused, retries = 3,
    want = { action = "fail", kind = "exhausted", message = "last: connection refused" } },

  -- the retry budget
  { name = "the retry budget agrees", status = 503, budget = {}, answers = { budget = true },
    want = { action = "retry" } },
  { name = "the retry budget refuses", status = 503, budget = {}, answers = { budget = false },
    want = { action = "fail", kind = "budget", refused = "budget",
      message = "the retry budget refused a retry after 503 (retries are capped at a share of requests)" } },
  { name = "no budget asked when the retry would not fit anyway", status = 429, budget = {}, left = 1,
    headers = { ["retry-after"] = "5" }, want = { action = "fail", kind = "budget" } },

  -- a policy's verdict
  { name = "policy: a 503 is terminal", status = 503, policy = policy_with { classify = yes },
    answers = { classify = "terminal" }, want = { action = "fail", kind = "terminal" } },
  { name = "policy: a 200 is retryable", status = 200, policy = policy_with { classify = yes },
    answers = { classify = "retryable" }, want = { action = "retry", source = "backoff" } },
  { name = "policy: a 500 is an answer", status = 500, policy = policy_with { classify = yes },
    answers = { classify = "success" }, want = { action = "return", class = "success" } },
  { name = "policy without a verdict: the built-in one", status = 404, policy = policy_with { classify = yes },
    answers = { classify = false }, want = { action = "fail", kind = "terminal" } },

  -- what the decision asks, and only where it matters
  { name = "asks a policy's verdict first", status = 200, policy = policy_with { classify = yes },
    want = { action = "ask", hook = "classify" } },
  { name = "asks a policy's hint of a retryable", status = 429, policy = policy_with { delay = yes },
    want = { action = "ask", hook = "policy_delay" } },
  { name = "no hint asked of a terminal status", status = 404, policy = policy_with { delay = yes },
    want = { action = "fail", kind = "terminal" } },
  { name = "no hint asked of a 2xx", status = 200, policy = policy_with { delay = yes },
    want = { action = "return" } },
  { name = "asks whether an unsafe request may be replayed", method = "POST", safe = false, status = 429,
    policy = policy_with { replayable = yes }, want = { action = "ask", hook = "replayable" } },
  { name = "never asks replayable of a safe one", status = 429, policy = policy_with { replayable = yes },
    want = { action = "retry" } },
  { name = "asks the delay option", status = 500, opts = { delay = yes }, want = { action = "ask", hook = "delay" } },
  { name = "not the delay option once exhausted", status = 500, opts = { delay = yes }, retries = 3,
    want = { action = "fail", kind = "exhausted" } },
  { name = "asks the retry budget last", status = 503, budget = {}, want = { action = "ask", hook = "budget" } },
}

describe("fetch.decision: the table of cases", function()
  for _, case in ipairs(cases) do
    it(case.name, function() check(case, decide(case)) end)
  end
end)

describe("fetch.decision", function()
  it("is pure: the same inputs give the same record, and the inputs are left as they were", function()
    local case = { status = 429, headers = { ["retry-after"] = "10" }, opts = { hint_jitter = 0.2 }, u = 0.25 }
    local call, res = inputs(case)
    local first = decision.decide(call, res, nil, clock(0.25))
    local second = decision.decide(call, res, nil, clock(0.25))
    assert.same(first, second)
    assert.equal(10.5, first.delay)
    assert.is_nil(res.throttled)
    assert.equal(0, call.retries)
    assert.is_nil(call.previous_backoff)
    assert.is_nil(call.hint)
  end)

  it("backs off from 0.05 s after a 429 that names no wait, from 1 s otherwise (docs/limits.md)", function()
    assert.equal(0.05, decision.THROTTLE_BASE)
    assert.equal(1, decision.DEFAULT_BASE)
    local bare = decide { status = 429, opts = { jitter = "full" }, u = 0.999 }
    assert.is_true(bare.delay < 0.05 and bare.delay > 0.049, "429: " .. bare.delay)
    local down = decide { status = 503, opts = { jitter = "full" }, u = 0.999 }
    assert.is_true(down.delay < 1 and down.delay > 0.99, "503: " .. down.delay)
  end)

  it("draws the jitter from the clock it is given", function()
    local draws = {}
    local function at(u)
      local call, res = inputs { status = 503, retries = 3, opts = { jitter = "full", max_retries = 5 } }
      local d = decision.decide(call, res, nil, clock(u))
      draws[#draws + 1] = d.delay
      return d
    end
    assert.equal("backoff", at(0).source)
    at(0.5)
    at(0.999)
    assert.equal(0, draws[1])
    assert.equal(4, draws[2]) -- full jitter: u * 2^3
    assert.is_true(draws[3] < 8 and draws[3] > 7.9)
  end)

  it("takes a decorrelated backoff from the one before", function()
    local call, res = inputs { status = 503, retries = 1, opts = { jitter = "decorrelated", max_retries = 5 } }
    call.previous_backoff = 4
    local d = decision.decide(call, res, nil, clock(0.5))
    assert.equal("backoff", d.source)
    assert.equal(d.delay, d.backoff)
    assert.is_true(d.delay >= 1 and d.delay <= 12) -- within [base, 3 * previous]
  end)

  it("reads a provider's headers through its policy's answer", function()
    local openai = providers.openai
    local res = { status = 429, headers = { ["x-ratelimit-reset-requests"] = "6s",
      ["x-ratelimit-reset-tokens"] = "1m30s" } }
    local call = inputs { policy = openai }
    local d = decision.decide(call, res, nil, clock())
    assert.same({ action = "ask", hook = "classify" }, d)
    call.answers = { classify = openai.classify(res) or false }
    d = decision.decide(call, res, nil, clock())
    assert.same({ action = "ask", hook = "policy_delay" }, d)
    call.answers.policy_delay = openai.delay(res, 0)
    d = decision.decide(call, res, nil, clock())
    assert.equal("retry", d.action)
    assert.equal("policy", d.source)
    assert.equal(90, d.delay) -- the longer of the two resets
    -- the response's own Retry-After still wins when it asks for longer
    -- than the provider's reading (retry-after-ms, which OpenAI reads first)
    res.headers["retry-after-ms"], res.headers["retry-after"] = "2000", "60"
    call.answers.policy_delay = openai.delay(res, 0)
    assert.equal(2, call.answers.policy_delay)
    d = decision.decide(call, res, nil, clock())
    assert.same({ 60, "retry-after" }, { d.delay, d.source })
  end)

  it("needs no call for a plain 2xx, and asks for it for anything else", function()
    assert.same({ action = "return", class = "success", throttled = false },
      decision.decide(nil, { status = 204, headers = {} }, nil, clock()))
    assert.same({ action = "ask", hook = "call" }, decision.decide(nil, { status = 503, headers = {} }, nil, clock()))
    assert.same({ action = "ask", hook = "call" }, decision.decide(nil, nil, refused, clock()))
  end)

  it("is given replay safety by the plan: a POST is safe only with a key or retry_non_idempotent", function()
    -- (plan.make's values: a record's field, or the tenth of the values)
    local function safe(opts)
      local values = { plan.make(URL, opts) }
      local first = values[1]
      if type(first) == "table" then return first.safe end
      return values[10]
    end
    assert.is_false(not not safe { method = "POST", body = "x" })
    assert.is_true(not not safe { method = "POST", body = "x", idempotency_key = "k-1" })
    assert.is_true(not not safe { method = "POST", body = "x", retry_non_idempotent = true })
    assert.is_true(not not safe { method = "POST", body = "x", headers = { ["Idempotency-Key"] = "k-2" } })
    assert.is_true(not not safe { method = "PUT", body = "x" })
    assert.is_true(not not safe {})
  end)
end)
