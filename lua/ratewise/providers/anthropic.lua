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
--   stream_usage: a stream's usage from its events: message_start's
--   message.usage (the input, as for a whole answer), message_delta's
--   usage.output_tokens (cumulative: the last one is the output); before
--   that, the text of the content_block_delta events seen at 4 characters
--   a token, never more than was taken (max_tokens): what a stream that
--   breaks or is closed early is settled to
local policy = require "ratewise.policy"
local common = require "ratewise.providers.common"

local type, pcall, ceil, huge = type, pcall, math.ceil, math.huge

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

-- A count of tokens a server reports, or nil: a JSON number may also be
-- negative or, written as 1e999, infinite, which no limit could take.
local function tokens(v)
  if type(v) == "number" and v >= 0 and v < huge then return v end
  return nil
end

-- The input a usage object reports as Anthropic counts it against ITPM:
-- cache writes count, cache reads do not.
local function input_of(usage)
  local input = tokens(usage.input_tokens)
  if not input then return nil end
  local written = tokens(usage.cache_creation_input_tokens)
  if written then input = input + written end
  if input == huge then return nil end
  return input
end

local function output_of(usage)
  return tokens(usage.output_tokens)
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
  local input, output = input_of(usage), output_of(usage)
  if not (input and output) then return nil end
  return { input_tokens = input, output_tokens = output }
end

-- The characters of a delta's text: its text, its thinking or a tool
-- call's input as it is written out.
local function delta_chars(delta)
  if type(delta) ~= "table" then return 0 end
  local text = delta.text or delta.thinking or delta.partial_json
  if type(text) ~= "string" then return 0 end
  return common.utf8_chars(text)
end

-- The events whose data tell of the usage, or of text that the output
-- is estimated from until they do.
local USAGE_EVENTS = { message_start = true, message_delta = true, content_block_delta = true }

-- usage: { input_tokens =, output_tokens = (the costs so far), reported =
-- the output the last usage reported, chars = the text seen since,
-- final = whether message_delta told the output }.
local function stream_usage(event, usage, taken)
  local name = event.event
  if not USAGE_EVENTS[name] then return nil end
  local ok, data = pcall(event.json, event)
  if not ok or type(data) ~= "table" then return nil end
  usage = usage or { reported = 0, chars = 0, final = false }
  if name == "content_block_delta" then
    usage.chars = usage.chars + delta_chars(data.delta)
  else
    local reported = name == "message_start" and type(data.message) == "table" and data.message.usage
      or name == "message_delta" and data.usage
    if type(reported) ~= "table" then return usage end
    usage.input_tokens = input_of(reported) or usage.input_tokens
    local output = output_of(reported)
    if output then
      usage.reported, usage.chars = output, 0
      usage.final = name == "message_delta"
    end
  end
  local output = usage.reported
  if not usage.final then
    output = output + ceil(usage.chars / 4)
    local most = type(taken) == "table" and taken.output_tokens
    if type(most) == "number" and output > most then output = most end
  end
  usage.output_tokens = output
  return usage
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
  stream_usage = stream_usage,
}
