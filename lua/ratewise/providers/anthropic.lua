-- Anthropic's API (docs.anthropic.com, "Rate limits" and "Errors").
--   x-should-retry: true/false decides for any non-2xx status; else 529
--   (overloaded) is retryable
--   the wait: retry-after, else on a 429 the latest of the
--   anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-reset
--   times (RFC 3339; the limit that was hit is not said, so the latest is the
--   safe wait), measured against the response's Date
--   observe: anthropic-ratelimit-requests-remaining and -requests-reset to
--   the limiter's requests; anthropic-ratelimit-{input,output}-tokens-
--   remaining and -reset to its "input_tokens" and "output_tokens" limits
--   cost: what Anthropic counts at admission: the input (its characters / 4,
--   the rule of thumb) against ITPM, max_tokens against OTPM
--   settle: what the answer's usage says: Anthropic gives back the output
--   tokens an answer did not use, and counts the input as it tokenized it;
--   a request it refused (429, 529, 408) takes nothing
local policy = require "ratewise.policy"
local common = require "ratewise.providers.common"

local type, ceil = type, math.ceil

-- The output tokens a request that names no max_tokens is taken for
-- (Anthropic requires max_tokens: such a request is refused, 400).
local DEFAULT_MAX_TOKENS = 4096

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
  for name, header in pairs { input_tokens = "anthropic-ratelimit-input-tokens",
    output_tokens = "anthropic-ratelimit-output-tokens" } do
    common.sync_limit(limiter, name, common.number(res, header .. "-remaining"),
      common.reset_rfc3339(res, header .. "-reset"), common.number(res, header .. "-limit"))
  end
end

local function cost(request)
  local body = request.json
  if type(body) ~= "table" then return nil end
  local input = ceil(common.prompt_chars(body) / 4)
  return { requests = 1, input_tokens = input > 0 and input or 1,
    output_tokens = common.positive_integer(body.max_tokens) or DEFAULT_MAX_TOKENS }
end

-- What Anthropic counted of the attempt: nothing for a refusal; for an
-- answer, the input as its usage reports it (cache writes count toward
-- ITPM, cache reads do not) and the output it used.
local REFUSED = { requests = 0, input_tokens = 0, output_tokens = 0 }
local function settle(res)
  local status = type(res) == "table" and res.status
  if status == 429 or status == 529 or status == 408 then return REFUSED end
  local usage = common.usage(res)
  if not usage then return nil end
  local input, output = usage.input_tokens, usage.output_tokens
  if type(input) ~= "number" or type(output) ~= "number" or input < 0 or output < 0 then return nil end
  local written = usage.cache_creation_input_tokens
  if type(written) == "number" and written > 0 then input = input + written end
  return { input_tokens = input, output_tokens = output }
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
  cost = cost,
  settle = settle,
}
