-- fetch.decision: what follows an attempt: the verdict on its response
-- (or transport error), the server's hint, the backoff, whether a replay
-- is allowed and the retry budget agrees; then a retry (after its wait),
-- the response, or the error the call ends with.
local core = require "ratewise.core"
local headers = require "ratewise.headers"
local response = require "ratewise.response"
local retry = require "ratewise.retry"
local runtime = require "ratewise.runtime"
local report = require "ratewise.fetch.report"

local classify, now = core.classify, core.now
local format = string.format
local type, tostring = type, tostring
local call_hook, guarded, not_boolean = report.call_hook, report.guarded, report.not_boolean
local fetch_error, budget_error, counting = report.fetch_error, report.budget_error, report.counting

local decision = {}

-- How far a hinted wait is spread past the hint (spread_hint): a fifth,
-- so that callers who got one Retry-After come back over a fifth of it.
local HINT_JITTER = 0.2

-- The wait the server asked for before trying again (read by the policy,
-- or from the response's own headers), and where it came from; nil when it
-- named none. Whatever a policy reads (a quota's reset, say), the
-- response's own Retry-After is the least wait: every draft of the
-- RateLimit fields gives Retry-After precedence.
local function server_hint(policy, res, attempt)
  local hint, source
  local policy_delay = policy and policy.delay
  if policy_delay then
    hint = call_hook("delay", policy_delay, res, attempt)
    if hint ~= nil and (type(hint) ~= "number" or hint ~= hint or hint < 0) then
      error(format("fetch: the policy's delay must return a non-negative number or nil (got %s)",
        tostring(hint)), 0)
    end
    source = "policy"
  end
  if hint == nil then return retry.hint(res.headers) end
  local asked = retry.retry_after(res.headers)
  if asked and asked > hint then return asked, "retry-after" end
  return hint, source
end

-- The wait before the next attempt, and where it came from. The server's
-- hint is a floor: a delay hook may lengthen it or replace the backoff, but
-- never make it shorter.
local function next_delay(opts, state, res, attempt, hint, source)
  if opts.delay then
    local v = call_hook("delay", opts.delay, res, attempt, state.last_transport)
    if v ~= nil then
      if type(v) ~= "number" or v ~= v or v < 0 then
        error(format("fetch: the 'delay' callback must return a non-negative number or nil (got %s)",
          tostring(v)), 0)
      end
      if not hint or v >= hint then return v, "delay" end
      return hint, source
    end
  end
  if hint then return hint, source end
  local delay = retry.backoff(attempt, {
    base = opts.base, max_delay = opts.max_delay, jitter = opts.jitter,
    previous = state.previous_backoff,
  })
  state.previous_backoff = delay
  return delay, "backoff"
end

-- A hinted wait, spread so that the callers who got the same hint do not
-- all come back at the same instant: within [hint, hint * (1 + spread)],
-- never shorter than asked, and short of the `left` seconds of the budget
-- when the hint itself fits. With a cap (retry_after = "clamp"), never
-- over it: a wait clamped to the cap is spread below it.
local function spread_hint(delay, spread, left, cap)
  if spread <= 0 then
    if cap and delay > cap then return cap end
    return delay
  end
  local u = retry.random()
  if cap and delay >= cap then return cap * (1 - spread * u / (1 + spread)) end
  local wait = delay * (1 + spread * u)
  if cap and wait > cap then wait = cap end
  if wait >= left and delay < left then wait = delay + (left - delay) * u end
  return wait
end


-- The policy's verdict on a response, checked, or the built-in one. A 413
-- that says when to come back (RFC 9110 15.5.14: the condition is
-- temporary) is retryable, as in urllib3 and got.
local function verdict(policy, res)
  local hook = policy and policy.classify
  if hook then
    local class = call_hook("classify", hook, res)
    if class ~= nil then
      if class ~= "success" and class ~= "retryable" and class ~= "terminal" then
        error(format("fetch: the policy's classify must answer success, retryable, terminal or nil (got %s)",
          tostring(class)), 0)
      end
      return class
    end
  end
  local status = res.status
  if status == 413 and retry.retry_after(res.headers) then return "retryable" end
  return classify(status)
end

-- The policy's word that a refused attempt was not acted on. Hooks answer
-- booleans: "no" or 0 would read as yes, so anything else is misuse.
local function replay_allowed(policy, res, method)
  local hook = policy and policy.replayable
  if not hook then return false end
  local answer = call_hook("replayable", hook, res, method)
  if answer ~= nil and answer ~= true and answer ~= false then
    error(format("fetch: the policy's replayable must answer true, false or nil (got %s %s)", type(answer),
      type(answer) == "string" and format("%q", answer) or tostring(answer)), 0)
  end
  return answer == true
end

--- done, res | nil, err = decision.after(state, res, terr, sent_at, streaming, budget_cut): what
-- follows attempt number state.attempts, which gave res or the transport
-- error terr (sent at sent_at; streaming: a stream's reader; budget_cut:
-- attempt.send's). done: the call ends with what follows; false: the wait
-- before the next attempt is over, try again.
function decision.after(state, res, terr, sent_at, streaming, budget_cut)
  local policy, limiter, circuit, on_event, counters = state.policy, state.limiter, state.circuit, state.on_event,
    state.counters
  local method, shown_url, retries = state.method, state.shown_url, state.retries
  local why, class, hint, hint_source
  if res then
    local status = res.status
    if policy and policy.observe then
      call_hook("observe", policy.observe, res, limiter)
      status = res.status
    end
    if status >= 200 and status < 300 and not (policy and policy.classify) then
      class = "success"
    else
      class = verdict(policy, res)
    end
    -- A throttle: the server refused for rate (a 429), or refused for now
    -- and said when to come back (a 503 with Retry-After, a quota's reset
    -- read by a provider's policy).
    if class == "retryable" then hint, hint_source = server_hint(policy, res, retries) end
    res.throttled = status == 429 or hint ~= nil
    -- A zero hint (a reset already past, "Retry-After: 0") would send
    -- the retry at once, and the one after it: backoff instead.
    if hint == 0 then hint, hint_source = nil, nil end
    if limiter then
      local observe = state.limiter_methods.observe
      if observe then guarded("limiter", "observe", observe, limiter, res, sent_at) end
    end
    if counters then counting.attempt(counters, status) end
    if on_event then
      call_hook("on_event", on_event, { type = "response", status = res.status, class = class,
        attempt = state.attempts, throttled = res.throttled })
    end
    -- A redirect that was not followed, or a 304, is an answer, not a failure.
    if class ~= "retryable" and res.status >= 300 and res.status < 400 then class = "success" end
    if circuit then
      -- A terminal 4xx says nothing about the server's health.
      guarded("circuit", "record", circuit.record, circuit, state.origin, class == "success" and "success"
        or (class == "retryable" or res.status >= 500) and "failure" or "neutral")
    end
    if streaming and class ~= "success" then
      -- A policy that does not take this 2xx for an answer sees it whole.
      local _, derr = response.drain(res, true)
      if derr then res.body = "" end
    end
    if class == "success" then return true, res end
    state.last_response, state.last_transport, state.hint = res, nil, hint
    if class == "terminal" then
      return true, nil, fetch_error("terminal", format("%s: %d is a terminal status, not retried",
        method .. " " .. shown_url, res.status), state, res)
    end
    why = tostring(res.status)
  else
    state.last_transport, state.hint = terr, nil
    local opts = state.opts
    local message = terr.tls and response.tls_file_problem(opts, terr.code) or terr.message or "transport failure"
    if state.url_secrets then message = headers.scrub(message, state.url_secrets) end
    if state.header_secrets then message = headers.scrub(message, state.header_secrets) end
    message = headers.scrub_proxies(message, opts.proxy)
    terr.message = message
    if counters then counting.attempt(counters, "network") end
    if on_event then
      call_hook("on_event", on_event, { type = "response", error = message, class = "retryable",
        attempt = state.attempts })
    end
    if circuit and not terr.tls then guarded("circuit", "record", circuit.record, circuit, state.origin, "failure") end
    -- (a stream's own time to its headers was not cut when only its time read whole was)
    if terr.timeout and budget_cut and (budget_cut ~= "after_headers" or terr.status) then
      return true, budget_error(state, "the attempt was cut short by the time budget", nil, terr)
    end
    if not terr.retryable then
      return true, nil, fetch_error("network", format("%s: %s%s", method .. " " .. shown_url,
        terr.tls and "TLS verification failed: " or "", terr.message), state, nil, terr)
    end
    why = terr.message
  end

  -- A request that never reached the server is not a replay; nor is one
  -- the policy knows the server refused without acting on it.
  if not state.safe and (res or terr.sent) and not replay_allowed(policy, res, method) then
    return true, nil, fetch_error("unsafe", format(
      "%s was not retried after %s: %s is not replay-safe (give an idempotency_key, or set retry_non_idempotent)",
      method .. " " .. shown_url, why, method), state, res, terr)
  end
  local opts = state.opts
  local retry_after, retry_after_max = state.retry_after, state.retry_after_max
  local max_retries = state.max_retries
  if not max_retries then
    -- What only a retry needs, read at the first one (most calls have none).
    max_retries = opts.max_retries or 3
    local on_retry = opts.on_retry
    if on_retry == nil then on_retry = report.default_on_retry end
    -- clamp: no hinted wait is longer than this
    state.max_retries, state.on_retry = max_retries, on_retry
    state.retry_after_cap = retry_after == "clamp" and retry_after_max or nil
    state.hint_jitter = opts.hint_jitter or HINT_JITTER
  end
  if retries >= max_retries then
    return true, nil, fetch_error("exhausted", format("%s failed after %d attempt%s (max_retries %d), last: %s",
      method .. " " .. shown_url, state.attempts, state.attempts == 1 and "" or "s", max_retries, why),
      state, res, terr)
  end

  local delay, source = next_delay(opts, state, res, retries, hint, hint_source)
  local cap = hint and source ~= "delay" and state.retry_after_cap or nil
  if hint then
    if retry_after == "defer" then
      return true, nil, fetch_error("deferred", format("%s: the server asked to wait %.2f s (%s); deferred to "
        .. "the caller (retry_after = \"defer\")", method .. " " .. shown_url, hint, hint_source), state, res)
    elseif retry_after == "fail_fast" and hint > retry_after_max then
      return true, nil, fetch_error("throttled", format("%s: the server asked to wait %.2f s (%s), more than "
        .. "retry_after_max (%.2f s)", method .. " " .. shown_url, hint, hint_source, retry_after_max),
        state, res)
    end
    if cap and delay > cap then delay = cap end
  end
  local left = state.deadline - now()
  if delay >= left then
    return true, budget_error(state, format("a retry in %.2f s (%s) would not fit the %.2f s left",
      delay, source, left > 0 and left or 0), res, terr)
  end
  -- Only the server's own wait is spread here: a backoff is jittered
  -- already, and a delay hook's answer is the caller's to make.
  if hint and source ~= "delay" then delay = spread_hint(delay, state.hint_jitter, left, cap) end
  local budget = state.budget
  local retry_allowed = budget and guarded("budget", "allow_retry", budget.allow_retry, budget)
  if budget and retry_allowed ~= true and retry_allowed ~= false then
    not_boolean("budget", "allow_retry", retry_allowed)
  end
  if budget and not retry_allowed then
    if counters then counters.budget_refusals = counters.budget_refusals + 1 end
    if on_event then
      call_hook("on_event", on_event, { type = "budget_refused", status = res and res.status or nil })
    end
    return true, budget_error(state, format(
      "the retry budget refused a retry after %s (retries are capped at a share of requests)", why), res, terr)
  end
  retries = retries + 1
  state.retries = retries
  if counters then counting.retry(counters, res and res.status or "network", source, delay) end
  if on_event then
    call_hook("on_event", on_event, { type = "retry", status = res and res.status or nil, delay = delay,
      source = source, attempt = retries })
  end
  local on_retry = state.on_retry
  if on_retry then
    call_hook("on_retry", on_retry, {
      method = method, url = shown_url, status = res and res.status or nil,
      delay = delay, attempt = retries, max_retries = max_retries, source = source,
      error = terr and terr.message or nil,
    })
  end
  local sleep = state.sleep
  if sleep then
    guarded("sleep", "the wait before a retry", runtime.sleep, delay, sleep)
  else
    runtime.sleep(delay)
  end
  state.hint = nil -- waited out
  return false
end

return decision
