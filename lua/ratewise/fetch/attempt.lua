-- fetch.attempt: one try of a call: admission (the circuit, the limiter
-- within the time left), then the transfer through the runtime seam, which
-- gives a response or a transport error.
local core = require "ratewise.core"
local response = require "ratewise.response"
local runtime = require "ratewise.runtime"
local report = require "ratewise.fetch.report"

local now = core.now
local format = string.format
local min = math.min
local sort, concat = table.sort, table.concat
local type, tostring = type, tostring
local call_hook, guarded, not_boolean = report.call_hook, report.guarded, report.not_boolean
local fetch_error, budget_error, limiter_failed = report.fetch_error, report.budget_error, report.limiter_failed
local response_mt = response.mt

local attempt = {}

-- A cost as an error says it: "3 tokens", or per limit "requests 1,
-- tokens 900" (in the order of the names).
local function shown_cost(cost)
  if type(cost) ~= "table" then return format("%s token%s", tostring(cost), cost == 1 and "" or "s") end
  local names = {}
  for name in pairs(cost) do names[#names + 1] = tostring(name) end
  sort(names)
  for i = 1, #names do names[i] = format("%s %s", names[i], tostring(cost[names[i]])) end
  return concat(names, ", ")
end

--- true | nil, err = attempt.admit(state): asks the call's circuit and
-- limiter (state: plan.make's) whether an attempt may go now, waiting for
-- the limiter within the time left; nil, err ends the call.
function attempt.admit(state)
  local circuit, limiter = state.circuit, state.limiter
  local method, shown_url = state.method, state.shown_url
  if circuit then
    local allowed, retry_in = guarded("circuit", "allow", circuit.allow, circuit, state.origin)
    if allowed ~= true and allowed ~= false then not_boolean("circuit", "allow", allowed) end
    if not allowed then
      local counters, on_event = state.counters, state.on_event
      if counters then counters.circuit_refusals = counters.circuit_refusals + 1 end
      if on_event then
        call_hook("on_event", on_event, { type = "circuit_open", url = shown_url, retry_in = retry_in })
      end
      return nil, fetch_error("circuit_open", format("%s: the circuit for %s is open after repeated "
        .. "failures; nothing was sent (a trial request goes through in %.2f s)",
        method .. " " .. shown_url, state.origin, retry_in or 0),
        state, state.last_response, state.last_transport)
    end
  end
  if limiter then
    local cost = state.cost
    -- A wait for the limiter counts against max_elapsed like any other:
    -- asked first, so that a wait that cannot fit ends the call at once
    -- with nothing taken (the token stays for a call that can use it).
    local left = state.deadline - now()
    local methods = state.limiter_methods
    local wait_time = methods.wait_time
    -- A limiter whose acquire says itself when it cannot serve within
    -- max_wait (a shared bucket, for which each question is a round trip
    -- to Redis) is not asked first.
    if wait_time and not methods.honors_max_wait then
      local wait, why = guarded("limiter", "wait_time", wait_time, limiter, cost)
      if wait == nil and type(why) == "table" then
        return limiter_failed(state, method .. " " .. shown_url, why)
      end
      if type(wait) ~= "number" or wait ~= wait then
        error(format("fetch: option 'limiter': wait_time must return a number of seconds (got %s)",
          tostring(wait)), 0)
      end
      if wait >= left then
        return budget_error(state, format("the limiter would wait %.2f s for %s, more than the "
          .. "%.2f s left; nothing was taken", wait, shown_cost(cost), left > 0 and left or 0),
          state.last_response, state.last_transport)
      end
    end
    -- The time left goes along: a limiter that knows it cannot serve in
    -- time answers false and takes nothing.
    local acquired, why = guarded("limiter", "acquire", limiter.acquire, limiter, cost, state.sleep, left)
    if acquired == false then
      return budget_error(state, format("the limiter could not serve %s within the %.2f s left",
        shown_cost(cost), left > 0 and left or 0), state.last_response, state.last_transport)
    elseif acquired == nil and why ~= nil then
      return limiter_failed(state, method .. " " .. shown_url, why)
    end
  end
  return true
end

--- res, terr, streaming = attempt.send(p, left, timeout): one transfer
-- of the request of plan p (plan.make's), within the `left` seconds of
-- its time budget, `timeout` being an attempt's own (the option's, or its
-- default). res: the response (a stream's reader in streaming), whose url is
-- p.shown_url unless a redirect was followed (but a stream's), or terr:
-- the transport error. A stream's p.budget_cut: whether the time budget
-- cut its timeouts ("after_headers": only its time read whole).
function attempt.send(p, left, timeout)
  -- The plan is the request the engine reads: it copies what it needs as
  -- the transfer starts, so the plan serves every attempt.
  local sleep, stream
  if p.hooked then sleep, stream = p.sleep, p.stream end
  local res, terr, streaming
  if stream then
    -- No total timeout for a 2xx: `timeout` bounds the time to the
    -- headers (unless first_byte_timeout does), which fits what is left
    -- of max_elapsed. An answer read whole (not a 2xx) is bounded as a
    -- call without stream is, given at least the time to its headers.
    local first_byte = p.first_byte
    local whole = first_byte > timeout and first_byte or timeout
    p.timeout = min(whole, left)
    p.first_byte_timeout = min(first_byte, left)
    p.budget_cut = left < first_byte or left < whole and "after_headers"
    if sleep then
      res, terr, streaming = guarded("sleep", "a wait for the transfer", runtime.open_stream, p, sleep)
    else
      res, terr, streaming = runtime.open_stream(p)
    end
    -- The response reads its body from here on (and a hook that raises
    -- below drops both, the transfer closing as it is collected).
    if res then response.new(res) end
    if streaming then response.stream(res, streaming, sleep, p.method .. " " .. p.shown_url, p.max_body) end
    return res, terr, streaming
  end
  p.timeout = left < timeout and left or timeout
  if sleep then
    return guarded("sleep", "a wait for the transfer", runtime.transfer, p, sleep, response_mt, p.shown_url)
  end
  return runtime.transfer(p, nil, response_mt, p.shown_url)
end

return attempt
