-- OpenAI's API (platform.openai.com, "Rate limits"; the official SDKs'
-- retry rules).
--   x-should-retry: true/false decides for any non-2xx status
--   the wait: retry-after-ms (milliseconds), else retry-after (seconds or an
--   HTTP-date), else on a 429 the longer of x-ratelimit-reset-requests and
--   x-ratelimit-reset-tokens (Go durations such as "6m0s"; which of the two
--   limits was hit is not said, and a token limit can refuse a request while
--   some tokens remain, so the longer one is the safe wait)
--   observe: x-ratelimit-remaining-requests and x-ratelimit-reset-requests
local policy = require "ratewise.policy"
local common = require "ratewise.providers.common"

local type = type

local function classify(res)
  return common.override(res, "x-should-retry")
end

local function delay(res)
  local ms = common.number(res, "retry-after-ms")
  if ms then return ms / 1000 end
  local seconds = common.retry_after(res)
  if seconds then return seconds end
  if type(res) == "table" and res.status == 429 then
    local requests = common.duration(res, "x-ratelimit-reset-requests")
    local tokens = common.duration(res, "x-ratelimit-reset-tokens")
    if requests and tokens then return requests > tokens and requests or tokens end
    return requests or tokens
  end
  return nil
end

local function observe(res, limiter)
  local remaining = common.number(res, "x-ratelimit-remaining-requests")
  if remaining then
    common.sync(limiter, remaining, common.duration(res, "x-ratelimit-reset-requests"))
  end
end

-- A rate-limited (429), timed-out (408) or should-retry response was not
-- acted on: the official SDKs send such a POST again, and so may ratewise.
-- (The SDKs also replay every 5xx and 409; a 500 may come after the model
-- ran, so only x-should-retry: true replays one here.)
local function replayable(res)
  return common.not_acted_on(res, "x-should-retry")
end

return policy.new {
  name = "openai",
  replayable = replayable,
  classify = classify,
  delay = delay,
  observe = observe,
}
