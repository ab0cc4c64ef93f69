-- Anthropic's API (docs.anthropic.com, "Rate limits" and "Errors").
--   x-should-retry: true/false decides for any non-2xx status; else 529
--   (overloaded) is retryable
--   the wait: retry-after, else on a 429 the latest of the
--   anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-reset
--   times (RFC 3339; the limit that was hit is not said, so the latest is the
--   safe wait), measured against the response's Date
--   observe: anthropic-ratelimit-requests-remaining and -requests-reset
local policy = require "ratewise.policy"
local common = require "ratewise.providers.common"

local type = type

local reset_headers = {
  "anthropic-ratelimit-requests-reset",
  "anthropic-ratelimit-tokens-reset",
  "anthropic-ratelimit-input-tokens-reset",
  "anthropic-ratelimit-output-tokens-reset",
}

local function classify(res)
  local class = common.override(res, "x-should-retry")
  if class then return class end
  if type(res) == "table" and res.status == 529 then return "retryable" end
  return nil
end

local function delay(res)
  local seconds = common.retry_after(res)
  if seconds then return seconds end
  if type(res) == "table" and res.status == 429 then
    local latest
    for i = 1, #reset_headers do
      local wait = common.reset_rfc3339(res, reset_headers[i])
      if wait and (not latest or wait > latest) then latest = wait end
    end
    return latest
  end
  return nil
end

local function observe(res, limiter)
  local remaining = common.number(res, "anthropic-ratelimit-requests-remaining")
  if remaining then
    common.sync(limiter, remaining, common.reset_rfc3339(res, "anthropic-ratelimit-requests-reset"))
  end
end

-- A rate-limited (429), overloaded (529), timed-out (408) or should-retry
-- response was not acted on: the official SDKs send such a POST again, and
-- so may ratewise. (The SDKs also replay every 5xx and 409; a 500 may come
-- after the model ran, so only x-should-retry: true replays one here.)
local OVERLOADED = { [529] = true }
local function replayable(res)
  return common.not_acted_on(res, "x-should-retry", OVERLOADED)
end

return policy.new {
  name = "anthropic",
  replayable = replayable,
  classify = classify,
  delay = delay,
  observe = observe,
}
