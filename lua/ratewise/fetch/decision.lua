-- fetch.decision: what follows an attempt, decided in one place and by one
-- pure function. Given the call (what it asked and where it stands), the
-- attempt's outcome (a response or a transport error) and a clock, it
-- answers with a record:
--
--   { action = "return", class, throttled }: return the response
--   { action = "retry", delay = seconds, source = "retry-after" | "x-ratelimit-reset" | "policy" | "delay"
--     | "backoff", class, throttled, hint, hint_source, floor, backoff }
--   { action = "fail", kind = "terminal" | "network" | "unsafe" | "exhausted" | "deferred" | "throttled"
--     | "budget", message, class, throttled, hint, refused }
--   { action = "ask", hook = "classify" | "policy_delay" | "replayable" | "delay" | "budget" | "call" }
--
-- It runs no hook, counts nothing, tells no listener and never waits: the
-- fetch loop carries the record out (fetch/carry.lua). When the decision
-- needs an answer only the caller's code can give (a policy's verdict or
-- hint, whether a refused request may be replayed, the `delay` option, the
-- retry budget's consent), it asks for it: the carrier runs that hook, puts
-- its answer in call.answers (false for none) and decides again. Each
-- hook is asked only when the decision reaches the point where it matters,
-- so that a call whose answer is settled before never runs it.
--
-- The call (fetch/plan.lua's state): method, shown_url, safe (replay-safe),
-- policy, retry_after (nil: honor) and retry_after_max, budget (an object:
-- whether there is one), retries (made so far), attempts, previous_backoff,
-- deadline and max_elapsed (the time budget; by_deadline and started: the
-- deadline option set its end), opts, the caller's options
-- (max_retries, base, max_delay, jitter, hint_jitter, delay), and of the
-- attempt: budget_cut (whether the time budget cut its own timeouts;
-- "after_headers" for a stream's time read whole) and answers. A call
-- without a policy whose state is not made yet (a plain call's first
-- attempt) may be nil: its 2xx needs nothing more, anything else asks for
-- it (hook "call").
-- The outcome: the response, or the transport error (message, retryable,
-- timeout, sent, tls, status). The clock: now() (monotonic seconds, as the deadline),
-- time() (epoch seconds, for dates) and random() (a number in [0, 1), for
-- the jitter).
local core = require "ratewise.core"
local retry = require "ratewise.retry"
local providers = require "ratewise.providers.known"

local classify, backoff = core.classify, core.backoff
local format = string.format
local tostring = tostring

local decision = {}

-- The clock of a real call.
decision.clock = { now = core.now, time = core.time, random = retry.random }

-- Defaults of the options that shape a retry.
local DEFAULT_MAX_RETRIES, DEFAULT_BASE, DEFAULT_MAX_DELAY, DEFAULT_JITTER = 3, 1, 60, "full"
decision.DEFAULT_MAX_RETRIES = DEFAULT_MAX_RETRIES
-- The first step of the backoff after a 429 that names no wait (nginx's
-- limit_req, most gateways), unless `base` is given: such a limit refills
-- in milliseconds, and a second's first step left callers asleep while
-- its rate went unused. A server down or overloaded (a 5xx) keeps
-- DEFAULT_BASE.
local THROTTLE_BASE = 0.05
decision.DEFAULT_BASE, decision.THROTTLE_BASE = DEFAULT_BASE, THROTTLE_BASE
-- How far a hinted wait is spread past the hint (spread_hint): a fifth,
-- so that callers who got one Retry-After come back over a fifth of it.
local HINT_JITTER = 0.2

local function ask(hook)
  return { action = "ask", hook = hook }
end

-- The records that carry nothing of their own call, made once.
local RETURNED = { action = "return", class = "success", throttled = false }
local ASK_CALL = { action = "ask", hook = "call" }

-- The message of a call stopped by its time budget (report.budget_error's
-- wording).
local function budget_message(call, why)
  local attempts = call.attempts
  local limit -- what ended the time: max_elapsed, or the deadline option when it came first
  if not call.by_deadline then
    limit = format("max_elapsed %.2f s", call.max_elapsed)
  elseif call.deadline > call.started then
    limit = format("deadline %.2f s after the call began", call.deadline - call.started)
  else
    limit = format("the deadline had passed %.2f s before the call began", call.started - call.deadline)
  end
  return format("%s: %s (%s, %d attempt%s)", call.method .. " " .. call.shown_url, why, limit, attempts,
    attempts == 1 and "" or "s")
end
decision.budget_message = budget_message

-- The verdict on a response: the policy's answer, else the built-in one.
-- A 413 that says when to come back (RFC 9110 15.5.14: the condition is
-- temporary) is retryable, as in urllib3 and got.
local function verdict(answer, res, time)
  if answer then return answer end
  local status = res.status
  if status == 413 and retry.retry_after(res.headers, retry.server_now(res.headers, time)) then
    return "retryable"
  end
  return classify(status)
end

-- The wait the server asked for, and where it came from; nil when it named
-- none. A policy's reading (a quota's reset, a provider's header) comes
-- first, but the response's own Retry-After is the least wait: every draft
-- of the RateLimit fields gives Retry-After precedence.
local function server_hint(policy_hint, h, time)
  if not policy_hint then return retry.hint(h, time) end
  local asked = retry.retry_after(h, retry.server_now(h, time))
  if asked and asked >= policy_hint then return asked, "retry-after" end
  return policy_hint, "policy"
end

-- A hinted wait, spread so that the callers who got the same hint do not
-- all come back at the same instant: within [hint, hint * (1 + spread)],
-- never shorter than asked, and short of the `left` seconds of the budget
-- when the hint itself fits. With a cap (retry_after = "clamp"), never
-- over it: a wait clamped to the cap is spread below it.
local function spread_hint(delay, spread, left, cap, random)
  if spread <= 0 then
    if cap and delay > cap then return cap end
    return delay
  end
  local u = random()
  if cap and delay >= cap then return cap * (1 - spread * u / (1 + spread)) end
  local wait = delay * (1 + spread * u)
  if cap and wait > cap then wait = cap end
  if wait >= left and delay < left then wait = delay + (left - delay) * u end
  return wait
end

local function fail(kind, message, d)
  d.action, d.kind, d.message = "fail", kind, message
  return d
end

-- Why a request that is not replay-safe was not sent again, and the fix:
-- first the provider whose servers say such an answer was not acted on
-- (an API that speaks its dialect at another host: a proxy, a gateway, a
-- mock), when the call has no policy that answered for it.
local function unsafe_message(call, res, method_url, why)
  local policy = call.policy
  local names = res and not (policy and policy.replayable) and providers.replaying_providers(res, call.method)
  local fix = "give an idempotency_key, or set retry_non_idempotent"
  if names then
    local quoted = format("%q", names[1])
    for i = 2, #names do quoted = quoted .. format(" or %q", names[i]) end
    fix = format("give the API's provider, policy = %s (a client's provider option), when the API is theirs or "
      .. "speaks their dialect: its servers did not act on such an answer; else %s", quoted, fix)
  end
  return format("%s was not retried after %s: %s is not replay-safe (%s)", method_url, why, call.method, fix)
end

-- What follows an attempt that is to be retried if it may: replay safety,
-- max_retries, the wait and its source, the server's hint against the
-- retry_after mode, the time budget, the retry budget. why: what failed
-- (a status, a transport error's message); d: the record so far.
local function retry_or_fail(call, res, terr, clock, why, d)
  local answers = call.answers
  local opts, policy = call.opts, call.policy
  local method_url = call.method .. " " .. call.shown_url
  -- A request that never reached the server is not a replay; nor is one
  -- the policy knows the server refused without acting on it.
  if not call.safe and (res or terr.sent) then
    local allowed = false
    if policy and policy.replayable then
      allowed = answers and answers.replayable
      if allowed == nil then return ask("replayable") end
    end
    if not allowed then
      return fail("unsafe", unsafe_message(call, res, method_url, why), d)
    end
  end
  local retries, attempts = call.retries, call.attempts
  local max_retries = opts.max_retries or DEFAULT_MAX_RETRIES
  if retries >= max_retries then
    return fail("exhausted", format("%s failed after %d attempt%s (max_retries %d), last: %s", method_url,
      attempts, attempts == 1 and "" or "s", max_retries, why), d)
  end

  -- The wait: the server's hint is a floor; the `delay` option may lengthen
  -- it or replace the backoff, but never make it shorter.
  local hint, hint_source = d.hint, d.hint_source
  local delay, source
  if opts.delay then
    local asked = answers and answers.delay
    if asked == nil then return ask("delay") end
    local least = hint or d.floor
    if asked and (not least or asked >= least) then delay, source = asked, "delay" end
  end
  if not delay then
    if hint then
      delay, source = hint, hint_source
    else
      local jitter = opts.jitter or DEFAULT_JITTER
      local u = jitter == "none" and 0 or clock.random()
      local base = opts.base or (res and res.status == 429 and THROTTLE_BASE) or DEFAULT_BASE
      delay = backoff(retries, base, opts.max_delay or DEFAULT_MAX_DELAY, jitter, u, call.previous_backoff or base)
      local floor = d.floor
      if floor and delay < floor then delay = floor end
      source, d.backoff = "backoff", delay
    end
  end
  local mode, cap = call.retry_after, nil
  if hint then
    if mode == "defer" then
      return fail("deferred", format("%s: the server asked to wait %.2f s (%s); deferred to the caller "
        .. "(retry_after = \"defer\")", method_url, hint, hint_source), d)
    elseif mode == "fail_fast" and hint > call.retry_after_max then
      return fail("throttled", format("%s: the server asked to wait %.2f s (%s), more than retry_after_max "
        .. "(%.2f s)", method_url, hint, hint_source, call.retry_after_max), d)
    end
    -- clamp: no hinted wait is longer than retry_after_max
    if mode == "clamp" and source ~= "delay" then
      cap = call.retry_after_max
      if delay > cap then delay = cap end
    end
  end
  local left = call.deadline - clock.now()
  if delay >= left then
    return fail("budget", budget_message(call, format("a retry in %.2f s (%s) would not fit the %.2f s left",
      delay, source, left > 0 and left or 0)), d)
  end
  -- Only the server's own wait is spread here: a backoff is jittered
  -- already, and a delay hook's answer is the caller's to make.
  if hint and source ~= "delay" then
    delay = spread_hint(delay, opts.hint_jitter or HINT_JITTER, left, cap, clock.random)
  end
  if call.budget then
    local allowed = answers and answers.budget
    if allowed == nil then return ask("budget") end
    if not allowed then
      d.refused = "budget"
      return fail("budget", budget_message(call, format(
        "the retry budget refused a retry after %s (retries are capped at a share of requests)", why)), d)
    end
  end
  d.action, d.delay, d.source = "retry", delay, source
  return d
end

-- After a response: its verdict, the server's hint, then a return, a
-- failure or a retry.
local function after_response(call, res, clock)
  local status = res.status
  local policy = call and call.policy
  local answer -- the policy's verdict
  if policy and policy.classify then
    answer = call.answers and call.answers.classify
    if answer == nil then return ask("classify") end
  end
  if not call then return ASK_CALL end
  local answers = call.answers
  local time = clock.time()
  local class = verdict(answer, res, time)
  -- A throttle: the server refused for rate (a 429), or refused for now
  -- and said when to come back (a 503 with Retry-After, a quota's reset
  -- read by a provider's policy).
  local hint, hint_source
  if class == "retryable" then
    local policy_hint
    if policy and policy.delay then
      policy_hint = answers and answers.policy_delay
      if policy_hint == nil then return ask("policy_delay") end
    end
    hint, hint_source = server_hint(policy_hint, res.headers, time)
  end
  local d = { class = class, throttled = status == 429 or hint ~= nil }
  -- A zero hint (a reset already past, "Retry-After: 0") would send the
  -- retry at once, and the one after it, and so would one below the
  -- backoff's first step ("Retry-After: 0.000001"): backoff instead, never
  -- shorter than such a hint (its floor).
  if hint and hint > 0 then
    if hint >= (call.opts.base or DEFAULT_BASE) then
      d.hint, d.hint_source = hint, hint_source
    else
      d.floor = hint
    end
  end
  -- A redirect that was not followed, or a 304, is an answer, not a failure.
  if class == "success" or class ~= "retryable" and status >= 300 and status < 400 then
    d.action = "return"
    return d
  end
  local method_url = call.method .. " " .. call.shown_url
  if class == "terminal" then
    return fail("terminal", format("%s: %d is a terminal status, not retried", method_url, status), d)
  end
  return retry_or_fail(call, res, nil, clock, tostring(status), d)
end

-- After a transport error (its message already fit to print).
local function after_error(call, terr, clock)
  if not call then return ASK_CALL end
  local d = { class = "retryable", throttled = false }
  local method_url = call.method .. " " .. call.shown_url
  -- (a stream's own time to its headers was not cut when only its time read whole was)
  local cut = call.budget_cut
  if terr.timeout and cut and (cut ~= "after_headers" or terr.status) then
    return fail("budget", budget_message(call, "the attempt was cut short by the time budget"), d)
  end
  if not terr.retryable then
    return fail("network", format("%s: %s%s", method_url, terr.tls and "TLS verification failed: " or "",
      terr.message), d)
  end
  return retry_or_fail(call, nil, terr, clock, terr.message, d)
end

--- d = decision.decide(call, res, terr [, clock]): what follows the attempt
-- number call.attempts, which gave the response res or the transport error
-- terr (see the top of this file).
function decision.decide(call, res, terr, clock)
  if res then
    -- A 2xx is an answer, with nothing more to ask, unless the policy
    -- classifies responses itself.
    local status = res.status
    if status >= 200 and status < 300 then
      local policy = call and call.policy
      if not (policy and policy.classify) then return RETURNED end
    end
    return after_response(call, res, clock or decision.clock)
  end
  return after_error(call, terr, clock or decision.clock)
end

return decision
