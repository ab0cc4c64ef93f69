-- fetch.report: how a call speaks to its caller: the caller's hooks called
-- (an error they raise names them), the errors a call ends with, and an
-- rw.client's counters.
local compat = require "ratewise.compat"
local core = require "ratewise.core"
local errors = require "ratewise.errors"
local log = require "ratewise.log"
local scheduler = require "ratewise.scheduler"
local budget_message = require("ratewise.fetch.decision").budget_message

local CANCELLED, task_origin = scheduler.CANCELLED, scheduler.origin
local now = core.now
local format = string.format
local type, tostring, getmetatable, setmetatable = type, tostring, getmetatable, setmetatable

local report = {}

local error_mt = errors.mt
report.error_mt = error_mt

local function call_hook(name, fn, ...)
  local ok, a, b = compat.pcall(fn, ...)
  if not ok then
    error(format("fetch: the '%s' callback raised an error: %s", name, tostring(a)), 0)
  end
  return a, b
end

-- The objects fetch drives (a limiter, a circuit, a budget, a sleep) are the
-- caller's code too: an error they raise is reported naming the option. A
-- cancellation passes through untouched: it is how a waiting task ends.
local function guarded(option, method, fn, ...)
  local ok, a, b = compat.pcall(fn, ...)
  if not ok then
    if a == CANCELLED then error(a, 0) end
    error(format("fetch: option '%s' raised an error in %s: %s", option, method, tostring(a)), 0)
  end
  return a, b
end

-- The objects' yes-or-no answers are booleans: "no" or 0 would read as yes.
local function not_boolean(option, method, answer)
  error(format("fetch: option '%s': %s must answer true or false (got %s %s)", option, method, type(answer),
    type(answer) == "string" and format("%q", answer) or tostring(answer)), 0)
end

report.call_hook, report.guarded, report.not_boolean = call_hook, guarded, not_boolean

local function fetch_error(kind, message, state, res, transport)
  local err = setmetatable({
    kind = kind,
    message = message,
    status = res and res.status or (transport and transport.status) or nil,
    response = res,
    attempts = state.attempts,
    elapsed = now() - state.started,
    transport = transport,
  }, error_mt)
  -- A call that ends on a response that asked for a wait tells the caller
  -- when to come back: retry_in seconds from now, at retry_at (epoch
  -- seconds), for callers that reschedule the work themselves.
  local hint = res and state.hint
  if hint then
    err.retry_in = hint
    err.retry_at = core.time() + hint
  end
  -- Every call that fails tells a listener how it ended (an open circuit
  -- already said so with its own event).
  if state.on_event and kind ~= "circuit_open" then
    call_hook("on_event", state.on_event, { type = "error", kind = kind, status = err.status,
      attempts = err.attempts })
  end
  return err
end

local function budget_error(state, why, res, transport)
  return nil, fetch_error("budget", budget_message(state, why), state, res, transport)
end

-- The limiter could not answer (a shared bucket whose Redis is down, with
-- on_error = "closed"): the call ends with its error, of its kind.
local function limiter_failed(state, what, why)
  local kind = type(why) == "table" and type(why.kind) == "string" and why.kind or "limiter_unavailable"
  local message = type(why) == "table" and why.message or why
  return nil, fetch_error(kind, format("%s: %s; nothing was sent", what, tostring(message)), state,
    state.last_response, state.last_transport)
end

report.fetch_error, report.budget_error, report.limiter_failed = fetch_error, budget_error, limiter_failed

-- The line a retry writes when the call gives no on_retry of its own. A
-- retry in a task ends with what caused the task, as its host labelled it
-- (OpenResty: "request <id>", the client request that spawned it, as the
-- line is nginx's driver timer's, which names no request).
local function default_on_retry(info)
  local why
  if info.status then
    why = tostring(info.status)
  else
    why = "network error: " .. (info.error or "unknown")
  end
  local line = format("retrying %s %s in %.2f s (%s, attempt %d/%d, %s)",
    info.method, info.url, info.delay, why, info.attempt, info.max_retries, info.source)
  local origin = task_origin()
  if origin then line = line .. "; " .. origin end
  log.write(line, "info")
end
report.default_on_retry = default_on_retry

-- The counters of an rw.client (client:stats()), which fetch keeps as the
-- call goes, in the client's own table rather than through an event
-- listener: a client that nobody listens to still counts.
local counters_mt = { __name = "ratewise.counters" }
local counting = {}

--- counters = report.counters(t) (fetch.counters): t (an rw.client's
-- counters: attempts, statuses, retries, ...), marked as counters
-- fetch.fetch may keep.
function report.counters(t)
  return setmetatable(t, counters_mt)
end

local function bump(t, k, by)
  t[k] = (t[k] or 0) + (by or 1)
end

-- Raises unless counters are fetch.counters' (a third argument given to
-- rw.fetch by mistake is not taken for them).
function counting.check(counters)
  if getmetatable(counters) ~= counters_mt then
    error(format("fetch: expected (url [, opts]), got a third argument (%s)", type(counters)), 3)
  end
end

-- status: a number, or "network" for an attempt that got no response
-- (client:stats() turns the numbers into strings).
function counting.attempt(counters, status)
  counters.attempts = counters.attempts + 1
  bump(counters.statuses, status)
end

function counting.retry(counters, status, source, delay)
  counters.retries = counters.retries + 1
  bump(counters.retries_by_status, status)
  bump(counters.retries_by_source, source)
  counters.waits, counters.waited = counters.waits + 1, counters.waited + delay
  bump(counters.waits_by_source, source, delay)
end

report.counting = counting

return report
