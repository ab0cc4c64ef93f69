-- fetch.attempt: one try of a call: admission (the circuit, the limiter
-- within the time left), then the transfer through the runtime seam, which
-- gives a response or a transport error.
local core = require "ratewise.core"
local response = require "ratewise.response"
local runtime = require "ratewise.runtime"
local plan = require "ratewise.fetch.plan"
local report = require "ratewise.fetch.report"

local now = core.now
local format = string.format
local min = math.min
local type, tostring, pairs, getmetatable = type, tostring, pairs, getmetatable
local call_hook, guarded, not_boolean = report.call_hook, report.guarded, report.not_boolean
local fetch_error, budget_error, limiter_failed = report.fetch_error, report.budget_error, report.limiter_failed
local transport_options, is_transport_option, has_body = plan.transport_options, plan.is_transport_option,
  plan.has_body
local response_mt = response.mt

local attempt = {}

-- The fields the engine reads of every request, so that assigning one
-- never grows the table; the rarer ones are there only while a call lists
-- them (set_transport, put_transport).
local scratch_request = { url = false, method = false, headers = false, timeout = false, body = false,
  transport = false }

-- The names of the transport options scratch_request holds: the engine
-- looks for those only (src/request.c), and the next call takes them away.
local scratch_transport_names, scratch_transport_n = {}, 0

-- Puts into the request the transport options a call names (transport:
-- whether it names any), in place of those of the call before. The engine
-- looks for the names listed (request.transport), or for none (false).
local function set_transport(request, opts, transport)
  local names, n = scratch_transport_names, scratch_transport_n
  for i = 1, n do
    request[names[i]] = nil
    names[i] = nil
  end
  n = 0
  if transport then
    if getmetatable(opts) == nil then -- its own keys are all it has
      for k, v in pairs(opts) do
        if is_transport_option[k] then
          request[k] = v
          n = n + 1
          names[n] = k
        end
      end
    else
      for i = 1, #transport_options do
        local name = transport_options[i]
        local v = opts[name]
        if v ~= nil then
          request[name] = v
          n = n + 1
          names[n] = name
        end
      end
    end
  end
  scratch_transport_n = n
  request.transport = transport and names -- false: the engine need not look for any
end

-- A rare request field that fetch works out itself (the stream's
-- timeouts, an empty body, a body limit...): listed for the engine to read.
local function put_transport(request, name, v)
  if request[name] == nil then
    scratch_transport_n = scratch_transport_n + 1
    scratch_transport_names[scratch_transport_n] = name
  end
  request[name] = v
  request.transport = scratch_transport_names
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
        return budget_error(state, format("the limiter would wait %.2f s for %s token%s, more than the "
          .. "%.2f s left; nothing was taken", wait, tostring(cost), cost == 1 and "" or "s",
          left > 0 and left or 0), state.last_response, state.last_transport)
      end
    end
    -- The time left goes along: a limiter that knows it cannot serve in
    -- time answers false and takes nothing.
    local acquired, why = guarded("limiter", "acquire", limiter.acquire, limiter, cost, state.sleep, left)
    if acquired == false then
      return budget_error(state, format("the limiter could not serve %s token%s within the %.2f s left",
        tostring(cost), cost == 1 and "" or "s", left > 0 and left or 0), state.last_response,
        state.last_transport)
    elseif acquired == nil and why ~= nil then
      return limiter_failed(state, method .. " " .. shown_url, why)
    end
  end
  return true
end

--- res, terr, streaming = attempt.send(state, url, method, lines, body, opts, transport, rare, safe, timeout,
-- left, shown_url): one transfer of the request plan.make made (state: the
-- call's, or nil for a common call's first attempt), within the `left`
-- seconds of its time budget. res: the response (a stream's reader in
-- streaming), whose url is shown_url unless a redirect was followed (but
-- a stream's), or terr: the transport error. A stream's state.budget_cut:
-- whether the time budget cut its timeouts ("after_headers": only its time
-- read whole).
function attempt.send(state, url, method, lines, body, opts, transport, rare, safe, timeout, left, shown_url)
  local attempt_timeout = timeout
  if left < timeout then attempt_timeout = left end -- min(), without a call
  -- The engine copies what it needs from the request as it starts the
  -- transfer, so one table serves every attempt of every call. Every
  -- field is assigned; those the call does not use are nil, and the
  -- engine leaves libcurl's defaults for them.
  local request = scratch_request
  request.url, request.method, request.headers = url, method, lines
  request.timeout, request.body = attempt_timeout, body
  -- The rare fields are copied (or cleared after a call that had them)
  -- only when there is something to copy or clear.
  if rare == "no_replay" and scratch_transport_n == 1 and request.no_replay then -- luacheck: ignore 542
    -- The call before listed no_replay alone (a POST without a key, as
    -- most are), and the request holds it still.
  elseif rare or scratch_transport_n > 0 then
    set_transport(request, opts, transport)
    -- (servers expect a Content-Length on these even when the body is empty)
    if body == nil and has_body[method] then put_transport(request, "empty_body", true) end
    if state then
      if state.follow == false then put_transport(request, "follow_redirects", false) end
      if state.max_body ~= nil then put_transport(request, "max_body", state.max_body) end
      if state.verify_tls ~= nil then put_transport(request, "verify_tls", state.verify_tls) end
    end
    -- libcurl re-sends a request on its own when a reused connection
    -- turns out to be dead; only a replay-safe request may take that chance
    -- (the engine keeps any other from it: src/request.c, no_replay).
    if not safe then put_transport(request, "no_replay", true) end
    -- More names whose lines the engine keeps from another origin.
    if state and state.secret_headers ~= nil then put_transport(request, "secret_headers", state.secret_headers) end
  else
    request.transport = false
  end
  local res, terr, streaming
  local sleep = state and state.sleep
  if state and state.stream then
    -- No total timeout for a 2xx: `timeout` bounds the time to the
    -- headers (unless first_byte_timeout does), which fits what is left
    -- of max_elapsed. An answer read whole (not a 2xx) is bounded as a
    -- call without stream is, given at least the time to its headers.
    local first_byte = state.first_byte
    local whole = first_byte > timeout and first_byte or timeout
    request.timeout = min(whole, left)
    put_transport(request, "first_byte_timeout", min(first_byte, left))
    put_transport(request, "idle_timeout", state.idle)
    state.budget_cut = left < first_byte or left < whole and "after_headers"
    if sleep then
      res, terr, streaming = guarded("sleep", "a wait for the transfer", runtime.open_stream, request, sleep)
    else
      res, terr, streaming = runtime.open_stream(request)
    end
    -- The response reads its body from here on (and a hook that raises
    -- below drops both, the transfer closing as it is collected).
    if res then response.new(res) end
    if streaming then response.stream(res, streaming, sleep, method .. " " .. state.shown_url, state.max_body) end
  elseif sleep then
    res, terr = guarded("sleep", "a wait for the transfer", runtime.transfer, request, sleep, response_mt, shown_url)
  else
    res, terr = runtime.transfer(request, nil, response_mt, shown_url)
  end
  if body ~= nil then request.body = nil end -- not kept alive by the next call's table
  return res, terr, streaming
end

return attempt
