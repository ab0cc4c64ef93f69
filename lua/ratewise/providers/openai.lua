-- OpenAI's API (platform.openai.com, "Rate limits"; the official SDKs'
-- retry rules).
--   x-should-retry: true/false decides for any non-2xx status
--   the wait: retry-after-ms (milliseconds), else retry-after (seconds or an
--   HTTP-date), else on a 429 the longer of x-ratelimit-reset-requests and
--   x-ratelimit-reset-tokens (Go durations such as "6m0s"; which of the two
--   limits was hit is not said, and a token limit can refuse a request while
--   some tokens remain, so the longer one is the safe wait)
--   observe: x-ratelimit-remaining-requests and x-ratelimit-reset-requests
--   to the limiter's requests; x-ratelimit-remaining-tokens and
--   x-ratelimit-reset-tokens to its "tokens" limit (rw.limiters)
--   cost: what OpenAI counts against TPM at admission: the prompt's
--   characters / 4 plus max_tokens (or max_completion_tokens, else
--   DEFAULT_MAX_TOKENS), times n
--   settle: none. OpenAI never corrects the count from the answer's usage,
--   and says that unsuccessful requests count too: giving tokens back from
--   usage drew 429s (issue 41's measurements).
local policy = require "ratewise.policy"
local common = require "ratewise.providers.common"

local type, ceil = type, math.ceil

-- The tokens a request that names no max_tokens is taken for (a model's
-- output limit is not known here; OpenAI reserves up to it).
local DEFAULT_MAX_TOKENS = 4096

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
  common.sync_limit(limiter, "tokens", common.number(res, "x-ratelimit-remaining-tokens"),
    common.duration(res, "x-ratelimit-reset-tokens"), common.number(res, "x-ratelimit-limit-tokens"))
end

local function cost(request)
  local body = request.json
  if type(body) ~= "table" then return nil end
  local max_tokens = common.positive_integer(body.max_tokens) or common.positive_integer(body.max_completion_tokens)
    or DEFAULT_MAX_TOKENS
  local n = common.positive_integer(body.n) or 1
  return { requests = 1, tokens = (ceil(common.prompt_chars(body) / 4) + max_tokens) * n }
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
  cost = cost,
}
