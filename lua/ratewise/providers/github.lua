-- GitHub's REST API (docs.github.com, "Rate limits for the REST API").
--   primary limit:   403 or 429 with x-ratelimit-remaining: 0; wait until
--                    x-ratelimit-reset (epoch seconds; seconds from now
--                    when below 1e9), or Retry-After when the
--                    reset is less than a second past it
--   secondary limit: 403 or 429 with retry-after; wait that long. Without
--                    one, GitHub asks for at least a minute, then longer
--                    waits: 60 s * 2^attempt (no jitter: the minute is a floor)
--   anything else on a 403 is a permission error, terminal as built in.
--   observe: limiter:sync(x-ratelimit-remaining, the reset, x-ratelimit-limit)
local policy = require "ratewise.policy"
local common = require "ratewise.providers.common"

local type, find, min = type, string.find, math.min

local SECONDARY_WAIT = 60
local MAX_DOUBLINGS = 30 -- keeps 60 * 2^n finite; the time budget ends it long before

local function limit_status(res)
  local status = type(res) == "table" and res.status
  return status == 403 or status == 429
end

local function primary_exhausted(res)
  return common.number(res, "x-ratelimit-remaining") == 0
end

-- GitHub's message for a secondary limit; older GitHub Enterprise servers
-- still call it abuse detection. A pattern, not lower(): bodies may be big.
local function mentions_secondary(res)
  local body = res.body
  return type(body) == "string" and (find(body, "[Ss]econdary [Rr]ate [Ll]imit") ~= nil
    or find(body, "[Aa]buse [Dd]etection") ~= nil)
end

local function classify(res)
  if not limit_status(res) then return nil end
  if primary_exhausted(res) or common.retry_after(res) or mentions_secondary(res) then
    return "retryable"
  end
  return nil -- a 403 stays terminal, a 429 retryable, as built in
end

local function delay(res, attempt)
  local wait = common.retry_after(res)
  if primary_exhausted(res) then
    local reset = common.reset_at(res, "x-ratelimit-reset")
    -- Both are whole seconds, rounded up by the servers that send both
    -- (express-rate-limit): a reset less than a second past Retry-After
    -- names the same moment, which Retry-After, counted from now, names
    -- more closely.
    if reset and (not wait or reset >= wait + 1) then wait = reset end
  end
  if wait then return wait end
  if limit_status(res) and mentions_secondary(res) then
    local n = type(attempt) == "number" and attempt >= 0 and attempt or 0
    return SECONDARY_WAIT * 2 ^ min(n, MAX_DOUBLINGS)
  end
  return nil
end

local function observe(res, limiter)
  local remaining = common.number(res, "x-ratelimit-remaining")
  if remaining then
    common.sync(limiter, remaining, common.reset_at(res, "x-ratelimit-reset"),
      common.number(res, "x-ratelimit-limit"))
  end
end

return policy.new {
  name = "github",
  classify = classify,
  delay = delay,
  observe = observe,
}
