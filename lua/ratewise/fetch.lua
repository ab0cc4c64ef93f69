-- fetch: one HTTP request, retried the way the server asks. The loop that
-- ties a call's plan (fetch/plan.lua: its options, URL and header lines,
-- checked once), its attempts (fetch/attempt.lua: admission and the
-- transfer) and the decision after each (fetch/decision.lua: retry, return
-- or fail, carried out by fetch/carry.lua). What is kept from one call for
-- the next: fetch/cache.lua.
local core = require "ratewise.core"
local headers = require "ratewise.headers"
local plan = require "ratewise.fetch.plan"
local attempt = require "ratewise.fetch.attempt"
local carry = require "ratewise.fetch.carry"
local report = require "ratewise.fetch.report"

local now = core.now
local type = type
local make_plan, bad_options_type = plan.make, plan.bad_options_type
local admit, send, after = attempt.admit, attempt.send, carry.after
local guarded, call_hook, budget_error = report.guarded, report.call_hook, report.budget_error
local check_counters = report.counting.check
local redact_url = headers.redact_url
local DEFAULT_MAX_ELAPSED, DEFAULT_TIMEOUT = plan.DEFAULT_MAX_ELAPSED, plan.DEFAULT_TIMEOUT

local fetch = {}

fetch.error_mt = report.error_mt
fetch.DEFAULT_MAX_ELAPSED = DEFAULT_MAX_ELAPSED

--- fetch.check(url, opts [, depth [, kept]]): raises, as fetch would, for a
-- bad URL or option. For callers that run the fetch elsewhere (a shared
-- task) and want misuse reported at the call. The next fetch.fetch with
-- opts (a table its caller leaves as it was) does not check them again;
-- with kept, no fetch with it does (for a table its owner never changes).
fetch.check = plan.check

--- counters = fetch.counters(t): t (an rw.client's counters: attempts,
-- statuses, retries, ...), marked as counters fetch.fetch may keep.
fetch.counters = report.counters

-- The options of a call that gives none: one table for all of them (fetch
-- only reads its options, and hands the table to no one).
local NO_OPTIONS = {}

local NO_TIME_FIRST = "no time left for a first attempt; nothing was sent"

--- res | nil, err = fetch.fetch(url [, opts [, counters]])
-- counters: fetch.counters' (rw.client's), or nil.
function fetch.fetch(url, opts, counters)
  if opts == nil then opts = NO_OPTIONS end
  if counters ~= nil then
    -- (options that are not a table are plan.make's to refuse; here, only
    -- so that they are refused before the counters)
    if type(opts) ~= "table" then bad_options_type(url, opts, 3) end
    check_counters(counters)
  end
  -- the call's plan, which is its state too
  local state, err = make_plan(url, opts, counters)
  if not state then return nil, err end -- no idempotency key could be made
  local request_url, shown_url = state.url, state.shown_url
  local timeout = opts.timeout or DEFAULT_TIMEOUT
  -- (when the call began and when it must end: plan.make's, the one place
  -- that weighs max_elapsed against the deadline option)
  local started, deadline = state.started, state.deadline
  local hooked = state.hooked
  if hooked then
    local budget, on_event = state.budget, state.on_event
    if on_event then
      call_hook("on_event", on_event, { type = "request", method = state.method, url = shown_url })
    end
    -- A deadline already past ends the call before anything is asked of
    -- the retry budget (which would count a request never sent), the
    -- limiter or the circuit (a plain call's first attempt sees it below).
    if deadline <= started then return budget_error(state, NO_TIME_FIRST) end
    if budget then guarded("budget", "request", budget.request, budget) end
  end
  local attempts = 0
  while true do
    if hooked then
      local admitted, aerr = admit(state)
      if not admitted then return nil, aerr end
    end
    -- (the first attempt of a call with nothing to wait for goes out as it starts)
    local sent_at = attempts == 0 and not hooked and started or now()
    local left = deadline - sent_at
    if left <= 0 then
      return budget_error(state, attempts == 0 and NO_TIME_FIRST or "no time left for another attempt",
        state.last_response)
    end
    local res, terr, streaming = send(state, left, timeout)
    attempts = attempts + 1
    state.attempts = attempts
    if res then
      -- shown_url, unless a redirect was followed (or the response is a
      -- stream's, which has no url then)
      local final_url = res.url
      if final_url ~= shown_url then
        if final_url == nil or final_url == request_url then
          res.url = shown_url
        else
          res.url = redact_url(final_url)
        end
      end
      res.attempts = attempts
      res.elapsed = now() - started
    end
    -- whether the time budget cut the attempt's own timeouts (a stream's: attempt.send's)
    local budget_cut = left < timeout
    if hooked and state.stream then budget_cut = state.budget_cut end
    local done, a, b = after(state, res, terr, sent_at, streaming, budget_cut)
    if done then return a, b end
  end
end

return fetch
