-- fetch.carry: carries out what fetch/decision.lua decides after an
-- attempt. The decision is pure; everything that acts is here: the
-- caller's hooks it asks for (a policy's, the `delay` option, the retry
-- budget), the limiter's and the circuit's bookkeeping, the counters and
-- events, the error the call ends with (fetch/report.lua), and the wait
-- before a retry through the seam.
local headers = require "ratewise.headers"
local response = require "ratewise.response"
local runtime = require "ratewise.runtime"
local decision = require "ratewise.fetch.decision"
local report = require "ratewise.fetch.report"

local decide = decision.decide
local format = string.format
local type, tostring, pairs = type, tostring, pairs
local call_hook, guarded, not_boolean = report.call_hook, report.guarded, report.not_boolean
local fetch_error, counting = report.fetch_error, report.counting

local carry = {}

local function check_wait(v, what)
  if type(v) ~= "number" or v ~= v or v < 0 then
    error(format("fetch: %s must return a non-negative number or nil (got %s)", what, tostring(v)), 0)
  end
  return v
end

-- The answer of the hook the decision asks for, checked; false for none.
-- Hooks answer booleans where they are asked yes or no: "no" or 0 would
-- read as yes, so anything else is misuse.
local function answer(state, hook, res, terr)
  local policy = state.policy
  if hook == "classify" then
    local class = call_hook("classify", policy.classify, res)
    if class == nil then return false end
    if class ~= "success" and class ~= "retryable" and class ~= "terminal" then
      error(format("fetch: the policy's classify must answer success, retryable, terminal or nil (got %s)",
        tostring(class)), 0)
    end
    return class
  elseif hook == "policy_delay" then
    local hint = call_hook("delay", policy.delay, res, state.retries)
    return hint ~= nil and check_wait(hint, "the policy's delay")
  elseif hook == "replayable" then
    local allowed = call_hook("replayable", policy.replayable, res, state.method)
    if allowed ~= nil and allowed ~= true and allowed ~= false then
      error(format("fetch: the policy's replayable must answer true, false or nil (got %s %s)", type(allowed),
        type(allowed) == "string" and format("%q", allowed) or tostring(allowed)), 0)
    end
    return allowed == true
  elseif hook == "delay" then
    local wait = call_hook("delay", state.opts.delay, res, state.retries, terr)
    return wait ~= nil and check_wait(wait, "the 'delay' callback")
  end
  local budget = state.budget -- "budget": its consent, which counts the retry
  local allowed = guarded("budget", "allow_retry", budget.allow_retry, budget)
  if allowed ~= true and allowed ~= false then not_boolean("budget", "allow_retry", allowed) end
  return allowed
end

-- A transport error's message as it may be printed: a TLS file problem
-- named, the URL's and headers' secrets and a proxy's credentials out.
local function printable(state, terr)
  local opts = state.opts
  local message = terr.tls and response.tls_file_problem(opts, terr.code) or terr.message or "transport failure"
  if state.url_secrets then message = headers.scrub(message, state.url_secrets) end
  if state.header_secrets then message = headers.scrub(message, state.header_secrets) end
  terr.message = headers.scrub_proxies(message, opts.proxy)
end

-- Whether the response came from an origin other than the request's: a
-- redirect took it elsewhere (a download host, a CDN), whose quotas and
-- throttles are its own, not the API's the limiter paces.
local function elsewhere(state, res)
  local redirects = res.redirects
  if not redirects or redirects == 0 or type(res.url) ~= "string" then return false end
  return headers.origin(res.url) ~= state.origin
end

-- What the limiter, the circuit, the counters and a listener learn of the
-- attempt's response, and what the caller's response says of it. foreign:
-- the response came from another origin, which the limiter does not hear.
local function record_response(state, d, res, sent_at, streaming, foreign)
  res.throttled = d.throttled
  local counters, limiter, circuit, on_event = state.counters, nil, nil, nil
  if state.hooked then limiter, circuit, on_event = state.limiter, state.circuit, state.on_event end
  local status = res.status
  if limiter and not foreign then
    local observe = state.limiter_methods.observe
    if observe then guarded("limiter", "observe", observe, limiter, res, sent_at) end
  end
  if counters then counting.attempt(counters, status) end
  if on_event then
    call_hook("on_event", on_event, { type = "response", status = status, class = d.class,
      attempt = state.attempts, throttled = d.throttled })
  end
  if circuit then
    -- A terminal 4xx says nothing about the server's health.
    guarded("circuit", "record", circuit.record, circuit, state.origin, d.action == "return" and "success"
      or (d.class == "retryable" or status >= 500) and "failure" or "neutral")
  end
  if streaming and d.action ~= "return" then
    -- A policy that does not take this 2xx for an answer sees it whole.
    local _, derr = response.drain(res, true)
    if derr then res.body = "" end
  end
end

-- A stream handed to the caller is settled when it ends, breaks off or is
-- closed, once, from the usage its events reported as they were read: the
-- policy's stream_usage(event, usage, taken) answers the usage so far (a
-- cost per limit, and whatever else it keeps between events), and the
-- limits the call took are settled to it. No usage seen (a stream that
-- broke before its first report): as taken. The watcher holds the call's
-- state, never the response (response.watch).
local function settle_stream(state, res)
  local policy, methods, cost = state.policy, state.limiter_methods, state.cost
  local stream_usage, settle_limiter = policy.stream_usage, methods.settle
  if not (stream_usage and settle_limiter) or type(cost) ~= "table" then return end
  local limiter, usage = state.limiter, nil
  response.watch(res, {
    event = function(event)
      local now = call_hook("stream_usage", stream_usage, event, usage, cost)
      if now ~= nil and type(now) ~= "table" then
        error(format("fetch: the policy's stream_usage must answer a table of usage or nil (got %s)",
          type(now)), 0)
      end
      if now ~= nil then usage = now end
    end,
    ended = function()
      if usage == nil then return end
      local actual = {}
      for name in pairs(cost) do
        local n = usage[name]
        if type(n) == "number" then actual[name] = n end
      end
      guarded("limiter", "settle", settle_limiter, limiter, cost, actual)
    end,
  })
end

-- What the attempt really cost, as the API counts it, set right in the
-- limiter: the policy's settle reads the answer (the usage it reports; a
-- refusal the API does not count) and the limiter gives back or takes the
-- difference; a request never sent gives back all it took. Only with a
-- policy that has settle: what an API counts is its own rule. unread: a
-- stream's 2xx handed to the caller, settled when it ends (settle_stream).
local function settle(state, res, terr, foreign, unread)
  if not state.hooked then return end
  local limiter, policy = state.limiter, state.policy
  if not (limiter and policy) or foreign then return end
  if unread then return settle_stream(state, res) end
  if not policy.settle then return end
  local methods, cost = state.limiter_methods, state.cost
  if res then
    if not methods.settle then return end
    local actual = call_hook("settle", policy.settle, res, cost)
    -- (a cost per limit settles a limiter with named limits only)
    if actual ~= nil and type(actual) == type(cost) then
      guarded("limiter", "settle", methods.settle, limiter, cost, actual)
    end
  elseif not terr.sent and methods.refund then
    guarded("limiter", "refund", methods.refund, limiter, cost)
  end
end

-- The same for a transport error.
local function record_error(state, terr)
  local circuit, counters, on_event = state.circuit, state.counters, state.on_event
  if counters then counting.attempt(counters, "network") end
  if on_event then
    call_hook("on_event", on_event, { type = "response", error = terr.message, class = "retryable",
      attempt = state.attempts })
  end
  if circuit and not terr.tls then guarded("circuit", "record", circuit.record, circuit, state.origin, "failure") end
end

-- The retry: counted, told, then waited for.
local function retry(state, d, res, terr)
  local retries = state.retries + 1
  state.retries = retries
  if d.backoff then state.previous_backoff = d.backoff end
  local status, delay, source = res and res.status or nil, d.delay, d.source
  local counters, on_event, opts = state.counters, state.on_event, state.opts
  if counters then counting.retry(counters, status or "network", source, delay) end
  if on_event then
    call_hook("on_event", on_event, { type = "retry", status = status, delay = delay, source = source,
      attempt = retries })
  end
  local on_retry = opts.on_retry
  if on_retry == nil then on_retry = report.default_on_retry end
  if on_retry then
    call_hook("on_retry", on_retry, {
      method = state.method, url = state.shown_url, status = status, delay = delay, attempt = retries,
      max_retries = opts.max_retries or decision.DEFAULT_MAX_RETRIES, source = source,
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
end

--- done, res | nil, err = carry.after(state, res, terr, sent_at, streaming, budget_cut): decides what
-- follows attempt number state.attempts, which gave res or the transport
-- error terr (sent at sent_at; streaming: a stream's reader; budget_cut:
-- whether the time budget cut the attempt's timeouts), and carries it out.
-- done: the call ends with what follows; false: the wait before the next
-- attempt is over, try again.
function carry.after(state, res, terr, sent_at, streaming, budget_cut)
  local foreign = res and state.hooked and state.limiter and elsewhere(state, res)
  if res then
    local policy = state.hooked and state.policy
    -- (only the request's origin may sync the limiter with its quota)
    if policy and policy.observe then
      call_hook("observe", policy.observe, res, not foreign and state.limiter or nil)
    end
  else
    printable(state, terr)
    state.budget_cut = budget_cut -- (what the decision reads of a transport error)
  end
  local d = decide(state, res, terr)
  if d.action == "ask" then
    -- the answers of this attempt's decision, which the next does not see
    local answers = {}
    state.answers = answers
    repeat
      answers[d.hook] = answer(state, d.hook, res, terr)
      d = decide(state, res, terr)
    until d.action ~= "ask"
    state.answers = nil
  end
  if res then
    record_response(state, d, res, sent_at, streaming, foreign)
    -- (a stream whose transfer ended before its headers were seen is
    -- handed over whole: settled from its events as well)
    local stream_answer = d.action == "return" and (streaming or state.stream and res.status >= 200
      and res.status <= 299)
    settle(state, res, nil, foreign, stream_answer)
    if d.action == "return" then return true, res end
    state.last_response, state.last_transport, state.hint = res, nil, d.hint
  else
    record_error(state, terr)
    settle(state, nil, terr)
    state.last_transport, state.hint = terr, nil
  end
  if d.action == "fail" then
    if d.refused then
      local counters, on_event = state.counters, state.on_event
      if counters then counters.budget_refusals = counters.budget_refusals + 1 end
      if on_event then
        call_hook("on_event", on_event, { type = "budget_refused", status = res and res.status or nil })
      end
    end
    return true, nil, fetch_error(d.kind, d.message, state, res, terr)
  end
  retry(state, d, res, terr)
  return false
end

return carry
