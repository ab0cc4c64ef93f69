-- Policies: the rules of one API's dialect, written in Lua. Each hook may be
-- missing or answer nil, and then the built-in behaviour applies.
--   classify(res)          -> "success" | "retryable" | "terminal" | nil
--   delay(res, attempt)    -> seconds | nil: the wait the server asked for
--   observe(res, limiter)  -> nothing: feeds what the response says of the
--                             quota back into the limiter
--   prepare(request)       -> nothing: may add headers (request.headers) or
--                             an idempotency key (request.idempotency_key)
--                             before the first attempt
--   replayable(res, method) -> true | nil: the server's word that a failed
--                             attempt of a request that is not replay-safe
--                             was not acted on (a 429), so it may be sent
--                             again (res is nil after a transport failure)
--   cost(request)          -> a cost per limit ({ requests = 1, tokens = n })
--                             or nil: what the API will count of a request
--                             (request: method, url, headers, body, json),
--                             taken from a limiter with named limits when
--                             the call gives no cost of its own
--   settle(res, taken)     -> a cost per limit or nil: what the attempt
--                             really cost, as the API counts it once the
--                             answer is whole (nil: as taken); the limiter
--                             gives back the difference or takes the extra
--   stream_usage(event, usage, taken) -> usage or nil: for a stream handed
--                             to the caller, each server-sent event as it
--                             is read, with what it answered before (nil
--                             at first): the usage so far, a cost per limit
--                             (and whatever else it keeps); the stream is
--                             settled to it when it ends, breaks off or is
--                             closed (nil: the usage as it was)
local options = require "ratewise.options"

local format = string.format
local type, pairs, select, setmetatable, getmetatable = type, pairs, select,
  setmetatable, getmetatable

local policy = {}

local Policy = {}
Policy.__index = Policy
Policy.__name = "ratewise.Policy"

-- The hooks a policy may have; with its `name`, the fields it takes.
local hooks, policy_fields = {}, { "name" }
for _, hook in ipairs { "classify", "delay", "observe", "prepare", "replayable", "cost", "settle",
  "stream_usage" } do
  hooks[hook] = true
  policy_fields[#policy_fields + 1] = hook
end

local function is_policy(v)
  return getmetatable(v) == Policy
end
policy.is_policy = is_policy

-- Errors are raised at `level`, the caller's line of rw.policy or chain.
local function build(spec, level)
  if is_policy(spec) then return spec end
  if type(spec) ~= "table" then
    error(format("policy: expected a table of hooks (got %s)", type(spec)), level)
  end
  local p = {}
  for k, v in pairs(spec) do
    if k == "name" then
      if type(v) ~= "string" then error("policy: 'name' must be a string", level) end
    elseif not hooks[k] then
      options.unknown("policy", k, policy_fields, level, "field")
    elseif type(v) ~= "function" then
      error(format("policy: hook '%s' must be a function (got %s)", k, type(v)), level)
    end
    p[k] = v
  end
  return setmetatable(p, Policy)
end

--- p = rw.policy{classify = fn, delay = fn, observe = fn, prepare = fn, replayable = fn, cost = fn, settle = fn,
-- stream_usage = fn, name = "..."}
function policy.new(spec)
  local p = build(spec, 3)
  return p
end

-- The first non-nil answer of the policies, in order.
local function first_answer(list, hook)
  return function(...)
    for i = 1, #list do
      local fn = list[i][hook]
      if fn then
        local answer = fn(...)
        if answer ~= nil then return answer end
      end
    end
    return nil
  end
end

-- Every policy sees the response and may prepare the request.
local function all_of(list, hook)
  return function(...)
    for i = 1, #list do
      local fn = list[i][hook]
      if fn then fn(...) end
    end
  end
end

--- p = rw.policy.chain(a, b, ...): the first non-nil answer wins; observe
-- and prepare run for every policy, in order.
function policy.chain(...)
  local list, names = {}, {}
  for i = 1, select("#", ...) do
    local p = select(i, ...)
    if p ~= nil then
      p = build(p, 3)
      list[#list + 1] = p
      names[#names + 1] = p.name or "?"
    end
  end
  local chained = { name = table.concat(names, "+") }
  for hook in pairs(hooks) do
    local any = false
    for i = 1, #list do if list[i][hook] then any = true end end
    if any then
      chained[hook] = (hook == "observe" or hook == "prepare") and all_of(list, hook)
        or first_answer(list, hook)
    end
  end
  return setmetatable(chained, Policy)
end

Policy.__tostring = function(p)
  return "ratewise.Policy (" .. (p.name or "custom") .. ")"
end

return setmetatable(policy, {
  __call = function(_, spec) return policy.new(spec) end,
})
